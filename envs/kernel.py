"""The one step function of the trading environments: a batch of B portfolios trades at one day's close.

``trade_step`` is the only place the trading math lives; ``VectorStockTradingEnv`` calls it for B
episodes at once and ``StockTradingEnv`` is that env with B = 1. Money and shares are float64 on
whatever device the inputs live on (CPU or CUDA); no Python loop over envs or stocks.

Orders are sized at day t's close p, the last price the policy saw, and fill at the price ``--execution`` names
(`envs.execution`: that same close, the next open or the next close); rules 2-4 below use the fill price
(FinRL conventions, pro-rata buy cap instead of FinRL's largest-buy-first loop):

1. Orders from the actions (`orders_from_actions`). ``action_mode="shares"`` (the paper's):
   ``orders = trunc(clip(action, -1, 1) * hmax)``, whole shares toward zero. ``action_mode="weights"``: the
   action names a target portfolio, weights ``softmax([5 clip(a_1), ..., 5 clip(a_N), 0])`` over the N stocks
   and cash (a = 0 everywhere: equal weights, 1/(N+1) in cash; the scale 5 lets one stock take 94% or cash 97%
   of the value); each stock's target is ``floor(w_i V / (p_i (1 + buy_cost_pct)))`` shares with V the value at
   p; each day's order is ``target - held`` shares, and a stock is traded only when that order is worth more
   than ``rebalance_band x V`` (no daily churn around the target); hmax does not apply.
2. Sells first: ``sell = min(-orders, held)`` where orders < 0 (never more than held: no shorting).
   Cash receives ``sell * p * (1 - sell_cost_pct)``.
3. Buys: ``want = orders`` where orders > 0, costing ``want * p * (1 + buy_cost_pct)``. If one env's
   total exceeds its cash after the sells, every buy of that env is scaled by the same factor
   ``f = cash / total * (1 - 1e-12)`` and floored: ``buy = floor(want * f)``.
4. Turbulent day (turbulence >= threshold): sell every share held and buy nothing.

Why cash never goes negative: the spend is at most f * total = cash * (1 - 1e-12) < cash, as floor(want_i * f) <=
want_i * f. The 1e-12 margin absorbs the float64 rounding of the division and the sums (a few ulps, ~1e-16 relative
each), so the strict inequality holds in floating point too. When the total fits (total <= cash) nothing is scaled.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from envs.config import EnvConfig

_CAP_MARGIN = 1e-12  # relative safety margin of the pro-rata buy cap (see module docstring)


class StepStats(NamedTuple):
    """What one trade step did, per env."""

    costs: Tensor  # [B] float64 dollars, buy + sell transaction costs
    shares_traded: Tensor  # [B, N] float64 shares, + bought / - sold
    num_trades: Tensor  # [B] int64, stocks whose holding changed
    wanted_buy_value: Tensor  # [B] float64 dollars the orders asked to buy (cost included; 0 on a turbulent day)
    refused_buy_value: Tensor  # [B] float64 dollars of those buys the cash could not pay for


WEIGHT_LOGIT_SCALE = 5.0  # action_mode "weights": logits = this x clip(action, -1, 1)


def target_weights(actions: Tensor) -> Tensor:
    """``action_mode="weights"``: actions ``[B, N]`` -> the target portfolio ``[B, N + 1]`` float64, the stocks'
    weights then cash's: ``softmax([5 clip(a_1), ..., 5 clip(a_N), 0])``."""
    clipped = actions.to(torch.float64).clamp(-1.0, 1.0)
    logits = torch.cat([clipped * WEIGHT_LOGIT_SCALE, torch.zeros_like(clipped[:, :1])], dim=1)
    return torch.softmax(logits, dim=1)


def actions_for_weights(weights: Tensor) -> Tensor:
    """The inverse of `target_weights`: the actions ``[B, N]`` whose target portfolio is ``weights [B, N + 1]``
    (stocks, then cash; every weight > 0). A mean of targets that came from actions in [-1, 1] maps back into
    [-1, 1]: each ratio w_i / w_cash of the mean lies between the members' ratios."""
    w = weights.to(torch.float64)
    return (torch.log(w[:, :-1]) - torch.log(w[:, -1:])) / WEIGHT_LOGIT_SCALE


def orders_from_actions(
    actions: Tensor, cash: Tensor, shares: Tensor, prices: Tensor, cfg: EnvConfig, bands: Tensor | None = None
) -> Tensor:
    """Rule 1 of the module docstring: actions ``[B, N]`` (any float dtype) -> whole-share orders ``[B, N]`` float64
    (+ buy, - sell) for portfolios of cash [B] and shares [B, N] at prices [B, N] dollars. ``bands`` ``[B]`` float64:
    each portfolio's own no-trade band instead of ``cfg.rebalance_band`` (a family of traders in one pass)."""
    if cfg.action_mode == "shares":
        return torch.trunc(actions.to(torch.float64).clamp(-1.0, 1.0) * cfg.hmax)
    num_stocks = shares.shape[1]
    if actions.shape[1] != num_stocks:
        raise ValueError(f"{actions.shape[1]} action numbers for {num_stocks} stocks; expected {num_stocks}")
    weights = target_weights(actions)[:, :-1]
    value = portfolio_value(cash, shares, prices).unsqueeze(1)
    orders = torch.floor(weights * value / (prices * (1.0 + cfg.buy_cost_pct))) - shares
    band = cfg.rebalance_band if bands is None else bands.unsqueeze(1)
    return torch.where((orders * prices).abs() > band * value, orders, 0.0)


def trade_step(
    cash: Tensor,
    shares: Tensor,
    actions: Tensor,
    prices: Tensor,
    turbulent: Tensor,
    cfg: EnvConfig,
    fill: Tensor | None = None,
    bands: Tensor | None = None,
) -> tuple[Tensor, Tensor, StepStats]:
    """Execute one day's actions for B portfolios: orders sized at the close the policy saw
    (`orders_from_actions`), filled at ``fill`` (`execute_orders`; `envs.execution` says which price that is).

    :param cash: [B] float64 dollars, >= 0
    :param shares: [B, N] float64 whole shares, >= 0
    :param actions: [B, N] any float dtype, clipped to [-1, 1]: see `orders_from_actions`
    :param prices: [B, N] float64 dollars, > 0: the close the decision was made on (sizes the orders)
    :param turbulent: [B] bool: liquidate everything, no buys
    :param cfg: costs and hmax
    :param fill: [B, N] float64 dollars, > 0: the price the orders fill at (default ``prices``: the paper's fill at
        the decision's own close)
    :param bands: [B] float64: each portfolio's no-trade band (default ``cfg.rebalance_band`` for all)
    :return: (new_cash [B] float64, new_shares [B, N] float64, StepStats)
    """
    return execute_orders(
        cash,
        shares,
        orders_from_actions(actions, cash, shares, prices, cfg, bands),
        prices if fill is None else fill,
        turbulent,
        buy_cost_pct=cfg.buy_cost_pct,
        sell_cost_pct=cfg.sell_cost_pct,
    )


def execute_orders(
    cash: Tensor,
    shares: Tensor,
    orders: Tensor,
    prices: Tensor,
    turbulent: Tensor,
    *,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> tuple[Tensor, Tensor, StepStats]:
    """Rules 2-4 of the module docstring for whole-share ``orders [B, N]`` float64 (+ buy, - sell); the env (through
    `trade_step`), the study's baselines and paper trading all execute orders here. Same shapes and units as
    `trade_step`."""
    turb = turbulent.unsqueeze(1)
    sell = torch.where(turb, shares, torch.minimum((-orders).clamp_min(0.0), shares))
    want = torch.where(turb, 0.0, orders.clamp_min(0.0))

    sell_value = (sell * prices).sum(1)
    sell_costs = sell_value * sell_cost_pct
    cash_after_sells = cash + (sell_value - sell_costs)

    unit_cost = prices * (1.0 + buy_cost_pct)  # dollars per share bought, cost included
    total = (want * unit_cost).sum(1)
    # Pro-rata cap: one factor per env, < 1 only when the wanted buys do not fit the cash.
    over = total > cash_after_sells
    factor = torch.where(over, cash_after_sells / total.clamp_min(1e-300) * (1.0 - _CAP_MARGIN), 1.0)
    buy = torch.where(over.unsqueeze(1), torch.floor(want * factor.unsqueeze(1)), want)

    # Spend with the same expression as `total`, so an uncapped env pays exactly total <= cash.
    spend = (buy * unit_cost).sum(1)
    new_cash = cash_after_sells - spend
    costs = sell_costs + (spend - (buy * prices).sum(1))
    traded = buy - sell
    return new_cash, shares + traded, StepStats(costs, traded, (traded != 0).sum(1), total, total - spend)


def portfolio_value(cash: Tensor, shares: Tensor, prices: Tensor) -> Tensor:
    """cash + shares . prices: [B] float64 dollars from [B], [B, N], [B, N]."""
    return cash + (shares * prices).sum(1)
