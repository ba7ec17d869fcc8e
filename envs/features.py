"""Technical indicators, the turbulence index and normalisation statistics (fit on the training split only).

Everything here is causal: the value at day t is computed from days 0..t only, so an agent acting at day t's close never
sees the future. Arrays are ``[D, N]`` (days x tickers) float64; every computation is vectorised over tickers (the only
Python loops run over time, for the recursive averages, or over chunks of days for the turbulence covariances).

Indicator set and conventions (the paper's four, as FinRL computes them with stockstats:
``macd``, ``rsi_30``, ``cci_30``, ``dx_30``; our names in ``INDICATORS`` are the contract's):

``macd``  EMA(close, 12) - EMA(close, 26), EMAs recursive with alpha = 2 / (span + 1) and seeded
          with the first close (pandas ``ewm(span, adjust=False)``; identical to ``ta.trend.MACD``
          wherever ta is defined). stockstats uses ``adjust=True``; the two differ only in the first
          weeks, by a factor that decays like (1 - alpha)^t.
``rsi``   RSI over 30 days with Wilder's smoothing (alpha = 1/30, ``adjust=False``), seeded with a
          zero change on day 0: 100 * U / (U + D) of the smoothed up/down moves; identical to
          ``ta.momentum.RSIIndicator(window=30)`` where ta is defined, except that a ticker that has
          not moved at all reads 50 (ta says 100).
``cci``   CCI over 30 days: (TP - SMA30(TP)) / (0.015 * mean absolute deviation30(TP)) with
          TP = (high + low + close) / 3; identical to ``ta.trend.CCIIndicator(window=30)`` from day 29
          on. Before that the window is the days available so far (stockstats' ``min_periods=1``);
          0 where the deviation is 0.
``adx``   DX over 30 days (stockstats ``dx_30``, what FinRL feeds the paper's "ADX" slot):
          100 * |+DI - -DI| / (+DI + -DI) with +DI = 100 * W(+DM) / W(TR), -DI likewise, W Wilder's
          smoothing (alpha = 1/30, ``adjust=False``, seeded with day 0), TR_0 = high_0 - low_0; 0 where
          undefined. Not compared with ``ta``'s ADX, whose loop seeds from a 30-day sum and leaves the
          last value at 0; the tests check it against an independent per-ticker loop instead.

When the data only has closes (``MarketData.close_only``), high = low = close and CCI/ADX are
computed from closes; ``compute_indicators`` warns once.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.data import DayRange, MarketData, Splits
from envs.errors import UserError
from envs.state import (
    DEFAULT_PRICE_MODE,
    HOLDINGS_SCALE,
    INDICATORS,
    PRICE_MODES,
    StateLayout,
    column_of,
    indicator_name_problem,
)

INDICATOR_WINDOW = 30
"""Window of RSI, CCI and DX in trading days (FinRL's ``_30`` indicators)."""

TURBULENCE_LOOKBACK = 252
"""Trading days of history behind each day's turbulence (FinRL's one year)."""

TURBULENCE_QUANTILE = 0.90
"""Turbulence threshold = this quantile of the training split's turbulence (paper, FinRL)."""


SPEC_FORMAT = 1


def _ewm(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Recursive exponential averages y_t = a x_t + (1 - a) y_{t-1}, y_0 = x_0 (pandas adjust=False).

    :param x: [D, ..., S] float64, S series along the last axis
    :param alpha: [S] smoothing factor per series
    :return: [D, ..., S] float64
    """
    out = np.empty_like(x)
    out[0] = x[0]
    keep = 1.0 - alpha
    for t in range(1, x.shape[0]):  # loop over time only; each step is vectorised over tickers/series
        np.multiply(out[t - 1], keep, out=out[t])
        out[t] += alpha * x[t]
    return out


def _rolling_mean_and_mad(x: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing mean and mean absolute deviation over `window` days (fewer in the first days).

    :param x: [D, N] float64
    :return: ([D, N], [D, N]) float64
    """
    D = x.shape[0]
    mean, mad = np.empty_like(x), np.empty_like(x)
    for t in range(min(window - 1, D)):  # warm-up: expanding window over the days so far
        w = x[: t + 1]
        m = w.mean(axis=0)
        mean[t] = m
        mad[t] = np.abs(w - m).mean(axis=0)
    if D >= window:
        w = np.lib.stride_tricks.sliding_window_view(x, window, axis=0)  # [D - window + 1, N, window]
        m = w.mean(axis=-1)
        mean[window - 1 :] = m
        mad[window - 1 :] = np.abs(w - m[..., None]).mean(axis=-1)
    return mean, mad


def feature_column(data: MarketData, name: str) -> np.ndarray:
    """``[D, N]`` float64: the data's own numeric column ``name`` (``--indicators col:NAME``), its value on date t
    known at t's close (docs/data.md, "Feature columns").

    :raises UserError: in one line, naming the column, where the data has no such column, where it does not read as
        numbers, where a value is infinite, or where one is missing (the first ticker and date, and how many).
    """
    if name not in data.columns:
        if name in data.unreadable_columns:
            raise UserError(f"col:{name}: {data.unreadable_columns[name]}")
        have = ", ".join(data.columns) or "none"
        raise UserError(f"col:{name}: the data has no column {name!r} (its feature columns: {have})")
    values = data.columns[name]
    for bad, what, fix in (
        (np.isinf(values), "is infinite", "fix the file"),
        (
            np.isnan(values),
            "has no value",
            "fill it in the file, start the data later, or load with --gap_policy ffill (fills short runs)",
        ),
    ):
        if bad.any():
            day, col = np.argwhere(bad)[0]
            raise UserError(
                f"column {name!r} {what} for {data.tickers[col]} on {data.date_str(int(day))} ({int(bad.sum())} "
                f"value(s) in all): {fix}"
            )
    return values


def compute_indicators(data: MarketData, names: tuple[str, ...] | list[str] = INDICATORS) -> np.ndarray:
    """Technical indicators for every day and ticker (conventions in the module docstring), and the data's own feature
    columns named ``col:NAME`` (`feature_column`).

    :param names: built-in indicators of ``INDICATORS`` and ``col:NAME``, in the order wanted
    :return: [D, N, K] float64, K = len(names); causal (day t uses days 0..t)
    """
    names = tuple(names)
    problem = indicator_name_problem(names)
    if problem:
        raise UserError(f"indicators {list(names)}: {problem}; available: {list(INDICATORS)} and col:NAME")
    if data.close_only and ({"cci", "adx"} & set(names)):
        warnings.warn("market data has closes only: CCI and ADX use the close for high and low", stacklevel=2)
    close = np.asarray(data.close, dtype=np.float64)
    high = close if data.close_only else np.asarray(data.high, dtype=np.float64)
    low = close if data.close_only else np.asarray(data.low, dtype=np.float64)
    w = INDICATOR_WINDOW

    # Every recursive average the chosen indicators need goes through one time loop.
    series: list[np.ndarray] = []
    alphas: list[float] = []
    prev_close = np.concatenate([close[:1], close[:-1]])  # day 0 has no change: use its own close
    if "macd" in names:
        series += [close, close]
        alphas += [2.0 / (12 + 1), 2.0 / (26 + 1)]
    if "rsi" in names:
        change = close - prev_close
        series += [np.maximum(change, 0.0), np.maximum(-change, 0.0)]
        alphas += [1.0 / w, 1.0 / w]
    if "adx" in names:
        up, down = np.zeros_like(high), np.zeros_like(low)
        up[1:] = high[1:] - high[:-1]
        down[1:] = low[:-1] - low[1:]
        plus_dm = np.where((up > down) & (up > 0), up, 0.0)
        minus_dm = np.where((down > up) & (down > 0), down, 0.0)
        tr = np.maximum(high - low, np.maximum(np.abs(high - prev_close), np.abs(low - prev_close)))
        tr[0] = high[0] - low[0]
        series += [plus_dm, minus_dm, tr]
        alphas += [1.0 / w] * 3
    smooth = iter(np.moveaxis(_ewm(np.stack(series, axis=-1), np.asarray(alphas)), -1, 0)) if series else iter(())

    results: dict[str, np.ndarray] = {n: feature_column(data, c) for n in names if (c := column_of(n)) is not None}
    if "macd" in names:
        results["macd"] = next(smooth) - next(smooth)
    if "rsi" in names:
        up_avg, down_avg = next(smooth), next(smooth)
        total = up_avg + down_avg
        with np.errstate(invalid="ignore", divide="ignore"):
            results["rsi"] = np.where(total > 0, 100.0 * up_avg / total, 50.0)
    if "adx" in names:
        pdm, mdm, atr = next(smooth), next(smooth), next(smooth)
        with np.errstate(invalid="ignore", divide="ignore"):
            pdi = np.where(atr > 0, 100.0 * pdm / atr, 0.0)
            mdi = np.where(atr > 0, 100.0 * mdm / atr, 0.0)
            di_sum = pdi + mdi
            results["adx"] = np.where(di_sum > 0, 100.0 * np.abs(pdi - mdi) / di_sum, 0.0)
    if "cci" in names:
        tp = (high + low + close) / 3.0
        tp_mean, tp_mad = _rolling_mean_and_mad(tp, w)
        with np.errstate(invalid="ignore", divide="ignore"):
            results["cci"] = np.where(tp_mad > 0, (tp - tp_mean) / (0.015 * tp_mad), 0.0)
    return np.stack([results[name] for name in names], axis=-1) if names else np.zeros((*close.shape, 0))


def turbulence_index(close: np.ndarray, lookback: int = TURBULENCE_LOOKBACK, chunk: int = 256) -> np.ndarray:
    """Mahalanobis distance of each day's returns from the trailing `lookback` days (Kritzman & Li).

    turbulence_t = (r_t - mu)' pinv(S) (r_t - mu), r_t = close_t / close_{t-1} - 1 per ticker, mu and S (sample
    covariance, ddof = 1) from r_{t-lookback} .. r_{t-1}: the days *before* t. The first lookback + 1 days (no full
    history of returns) are 0. Unlike FinRL we do not also zero the first two positive values after the warm-up.

    :param close: [D, N] float64 dollars
    :param chunk: days per batched covariance/pinv (bounds memory at chunk x lookback x N)
    :return: [D] float64, >= 0
    """
    close = np.asarray(close, dtype=np.float64)
    D, N = close.shape
    out = np.zeros(D)
    if D <= lookback + 1:
        return out
    r = close[1:] / close[:-1] - 1.0  # r[i] is day i+1's return
    windows = np.lib.stride_tricks.sliding_window_view(r, lookback, axis=0)  # [D-lookback, N, L]
    # Day t = j + lookback + 1 uses history windows[j] = r[j : j + lookback] and today's r[j + lookback].
    num = D - lookback - 1
    for j0 in range(0, num, chunk):
        j1 = min(j0 + chunk, num)
        hist = windows[j0:j1]
        mu = hist.mean(axis=-1)
        centred = hist - mu[..., None]
        cov = centred @ centred.transpose(0, 2, 1) / (lookback - 1)  # [c, N, N]
        dev = r[j0 + lookback : j1 + lookback] - mu
        inv = np.linalg.pinv(cov)
        out[j0 + lookback + 1 : j1 + lookback + 1] = np.einsum("cn,cnm,cm->c", dev, inv, dev)
    return np.maximum(out, 0.0)  # pinv rounding can leave -1e-17 where the distance is 0


def _safe_std(x: np.ndarray, axis: int) -> np.ndarray:
    std = x.std(axis=axis)
    return np.where(std > 1e-12, std, 1.0)  # a constant series is centred, not blown up


PRICE_RELATIVE_INDICATORS = ("macd",)  # in dollars: divided by the close in the return modes


def price_features(
    close: np.ndarray, indicators: np.ndarray, mode: str, relative: tuple[int, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """The raw (not yet z-scored) price column and indicators of each day's state: ``(price [D, N], indicators
    [D, N, K])`` from ``close [D, N]`` float64 dollars and ``indicators [D, N, K]``, causal (day t uses days <= t).

    :param mode: "level": the close itself (the paper's and FinRL's state); "return": the day's log return
        ``log(close[t] / close[t-1])`` (0 on day 0; `envs.state.DEFAULT_PRICE_MODE` says why).
    :param relative: indicator indices (e.g. MACD, in dollars) divided by the close in the return modes.
    """
    if mode == "level":
        return close, indicators
    if mode not in PRICE_MODES:
        raise UserError(f"unknown price feature mode {mode!r}; choose one of {', '.join(PRICE_MODES)}")
    price = np.concatenate([np.zeros_like(close[:1]), np.diff(np.log(close), axis=0)])
    if relative:
        indicators = indicators.copy()
        for k in relative:
            indicators[:, :, k] = indicators[:, :, k] / close
    return price, indicators


@dataclass(frozen=True, eq=False)
class Normalization:
    """Per-ticker z-score statistics, fitted on the training split's days only: the price feature (`price_features`)
    becomes (value - close_mean) / close_std, indicator k of ticker i (value - indicator_mean[k, i]) /
    indicator_std[k, i]; the env scales cash by its initial amount and shares by ``holdings_scale``."""

    close_mean: np.ndarray  # [N] mean of the price feature (dollars in "level" mode)
    close_std: np.ndarray  # [N]
    indicator_mean: np.ndarray  # [K, N]
    indicator_std: np.ndarray  # [K, N]
    holdings_scale: float = HOLDINGS_SCALE  # shares
    fit_start: int = 0  # day indices [fit_start, fit_stop) the statistics came from
    fit_stop: int = 0
    price_mode: str = DEFAULT_PRICE_MODE
    price_relative: tuple[int, ...] = ()

    @classmethod
    def fit(
        cls,
        close: np.ndarray,
        indicators: np.ndarray,
        days: DayRange,
        *,
        price_mode: str = DEFAULT_PRICE_MODE,
        price_relative: tuple[int, ...] = (),
    ) -> Normalization:
        """Statistics from ``days`` only. close: [D, N] float64; indicators: [D, N, K] float64."""
        price, ind_all = price_features(close, indicators, price_mode, price_relative)
        c = price[days.start : days.stop]
        ind = ind_all[days.start : days.stop].transpose(2, 0, 1)  # [K, days, N]
        return cls(
            close_mean=c.mean(axis=0),
            close_std=_safe_std(c, axis=0),
            indicator_mean=ind.mean(axis=1),
            indicator_std=_safe_std(ind, axis=1),
            fit_start=int(days.start),
            fit_stop=int(days.stop),
            price_mode=price_mode,
            price_relative=tuple(int(k) for k in price_relative),
        )

    def market_rows(self, close: np.ndarray, indicators: np.ndarray) -> np.ndarray:
        """Normalised market part of each day's state.

        :param close: [D, N] float64; indicators: [D, N, K] float64
        :return: [D, N + K*N] float64: N price features, then each indicator for all N tickers (FinRL's order)
        """
        price, indicators = price_features(close, indicators, self.price_mode, self.price_relative)
        c = (price - self.close_mean) / self.close_std
        ind = (indicators.transpose(0, 2, 1) - self.indicator_mean) / self.indicator_std  # [D, K, N]
        return np.concatenate([c, ind.reshape(ind.shape[0], -1)], axis=1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (lists of floats)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            k: v.tolist() if isinstance(v, np.ndarray) else list(v) if isinstance(v, tuple) else v
            for k, v in out.items()
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Normalization:
        n = len(d["close_mean"])
        return cls(
            close_mean=np.asarray(d["close_mean"], dtype=np.float64),
            close_std=np.asarray(d["close_std"], dtype=np.float64),
            indicator_mean=np.asarray(d["indicator_mean"], dtype=np.float64).reshape(-1, n),
            indicator_std=np.asarray(d["indicator_std"], dtype=np.float64).reshape(-1, n),
            holdings_scale=float(d.get("holdings_scale", HOLDINGS_SCALE)),
            fit_start=int(d.get("fit_start", 0)),
            fit_stop=int(d.get("fit_stop", 0)),
            price_mode=str(d["price_mode"]),
            price_relative=tuple(int(k) for k in d.get("price_relative", ())),
        )


def turbulence_threshold(turbulence: np.ndarray, train: DayRange, lookback: int, enabled: bool) -> float:
    """The liquidation threshold: ``TURBULENCE_QUANTILE`` of the training split's defined turbulence ``[D]``
    (days with ``lookback`` days of return history); inf when disabled or when no training day has that history
    (then with a warning)."""
    if not enabled:
        return float("inf")
    defined = turbulence[max(train.start, lookback + 1) : train.stop]
    if defined.size == 0:
        warnings.warn(
            f"training split has no day with {lookback} days of return history: turbulence stop disabled", stacklevel=3
        )
        return float("inf")
    return float(np.quantile(defined, TURBULENCE_QUANTILE))


def _range_to_dates(data: MarketData, r: DayRange | None) -> dict[str, str] | None:
    return None if r is None else {"start": data.date_str(r.start), "end": data.date_str(r.stop - 1)}


def _dates_to_range(data: MarketData, d: dict[str, str] | None) -> DayRange | None:
    """Day indices of the data inside [start, end] (inclusive dates); None when fewer than 2 days."""
    if d is None:
        return None
    dates = np.asarray(data.dates).astype("datetime64[D]")
    start = int(np.searchsorted(dates, np.datetime64(d["start"], "D"), side="left"))
    stop = int(np.searchsorted(dates, np.datetime64(d["end"], "D"), side="right"))
    return DayRange(start, stop) if stop - start >= 2 else None


def split_ranges(data: MarketData, dates: dict[str, dict[str, str] | None]) -> dict[str, DayRange | None]:
    """Stored split dates (`PreparedMarket.to_spec`'s ``splits``: name -> {start, end} or None) mapped onto ``data``
    by date: name -> the DayRange of its trading days inside them, None where fewer than 2 days are in ``data``."""
    return {name: _dates_to_range(data, d) for name, d in dates.items()}


@dataclass(frozen=True, eq=False)
class PreparedMarket:
    """Everything an env needs. Arrays over the FULL data; splits index into them."""

    data: MarketData
    indicators: np.ndarray  # [D, N, K] float64 raw
    indicator_names: tuple[str, ...]
    turbulence: np.ndarray  # [D] float64
    turbulence_threshold: float  # 90th percentile of training-split turbulence (inf when disabled)
    normalization: Normalization
    splits: Splits
    window: int
    turbulence_lookback: int = TURBULENCE_LOOKBACK
    use_turbulence: bool = True  # False: the threshold is inf (no liquidation day)
    pool: tuple[PreparedMarket, ...] = ()  # more markets of the same length and spec whose training days a training
    # env also runs on (a synthetic source's ``train_draws``: `envs.vector_env`); validation and test are this one's

    @classmethod
    def prepare(
        cls,
        data: MarketData,
        splits: Splits,
        *,
        window: int = 30,
        indicator_names: tuple[str, ...] | list[str] = INDICATORS,
        use_turbulence: bool = True,
        turbulence_lookback: int = TURBULENCE_LOOKBACK,
        price_mode: str = DEFAULT_PRICE_MODE,
    ) -> PreparedMarket:
        """Indicators and turbulence over all days; normalisation and threshold from the train split only.
        ``price_mode``: the state's price column, "level" or "return" (`price_features`)."""
        if window < 1:
            raise UserError(f"window must be >= 1, got {window}")
        indicator_names = tuple(indicator_names)
        indicators = compute_indicators(data, indicator_names)
        turbulence = turbulence_index(data.close, turbulence_lookback)
        return cls(
            data=data,
            indicators=indicators,
            indicator_names=indicator_names,
            turbulence=turbulence,
            turbulence_threshold=turbulence_threshold(turbulence, splits.train, turbulence_lookback, use_turbulence),
            normalization=Normalization.fit(
                np.asarray(data.close, dtype=np.float64),
                indicators,
                splits.train,
                price_mode=price_mode,
                price_relative=tuple(i for i, n in enumerate(indicator_names) if n in PRICE_RELATIVE_INDICATORS),
            ),
            splits=splits,
            window=int(window),
            turbulence_lookback=int(turbulence_lookback),
            use_turbulence=bool(use_turbulence),
        )

    def resplit(self, splits: Splits) -> PreparedMarket:
        """The same market with other splits: normalisation and turbulence threshold refitted on the new training
        split, indicators and turbulence reused (they are causal, so no day after a split sees its future).
        A walk-forward study prepares one market and resplits it once per retraining window."""
        norm = self.normalization
        return dataclasses.replace(
            self,
            splits=splits,
            turbulence_threshold=turbulence_threshold(
                self.turbulence, splits.train, self.turbulence_lookback, self.use_turbulence
            ),
            normalization=Normalization.fit(
                np.asarray(self.data.close, dtype=np.float64),
                self.indicators,
                splits.train,
                price_mode=norm.price_mode,
                price_relative=norm.price_relative,
            ),
        )

    def stopped_days(self) -> np.ndarray:
        """``[D] bool``: the days the turbulence stop holds the portfolio in cash: those whose turbulence reaches
        this market's threshold (the paper's rule: back in on the first calm day; never with the stop off, whose
        threshold is inf). Causal: day t depends on days <= t only."""
        return np.asarray(self.turbulence) >= self.turbulence_threshold

    @property
    def num_tickers(self) -> int:
        return len(self.data.tickers)

    @property
    def layout(self) -> StateLayout:
        """Where each number of a day's state sits (cash, price columns, holdings, indicators)."""
        return StateLayout(self.num_tickers, len(self.indicator_names))

    @property
    def num_features(self) -> int:
        """F = 1 + N + N + K*N (cash, closes, holdings, indicators)."""
        return self.layout.num_features

    def split_range(self, split: str | DayRange) -> DayRange:
        """The DayRange for "train" | "validation" | "test" (or a DayRange, returned as is)."""
        if isinstance(split, DayRange):
            r = split
        else:
            ranges = self.splits.as_dict()
            if split not in ranges:
                raise UserError(f"unknown split {split!r}; expected one of {sorted(ranges)}")
            r = ranges[split]
            if r is None:
                raise UserError(f"split {split!r} is empty for this market")
        if not (0 <= r.start and r.stop <= self.data.num_days and r.stop - r.start >= 2):
            raise UserError(
                f"split {split!r} = days [{r.start}, {r.stop}) needs >= 2 days within 0..{self.data.num_days}"
            )
        return r

    def to_spec(self) -> dict[str, Any]:
        """JSON-able description that lets ``from_spec`` rebuild this market's features from data."""
        thr = self.turbulence_threshold
        return {
            "format": SPEC_FORMAT,
            "tickers": list(self.data.tickers),
            "indicator_names": list(self.indicator_names),
            "normalization": self.normalization.to_dict(),
            "turbulence_threshold": None if not np.isfinite(thr) else float(thr),  # JSON has no inf
            "turbulence_lookback": self.turbulence_lookback,
            "window": self.window,
            "splits": {name: _range_to_dates(self.data, r) for name, r in self.splits.as_dict().items()},
        }

    @classmethod
    def from_spec(
        cls, data: MarketData, spec: dict[str, Any], *, splits: Splits | None = None, lean: bool = False
    ) -> PreparedMarket:
        """Rebuild from a stored spec, reusing its normalisation and threshold (no refit on new data).

        Indicators and turbulence are recomputed from ``data`` (they are causal, so longer data gives the same values on
        shared days once warm). Splits come from the spec's dates mapped onto ``data`` unless ``splits`` is given; a
        split with fewer than 2 days in the data becomes None (the train split then falls back to the whole data, only
        used for indexing). ``lean``: where the spec's stop is off, the turbulence index is left at zero instead of
        computed (nothing reads it then: a training pool's markets, `clstm_ppo.market.build_market`).
        """
        if spec.get("format") != SPEC_FORMAT:
            raise UserError(f"unsupported market spec format {spec.get('format')!r} (expected {SPEC_FORMAT})")
        want, have = list(spec["tickers"]), list(data.tickers)
        if want != have:
            missing = [t for t in want if t not in have]
            extra = [t for t in have if t not in want]
            if missing or extra:
                raise UserError(f"data tickers differ from the checkpoint's: missing {missing}, unexpected {extra}")
            data = data.select_tickers(want)  # same set, different order: use the spec's order
        names = tuple(spec["indicator_names"])
        lookback = int(spec.get("turbulence_lookback", TURBULENCE_LOOKBACK))
        if splits is None:
            ranges = split_ranges(data, spec["splits"])
            train = ranges.get("train") or DayRange(0, data.num_days)
            splits = Splits(train=train, validation=ranges.get("validation"), test=ranges.get("test"))
        thr = spec.get("turbulence_threshold")
        return cls(
            data=data,
            indicators=compute_indicators(data, names),
            indicator_names=names,
            turbulence=np.zeros(data.num_days) if lean and thr is None else turbulence_index(data.close, lookback),
            turbulence_threshold=float("inf") if thr is None else float(thr),
            normalization=Normalization.from_dict(spec["normalization"]),
            splits=splits,
            window=int(spec["window"]),
            turbulence_lookback=lookback,
            use_turbulence=thr is not None,
        )
