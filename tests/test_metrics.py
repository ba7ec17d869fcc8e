"""Trading metrics: hand-worked series, empyrical as an independent oracle, brute-force MER."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clstm_ppo.evaluation import metrics as m

# values 100 -> 110 -> 99 -> 121 -> 121: returns +10 %, -10 %, +2/9, 0
HAND = np.array([100.0, 110.0, 99.0, 121.0, 121.0])


def test_hand_series_returns_drawdown_mer():
    np.testing.assert_allclose(m.daily_returns(HAND), [0.1, -0.1, 22 / 99, 0.0])
    assert m.cumulative_return(HAND) == pytest.approx(0.21)
    # 4 daily returns = 4/252 of a year: 1.21 ** 63 - 1
    assert m.annual_return(HAND) == pytest.approx(1.21**63 - 1)
    # peak 110 -> 99 is the only fall: 11/110
    assert m.max_drawdown(HAND) == pytest.approx(0.1)
    np.testing.assert_allclose(m.drawdown_series(HAND), [0, 0, 0.1, 0, 0], atol=1e-15)
    # the trough 99 -> 121 beats the start 100 -> 121
    assert m.max_earning_rate(HAND) == pytest.approx(22 / 99)
    assert m.daily_win_rate(HAND) == pytest.approx(0.5)
    assert m.calmar_ratio(HAND) == pytest.approx((1.21**63 - 1) / 0.1)


def test_hand_series_sharpe_sortino_volatility():
    mean = (0.1 - 0.1 + 2 / 9 + 0.0) / 4  # 1/18
    dev = np.array([0.1, -0.1, 2 / 9, 0.0]) - mean
    sd = math.sqrt(float(np.sum(dev**2)) / 3)  # ddof = 1
    assert sd == pytest.approx(0.137885, abs=1e-6)
    assert m.annual_volatility(HAND) == pytest.approx(sd * math.sqrt(252))
    assert m.sharpe_ratio(HAND) == pytest.approx(mean / sd * math.sqrt(252))
    assert m.sharpe_ratio(HAND) == pytest.approx(6.3960, abs=1e-3)
    # one day below zero (-0.1): downside deviation sqrt(0.01 / 4) = 0.05 over all four days
    assert m.sortino_ratio(HAND) == pytest.approx(mean * math.sqrt(252) / 0.05)


def test_risk_free_converted_to_daily():
    rf_d = m.daily_risk_free(0.05)
    assert (1 + rf_d) ** 252 == pytest.approx(1.05)
    e = np.array([0.1, -0.1, 22 / 99, 0.0]) - rf_d
    assert m.sharpe_ratio(HAND, risk_free=0.05) == pytest.approx(e.mean() / e.std(ddof=1) * math.sqrt(252))


@pytest.mark.parametrize("series", [[7.0], [5.0, 5.0], [1e6] * 30])
def test_constant_and_one_day_series_are_all_zero_not_nan(series):
    s = m.summarize(series)
    for key in (
        "cumulative_return",
        "annual_return",
        "annual_volatility",
        "sharpe",
        "sortino",
        "max_drawdown",
        "max_earning_rate",
        "calmar",
        "daily_win_rate",
        "profit",
    ):
        assert s[key] == 0.0, key
    assert s["num_days"] == len(series)
    # nothing said about trades: unknown, not zero
    for key in ("num_trades", "appt", "turnover", "annual_turnover", "win_rate", "total_costs"):
        assert math.isnan(s[key]), key


def test_constant_growth_has_zero_ratio_not_a_float_noise_blowup():
    v = 100.0 * 1.001 ** np.arange(300)
    assert m.annual_volatility(v) < 1e-12
    assert m.sharpe_ratio(v) == 0.0
    assert m.sortino_ratio(v) == 0.0  # no day below target
    assert m.max_drawdown(v) == 0.0 and m.calmar_ratio(v) == 0.0
    assert m.annual_return(v) == pytest.approx(1.001**252 - 1)
    # with a risk-free rate the excess is constant too: still no dispersion -> 0
    assert m.sharpe_ratio(np.full(10, 3.0), risk_free=0.02) == 0.0


def test_two_days():
    s = m.summarize([100.0, 90.0])
    assert s["cumulative_return"] == pytest.approx(-0.1)
    assert s["annual_volatility"] == 0.0 and s["sharpe"] == 0.0
    assert s["sortino"] == pytest.approx(-0.1 * math.sqrt(252) / 0.1)
    assert s["max_drawdown"] == pytest.approx(0.1) and s["max_earning_rate"] == 0.0


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [1.0, np.nan], [1.0, 0.0], [1.0, -3.0], [np.inf]])
def test_invalid_values_raise(bad):
    with pytest.raises(ValueError):
        m.summarize(np.asarray(bad, dtype=float))


# ------------------------------------------------------------------------------------- empyrical oracle


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("risk_free", [0.0, 0.03])
def test_against_empyrical(seed, risk_free):
    ep = pytest.importorskip("empyrical")
    rng = np.random.default_rng(seed)
    days = int(rng.integers(5, 800))
    r = rng.normal(rng.uniform(-0.001, 0.002), rng.uniform(0.002, 0.03), days)
    v = 1e6 * np.cumprod(np.r_[1.0, 1.0 + r])
    rf_d = m.daily_risk_free(risk_free)
    s = m.summarize(v, risk_free=risk_free)
    tol = dict(rel=1e-9, abs=1e-12)
    assert s["cumulative_return"] == pytest.approx(ep.cum_returns_final(r), **tol)
    assert s["annual_return"] == pytest.approx(ep.annual_return(r), **tol)
    assert s["annual_volatility"] == pytest.approx(ep.annual_volatility(r), **tol)
    assert s["sharpe"] == pytest.approx(ep.sharpe_ratio(r, risk_free=rf_d), **tol)
    assert s["sortino"] == pytest.approx(ep.sortino_ratio(r, required_return=rf_d), **tol)
    assert s["max_drawdown"] == pytest.approx(-ep.max_drawdown(r), **tol)
    assert s["calmar"] == pytest.approx(ep.calmar_ratio(r), **tol)


def _mer_brute(v: np.ndarray) -> float:
    return max(v[j] / v[i] - 1.0 for i in range(len(v)) for j in range(i, len(v)))


def _mdd_brute(v: np.ndarray) -> float:
    return max(1.0 - v[j] / v[i] for i in range(len(v)) for j in range(i, len(v)))


@pytest.mark.parametrize("seed", range(25))
def test_mer_and_drawdown_against_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    v = np.exp(np.cumsum(rng.normal(0, 0.05, int(rng.integers(1, 80)))))
    assert m.max_earning_rate(v) == pytest.approx(_mer_brute(v), rel=1e-12, abs=1e-15)
    assert m.max_drawdown(v) == pytest.approx(_mdd_brute(v), rel=1e-12, abs=1e-15)
    assert m.max_earning_rate(v) >= max(m.cumulative_return(v), 0.0) - 1e-15


# ---------------------------------------------------------------------------------------------- trades

HAND_TRADES = {
    "date": np.array([0, 0, 1, 2, 3, 3]),
    "ticker": np.array(["A", "B", "A", "A", "B", "A"]),
    "side": np.array(["buy", "buy", "buy", "sell", "sell", "sell"]),
    "shares": np.array([10.0, 5.0, 10.0, 15.0, 5.0, 5.0]),
    "price": np.array([10.0, 20.0, 12.0, 11.0, 19.0, 12.0]),
    "cost": np.array([1.0, 1.0, 1.0, 2.0, 1.0, 0.0]),
}


def test_fifo_closed_trades_and_win_rate():
    # A lots: 10 @ (100+1)/10 = 10.1, then 10 @ 12.1. Sell 15 @ 11, cost 2: 165 - 2 - (101 + 60.5) = +1.5
    # B: 5 @ 20.2; sell 5 @ 19, cost 1: 95 - 1 - 101 = -7.  A: sell last 5 @ 12, cost 0: 60 - 60.5 = -0.5
    np.testing.assert_allclose(m.closed_trade_pnl(HAND_TRADES), [1.5, -7.0, -0.5])
    assert m.win_rate(HAND_TRADES) == pytest.approx(1 / 3)
    assert m.num_trades(HAND_TRADES) == 6
    assert m.total_costs(HAND_TRADES) == pytest.approx(6.0)


def test_same_day_sells_execute_before_buys_and_unknown_basis_is_left_out():
    # listed buy-first, but the env sells first: the sell finds no lot, so nothing is closed
    t = {
        "date": np.array(["2020-01-02", "2020-01-02"], dtype="datetime64[ns]"),
        "ticker": ["D", "D"],
        "side": ["buy", "sell"],
        "shares": [5.0, 5.0],
        "price": [30.0, 31.0],
        "cost": [0.0, 0.0],
    }
    assert m.closed_trade_pnl(t).size == 0
    assert math.isnan(m.win_rate(t))
    # without dates the given order is used: the sell closes the buy
    no_dates = {k: v for k, v in t.items() if k != "date"}
    np.testing.assert_allclose(m.closed_trade_pnl(no_dates), [5.0])
    # partial basis: 4 known of 10 sold, cost charged pro rata (4/10 of 2.0)
    partial = {
        "ticker": ["E", "E"],
        "side": ["buy", "sell"],
        "shares": [4, 10],
        "price": [10, 12],
        "cost": [0, 2],
    }
    np.testing.assert_allclose(m.closed_trade_pnl(partial), [4 * 12 - 0.8 - 40])


def test_bad_trades_table():
    with pytest.raises(ValueError, match="side"):
        m.win_rate({"ticker": ["A"], "side": ["hold"], "shares": [1], "price": [1], "cost": [0]})
    with pytest.raises(ValueError, match="price"):
        m.summarize(HAND, trades={"ticker": ["A"], "side": ["buy"], "shares": [1], "cost": [0]})


def test_summarize_with_trades_table_count_and_overrides():
    v = np.array([1000.0, 1010.0, 990.0, 1030.0])
    s = m.summarize(v, trades=HAND_TRADES)
    assert s["num_trades"] == 6 and s["appt"] == pytest.approx(30 / 6)
    assert s["total_costs"] == pytest.approx(6.0)
    assert s["turnover"] == pytest.approx((100 + 100 + 120 + 165 + 95 + 60) / np.mean(v))  # sum(shares * price)
    assert s["annual_turnover"] == pytest.approx(640 / np.mean(v) * 252 / 3)
    assert s["win_rate"] == pytest.approx(1 / 3)
    s2 = m.summarize(v, trades=4, costs=2.5, traded_value=500.0)
    assert s2["num_trades"] == 4 and s2["appt"] == pytest.approx(7.5)
    assert s2["total_costs"] == 2.5 and s2["turnover"] == pytest.approx(500 / np.mean(v))
    assert math.isnan(s2["win_rate"])
    assert m.summarize(v, trades=0)["appt"] == 0.0
    assert tuple(s) == m.METRIC_NAMES


def test_trades_from_holdings():
    holdings = np.array([[0.0, 5.0], [3.0, 5.0], [1.0, 0.0]])
    prices = np.array([[10.0, 20.0], [11.0, 21.0], [12.0, 22.0]])
    t = m.trades_from_holdings(["d0", "d1", "d2"], ["A", "B"], holdings, prices, buy_cost_pct=0.01, sell_cost_pct=0.02)
    # day 2: both sells (A 2 shares, B 5), A listed first by ticker order
    assert list(t["date"]) == ["d0", "d1", "d2", "d2"]
    assert list(t["ticker"]) == ["B", "A", "A", "B"]
    assert list(t["side"]) == ["buy", "buy", "sell", "sell"]
    np.testing.assert_allclose(t["shares"], [5, 3, 2, 5])
    np.testing.assert_allclose(t["price"], [20, 11, 12, 22])
    np.testing.assert_allclose(t["cost"], [1.0, 0.33, 0.48, 2.2])
    # a sell before a buy on the same day comes first
    t2 = m.trades_from_holdings([0, 1], ["A", "B"], [[4, 0], [0, 4]], np.ones((2, 2)), buy_cost_pct=0, sell_cost_pct=0)
    assert list(t2["side"]) == ["buy", "sell", "buy"] and list(t2["ticker"]) == ["A", "A", "B"]
