"""The batched trade step (envs/kernel.py): hand-worked orders and property tests over random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from envs.config import EnvConfig
from envs.errors import UserError
from envs.kernel import portfolio_value, trade_step

f64 = torch.float64
SHARES = dict(action_mode="shares", reward="value")  # the paper's actions and reward, which these cases work by hand
CFG = EnvConfig(hmax=100, buy_cost_pct=0.01, sell_cost_pct=0.02, **SHARES)


def _t(x, dtype=f64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def test_hand_worked_sell_then_buy_with_costs() -> None:
    # One env, 2 stocks at $10 and $20, holding 30 and 0 shares, $100 cash.
    # action (-0.5, 0.259) -> orders (-50, 25): sell min(50, 30) = 30 for $300, cost 2% = $6;
    # buy 25 x $20 = $500 + 1% = $505 > $394 of cash -> factor 394 / 505 -> floor(25 x 0.780...) = 19 shares,
    # 19 x 20.2 = $383.80; cash left 394 - 383.80 = $10.20; costs 6 + 3.80 = $9.80.
    cash, shares, stats = trade_step(
        _t([100.0]),
        _t([[30.0, 0.0]]),
        _t([[-0.5, 0.259]], torch.float32),
        _t([[10.0, 20.0]]),
        _t([False], torch.bool),
        CFG,
    )
    assert shares.tolist() == [[0.0, 19.0]]
    assert cash.item() == pytest.approx(10.2, abs=1e-9)
    assert stats.costs.item() == pytest.approx(9.8, abs=1e-9)
    assert stats.shares_traded.tolist() == [[-30.0, 19.0]]
    assert stats.num_trades.tolist() == [2]


def test_actions_are_clipped_and_truncated_toward_zero() -> None:
    cash, shares, stats = trade_step(
        _t([1e9]),
        _t([[500.0, 500.0, 500.0, 500.0]]),
        _t([[3.0, -7.0, 0.0199, -0.0199]]),
        _t([[1.0, 1.0, 1.0, 1.0]]),
        _t([False], torch.bool),
        EnvConfig(buy_cost_pct=0.0, sell_cost_pct=0.0, **SHARES),
    )
    # 3 -> 1 -> +100; -7 -> -1 -> -100; 0.0199 x 100 = 1.99 -> 1; -1.99 -> -1
    assert stats.shares_traded.tolist() == [[100.0, -100.0, 1.0, -1.0]]
    assert cash.item() == 1e9


def test_pro_rata_cap_is_one_factor_for_all_buys() -> None:
    # Wanted: 100 x $10 and 100 x $30 = $4,000 (no costs); cash $1,000 -> factor 1/4 -> 25 and 25 shares.
    cash, shares, _ = trade_step(
        _t([1000.0]),
        _t([[0.0, 0.0]]),
        _t([[1.0, 1.0]]),
        _t([[10.0, 30.0]]),
        _t([False], torch.bool),
        EnvConfig(buy_cost_pct=0.0, sell_cost_pct=0.0, **SHARES),
    )
    # 1 - 1e-12 of the exact factor: 24.999... -> 24 (the margin that keeps cash >= 0 in floating point)
    assert shares.tolist() == [[24.0, 24.0]]
    assert cash.item() == pytest.approx(1000 - 24 * 40)


def test_exactly_affordable_buys_are_not_scaled() -> None:
    cfg = EnvConfig(buy_cost_pct=0.001, sell_cost_pct=0.0, **SHARES)
    prices = _t([[13.37, 101.01, 7.77]])
    want = _t([[100.0, 50.0, 3.0]])
    exact = (want * (prices * (1 + cfg.buy_cost_pct))).sum(1)  # the kernel's own expression
    cash, shares, _ = trade_step(exact, torch.zeros(1, 3, dtype=f64), want / 100, prices, _t([False], torch.bool), cfg)
    assert shares.tolist() == want.tolist()
    assert cash.item() == 0.0


def test_turbulent_day_sells_everything_and_buys_nothing() -> None:
    cash, shares, stats = trade_step(
        _t([50.0, 50.0]),
        _t([[250.0, 3.0], [250.0, 3.0]]),
        _t([[1.0, 1.0], [1.0, 1.0]]),
        _t([[2.0, 4.0], [2.0, 4.0]]),
        _t([True, False], torch.bool),
        CFG,
    )
    assert shares[0].tolist() == [0.0, 0.0]  # all 250 sold although hmax is 100
    assert cash[0].item() == pytest.approx(50 + (500 + 12) * 0.98)
    assert stats.shares_traded[0].tolist() == [-250.0, -3.0]
    assert shares[1].tolist()[0] > 250  # the calm env still bought


def test_a_turbulent_days_liquidation_fills_at_the_fill_price() -> None:
    """Under --execution next_open the stop decided on day t's close sells at day t+1's open, like any order; the
    orders of a calm env are sized at the close (hmax shares) and paid at the fill."""
    cash, shares, stats = trade_step(
        _t([50.0, 1000.0]),
        _t([[250.0, 3.0], [0.0, 0.0]]),
        _t([[1.0, 1.0], [0.05, 0.05]]),
        _t([[2.0, 4.0], [2.0, 4.0]]),  # day t's close: what the orders are sized at
        _t([True, False], torch.bool),
        CFG,
        fill=_t([[1.5, 5.0], [3.0, 5.0]]),  # day t+1's open
    )
    assert shares[0].tolist() == [0.0, 0.0]
    assert cash[0].item() == pytest.approx(50 + (250 * 1.5 + 3 * 5.0) * 0.98)
    assert stats.shares_traded[1].tolist() == [5.0, 5.0]  # trunc(0.05 x 100) shares each
    assert cash[1].item() == pytest.approx(1000 - (5 * 3.0 + 5 * 5.0) * 1.01)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(UserError, match="hmax"):
        EnvConfig(hmax=0)
    with pytest.raises(UserError, match="cost"):
        EnvConfig(buy_cost_pct=1.5)


@st.composite
def _batches(draw):
    b = draw(st.integers(1, 6))
    n = draw(st.integers(1, 8))
    price = arrays(np.float64, (b, n), elements=st.floats(0.01, 5000.0))
    held = arrays(np.float64, (b, n), elements=st.integers(0, 400).map(float))
    act = arrays(np.float32, (b, n), elements=st.floats(-2.0, 2.0, width=32))
    cash = arrays(np.float64, (b,), elements=st.one_of(st.just(0.0), st.floats(0.0, 2e6)))
    turb = arrays(np.bool_, (b,), elements=st.booleans())
    costs = st.tuples(st.sampled_from([0.0, 1e-3, 0.01]), st.sampled_from([0.0, 1e-3, 0.025]))
    hmax = st.sampled_from([1, 7, 100])
    return draw(price), draw(held), draw(act), draw(cash), draw(turb), draw(costs), draw(hmax)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches())
def test_trade_step_invariants(batch) -> None:
    price, held, act, cash, turb, (buy_pct, sell_pct), hmax = batch
    cfg = EnvConfig(hmax=hmax, buy_cost_pct=buy_pct, sell_cost_pct=sell_pct, **SHARES)
    p, h, c = torch.from_numpy(price), torch.from_numpy(held), torch.from_numpy(cash)
    new_cash, new_shares, stats = trade_step(c, h, torch.from_numpy(act), p, torch.from_numpy(turb), cfg)
    traded = stats.shares_traded

    assert (new_cash >= 0).all(), "cash went negative"
    assert (new_shares >= 0).all(), "shorted"
    assert torch.equal(new_shares, torch.round(new_shares)), "fractional shares"
    assert torch.equal(new_shares, h + traded)
    orders = np.trunc(np.clip(act.astype(np.float64), -1, 1) * hmax)
    sold, bought = (-traded).clamp_min(0).numpy(), traded.clamp_min(0).numpy()
    # Turbulent envs liquidate and never buy; calm envs trade in the order's direction, within it.
    assert np.all(sold[turb] == held[turb]) and np.all(bought[turb] == 0)
    calm = ~turb
    assert np.all(sold[calm] == np.minimum(np.maximum(-orders, 0), held)[calm])
    assert np.all(bought[calm] <= np.maximum(orders, 0)[calm])
    # Costs are exactly the per-side percentages of the traded value, and cash is conserved.
    sell_value, buy_value = (sold * price).sum(1), (bought * price).sum(1)
    np.testing.assert_allclose(stats.costs.numpy(), sell_value * sell_pct + buy_value * buy_pct, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        new_cash.numpy(), cash + sell_value - buy_value - stats.costs.numpy(), rtol=1e-9, atol=1e-6
    )
    assert np.array_equal(stats.num_trades.numpy(), (traded.numpy() != 0).sum(1))
    # The cap is tight: either every wanted buy happened, or less than one more share of each wanted
    # stock would have fitted in the cash that is left.
    want = np.where(calm[:, None], np.maximum(orders, 0), 0)
    capped = ~np.all(bought == want, axis=1)
    slack = (np.where(want > 0, price, 0) * (1 + buy_pct)).sum(1)
    assert np.all(new_cash.numpy()[capped] <= slack[capped] + 1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(1.0, 1e7),
    arrays(np.float64, (5,), elements=st.floats(0.01, 1e4)),
    arrays(np.float32, (5,), elements=st.floats(0.0, 1.0, width=32)),
)
def test_cash_never_negative_at_the_edge_of_affordability(scale, price, act) -> None:
    # Cash set to exactly the cost of the wanted buys, times a factor just below or at 1.
    cfg = EnvConfig(hmax=100, buy_cost_pct=1e-3, sell_cost_pct=1e-3, **SHARES)
    p = torch.from_numpy(price)[None]
    want = torch.trunc(torch.from_numpy(act).double() * 100)[None]
    exact = (want * (p * (1 + 1e-3))).sum(1)  # the kernel's own expression: no rounding gap
    for f in (1.0, 1 - 1e-15, 1 - 1e-9, 0.5):
        new_cash, new_shares, _ = trade_step(
            exact * f, torch.zeros_like(p), torch.from_numpy(act)[None], p, torch.tensor([False]), cfg
        )
        assert new_cash.item() >= 0
        if f == 1.0:
            assert torch.equal(new_shares, want)


def test_portfolio_value() -> None:
    assert portfolio_value(_t([5.0]), _t([[2.0, 3.0]]), _t([[10.0, 1.0]])).item() == 28.0


def test_weights_mode_targets_the_softmax_portfolio_with_a_no_trade_band():
    """a = 0 on every stock: equal weights over the stocks and cash (1/(N+1) each); hmax does not limit it."""
    from envs.kernel import orders_from_actions

    cfg = EnvConfig(action_mode="weights", hmax=1, buy_cost_pct=0.0, sell_cost_pct=0.0, rebalance_band=0.0)
    prices = _t([[10.0, 20.0, 50.0]])
    cash, shares = _t([1000.0]), _t([[0.0, 0.0, 0.0]])
    orders = orders_from_actions(torch.zeros(1, 3), cash, shares, prices, cfg)
    assert orders.tolist() == [[25.0, 12.0, 5.0]]  # 250 dollars each: floor(250 / p)
    new_cash, new_shares, _ = trade_step(cash, shares, torch.zeros(1, 3), prices, _t([False], torch.bool), cfg)
    assert new_shares.tolist() == [[25.0, 12.0, 5.0]] and float(new_cash) == pytest.approx(1000 - 250 - 240 - 250)
    # all in on the first stock: logits (5, -5, -5, 0) -> almost everything there, the others sold
    orders = orders_from_actions(torch.tensor([[1.0, -1.0, -1.0]]), new_cash, new_shares, prices, cfg)
    w = torch.softmax(torch.tensor([5.0, -5.0, -5.0, 0.0], dtype=torch.float64), 0)
    assert orders[0, 0] == torch.floor(w[0] * 1000 / 10) - 25 and orders[0, 1] < 0 and orders[0, 2] < 0
    # inside the band nothing trades: moving 1 share of 10 dollars is under 2% of 1,000
    banded = EnvConfig(action_mode="weights", rebalance_band=0.02, buy_cost_pct=0.0, sell_cost_pct=0.0)
    nudged = new_shares + _t([[1.0, 0.0, 0.0]])
    assert orders_from_actions(torch.zeros(1, 3), new_cash - 10.0, nudged, prices, banded).tolist() == [[0.0, 0.0, 0.0]]
    assert orders_from_actions(torch.zeros(1, 3), new_cash - 10.0, nudged, prices, cfg).tolist() == [[-1.0, 0.0, 0.0]]
