"""The study's rule-based baselines, on exactly the traded days and with the env's own costs and order rules.

Every series follows the env's convention: ``values[0]`` is the starting capital on the first traded day
(before that day's trades, which execute at its close); ``values[t]`` is cash + shares x close of day t.
Orders go through `envs.kernel.execute_orders` (sells first, buys capped by cash, costs on both sides), the
same function the env trades with.

- ``buy-and-hold``: equal weight in whole shares at the first day's close, held to the end
  (`clstm_ppo.evaluation.metrics.buy_and_hold_values`).
- ``buy-and-hold + turbulence stop``: the same, but on a day whose turbulence reaches the threshold of the
  retraining window it falls in, everything is sold at the close (the env's stop); on the first calm day after
  it buys equal weight again with all its cash. A policy's edge over buy-and-hold that this baseline also has
  comes from the stop, not from learning.
- ``1/N monthly``: equal weight at the first day's close and rebalanced to equal weight (whole shares) at the
  close of the first trading day of every month.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from clstm_ppo.evaluation.metrics import buy_and_hold_shares, buy_and_hold_values
from envs.kernel import execute_orders, portfolio_value

BUY_AND_HOLD, TURBULENCE_STOP, MONTHLY = "buy-and-hold", "buy-and-hold + turbulence stop", "1/N monthly"


@dataclass(frozen=True)
class BaselineRun:
    """A rule's day-by-day record on the traded days."""

    values: np.ndarray  # [D] dollars
    holdings_value: np.ndarray  # [D] dollars in stock
    num_trades: int  # orders (non-zero share changes per ticker and day)
    traded_value: float  # dollars bought + sold
    costs: float  # dollars of transaction costs


def _equal_weight_orders(
    cash: torch.Tensor, shares: torch.Tensor, prices: torch.Tensor, buy_cost_pct: float
) -> torch.Tensor:
    """Whole-share orders ``[1, N]`` that move a portfolio to equal weights of its value at ``prices [1, N]``."""
    value = portfolio_value(cash, shares, prices)
    target = torch.floor(value.unsqueeze(1) / prices.shape[1] / (prices * (1.0 + buy_cost_pct)))
    return target - shares


def _simulate(
    close: np.ndarray,
    trade_today: np.ndarray,
    liquidate_today: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> BaselineRun:
    """Run a rule day by day: at each day t < D - 1, liquidate (``liquidate_today[t]``) or move to equal weight
    (``trade_today[t]``) at the close, then value at t + 1. ``close [D, N]`` dollars."""
    c = torch.as_tensor(close, dtype=torch.float64)
    cash = torch.tensor([float(initial_amount)], dtype=torch.float64)
    shares = torch.zeros((1, c.shape[1]), dtype=torch.float64)
    values, held = np.empty(c.shape[0]), np.zeros(c.shape[0])
    values[0] = initial_amount
    trades, traded, costs = 0, 0.0, 0.0
    for t in range(c.shape[0] - 1):
        prices = c[t : t + 1]
        if liquidate_today[t] or trade_today[t]:
            orders = (
                torch.zeros_like(shares)
                if liquidate_today[t]
                else _equal_weight_orders(cash, shares, prices, buy_cost_pct)
            )
            cash, shares, stats = execute_orders(
                cash,
                shares,
                orders,
                prices,
                torch.tensor([bool(liquidate_today[t])]),
                buy_cost_pct=buy_cost_pct,
                sell_cost_pct=sell_cost_pct,
            )
            trades += int(stats.num_trades.sum())
            traded += float((stats.shares_traded.abs() * prices).sum())
            costs += float(stats.costs.sum())
        held[t + 1] = float((shares * c[t + 1 : t + 2]).sum())
        values[t + 1] = float(cash) + held[t + 1]
    return BaselineRun(values, held, trades, traded, costs)


def buy_and_hold(close: np.ndarray, initial_amount: float, buy_cost_pct: float) -> BaselineRun:
    """Equal-weight buy-and-hold (`clstm_ppo.evaluation.metrics.buy_and_hold_values`) with its holdings and trades."""
    shares, _ = buy_and_hold_shares(close, initial_amount, buy_cost_pct)
    held = np.asarray(close, dtype=np.float64) @ shares
    held[0] = 0.0  # day 0 is valued before its trade, as the env does
    bought = float(shares @ np.asarray(close, dtype=np.float64)[0])
    return BaselineRun(
        buy_and_hold_values(close, initial_amount, buy_cost_pct),
        held,
        int((shares > 0).sum()),
        bought,
        bought * buy_cost_pct,
    )


def turbulence_stop(
    close: np.ndarray, turbulent: np.ndarray, initial_amount: float, buy_cost_pct: float, sell_cost_pct: float
) -> BaselineRun:
    """Equal-weight buy-and-hold with the env's turbulence stop (module docstring).

    :param close: ``[D, N]`` closes of the traded days, dollars.
    :param turbulent: ``[D]`` bool, the day's turbulence reaches its retraining window's threshold.
    """
    turbulent = np.asarray(turbulent, dtype=bool)
    invested = False
    buy_today = np.zeros(len(turbulent), dtype=bool)
    for t, stormy in enumerate(turbulent):  # buy on the first calm day, and again on each calm day after a stop
        buy_today[t] = not stormy and not invested
        invested = (invested or buy_today[t]) and not stormy
    return _simulate(close, buy_today, turbulent, initial_amount, buy_cost_pct, sell_cost_pct)


def monthly_rebalance(
    close: np.ndarray, dates: np.ndarray, initial_amount: float, buy_cost_pct: float, sell_cost_pct: float
) -> BaselineRun:
    """1/N rebalanced at the close of the first day and of the first trading day of every month.

    :param dates: ``[D]`` the traded days; :param close: ``[D, N]`` dollars.
    """
    months = pd.DatetimeIndex(pd.to_datetime(np.asarray(dates))).to_period("M").to_numpy()
    first_of_month = np.r_[True, months[1:] != months[:-1]]
    return _simulate(
        close, first_of_month, np.zeros(len(first_of_month), dtype=bool), initial_amount, buy_cost_pct, sell_cost_pct
    )


def rule_baselines(
    close: np.ndarray,
    dates: np.ndarray,
    turbulent: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> dict[str, BaselineRun]:
    """The three rule baselines on the traded days, by name."""
    return {
        BUY_AND_HOLD: buy_and_hold(close, initial_amount, buy_cost_pct),
        TURBULENCE_STOP: turbulence_stop(close, turbulent, initial_amount, buy_cost_pct, sell_cost_pct),
        MONTHLY: monthly_rebalance(close, dates, initial_amount, buy_cost_pct, sell_cost_pct),
    }
