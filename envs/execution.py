"""When an order fills: the one place that maps ``--execution`` to prices, for the env, the backtest's and the
study's baselines, and the trade plan.

A policy decides on day t after seeing day t's close. Its orders are sized at that close (the last price it
knows) and fill at:

- ``close``: day t's close itself (the paper's and FinRL's convention; no trader can get it, because the
  decision needs that close first). Kept for the ``paper`` preset and for checkpoints written before the setting.
- ``next_open``: day t+1's open: a market-on-open order sent after the close, what ``clstm-ppo trade`` does.
- ``next_close``: day t+1's close (the honest choice when the data has no opens).
- ``auto`` (the default): ``next_open`` where the data has opens, ``next_close`` on close-only data.

Either way the portfolio is valued at day t+1's close, so the gap between day t's close and the fill price is
paid (or earned) by every trade, and a turbulent day t's liquidation fills at the same price as any other order.
"""

from __future__ import annotations

import numpy as np

from envs.data import MarketData
from envs.errors import UserError
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
