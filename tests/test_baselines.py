"""The rule baselines (clstm_ppo/evaluation/baselines.py), worked by hand: the env's costs and order rules, and
fills where ``--execution`` says (the decision's close, or the next open)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from clstm_ppo.evaluation.baselines import buy_and_hold, monthly_rebalance, turbulence_stop
from envs.execution import Terms

CLOSE = np.array([[10.0, 20.0], [11.0, 20.0], [12.0, 18.0], [12.0, 19.0], [13.0, 21.0]])
DATES = pd.to_datetime(["2020-01-30", "2020-01-31", "2020-02-03", "2020-02-04", "2020-02-05"]).to_numpy()


def test_baselines_at_the_close_follow_the_env_rules():
    calm = np.zeros(5, dtype=bool)
    bh = buy_and_hold(CLOSE, None, 1000.0, 0.01)
    # 500 dollars each at 1% cost: 49 shares at 10.10 and 24 at 20.20 -> 979.70 spent, 20.30 cash left
    assert bh.values[0] == 1000.0  # day 0 valued before its trade, as the env reports it
    np.testing.assert_allclose(bh.values[1:], 20.3 + CLOSE[1:] @ np.array([49.0, 24.0]))
    np.testing.assert_array_equal(bh.holdings[1:], [[49.0, 24.0]] * 4)
    assert bh.num_trades == 2 and bh.costs == pytest.approx(9.7) and bh.traded_value == pytest.approx(970.0)
    # no turbulent day: the stop baseline is buy-and-hold
    np.testing.assert_allclose(turbulence_stop(CLOSE, None, calm, 1000.0, 0.01, 0.02).values, bh.values)
    # a turbulent day 2: everything sold at its close (2% cost), bought back at day 3's close
    stormy = calm.copy()
    stormy[2] = True
    stop = turbulence_stop(CLOSE, None, stormy, 1000.0, 0.01, 0.02)
    cash_after_sale = 20.3 + (49 * 12.0 + 24 * 18.0) * 0.98
    assert stop.values[3] == pytest.approx(cash_after_sale)  # all cash on day 3
    assert stop.holdings_value[3] == 0 and stop.holdings_value[4] > 0 and stop.num_trades == 6
    # 1/N monthly: bought on day 0, rebalanced on 2020-02-03 (the month's first trading day) only
    monthly = monthly_rebalance(CLOSE, None, DATES, 1000.0, 0.01, 0.02)
    np.testing.assert_allclose(monthly.values[:3], bh.values[:3])
    assert monthly.num_trades > bh.num_trades


def test_next_open_fills_price_the_orders_decided_on_the_close_at_the_next_open():
    """Orders sized on day 0's close (49 and 24 shares, as above) fill at day 1's open (10.5 and 19.0): the cost is
    the fill's, and the cash left is what the open prices leave. Day 1 is valued at its close as before."""
    opens = np.array([[10.0, 20.0], [10.5, 19.0], [12.5, 18.5], [12.0, 19.5], [13.5, 20.0]])
    fill = np.vstack([opens[1:], CLOSE[-1:]])  # row t: the fill of day t's orders (envs.execution.fill_prices)
    terms = Terms("next_open", fill, np.zeros_like(CLOSE), 0.0)
    bh = buy_and_hold(CLOSE, terms, 1000.0, 0.01)
    spent = (49 * 10.5 + 24 * 19.0) * 1.01
    np.testing.assert_allclose(bh.values[1:], 1000.0 - spent + CLOSE[1:] @ np.array([49.0, 24.0]))
    assert bh.costs == pytest.approx((49 * 10.5 + 24 * 19.0) * 0.01)
    # the stop on day 2 sells at day 3's open, and buys back on day 3 at day 4's open
    stormy = np.array([False, False, True, False, False])
    stop = turbulence_stop(CLOSE, terms, stormy, 1000.0, 0.01, 0.02)
    after_sale = 1000.0 - spent + (49 * 12.0 + 24 * 19.5) * 0.98
    assert stop.values[3] == pytest.approx(after_sale) and stop.holdings_value[3] == 0
    assert stop.holdings[4].sum() > 0  # bought back at day 4's open


def test_a_gap_up_at_the_open_scales_the_buys_down_as_the_env_does():
    """Orders sized at the close can cost more at the open than the cash holds: every buy is scaled by one factor
    and floored (the kernel's pro-rata cap), so cash never goes negative."""
    fill = np.vstack([CLOSE[1:] * 1.2, CLOSE[-1:]])  # a 20% gap up overnight
    bh = buy_and_hold(CLOSE, Terms("next_open", fill, np.zeros_like(CLOSE), 0.0), 1000.0, 0.01)
    want = np.array([49.0, 24.0])
    total = float(want @ (fill[0] * 1.01))
    assert total > 1000.0
    factor = 1000.0 / total * (1 - 1e-12)
    np.testing.assert_array_equal(bh.holdings[1], np.floor(want * factor))
    cash = 1000.0 - float(np.floor(want * factor) @ (fill[0] * 1.01))
    assert cash >= 0 and bh.values[1] == pytest.approx(cash + CLOSE[1] @ bh.holdings[1])


def test_cash_earns_the_risk_free_rate_and_holders_receive_their_dividends():
    """Buy-and-hold's leftover cash grows by the daily rate; a $1 dividend of AAA on day 2 is paid on the 49 shares
    held at day 1's close (at close fills: after day 1's trade; at next-open fills: before it)."""
    dividends = np.zeros_like(CLOSE)
    dividends[2, 0] = 1.0
    rate = 0.0001
    close_terms = Terms("close", CLOSE.copy(), dividends, rate)
    bh = buy_and_hold(CLOSE, close_terms, 1000.0, 0.01)
    cash = 20.3 * (1 + rate)
    np.testing.assert_allclose(bh.values[1], cash + CLOSE[1] @ [49.0, 24.0])
    cash = cash * (1 + rate) + 49 * 1.0
    np.testing.assert_allclose(bh.values[2], cash + CLOSE[2] @ [49.0, 24.0])
    # a stop sells everything at day 1's close: under close fills it holds nothing at day 1's close and gets no
    # dividend; under next-open fills it still holds its shares at day 1's close (they sell at day 2's open)
    stormy = np.array([False, True, False, False, False])
    assert turbulence_stop(CLOSE, close_terms, stormy, 1000.0, 0.01, 0.02).holdings[2].sum() == 0
    opens = Terms("next_open", np.vstack([CLOSE[1:], CLOSE[-1:]]), dividends, 0.0)
    later = turbulence_stop(CLOSE, opens, stormy, 1000.0, 0.01, 0.02)
    no_dividend = turbulence_stop(
        CLOSE, Terms("next_open", opens.fill, np.zeros_like(CLOSE), 0.0), stormy, 1000.0, 0.01, 0.02
    )
    assert later.holdings[1][0] > 0 and later.holdings[2].sum() == 0  # held at day 1's close, sold at day 2's open
    assert later.values[2] - no_dividend.values[2] == pytest.approx(later.holdings[1][0] * 1.0)
