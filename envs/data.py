"""Market data: D trading days x N tickers of daily OHLCV bars, aligned, validated, split by date.

Input is FinRL's long format, one row per (date, ticker): ``date, tic, open, high, low, close, volume``, column
names matched case-insensitively, spaces stripped, with the aliases of `ALIASES` (docs/data.md, "CSV / Parquet
format", has the rules below from the user's side).

An adjusted-close column is read as the dividends it implies (bars are otherwise used as given, e.g. Alpaca's
``adjustment="all"`` bars are already adjusted and carry none): on each day t the dividend per share that makes
the close-to-close return equal the adjusted one, ``d_t = close_{t-1} x adj_t / adj_{t-1} - close_t``, paid to
the holders of day t-1's close (`MarketData.dividends`; within +-1e-4 of the previous close it counts as zero,
and an implied payout beyond 25% of the price is refused: the closes then look split-unadjusted).
``use_adjusted=True`` instead rescales open/high/low/close of each row by ``adj_close / close`` (returns then
include the dividends, and none is paid); volume is left as is.

Close-only input (date, tic, close [, volume]) is accepted: open/high/low are filled from close, volume
from 0 when absent, and ``close_only=True`` (indicators needing a true high/low range degrade; the features
module warns). Bars whose open/high/low all equal close everywhere are also read back as close-only, which
makes ``from_frame(d.to_frame())`` lossless for close-only data too.

Invalid input raises `UserError`, one line naming the problem and the first offending tickers/dates; unsorted
input is sorted, not refused. Gap policy (tickers not all trading on the same dates): ``"fail"`` (default) refuses,
listing each ticker's missing dates; ``"intersect"`` keeps the dates every ticker has; ``"ffill"`` fills a missing
bar with a flat bar at the previous close (volume 0) for runs of at most ``max_ffill_days`` missing days (longer
runs, or a ticker missing the first date, are refused).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from envs.errors import UserError, first_line, shown_list
from envs.state import MAX_PRICE_RATIO

COLUMNS: tuple[str, ...] = ("date", "tic", "open", "high", "low", "close", "volume")

PRICE_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close")
ARRAYS: tuple[str, ...] = (*PRICE_COLUMNS, "volume", "dividends")  # MarketData's [D, N] fields
GAP_POLICIES: tuple[str, ...] = ("fail", "intersect", "ffill")

# canonical name <- accepted spellings (compared lower-cased and stripped)
ALIASES: dict[str, tuple[str, ...]] = {
    "date": ("date", "timestamp", "datetime", "time", "day"),
    "tic": ("tic", "symbol", "ticker", "asset", "stock"),
    "open": ("open",),
    "high": ("high",),
    "low": ("low",),
    "close": ("close",),
    "volume": ("volume", "vol"),
    "adj_close": ("adj_close", "adjusted", "adj close", "adjclose", "adjusted_close", "adj_close_price"),
}
_NA_STRINGS = ["", "NA", "N/A", "#N/A", "NaN", "nan", "NAN", "null", "NULL", "None", "none", "-"]
_SHOW = 5  # how many offending items an error message lists
# pandas < 3 parses CSV floats with a fast, not always correctly rounded parser unless asked;
# pandas 3 rounds correctly by default and deprecates the argument
_ROUND_TRIP: dict[str, str] = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


def _rows(df: pd.DataFrame, mask: np.ndarray | pd.Series, limit: int = _SHOW) -> str:
    """'AAPL 2020-01-03, MSFT 2020-01-06' for the first rows where mask is True."""
    sub = df.loc[np.asarray(mask, dtype=bool)]
    parts = []
    for tic, date in zip(sub["tic"].to_numpy()[:limit], sub["date"].to_numpy()[:limit], strict=True):
        try:
            parts.append(f"{tic} {pd.Timestamp(date).date()}")
        except (ValueError, TypeError):
            parts.append(f"{tic} {date}")
    return shown_list(parts, limit, noun="rows", total=len(sub))


def _resolve_columns(columns: Sequence[Any]) -> dict[str, str]:
    """Map each canonical column name to the input column that provides it."""
    lowered: dict[str, list[str]] = {}
    for col in columns:
        lowered.setdefault(str(col).strip().lower(), []).append(col)
    mapping: dict[str, str] = {}
    for canonical, spellings in ALIASES.items():
        found = [c for s in spellings for c in lowered.get(s, [])]
        if len(found) > 1:
            # an exact canonical name wins over an alias (e.g. "date" and "timestamp" both present)
            exact = [c for c in found if str(c).strip().lower() == canonical]
            if len(exact) != 1:
                raise UserError(f"ambiguous columns for {canonical!r}: {', '.join(map(str, found))}; keep one of them")
            found = exact
        if found:
            mapping[canonical] = found[0]
    return mapping


def _parse_dates(raw: pd.Series, tics: pd.Series) -> tuple[pd.Series, bool]:
    """(dates as datetime64[ns] with the time of day dropped, whether any had a time of day).

    :raises UserError: listing the first unparseable values.
    """
    if isinstance(raw.dtype, pd.DatetimeTZDtype):
        # keep each bar's local calendar date (Alpaca daily bars are stamped at midnight New York time)
        parsed = raw.dt.tz_localize(None)
    elif pd.api.types.is_datetime64_any_dtype(raw.dtype):
        parsed = raw
    else:
        text = raw.astype("string").str.strip() if not pd.api.types.is_numeric_dtype(raw.dtype) else None
        if text is None:
            # 20200102 read as an integer: treat as text, never as nanoseconds since 1970
            text = pd.Series(
                [str(int(v)) if pd.notna(v) and float(v).is_integer() else str(v) for v in raw],
                index=raw.index,
                dtype="string",
            )
        try:
            parsed = pd.to_datetime(text, errors="raise")
        except (ValueError, TypeError, OverflowError):
            parsed = pd.to_datetime(text, errors="coerce", format="mixed")
        if isinstance(parsed.dtype, pd.DatetimeTZDtype):
            parsed = parsed.dt.tz_localize(None)
        bad = parsed.isna().to_numpy()
        if bad.any():
            shown = [f"{t} {v!r}" for t, v in zip(tics[bad][:_SHOW], raw[bad][:_SHOW], strict=True)]
            listed = shown_list(shown, _SHOW, noun="rows", total=int(bad.sum()))
            raise UserError(f"unparseable dates in column 'date': {listed}")
    if parsed.isna().any():
        raise UserError(f"missing dates in column 'date' ({int(parsed.isna().sum())} rows)")
    day = parsed.dt.normalize()
    return day.astype("datetime64[ns]"), bool((parsed != day).any())


def _parse_numbers(raw: pd.Series, name: str, frame: pd.DataFrame) -> np.ndarray:
    """Column as float64; UserError naming non-numeric strings (NaN stays NaN, checked later)."""
    if pd.api.types.is_bool_dtype(raw.dtype):
        raise UserError(f"column {name!r} holds true/false values, not numbers")
    if pd.api.types.is_numeric_dtype(raw.dtype):
        return raw.to_numpy(dtype=np.float64, na_value=np.nan)
    text = raw.astype("string").str.strip()
    missing = text.isna() | text.isin(_NA_STRINGS)
    values = text.to_numpy(dtype=object, na_value="nan")
    values[missing.to_numpy()] = "nan"
    try:
        # numpy parses text like float(): correctly rounded, so CSV round trips are exact
        return np.asarray(values.astype(str), dtype=np.float64)
    except (ValueError, TypeError):
        numbers = pd.to_numeric(text, errors="coerce")
        bad = (numbers.isna() & ~missing).to_numpy()
        shown = [
            f"{v!r} ({t} {d})".replace(" 00:00:00", "")
            for v, t, d in zip(raw[bad][:_SHOW], frame["tic"][bad][:_SHOW], frame["date"][bad][:_SHOW], strict=True)
        ]
        listed = shown_list(shown, _SHOW, noun="rows", total=int(bad.sum()))
        raise UserError(f"non-numeric values in column {name!r}: {listed}") from None


def standardize_frame(df: pd.DataFrame, *, use_adjusted: bool = False) -> pd.DataFrame:
    """Any accepted long frame (a (date, tic) index too) -> canonical columns date, tic, open, high, low, close,
    volume [, adj_close], dates datetime64[ns] at midnight, every row validated (`UserError`; no gap check: that needs
    the whole panel, `MarketData.from_frame`), sorted by (date, tic). The frame carries ``attrs["close_only"]``,
    ``attrs["adjusted"]`` (OHLC rescaled by adj_close) and ``attrs["source_columns"]`` (canonical -> input name).
    """
    if not isinstance(df, pd.DataFrame):
        raise UserError(f"expected a pandas DataFrame of bars, got {type(df).__name__}")
    index_names = [n for n in df.index.names if n is not None]
    if index_names and any(str(n).strip().lower() in ALIASES["date"] + ALIASES["tic"] for n in index_names):
        df = df.reset_index()
    if len(df.columns) == 0 or len(df) == 0:
        raise UserError("no rows of market data (the input is empty)")
    mapping = _resolve_columns(list(df.columns))
    missing = [c for c in ("date", "tic", "close") if c not in mapping]
    if missing:
        raise UserError(
            f"missing columns {', '.join(missing)}; have {', '.join(map(str, df.columns))}; "
            "need date, tic, open, high, low, close, volume (or close-only: date, tic, close)"
        )
    ohl_present = [c for c in ("open", "high", "low") if c in mapping]
    if ohl_present and len(ohl_present) < 3:
        absent = [c for c in ("open", "high", "low") if c not in mapping]
        raise UserError(
            f"missing columns {', '.join(absent)} (have {', '.join(ohl_present)}); give all of open, high, low "
            "or none of them (close-only)"
        )
    if use_adjusted and "adj_close" not in mapping:
        raise UserError("use_adjusted=True but there is no adjusted-close column (adjusted / adj_close)")

    tic_raw = df[mapping["tic"]]
    if tic_raw.isna().any():
        raise UserError(f"missing ticker symbols in column {mapping['tic']!r} ({int(tic_raw.isna().sum())} rows)")
    tics = tic_raw.astype(str).str.strip()
    if (tics == "").any():
        raise UserError(f"empty ticker symbols in column {mapping['tic']!r} ({int((tics == '').sum())} rows)")
    dates, had_times = _parse_dates(df[mapping["date"]].reset_index(drop=True), tics.reset_index(drop=True))
    out = pd.DataFrame({"date": dates, "tic": tics.reset_index(drop=True).to_numpy(dtype=object)})
    out["tic"] = out["tic"].astype(str)
    close_only = not ohl_present
    for col in PRICE_COLUMNS:
        src = mapping.get(col, mapping["close"])
        out[col] = _parse_numbers(df[src].reset_index(drop=True), col, out)
    if "volume" in mapping:
        out["volume"] = _parse_numbers(df[mapping["volume"]].reset_index(drop=True), "volume", out)
    else:
        out["volume"] = 0.0
    if "adj_close" in mapping:
        adj = _parse_numbers(df[mapping["adj_close"]].reset_index(drop=True), "adj_close", out)
        bad = ~np.isfinite(adj) | (adj <= 0)
        if bad.any():
            raise UserError(f"NaN, inf or non-positive adjusted close at {_rows(out, bad)}")
        if use_adjusted:
            factor = adj / out["close"].to_numpy()
            for col in PRICE_COLUMNS:
                out[col] = out[col].to_numpy() * factor
        else:  # kept: MarketData.from_frame reads the dividends it implies
            out["adj_close"] = adj

    features, unreadable = _feature_columns(df, mapping, out)

    for col in PRICE_COLUMNS:
        values = out[col].to_numpy()
        if np.isnan(values).any():
            raise UserError(f"missing (NaN) {col} prices at {_rows(out, np.isnan(values))}")
        if np.isinf(values).any():
            raise UserError(f"infinite {col} prices at {_rows(out, np.isinf(values))}")
        if (values <= 0).any():
            raise UserError(f"non-positive {col} prices at {_rows(out, values <= 0)}")
    vol = out["volume"].to_numpy()
    if not np.isfinite(vol).all():
        raise UserError(f"missing (NaN) or infinite volume at {_rows(out, ~np.isfinite(vol))}")
    if (vol < 0).any():
        raise UserError(f"negative volume at {_rows(out, vol < 0)}")
    high, low = out["high"].to_numpy(), out["low"].to_numpy()
    if (high < low).any():
        raise UserError(f"high below low at {_rows(out, high < low)}")

    out = out.sort_values(["date", "tic"], kind="mergesort").reset_index(drop=True)
    dup = out.duplicated(["date", "tic"], keep=False).to_numpy()
    if dup.any():
        first = out.loc[dup].drop_duplicates(["date", "tic"])
        hint = " (intraday bars? MarketData holds one bar per ticker per day)" if had_times else ""
        raise UserError(f"duplicate (date, tic) rows: {_rows(first, np.ones(len(first), bool))}{hint}")
    if not close_only:
        # bars written by to_frame() from close-only data come back close-only
        o, c = out["open"].to_numpy(), out["close"].to_numpy()
        close_only = bool(np.array_equal(o, c) and np.array_equal(high, c) and np.array_equal(low, c))
    out.attrs["close_only"] = close_only
    out.attrs["source_columns"] = {k: str(v) for k, v in mapping.items()}
    out.attrs["adjusted"] = bool(use_adjusted)
    out.attrs["feature_columns"] = features
    out.attrs["unreadable_columns"] = unreadable
    return out


def _feature_columns(df: pd.DataFrame, mapping: dict[str, str], out: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """Copy every further column of ``df`` (beyond those ``mapping`` gives the bars) that reads as numbers into
    ``out`` under its stripped name, NaN where a value is missing: the data's feature columns (``--indicators
    col:NAME``, docs/data.md "Feature columns"). Returns their names and, for the columns that do not read as numbers,
    why (said only where a run names one: a text column such as a sector is no error otherwise)."""
    used = set(map(str, mapping.values()))
    features: list[str] = []
    unreadable: dict[str, str] = dict(df.attrs.get("unreadable_columns", {}))
    for col in df.columns:
        name = str(col).strip()
        if str(col) in used or not name or name in out.columns:
            continue
        try:
            out[name] = _parse_numbers(df[col].reset_index(drop=True), name, out)
            features.append(name)
        except UserError as err:
            unreadable[name] = str(err)
    return features, unreadable


def coverage_gaps(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per ticker of a `standardize_frame` frame, the dates (datetime64[ns]) present for some ticker but missing for
    it; only gappy tickers."""
    all_dates = np.unique(frame["date"].to_numpy())
    gaps: dict[str, np.ndarray] = {}
    for tic, dates in frame.groupby("tic", sort=True)["date"]:
        missing = np.setdiff1d(all_dates, dates.to_numpy(), assume_unique=True)
        if len(missing):
            gaps[str(tic)] = missing
    return gaps


def _describe_gaps(gaps: dict[str, np.ndarray], num_dates: int) -> str:
    parts = [
        f"{tic} misses {len(m)} of {num_dates} dates ({shown_list([pd.Timestamp(v).date() for v in m], 3)})"
        for tic, m in gaps.items()
    ]
    return shown_list(parts, _SHOW, noun="tickers", sep="; ")


def _pivot(frame: pd.DataFrame, col: str, dates: pd.DatetimeIndex, tickers: list[str]) -> np.ndarray:
    wide = frame.pivot(index="date", columns="tic", values=col)
    return wide.reindex(index=dates, columns=tickers).to_numpy(dtype=np.float64)


@dataclass(frozen=True, eq=False)
class MarketData:
    """D trading days x N tickers, aligned. Prices in dollars, volume in shares.

    Treat as immutable: methods return new objects and never write into the arrays.
    Compare two with :meth:`equals` (``==`` is identity, the fields are arrays).
    """

    dates: np.ndarray  # [D] datetime64[ns], strictly increasing
    tickers: tuple[str, ...]  # [N]
    open: np.ndarray  # [D, N] float64, dollars
    high: np.ndarray  # [D, N] float64, dollars
    low: np.ndarray  # [D, N] float64, dollars
    close: np.ndarray  # [D, N] float64, dollars
    volume: np.ndarray  # [D, N] float64, shares
    close_only: bool = False  # True when open/high/low were filled from close
    dividends: np.ndarray | None = None  # [D, N] float64 dollars per share paid on day t (zeros when None)
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [D, N] float64, the file's further
    # numeric columns (NaN where missing), the values of date t known at t's close: `envs.features.feature_column`
    unreadable_columns: dict[str, str] = field(default_factory=dict)  # name -> why it does not read as numbers

    def __post_init__(self) -> None:
        dates = np.asarray(self.dates).astype("datetime64[ns]")
        object.__setattr__(self, "dates", dates)
        object.__setattr__(self, "tickers", tuple(str(t) for t in self.tickers))
        shape = (len(dates), len(self.tickers))
        if self.dividends is None:
            object.__setattr__(self, "dividends", np.zeros(shape))
        for name in ARRAYS:
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(f"MarketData.{name} has shape {arr.shape}, expected {shape} (days, tickers)")
            object.__setattr__(self, name, arr)
        columns = {str(k): np.asarray(v, dtype=np.float64) for k, v in self.columns.items()}
        for name, arr in columns.items():
            if arr.shape != shape:
                raise ValueError(f"MarketData column {name!r} has shape {arr.shape}, expected {shape} (days, tickers)")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "unreadable_columns", dict(self.unreadable_columns))
        if len(dates) > 1 and not (np.diff(dates.astype(np.int64)) > 0).all():
            raise ValueError("MarketData.dates must be strictly increasing")
        if len(set(self.tickers)) != len(self.tickers):
            raise ValueError("MarketData.tickers must be unique")

    @property
    def num_days(self) -> int:
        """D, the number of trading days."""
        return int(self.dates.shape[0])

    @property
    def num_tickers(self) -> int:
        """N, the number of tickers."""
        return len(self.tickers)

    @classmethod
    def from_frame(
        cls,
        df: pd.DataFrame,
        *,
        gap_policy: str = "fail",
        max_ffill_days: int = 5,
        use_adjusted: bool = False,
        max_price_ratio: float = MAX_PRICE_RATIO,
    ) -> MarketData:
        """Long frame (FinRL format or an accepted alias) -> aligned MarketData.

        :param gap_policy: "fail" | "intersect" | "ffill" for tickers that miss some dates.
        :param max_ffill_days: longest run of consecutive missing days "ffill" fills per ticker.
        :param max_price_ratio: refuse a close beyond this multiple of the previous one, up or down (0: allow any).
        :raises UserError: invalid rows, gaps under "fail", nothing left after "intersect", an implausible jump.
        """
        if gap_policy not in GAP_POLICIES:
            raise UserError(f"unknown gap_policy {gap_policy!r}; choose one of {', '.join(GAP_POLICIES)}")
        if isinstance(max_ffill_days, bool) or not isinstance(max_ffill_days, int | np.integer) or max_ffill_days < 0:
            raise UserError(f"max_ffill_days must be a whole number >= 0, got {max_ffill_days!r}")
        frame = standardize_frame(df, use_adjusted=use_adjusted)
        tickers = sorted(frame["tic"].unique().tolist())
        dates = pd.DatetimeIndex(np.unique(frame["date"].to_numpy()))
        gaps = coverage_gaps(frame)
        if gaps and gap_policy == "fail":
            raise UserError(
                f"tickers do not cover the same dates: {_describe_gaps(gaps, len(dates))}; "
                "use gap_policy 'intersect' (keep common dates) or 'ffill' (fill short gaps)"
            )
        if gaps and gap_policy == "intersect":
            counts = frame.groupby("date")["tic"].size()
            dates = pd.DatetimeIndex(counts.index[counts.to_numpy() == len(tickers)])
            if len(dates) == 0:
                raise UserError(
                    f"the {len(tickers)} tickers share no common date; gap_policy 'intersect' leaves nothing"
                )
        columns = (*COLUMNS[2:], *(("adj_close",) if "adj_close" in frame else ()))
        arrays = {c: _pivot(frame, c, dates, tickers) for c in columns}
        features = {name: _pivot(frame, name, dates, tickers) for name in frame.attrs.get("feature_columns", [])}
        if gaps and gap_policy == "ffill":
            arrays = _forward_fill(arrays, dates, tickers, max_ffill_days)
        if gap_policy == "ffill":
            features = {name: _fill_column(name, v, max_ffill_days) for name, v in features.items()}
        check_price_jumps(arrays["close"], dates, tickers, max_price_ratio)
        adj = arrays.pop("adj_close", None)
        return cls(
            dates=dates.to_numpy(dtype="datetime64[ns]"),
            tickers=tuple(tickers),
            close_only=bool(frame.attrs["close_only"]),
            dividends=None if adj is None else implied_dividends(arrays["close"], adj, dates, tickers),
            columns=features,
            unreadable_columns=frame.attrs.get("unreadable_columns", {}),
            **arrays,
        )

    @classmethod
    def from_path(cls, path: str | Path, **kw: Any) -> MarketData:
        """Read a long-format CSV or Parquet file, by extension (.csv, .csv.gz, .parquet, .pq; see :meth:`from_frame`
        for ``kw``)."""
        return cls.from_frame(read_frame(path), **kw)

    def to_frame(self) -> pd.DataFrame:
        """Long format: date, tic, open, high, low, close, volume, sorted by (date, tic); D*N rows. With dividends,
        an adj_close column too (the total-return series they imply, 1 on the first day), so they read back."""
        d, n = self.num_days, self.num_tickers
        columns = {
            "date": np.repeat(self.dates, n),
            "tic": np.tile(np.asarray(self.tickers, dtype=object), d),
            **{c: getattr(self, c).reshape(-1) for c in COLUMNS[2:]},
        }
        if self.dividends.any():
            growth = (self.close[1:] + self.dividends[1:]) / self.close[:-1]
            columns["adj_close"] = np.vstack([np.ones((1, n)), np.cumprod(growth, axis=0)]).reshape(-1)
        columns.update({name: values.reshape(-1) for name, values in self.columns.items()})
        return pd.DataFrame(columns)

    def to_path(self, path: str | Path) -> Path:
        """Write :meth:`to_frame` as CSV or Parquet by extension; creates parent folders. Returns the path."""
        path = Path(path)
        kind = _kind_of(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame = self.to_frame()
        if kind == "csv":
            frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d")).to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
        return path

    def slice_days(self, start: int, stop: int) -> MarketData:
        """Days [start, stop) as a new MarketData (copies)."""
        if not (0 <= start < stop <= self.num_days):
            raise UserError(f"day range [{start}, {stop}) is empty or outside 0..{self.num_days}")
        sl = slice(start, stop)
        columns = {name: v[sl].copy() for name, v in self.columns.items()}
        return replace(
            self, dates=self.dates[sl].copy(), columns=columns, **{k: getattr(self, k)[sl].copy() for k in ARRAYS}
        )

    def select_tickers(self, tickers: Iterable[str]) -> MarketData:
        """The given tickers, in the given order; UserError naming any unknown or repeated ticker."""
        wanted = [str(t).strip() for t in tickers]
        if not wanted:
            raise UserError("no tickers selected")
        index = {t: i for i, t in enumerate(self.tickers)}
        unknown = [t for t in wanted if t not in index]
        if unknown:
            raise UserError(
                f"unknown tickers {shown_list(unknown, _SHOW)}; the data has {shown_list(self.tickers, 10)}"
            )
        repeated = sorted({t for t in wanted if wanted.count(t) > 1})
        if repeated:
            raise UserError(f"tickers selected more than once: {', '.join(repeated)}")
        cols = [index[t] for t in wanted]
        arrays = {k: getattr(self, k)[:, cols] for k in ARRAYS}
        columns = {name: v[:, cols] for name, v in self.columns.items()}
        return replace(self, dates=self.dates.copy(), tickers=tuple(wanted), columns=columns, **arrays)

    def select_dates(self, start: str | None = None, end: str | None = None) -> MarketData:
        """Days with start <= date <= end (either bound optional); UserError when none remain."""
        keep = date_mask(self.dates, start, end)
        if not keep.any():
            raise UserError(
                f"no trading days between {start or 'the start'} and {end or 'the end'}; "
                f"the data covers {self.date_str(0)} .. {self.date_str(-1)}"
            )
        idx = np.flatnonzero(keep)
        return self.slice_days(int(idx[0]), int(idx[-1]) + 1)

    def date_str(self, day: int) -> str:
        """ISO date (YYYY-MM-DD) of day index ``day``."""
        return str(self.dates[day].astype("datetime64[D]"))

    def equals(self, other: MarketData, rtol: float = 0.0, atol: float = 0.0) -> bool:
        """Equality of dates, tickers and the close_only flag, and of all six arrays and the feature columns: bit for
        bit by default (NaN matching NaN in a column), or within ``rtol`` / ``atol`` (NaN matching NaN) where another
        machine's float rounding is not other data."""

        def same(x: np.ndarray, y: np.ndarray) -> bool:
            if not (rtol or atol):
                return bool(np.array_equal(x, y))
            return x.shape == y.shape and bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True))

        return (
            isinstance(other, MarketData)
            and self.tickers == other.tickers
            and self.close_only == other.close_only
            and np.array_equal(self.dates, other.dates)
            and all(same(getattr(self, c), getattr(other, c)) for c in ARRAYS)
            and self.columns.keys() == other.columns.keys()
            and all(
                bool(np.array_equal(v, other.columns[k], equal_nan=True))
                if not (rtol or atol)
                else same(v, other.columns[k])
                for k, v in self.columns.items()
            )
        )


def check_price_jumps(close: np.ndarray, dates: Any, tickers: Sequence[str], max_ratio: float) -> None:
    """UserError naming the first ticker and date whose close is beyond ``max_ratio`` x the previous close,
    or below 1 / ``max_ratio`` of it (a bad tick such as 1e300 among prices near 100); 0 checks nothing.

    :param close: ``[D, N]`` float64 dollars, aligned (> 0: validated before).
    """
    if not max_ratio:
        return
    if max_ratio <= 1:
        raise UserError(f"max_price_ratio must be > 1 (or 0 to allow any jump), got {max_ratio:g}")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = close[1:] / close[:-1]
    bad = ~((ratio <= max_ratio) & (ratio >= 1.0 / max_ratio))
    if not bad.any():
        return
    day, col = np.argwhere(bad)[0]
    when = pd.DatetimeIndex(np.asarray(dates))
    raise UserError(
        f"implausible price jump: {tickers[col]} closed at {close[day + 1, col]:.6g} on {when[day + 1].date()} after "
        f"{close[day, col]:.6g} on {when[day].date()} ({ratio[day, col]:.3g}x; {int(bad.sum())} such jump(s) in all); "
        f"fix the data, or allow it with --max_price_ratio 0 (any) or a larger bound than {max_ratio:g}"
    )


def _forward_fill(
    arrays: dict[str, np.ndarray], dates: pd.DatetimeIndex, tickers: list[str], max_days: int
) -> dict[str, np.ndarray]:
    """Fill missing bars with flat bars at the last close; refuse leading gaps and runs > max_days."""
    close = arrays["close"]
    missing = np.isnan(close)
    problems = []
    for j, tic in enumerate(tickers):
        col = missing[:, j]
        if not col.any():
            continue
        if col[0]:
            problems.append(f"{tic} has no bar before {dates[int(np.argmin(col))].date()} to fill from")
            continue
        # lengths of runs of consecutive missing days
        edges = np.diff(np.concatenate(([0], col.astype(np.int8), [0])))
        starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long = [(s, e) for s, e in zip(starts, stops, strict=True) if e - s > max_days]
        if long:
            s, e = long[0]
            problems.append(f"{tic} misses {e - s} days in a row from {dates[s].date()} (max_ffill_days={max_days})")
    if problems:
        raise UserError(f"cannot forward-fill: {'; '.join(problems[:_SHOW])}; use gap_policy 'intersect'")
    filled_close = pd.DataFrame(close).ffill().to_numpy()
    out = {name: np.where(missing, filled_close, arrays[name]) for name in PRICE_COLUMNS}
    out["volume"] = np.where(missing, 0.0, arrays["volume"])
    if "adj_close" in arrays:  # a filled day pays nothing: both series stay flat
        out["adj_close"] = pd.DataFrame(arrays["adj_close"]).ffill().to_numpy()
    return out


def _fill_column(name: str, values: np.ndarray, max_days: int) -> np.ndarray:
    """``values`` [D, N] of feature column ``name`` with each run of at most ``max_days`` missing days after a value
    filled with that value (``gap_policy="ffill"``), saying so in a warning; leading and longer runs stay NaN (a run
    that names the column is refused: `envs.features.feature_column`)."""
    missing = np.isnan(values)
    if not missing.any():
        return values
    out = values.copy()
    for j in np.flatnonzero(missing.any(axis=0)):
        edges = np.diff(np.concatenate(([0], missing[:, j].astype(np.int8), [0])))
        for start, stop in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            if start > 0 and stop - start <= max_days:
                out[start:stop, j] = values[start - 1, j]
    count = int(missing.sum() - np.isnan(out).sum())
    if count:
        warnings.warn(
            f"--gap_policy ffill: filled {count} missing value(s) of column {name!r} with the previous day's value "
            f"(runs of at most {max_days} days)",
            stacklevel=4,
        )
    return out


DIVIDEND_NOISE = 1e-4
"""An implied dividend within this fraction of the previous close is rounding in the adjusted close: zero."""
MAX_DIVIDEND_YIELD = 0.25
"""An implied payout beyond this fraction of the price is a split the close column does not reflect."""


def implied_dividends(close: np.ndarray, adj: np.ndarray, dates: Any, tickers: Sequence[str]) -> np.ndarray:
    """The dividends per share ``[D, N]`` (dollars, paid on day t to holders of day t-1's close) that make the
    close-to-close returns of ``close`` equal those of the adjusted closes ``adj``: ``close_{t-1} x adj_t /
    adj_{t-1} - close_t`` (module docstring); UserError naming the first implausible one."""
    if not (np.isfinite(adj).all() and (adj > 0).all()):
        raise UserError("the adjusted-close column has missing, infinite or non-positive values")
    out = np.zeros_like(close)
    prev = close[:-1]
    out[1:] = prev * adj[1:] / adj[:-1] - close[1:]
    yield_ = out / np.vstack([close[:1], prev])
    bad = np.abs(yield_) > MAX_DIVIDEND_YIELD
    if bad.any():
        day, col = (int(x[0]) for x in np.nonzero(bad))
        raise UserError(
            f"the adjusted close implies a {yield_[day, col]:+.0%} payout on {tickers[col]} "
            f"{pd.Timestamp(dates[day]).date()}: the close column looks split-unadjusted; give split-adjusted "
            "closes, or drop the adjusted column"
        )
    out[np.abs(yield_) < DIVIDEND_NOISE] = 0.0
    return np.clip(out, 0.0, None)


def parse_date(value: Any, what: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError):
        ts = pd.NaT
    if pd.isna(ts):
        raise UserError(f"{what} date {value!r} is not a date (use YYYY-MM-DD)")
    if ts.tzinfo is not None:
        ts = ts.tz_localize(None)
    return ts.normalize()


def date_mask(dates: np.ndarray, start: str | None, end: str | None) -> np.ndarray:
    """``[n]`` bool: which of ``dates`` (``[n]`` datetime64[ns]) fall within start <= date <= end, inclusive ISO dates
    (either optional); UserError for a bound that is not a date or a start after the end."""
    lo = parse_date(start, "start") if start is not None else None
    hi = parse_date(end, "end") if end is not None else None
    if lo is not None and hi is not None and lo > hi:
        raise UserError(f"start {lo.date()} is after end {hi.date()}")
    keep = np.ones(len(dates), dtype=bool)
    if lo is not None:
        keep &= dates >= lo.to_datetime64()
    if hi is not None:
        keep &= dates <= hi.to_datetime64()
    return keep


def _kind_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz", ".csv.zip", ".csv.bz2", ".csv.xz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise UserError(f"cannot tell the format of {path}: use a .csv or .parquet file name")


def read_frame(path: str | Path, kind: str | None = None) -> pd.DataFrame:
    """Raw long frame from a CSV or Parquet file, ticker symbols kept as text (e.g. "NA", "TRUE").

    :param kind: "csv" | "parquet"; by extension when None.
    :raises UserError: missing, empty or unreadable file.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"data file not found: {path}")
    if path.is_dir():
        raise UserError(f"data path is a folder, not a file: {path}")
    kind = kind or _kind_of(path)
    if kind == "parquet":
        try:
            return pd.read_parquet(path)
        except Exception as err:  # pyarrow raises many types for a corrupt file
            raise UserError(f"cannot read Parquet file {path}: {first_line(err, 200)}") from None
    try:
        header = pd.read_csv(path, nrows=0)
    except pd.errors.EmptyDataError:
        raise UserError(f"data file is empty: {path}") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as err:
        raise UserError(f"cannot read CSV file {path}: {first_line(err, 200)}") from None
    tic_cols = [c for c in header.columns if str(c).strip().lower() in ALIASES["tic"]]
    na_values = {c: _NA_STRINGS for c in header.columns if c not in tic_cols}
    try:
        return pd.read_csv(
            path, dtype={c: str for c in tic_cols}, keep_default_na=False, na_values=na_values, **_ROUND_TRIP
        )
    except (UnicodeDecodeError, pd.errors.ParserError, ValueError) as err:
        raise UserError(f"cannot read CSV file {path}: {first_line(err, 200)}") from None


@dataclass(frozen=True)
class DayRange:
    """Half-open range of day indices [start, stop) into MarketData; lookback days precede start."""

    start: int
    stop: int

    @property
    def num_days(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Splits:
    """Train / validation / test day ranges, in this order, never overlapping."""

    train: DayRange
    validation: DayRange | None
    test: DayRange | None

    def as_dict(self) -> dict[str, DayRange | None]:
        return {"train": self.train, "validation": self.validation, "test": self.test}


MIN_SPLIT_DAYS = 2


def require_days(data: MarketData, window: int, min_days: int = MIN_SPLIT_DAYS) -> None:
    """UserError unless data has the window's lookback (window - 1 days) plus ``min_days`` trading days."""
    if isinstance(window, bool) or not isinstance(window, int | np.integer) or window < 1:
        raise UserError(f"window must be a whole number >= 1, got {window!r}")
    need = window - 1 + min_days
    if data.num_days < need:
        raise UserError(
            f"too few trading days: the data has {data.num_days}, a window of {window} needs at least {need} "
            f"({window - 1} lookback + {min_days})"
        )


def split_days(
    data: MarketData,
    *,
    window: int,
    train_end: str | None = None,
    validation_end: str | None = None,
    test_end: str | None = None,
    fractions: tuple[float, float, float] | None = None,
) -> Splits:
    """Split the days into train / validation / test.

    By dates: a split ends at and includes its date (a non-trading date means the last trading day before it); the next
    split starts the trading day after. ``train_end`` is required in date mode; validation exists only when
    ``validation_end`` is given; test runs to ``test_end``, or to the last day when ``test_end`` is None (and is None if
    no day remains).

    By fractions (default (0.7, 0.15, 0.15) when no dates): of the usable days [window-1, D); a zero
    fraction gives None for validation/test; fractions summing to less than 1 leave the last days unused.

    Train starts at day index window-1, so its first window has its lookback. Validation/test windows look
    back into the previous split's days; no split ever contains a day after its stop.

    :raises UserError: too few days, a split under 2 days, dates out of range or out of order,
        or dates and fractions together."""
    require_days(data, window)
    first = window - 1
    d = data.num_days
    dates_given = any(v is not None for v in (train_end, validation_end, test_end))
    if dates_given and fractions is not None:
        raise UserError("give split dates or split fractions, not both")
    if dates_given:
        if train_end is None:
            raise UserError("train_end is required when splitting by dates")
        names = ("train_end", "validation_end", "test_end")
        given = [(n, v) for n, v in zip(names, (train_end, validation_end, test_end), strict=True) if v is not None]
        stops = []
        for name, value in given:
            ts = parse_date(value, name)
            lo, hi = pd.Timestamp(data.dates[first]), pd.Timestamp(data.dates[-1])
            if ts < lo or ts > hi:
                raise UserError(
                    f"{name} {ts.date()} is outside the usable dates {lo.date()} .. {hi.date()} "
                    f"(the first {first} days are the window's lookback)"
                )
            stops.append(int(np.searchsorted(data.dates, ts.to_datetime64(), side="right")))
        for (n1, v1), (n2, v2), s1, s2 in zip(given, given[1:], stops, stops[1:], strict=False):
            if s2 <= s1:
                raise UserError(f"{n2} {v2} must be after {n1} {v1} (by at least one trading day)")
        bounds = dict(zip([n for n, _ in given], stops, strict=True))
        train = DayRange(first, bounds["train_end"])
        validation = DayRange(train.stop, bounds["validation_end"]) if "validation_end" in bounds else None
        prev = validation.stop if validation else train.stop
        test_stop = bounds.get("test_end", d)
        test = DayRange(prev, test_stop) if test_stop > prev else None
    else:
        fr = (0.7, 0.15, 0.15) if fractions is None else tuple(float(f) for f in fractions)
        if len(fr) != 3 or any(not np.isfinite(f) or f < 0 for f in fr) or fr[0] <= 0:
            raise UserError(f"split fractions must be three numbers >= 0 with train > 0, got {fractions!r}")
        total = sum(fr)
        if total > 1 + 1e-9:
            raise UserError(f"split fractions add up to {total:g}, more than 1")
        usable = d - first
        b = [first + int(round(c * usable)) for c in np.cumsum(fr)]
        if abs(total - 1) <= 1e-9:
            b[2] = d
        train = DayRange(first, b[0])
        validation = DayRange(b[0], b[1]) if fr[1] > 0 else None
        test = DayRange(b[1], b[2]) if fr[2] > 0 else None
    splits = Splits(train, validation, test)
    for name, r in splits.as_dict().items():
        if r is not None and r.num_days < MIN_SPLIT_DAYS:
            raise UserError(
                f"the {name} split has {r.num_days} trading day(s), needs at least {MIN_SPLIT_DAYS} "
                f"({data.num_days} days in the data, window {window})"
            )
    return splits


def columns_from_file(path: str | Path, names: Sequence[str], data: MarketData) -> MarketData:
    """``data`` with the feature columns ``names`` taken from the long file ``path`` (date, tic and the columns; bars
    are not needed) by date and ticker: what `clstm-ppo trade --features` adds to Alpaca's bars, which hold none. A
    day or ticker the file lacks is missing (NaN), and `envs.features.feature_column` names it where a run reads it.

    :raises UserError: an unreadable file, no date or tic column, or a column of ``names`` it lacks (one line naming
        it), or one that does not read as numbers.
    """
    frame = read_frame(path)
    mapping = _resolve_columns(list(frame.columns))
    if "date" not in mapping or "tic" not in mapping:
        raise UserError(
            f"{path}: needs date and tic columns beside the feature columns (has {', '.join(map(str, frame.columns))})"
        )
    by_name = {str(c).strip(): c for c in frame.columns}
    lacking = [n for n in names if n not in by_name]
    if lacking:
        raise UserError(f"{path} has no column {', '.join(map(repr, lacking))}, which the policy reads (col:NAME)")
    tics = frame[mapping["tic"]].astype(str).str.strip().reset_index(drop=True)
    dates, _ = _parse_dates(frame[mapping["date"]].reset_index(drop=True), tics)
    long = pd.DataFrame({"date": dates, "tic": tics})
    for name in names:
        long[name] = _parse_numbers(frame[by_name[name]].reset_index(drop=True), name, long)
    repeated = long.duplicated(["date", "tic"], keep=False).to_numpy()
    if repeated.any():
        raise UserError(f"{path}: duplicate (date, tic) rows: {_rows(long, repeated)}; keep one value per day")
    index = pd.DatetimeIndex(data.dates)
    added = {name: _pivot(long, name, index, list(data.tickers)) for name in names}
    return replace(data, columns={**data.columns, **added})
