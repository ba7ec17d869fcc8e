"""The terms a portfolio trades and holds on: when an order fills (``--execution``), the dividends holders receive
and the interest cash earns (``--risk_free``); the one place that maps them to numbers, for the env, the backtest's
and the study's baselines, and the trade plan (docs/backtesting.md, "When orders fill").

A policy decides on day t after seeing day t's close; its orders are sized at that close and fill at that close
itself (``close``: the paper's and FinRL's; no trader gets it, the decision needs that close first), day t+1's open
(``next_open``: a market-on-open order sent after the close, what ``clstm-ppo trade`` does) or day t+1's close
(``next_close``); ``auto`` is next_open where the data has opens, next_close on close-only data. Either way the
portfolio is valued at day t+1's close, so every trade pays (or earns) the gap between day t's close and its fill,
and a turbulent day t's liquidation fills at the same price as any other order.

Carry from day t's close to day t+1's: cash earns the daily risk-free rate ``(1 + risk_free)^(1/252) - 1``, and
day t+1's dividends (`envs.data.MarketData.dividends`, paid to the holders of record at day t's close) are paid
in cash on the shares held at day t's close: after the trade under ``close`` fills, before it under the next-day
fills (a share bought on the ex-dividend day does not receive it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.data import MarketData
from envs.errors import UserError
from envs.returns import daily_risk_free
from envs.state import EXECUTIONS


def resolve_execution(mode: str, data: MarketData) -> str:
    """The fill rule ``mode`` means on ``data``: ``auto`` becomes next_open, or next_close where the data has no
    opens; next_open on close-only data is refused in one line (it would silently be the next close)."""
    if mode not in EXECUTIONS:
        raise UserError(f"--execution must be one of {', '.join(EXECUTIONS)}, got {mode!r}")
    if mode == "auto":
        return "next_close" if data.close_only else "next_open"
    if mode == "next_open" and data.close_only:
        raise UserError("--execution next_open needs opening prices, but the data has closes only; use next_close")
    return mode


def fill_prices(data: MarketData, mode: str) -> np.ndarray:
    """``[D, N]`` float64 dollars: the price at which an order decided on day t's close fills (row t). The last
    day has no next day; its row repeats its close (no episode trades from the data's last day)."""
    mode = resolve_execution(mode, data)
    close = np.asarray(data.close, dtype=np.float64)
    if mode == "close":
        return close.copy()
    nxt = np.asarray(data.open if mode == "next_open" else data.close, dtype=np.float64)
    return np.concatenate([nxt[1:], close[-1:]], axis=0)


FILLS_AT = {
    "close": "at the close the policy decides on (the paper's; not tradeable)",
    "next_open": "at the next day's open",
    "next_close": "at the next day's close",
}
"""Each resolved mode in words."""


def describe_execution(mode: str, data: MarketData) -> str:
    """One phrase for the console: how this run's orders fill, and why where ``auto`` chose for the user."""
    resolved = resolve_execution(mode, data)
    why = " (--execution auto: the data has closes only)" if mode == "auto" and resolved == "next_close" else ""
    return f"orders fill {FILLS_AT[resolved]}{why}"


@dataclass(frozen=True)
class Terms:
    """The fills and carry of D days of N tickers (module docstring), for a rule or the env to trade on."""

    execution: str  # resolved: close | next_open | next_close
    fill: np.ndarray  # [D, N] float64 dollars: row t, where an order decided on day t's close fills
    dividends: np.ndarray  # [D, N] float64 dollars per share paid on day t to the holders of day t-1's close
    cash_rate: float  # interest on cash per trading day (fraction)

    @classmethod
    def of(cls, data: MarketData, execution: str, risk_free: float) -> Terms:
        """The terms of ``data`` under ``--execution`` and an annual ``risk_free`` rate (fraction)."""
        mode = resolve_execution(execution, data)
        return cls(
            mode, fill_prices(data, mode), np.asarray(data.dividends, dtype=np.float64), daily_risk_free(risk_free)
        )

    def days(self, start: int, stop: int) -> Terms:
        """The terms of days [start, stop)."""
        return Terms(self.execution, self.fill[start:stop], self.dividends[start:stop], self.cash_rate)

    @property
    def paid_after_fill(self) -> bool:
        """Are the next day's dividends paid on the holdings after the day's trade (only when it fills at the close
        itself, before the ex-dividend day opens)?"""
        return self.execution == "close"
