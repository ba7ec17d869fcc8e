"""Trading metrics over a daily portfolio-value series and a trade log (pure numpy).

Conventions shared by every function here:

* ``values`` is a ``[D] float64`` series of total portfolio value in dollars (cash + shares x close),
  one entry per trading day, ``values[0]`` the starting value (for a backtest: the initial capital on the
  first day, before that day's trades). Values must be finite and > 0.
* Daily simple returns ``r_t = values[t] / values[t-1] - 1`` for ``t = 1 .. D-1`` (``D - 1`` returns).
* A year has ``TRADING_DAYS = 252`` trading days.
* Fractions, not percent: a return of 12.5 % is ``0.125``. Drawdowns and MER are positive fractions.
* Degenerate inputs give a documented finite value, never NaN or an exception: a one-day series has zero return,
  volatility, drawdown and ratios; a ratio whose denominator is zero (no volatility, no downside, no drawdown) is
  ``0.0`` -- read it together with its denominator, which is in the summary. NaN is used only for "unknown": trade-based
  metrics when no trade information was given, and the win rate when no position was ever closed.

The trade log ("trades table") is a mapping of equal-length columns (a ``pandas.DataFrame`` works) with one row per
executed order, i.e. one non-zero share change of one ticker on one day -- the env's definition of a trade:

    date or day   sortable, chronological (optional; rows are taken in the given order without it)
    ticker        str or int
    side          "buy" | "sell"
    shares        > 0, shares traded
    price         dollars per share
    cost          dollars of transaction cost paid for this order

The backtest driver can build it from a holdings matrix with `trades_from_holdings`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

# The one definition of each, re-exported here with the other metrics.
from envs.returns import TRADING_DAYS, daily_risk_free, sharpe_from_returns
from envs.returns import ZERO_STD as _ZERO_STD

TradesLike = Mapping[str, Any]


def _as_values(values: Any) -> np.ndarray:
    """Validate a value series: 1-D, non-empty, finite, > 0. Returns ``[D] float64``."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"values must be a non-empty 1-D series, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("values contain NaN or inf")
    if np.any(v <= 0):
        raise ValueError("values must be > 0 dollars (a portfolio without shorting cannot go to zero or below)")
    return v


def daily_returns(values: Any) -> np.ndarray:
    """Simple daily returns ``values[1:] / values[:-1] - 1``: ``[D-1] float64`` (empty for ``D == 1``)."""
    v = _as_values(values)
    return v[1:] / v[:-1] - 1.0


def excess_returns(values: Any, risk_free: float = 0.0) -> np.ndarray:
    """``[D-1]`` daily simple returns of ``[D]`` values (dollars), in excess of the daily rate of an annual
    ``risk_free`` (what every Sharpe ratio, PSR and DSR here is computed on)."""
    return daily_returns(values) - daily_risk_free(risk_free)


def cumulative_return(values: Any) -> float:
    """CR: ``values[-1] / values[0] - 1`` (fraction). One day: ``0.0``."""
    v = _as_values(values)
    return float(v[-1] / v[0] - 1.0)


def annual_return(values: Any) -> float:
    """Compound annual growth rate: ``(values[-1] / values[0]) ** (252 / (D - 1)) - 1`` (fraction).

    ``D - 1`` is the number of daily returns, so 253 values make exactly one year. ``D == 1``: ``0.0``.
    Matches ``empyrical.annual_return`` on the daily returns.
    """
    v = _as_values(values)
    n = v.size - 1
    return float((v[-1] / v[0]) ** (TRADING_DAYS / n) - 1.0) if n else 0.0


def annual_volatility(values: Any) -> float:
    """Sample standard deviation (ddof=1) of daily returns x sqrt(252) (fraction per year).

    Fewer than two daily returns (``D < 3``): ``0.0``. Matches ``empyrical.annual_volatility``.
    """
    r = daily_returns(values)
    return float(np.std(r, ddof=1) * math.sqrt(TRADING_DAYS)) if r.size >= 2 else 0.0


def sharpe_ratio(values: Any, risk_free: float = 0.0) -> float:
    """Annualised Sharpe ratio: ``mean(e) / std(e, ddof=1) * sqrt(252)`` of daily excess returns.

    ``e_t = r_t - rf_d`` with ``rf_d = daily_risk_free(risk_free)`` (``risk_free`` is an annual rate).
    ``0.0`` when there are fewer than two returns or the excess returns do not vary (e.g. a constant
    series: all cash). Matches ``empyrical.sharpe_ratio(r, risk_free=rf_d)`` otherwise.
    """
    return sharpe_from_returns(daily_returns(values), risk_free)


def sortino_ratio(values: Any, risk_free: float = 0.0) -> float:
    """Annualised Sortino ratio: ``mean(e) * 252 / (sqrt(mean(min(e, 0) ** 2)) * sqrt(252))``.

    ``e`` are daily excess returns over the daily risk-free rate (the minimum acceptable return); the
    downside deviation averages over ALL days (days above the target count as zero), as empyrical and
    pyfolio do. ``0.0`` when there is no return or no day below the target.
    """
    e = daily_returns(values) - daily_risk_free(risk_free)
    if e.size == 0:
        return 0.0
    downside = math.sqrt(float(np.mean(np.minimum(e, 0.0) ** 2)))
    if downside < _ZERO_STD:
        return 0.0
    return float(np.mean(e) * math.sqrt(TRADING_DAYS) / downside)


def drawdown_series(values: Any) -> np.ndarray:
    """Drawdown from the running peak, ``1 - values[t] / max(values[:t+1])``: ``[D] float64`` in [0, 1).

    Zero on every new high. For plots: the max of this series is `max_drawdown`.
    """
    v = _as_values(values)
    return 1.0 - v / np.maximum.accumulate(v)


def max_drawdown(values: Any) -> float:
    """The paper's MPB (maximum pullback): largest fall from a running peak to a later value.

    ``max_t (1 - values[t] / max(values[:t+1]))`` as a positive fraction (0.25 = a 25 % fall);
    ``0.0`` for a series that never falls. ``empyrical.max_drawdown`` is the same number, negated.
    """
    return float(np.max(drawdown_series(values)))


def max_earning_rate(values: Any) -> float:
    """The paper's MER (maximum earning rate): largest gain from an earlier trough to a later peak.

    ``max_{i <= j} (values[j] / values[i] - 1)`` as a positive fraction, measured from the trough (the
    mirror image of the drawdown, which is measured from the peak); ``0.0`` for a series that never
    rises. The trough may be day 0, so ``MER >= max(CR, 0)`` always. O(D): running minimum.
    """
    v = _as_values(values)
    return float(np.max(v / np.minimum.accumulate(v)) - 1.0)


def calmar_ratio(values: Any) -> float:
    """Calmar ratio: ``annual_return / max_drawdown``; ``0.0`` when there is no drawdown.

    Matches ``empyrical.calmar_ratio`` (which gives NaN when there is no drawdown).
    """
    mdd = max_drawdown(values)
    return annual_return(values) / mdd if mdd > 0.0 else 0.0


def daily_win_rate(values: Any) -> float:
    """Fraction of days (daily returns) with a strictly positive return; ``0.0`` for one day."""
    r = daily_returns(values)
    return float(np.mean(r > 0.0)) if r.size else 0.0


# ----------------------------------------------------------------------------------------------- trades


def _column(trades: TradesLike, name: str) -> np.ndarray:
    if name not in trades:
        raise ValueError(f"trades table lacks column {name!r}; needs ticker, side, shares, price, cost")
    col = trades[name]
    return col.to_numpy() if hasattr(col, "to_numpy") else np.asarray(col)


def _sides(trades: TradesLike) -> np.ndarray:
    """``[M] bool``, True for a sell; rejects anything but buy/sell."""
    side = np.asarray([str(s).strip().lower() for s in _column(trades, "side")], dtype=object)
    bad = set(side.tolist()) - {"buy", "sell"}
    if bad:
        raise ValueError(f"trades side must be 'buy' or 'sell', got {sorted(bad)}")
    return side == "sell"


def num_trades(trades: TradesLike) -> int:
    """Number of rows of the trades table: executed orders (non-zero share changes per ticker and day)."""
    return int(len(_column(trades, "shares")))


def _traded_value(trades: TradesLike) -> float:
    """Dollar value traded, buys and sells together: ``sum(shares * price)``."""
    shares = np.asarray(_column(trades, "shares"), dtype=np.float64)
    price = np.asarray(_column(trades, "price"), dtype=np.float64)
    return float(np.sum(np.abs(shares) * price))


def total_costs(trades: TradesLike) -> float:
    """Transaction costs paid, dollars: ``sum(cost)``."""
    return float(np.sum(np.asarray(_column(trades, "cost"), dtype=np.float64)))


def closed_trade_pnl(trades: TradesLike) -> np.ndarray:
    """Realised profit of every sell that closes shares bought within the log, FIFO per ticker.

    Buys open lots whose unit basis includes their buy cost (``(shares * price + cost) / shares``); a sell consumes the
    oldest lots first and its realised profit is ``shares * price - cost - basis of the shares consumed`` (dollars).
    Rows are processed by date (or day) with sells before buys on the same date, the env's execution order; without a
    date column, in the given order. Shares sold beyond the lots in the log (held before the log began) have no known
    basis and are left out; a sell with none inside the log gives no entry. Returns ``[K] float64``.
    """
    n = num_trades(trades)
    if n == 0:
        return np.zeros(0)
    is_sell = _sides(trades)
    shares = np.abs(np.asarray(_column(trades, "shares"), dtype=np.float64))
    price = np.asarray(_column(trades, "price"), dtype=np.float64)
    cost = np.asarray(_column(trades, "cost"), dtype=np.float64)
    tickers = [str(t) for t in _column(trades, "ticker")]
    key = next((k for k in ("date", "day") if k in trades), None)
    order = np.arange(n)
    if key is not None:  # lexsort: last key is primary -> by date, then sells (0) before buys (1), then original order
        order = np.lexsort((order, (~is_sell).astype(np.int8), _column(trades, key)))
    lots: dict[str, deque[list[float]]] = {}
    pnl: list[float] = []
    for i in order:
        q = shares[i]
        if q <= 0:
            continue
        book = lots.setdefault(tickers[i], deque())
        if not is_sell[i]:
            book.append([q, (q * price[i] + cost[i]) / q])
            continue
        matched, basis = 0.0, 0.0
        while book and matched < q:
            lot = book[0]
            take = min(lot[0], q - matched)
            matched += take
            basis += take * lot[1]
            lot[0] -= take
            if lot[0] <= 1e-12:
                book.popleft()
        if matched > 0:
            # the sell's cost is charged pro rata to the part of it whose basis is known
            pnl.append(matched * price[i] - cost[i] * matched / q - basis)
    return np.asarray(pnl, dtype=np.float64)


def win_rate(trades: TradesLike) -> float:
    """Fraction of closed trades with a strictly positive realised profit (see `closed_trade_pnl`).

    This is what traders mean by win rate: of the positions (lots) closed by sells, how many made money
    after costs. NaN when nothing was ever closed (e.g. buy-and-hold): undefined, not zero.
    """
    pnl = closed_trade_pnl(trades)
    return float(np.mean(pnl > 0.0)) if pnl.size else math.nan


def trades_from_holdings(
    dates: Any,
    tickers: Any,
    holdings: Any,
    prices: Any,
    *,
    buy_cost_pct: float,
    sell_cost_pct: float,
    initial_holdings: Any | None = None,
) -> dict[str, np.ndarray]:
    """Trades table from end-of-day holdings: one row per non-zero share change.

    :param dates: ``[D]`` the day each row of ``holdings`` was reached (any dtype; copied to the table).
    :param tickers: ``[N]`` ticker names.
    :param holdings: ``[D, N]`` shares held after trading on each day.
    :param prices: ``[D, N]`` dollars per share at which that day's trades executed (the close).
    :param buy_cost_pct: cost as a fraction of traded value on buys (env: 0.001).
    :param sell_cost_pct: the same on sells.
    :param initial_holdings: ``[N]`` shares before day 0 (default none held).
    :returns: columns date, ticker, side, shares (> 0), price, cost (dollars), ordered by date, sells first
        within a date (the env's execution order), tickers in the given order within a side.
    """
    h = np.asarray(holdings, dtype=np.float64)
    p = np.asarray(prices, dtype=np.float64)
    if h.ndim != 2 or p.shape != h.shape:
        raise ValueError(f"holdings and prices must both be [D, N]; got {h.shape} and {p.shape}")
    start = np.zeros(h.shape[1]) if initial_holdings is None else np.asarray(initial_holdings, np.float64)
    delta = np.diff(np.vstack([start[None, :], h]), axis=0)
    day, col = np.nonzero(delta)
    sell = delta[day, col] < 0
    # lexsort: last key is primary -> by day, sells (0) before buys (1), then ticker order
    order = np.lexsort((col, (~sell).astype(np.int8), day))
    day, col, sell = day[order], col[order], sell[order]
    shares = np.abs(delta[day, col])
    price = p[day, col]
    names = np.asarray([str(t) for t in tickers], dtype=object)
    return {
        "date": np.asarray(dates)[day],
        "ticker": names[col],
        "side": np.where(sell, "sell", "buy").astype(object),
        "shares": shares,
        "price": price,
        "cost": shares * price * np.where(sell, sell_cost_pct, buy_cost_pct),
    }


# -------------------------------------------------------------------------------------------- summarize


def summarize(
    values: Any,
    *,
    trades: TradesLike | int | None = None,
    costs: float | None = None,
    traded_value: float | None = None,
    risk_free: float = 0.0,
) -> dict[str, float]:
    """Every metric of a backtest, as a flat ``{name: float}`` dict with the keys of `METRIC_NAMES`.

    :param values: ``[D]`` daily portfolio value, dollars (see the module docstring).
    :param trades: the trades table (columns ticker, side, shares, price, cost, optional date), or just
        the number of trades, or None when unknown.
    :param costs: total transaction costs in dollars; overrides the table's ``sum(cost)``.
    :param traded_value: dollars traded (buys + sells); overrides the table's ``sum(shares * price)``.
    :param risk_free: annual risk-free rate (fraction) for Sharpe and Sortino.

    Keys (fractions unless stated):

    * ``num_days`` D; ``initial_value``, ``final_value``, ``profit`` (final - initial) in dollars.
    * ``cumulative_return`` (CR), ``annual_return`` (CAGR over 252-day years), ``annual_volatility``,
      ``sharpe``, ``sortino``, ``max_drawdown`` (MPB), ``max_earning_rate`` (MER), ``calmar``.
    * ``num_trades``: executed orders. ``appt``: the paper's average profitability per trade, ``profit / num_trades`` in
      dollars per trade (profit is net of costs: they are already out of the values); 0.0 with no trades.
    * ``turnover``: ``traded_value / mean(values)`` over the whole period (buys and sells both count, so
      investing everything once and selling it once is 2.0); ``annual_turnover`` = turnover x 252 / (D-1).
    * ``win_rate``: fraction of closed trades (FIFO lots) that made money after costs; NaN if none
      closed. ``daily_win_rate``: fraction of days with a positive return.
    * ``total_costs``: dollars of transaction costs.

    Trade-based keys are NaN when the information they need was not given.
    """
    v = _as_values(values)
    nan = math.nan
    count = win = nan
    tv = nan if traded_value is None else float(traded_value)
    cost = nan if costs is None else float(costs)
    if isinstance(trades, int | np.integer):
        count = float(trades)
    elif trades is not None:
        count = float(num_trades(trades))
        win = win_rate(trades)
        if traded_value is None:
            tv = _traded_value(trades)
        if costs is None:
            cost = total_costs(trades)

    profit = float(v[-1] - v[0])
    appt = nan if math.isnan(count) else profit / count if count > 0 else 0.0
    turnover = tv / float(np.mean(v))
    annual_turnover = nan if math.isnan(turnover) else turnover * TRADING_DAYS / (v.size - 1) if v.size > 1 else 0.0

    return {
        "num_days": float(v.size),
        "initial_value": float(v[0]),
        "final_value": float(v[-1]),
        "profit": profit,
        "cumulative_return": cumulative_return(v),
        "annual_return": annual_return(v),
        "annual_volatility": annual_volatility(v),
        "sharpe": sharpe_ratio(v, risk_free),
        "sortino": sortino_ratio(v, risk_free),
        "max_drawdown": max_drawdown(v),
        "max_earning_rate": max_earning_rate(v),
        "calmar": calmar_ratio(v),
        "num_trades": count,
        "appt": appt,
        "turnover": turnover,
        "annual_turnover": annual_turnover,
        "win_rate": win,
        "daily_win_rate": daily_win_rate(v),
        "total_costs": cost,
    }


METRIC_NAMES: tuple[str, ...] = tuple(summarize([1.0]))
"""Keys of `summarize`'s result (the same whatever it is given), in display order."""
