"""Rule-based baselines on exactly the traded days, with the env's own costs, order rules and fills (docs/study.md).

Every series follows the env's convention: ``values[0]`` is the starting capital on the first traded day, before
any trade; ``values[t]`` is cash + shares x close of day t. A rule decides on day t's close, sizes its orders at that
close and trades on the same `envs.execution.Terms` as the policy (fills, interest, dividends) through
`envs.kernel.execute_orders`, the function the env trades with (sells first, buys capped by cash, costs both sides).

- ``buy-and-hold``: equal weight in whole shares decided on the first day, held to the end (the backtest's baseline).
- ``buy-and-hold + turbulence stop``: the same, but everything is sold on a day whose turbulence reaches the
  threshold of its retraining window, and equal weight bought again with all the cash on the first calm day after.
  A policy's edge over buy-and-hold that this baseline also has comes from the stop, not from learning.
- ``1/N monthly``: equal weight (whole shares) on the first day and the first trading day of every month.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from envs.execution import Terms
from envs.kernel import execute_orders, portfolio_value

BUY_AND_HOLD, TURBULENCE_STOP, MONTHLY = "buy-and-hold", "buy-and-hold + turbulence stop", "1/N monthly"


@dataclass(frozen=True)
class BaselineRun:
    """A rule's day-by-day record on the traded days (D days, N tickers)."""

    values: np.ndarray  # [D] dollars
    holdings: np.ndarray  # [D, N] shares held at each day's close (row t: after the trades decided on day t - 1)
    holdings_value: np.ndarray  # [D] dollars in stock
    num_trades: int  # orders (non-zero share changes per ticker and day)
    traded_value: float  # dollars bought + sold, at the fill prices
    costs: float  # dollars of transaction costs


def _equal_weight_orders(
    cash: torch.Tensor, shares: torch.Tensor, prices: torch.Tensor, buy_cost_pct: float
) -> torch.Tensor:
    """Whole-share orders ``[1, N]`` that move a portfolio to equal weights of its value at ``prices [1, N]``."""
    value = portfolio_value(cash, shares, prices)
    target = torch.floor(value.unsqueeze(1) / prices.shape[1] / (prices * (1.0 + buy_cost_pct)))
    return target - shares


def simulate(
    close: np.ndarray,
    terms: Terms | None,
    trade_today: np.ndarray,
    liquidate_today: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> BaselineRun:
    """Run a rule day by day: at each day t < D - 1, liquidate (``liquidate_today[t]``) or move to equal weight
    (``trade_today[t]``), orders sized at ``close[t]`` and filled at ``terms.fill[t]``; carry to t + 1 (interest
    and dividends, `envs.execution`) and value there.

    :param close: ``[D, N]`` dollars; :param terms: the same D days' terms (None: fills at the close itself, no
        dividends, no interest: the paper's).
    """
    c = torch.tensor(close, dtype=torch.float64)  # copies: a market's arrays are read-only
    f = c if terms is None else torch.tensor(terms.fill, dtype=torch.float64)
    dividends = None if terms is None or not terms.dividends.any() else torch.tensor(terms.dividends)
    growth = 1.0 + (terms.cash_rate if terms is not None else 0.0)
    cash = torch.tensor([float(initial_amount)], dtype=torch.float64)
    shares = torch.zeros((1, c.shape[1]), dtype=torch.float64)
    values, holdings = np.empty(c.shape[0]), np.zeros(c.shape)
    values[0] = initial_amount
    trades, traded, costs = 0, 0.0, 0.0
    for t in range(c.shape[0] - 1):
        held = shares
        if liquidate_today[t] or trade_today[t]:
            orders = (
                torch.zeros_like(shares)
                if liquidate_today[t]
                else _equal_weight_orders(cash, shares, c[t : t + 1], buy_cost_pct)
            )
            cash, shares, stats = execute_orders(
                cash,
                shares,
                orders,
                f[t : t + 1],
                torch.tensor([bool(liquidate_today[t])]),
                buy_cost_pct=buy_cost_pct,
                sell_cost_pct=sell_cost_pct,
            )
            trades += int(stats.num_trades.sum())
            traded += float((stats.shares_traded.abs() * f[t : t + 1]).sum())
            costs += float(stats.costs.sum())
        cash = cash * growth
        if dividends is not None:
            cash = cash + (shares if terms.paid_after_fill else held) @ dividends[t + 1]
        holdings[t + 1] = shares[0].numpy()
        values[t + 1] = float(cash) + float((shares * c[t + 1 : t + 2]).sum())
    held = (holdings * np.asarray(close, dtype=np.float64)).sum(axis=1)
    return BaselineRun(values, holdings, held, trades, traded, costs)


def buy_and_hold(close: np.ndarray, terms: Terms | None, initial_amount: float, buy_cost_pct: float) -> BaselineRun:
    """Equal weight in whole shares decided on day 0 (``initial_amount / N`` dollars a ticker at day 0's close,
    costs included), filled on ``terms`` (`simulate`), held to the end; nothing is sold at the end (values are marked to
    market, like the policy's)."""
    first = np.arange(len(close)) == 0
    return simulate(close, terms, first, np.zeros(len(close), dtype=bool), initial_amount, buy_cost_pct, 0.0)


def turbulence_stop(
    close: np.ndarray,
    terms: Terms | None,
    turbulent: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> BaselineRun:
    """Equal-weight buy-and-hold with the env's turbulence stop (module docstring).

    :param close: ``[D, N]`` closes of the traded days, dollars; :param terms: as for `simulate`.
    :param turbulent: ``[D]`` bool, the day's turbulence reaches its retraining window's threshold.
    """
    turbulent = np.asarray(turbulent, dtype=bool)
    invested = False
    buy_today = np.zeros(len(turbulent), dtype=bool)
    for t, stormy in enumerate(turbulent):  # buy on the first calm day, and again on each calm day after a stop
        buy_today[t] = not stormy and not invested
        invested = (invested or buy_today[t]) and not stormy
    return simulate(close, terms, buy_today, turbulent, initial_amount, buy_cost_pct, sell_cost_pct)


def monthly_rebalance(
    close: np.ndarray,
    terms: Terms | None,
    dates: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> BaselineRun:
    """1/N decided on the first day and on the first trading day of every month.

    :param dates: ``[D]`` the traded days; :param close: ``[D, N]`` dollars; :param terms: as for `simulate`.
    """
    months = pd.DatetimeIndex(pd.to_datetime(np.asarray(dates))).to_period("M").to_numpy()
    first_of_month = np.r_[True, months[1:] != months[:-1]]
    never = np.zeros(len(first_of_month), dtype=bool)
    return simulate(close, terms, first_of_month, never, initial_amount, buy_cost_pct, sell_cost_pct)


def rule_baselines(
    close: np.ndarray,
    terms: Terms | None,
    dates: np.ndarray,
    turbulent: np.ndarray,
    initial_amount: float,
    buy_cost_pct: float,
    sell_cost_pct: float,
) -> dict[str, BaselineRun]:
    """The three rule baselines on the traded days, by name."""
    return {
        BUY_AND_HOLD: buy_and_hold(close, terms, initial_amount, buy_cost_pct),
        TURBULENCE_STOP: turbulence_stop(close, terms, turbulent, initial_amount, buy_cost_pct, sell_cost_pct),
        MONTHLY: monthly_rebalance(close, terms, dates, initial_amount, buy_cost_pct, sell_cost_pct),
    }
