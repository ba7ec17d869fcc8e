"""Historical stock bars from Alpaca's market-data API, as a long DataFrame, cached on disk (docs/data.md, "Alpaca").

`fetch_bars` asks alpaca-py's `StockHistoricalDataClient` for `/v2/stocks/bars` (alpaca-py follows `next_page_token`
itself, so multi-page, multi-symbol answers arrive whole) and returns FinRL's long format, one row per (date, tic).

Keys (``ALPACA_API_KEY`` / ``ALPACA_SECRET_KEY``, or alpaca's ``APCA_API_KEY_ID`` / ``APCA_API_SECRET_KEY``) come
from the environment or ``./.env`` and are sent only as request headers: they never appear in messages, logs, cache
files or cache names. The cache holds one Parquet file per request, named by a hash of what changes the answer
(`cache_path`) and written atomically; an unreadable one is downloaded again (a note on stderr), and a range that
has not ended yet (end date today or later) is not cached, since its last bars are still to come.

Dates: ``start``/``end`` are calendar dates in the exchange's time zone (America/New_York), both
inclusive. Daily (and weekly/monthly) bars are dated by their trading day, tz-naive at midnight; intraday
bars carry their exchange-local (New York) start time, tz-naive.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from envs.atomic import atomic_write
from envs.data import COLUMNS
from envs.errors import UserError, first_line
from envs.source_spec import ALPACA_OPTIONS

EXCHANGE_TZ = "America/New_York"
DEFAULT_DATA_URL = "https://data.alpaca.markets"
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_WAIT_SECONDS = 3.0
DEFAULT_TIMEOUT_SECONDS = 30.0  # per HTTP request; alpaca-py itself sets none, so a silent server hung forever
# Bumped when the cached frame's layout changes, so old files are simply not found.
CACHE_FORMAT = 1

KEY_VARS = ("ALPACA_API_KEY", "APCA_API_KEY_ID")
SECRET_VARS = ("ALPACA_SECRET_KEY", "APCA_API_SECRET_KEY")
URL_VAR = "ALPACA_DATA_URL"
RETRIES_VAR = "ALPACA_MAX_RETRIES"
RETRY_WAIT_VAR = "ALPACA_RETRY_WAIT_SECONDS"
TIMEOUT_VAR = "ALPACA_TIMEOUT_SECONDS"

_TIMEFRAME_ALIASES = {  # alpaca-py's TimeFrameUnit name: the unit words a --timeframe may use (lower case)
    "Min": ("min", "mins", "minute", "minutes", "t"),
    "Hour": ("h", "hour", "hours"),
    "Day": ("d", "day", "days"),
    "Week": ("w", "week", "weeks"),
    "Month": ("m", "mo", "month", "months"),
}
_TIMEFRAME_UNITS = {word: unit for unit, words in _TIMEFRAME_ALIASES.items() for word in words}


@dataclass(frozen=True)
class Credentials:
    """An API key pair. ``repr`` hides both so a stray print or traceback cannot show them."""

    key: str
    secret: str

    def __repr__(self) -> str:
        return "Credentials(key=***, secret=***)"


def read_settings(names: Iterable[str]) -> dict[str, str]:
    """Values of ``names`` from the environment, else from ``./.env``; empty counts as unset.

    The `.env` file is read, not loaded into ``os.environ``: same precedence as ``load_dotenv(override=False)``, without
    handing the keys to every child process. Only the working directory is searched (as `clstm-ppo doctor` does), so an
    unrelated `.env` in a parent folder is never picked up.
    """
    from dotenv import dotenv_values

    path = Path(".env")
    file_values = dotenv_values(path) if path.is_file() else {}
    return {name: value for name in names if (value := (os.environ.get(name) or file_values.get(name) or "").strip())}


def load_credentials() -> Credentials:
    """The Alpaca key pair from ALPACA_* (preferred) or APCA_* variables; UserError naming what is missing."""
    found = read_settings(KEY_VARS + SECRET_VARS)
    key = next((found[n] for n in KEY_VARS if n in found), None)
    secret = next((found[n] for n in SECRET_VARS if n in found), None)
    if key and secret:
        return Credentials(key, secret)
    missing = [f"{a} (or {b})" for (a, b), v in ((KEY_VARS, key), (SECRET_VARS, secret)) if not v]
    raise UserError(
        f"Alpaca API keys not found: set {' and '.join(missing)} in the environment or in a .env file "
        "in the working directory (see .env.example)"
    )


def resolve_data_url(data_url: str | None = None) -> str:
    """The market-data base URL: ``data_url``, else ALPACA_DATA_URL, else Alpaca's; no trailing /v2."""
    url = (data_url or read_settings([URL_VAR]).get(URL_VAR) or DEFAULT_DATA_URL).strip().rstrip("/")
    # alpaca-py appends "/v2/stocks/bars" itself; accept a URL copied with the version on it.
    url = re.sub(r"/v2$", "", url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"Alpaca data URL {redact_url(url)!r} is not an http(s) URL like {DEFAULT_DATA_URL}")
    return url


def redact_url(url: str) -> str:
    """``url`` without user:password and query string, safe to show in a message."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "<unparseable URL>"


def retry_settings(
    max_retries: int | None, retry_wait_seconds: float | None, timeout_seconds: float | None = None
) -> tuple[int, float, float]:
    """(retries, first retry wait s, per-request timeout s) from the arguments, else the environment."""
    env = read_settings([RETRIES_VAR, RETRY_WAIT_VAR, TIMEOUT_VAR])

    def pick(given: float | None, var: str, default: float) -> float | str:
        return given if given is not None else env.get(var, default)

    try:
        retries = int(pick(max_retries, RETRIES_VAR, DEFAULT_MAX_RETRIES))
        wait = float(pick(retry_wait_seconds, RETRY_WAIT_VAR, DEFAULT_RETRY_WAIT_SECONDS))
        timeout = float(pick(timeout_seconds, TIMEOUT_VAR, DEFAULT_TIMEOUT_SECONDS))
    except ValueError as err:
        raise UserError(
            f"{RETRIES_VAR} must be an integer, {RETRY_WAIT_VAR} and {TIMEOUT_VAR} numbers of seconds"
        ) from err
    if retries < 0 or wait < 0:
        raise UserError(f"{RETRIES_VAR} and {RETRY_WAIT_VAR} must be >= 0")
    if not timeout > 0:
        raise UserError(f"{TIMEOUT_VAR} must be > 0 seconds, got {timeout:g}")
    return retries, wait, timeout


def parse_timeframe(text: str) -> Any:
    """ "1Day", "1D", "day", "1Hour", "15Min", "1Week", "1Month" -> alpaca-py ``TimeFrame``."""
    from alpaca.data.timeframe import TimeFrame, TimeFrameUnit

    match = re.fullmatch(r"\s*(\d*)\s*([A-Za-z]+)\s*", str(text))
    unit = _TIMEFRAME_UNITS.get(match.group(2).lower()) if match else None
    if unit is None:
        raise UserError(f"timeframe {text!r} not understood; use e.g. 1Day, 1Hour, 15Min, 1Week, 1Month")
    amount = int(match.group(1) or 1)
    try:
        return TimeFrame(amount, TimeFrameUnit(unit))
    except ValueError as err:
        raise UserError(f"timeframe {text!r} is not allowed by Alpaca: {err}") from None


def _parse_day(text: str, what: str) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError):
        stamp = pd.NaT
    if stamp is pd.NaT:
        raise UserError(f"{what} date {text!r} is not a date like 2015-01-01")
    return stamp


def _request_window(start: str, end: str) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[start 00:00, end 24:00) New York time as UTC instants; both calendar days included.

    A daily bar is stamped at midnight New York (04:00/05:00 UTC), so an end of "2024-12-31" read as
    midnight UTC would silently drop the last day.
    """
    first = _parse_day(start, "start")
    last = _parse_day(end, "end")
    if first.tzinfo is None:
        first = first.tz_localize(EXCHANGE_TZ)
    if last.tzinfo is None:
        if last == last.normalize():
            last = last + pd.Timedelta(days=1) - pd.Timedelta(microseconds=1)
        last = last.tz_localize(EXCHANGE_TZ)
    if first > last:
        raise UserError(f"start {start} is after end {end}")
    return first.tz_convert("UTC"), last.tz_convert("UTC")


def _normalise_tickers(tickers: Sequence[str] | str) -> list[str]:
    if isinstance(tickers, str):
        tickers = tickers.split(",")
    out = sorted({t.strip().upper() for t in tickers if t and t.strip()})
    if not out:
        raise UserError("no tickers given; pass e.g. --tickers AAPL,MSFT")
    bad = [t for t in out if not re.fullmatch(r"[A-Z0-9.\-/]{1,12}", t)]
    if bad:
        raise UserError(f"not a ticker symbol: {', '.join(bad)}")
    return out


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    value = str(value).strip().lower()
    if value not in allowed:
        raise UserError(f"{what} {value!r} not supported; choose one of {', '.join(allowed)}")
    return value


def cache_path(
    cache_dir: str | Path, tickers: Sequence[str], start: str, end: str, timeframe: str, adjustment: str, feed: str
) -> Path:
    """Where the bars for this request live: ``<cache_dir>/bars_<timeframe>_<feed>_<adj>_<hash>.parquet``.

    The hash covers exactly what changes the answer; keys and the data URL are deliberately left out.
    """
    spec = {
        "format": CACHE_FORMAT,
        "tickers": sorted(tickers),
        "start": str(start),
        "end": str(end),
        "timeframe": timeframe,
        "adjustment": adjustment,
        "feed": feed,
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    return Path(cache_dir) / f"bars_{timeframe}_{feed}_{adjustment}_{digest}.parquet"


def _read_cache(path: Path, tickers: Sequence[str]) -> pd.DataFrame | None:
    """The cached frame, or None when absent or unusable (then the caller downloads again)."""
    if not path.exists():
        return None
    try:
        frame = pd.read_parquet(path)
        if tuple(frame.columns) != COLUMNS or set(frame["tic"].unique()) != set(tickers) or frame.empty:
            raise ValueError("unexpected columns or tickers")
        return _tidy(frame)
    except Exception as err:  # noqa: BLE001 -- any unreadable file is a miss, never a crash
        print(f"note: ignoring unreadable cache file {path} ({type(err).__name__}); downloading again", file=sys.stderr)
        return None


def _tidy(frame: pd.DataFrame) -> pd.DataFrame:
    """Column order, dtypes (date datetime64[ns], tic str, prices/volume float64), sorted by date, tic."""
    out = pd.DataFrame(
        {
            "date": pd.to_datetime(frame["date"]).astype("datetime64[ns]"),
            "tic": frame["tic"].astype(str),
            **{c: pd.to_numeric(frame[c]).astype("float64") for c in COLUMNS[2:]},
        }
    )
    return out.sort_values(["date", "tic"], kind="stable").reset_index(drop=True)


def _frame_from_raw(raw: Any, daily: bool) -> pd.DataFrame:
    """alpaca-py's raw answer ``{symbol: [{"t","o","h","l","c","v",...}, ...]}`` -> long frame.

    Raises ValueError/TypeError/KeyError on any shape it does not expect (reported as malformed).
    """
    if not isinstance(raw, dict):
        raise TypeError(f"bars is {type(raw).__name__}, not an object keyed by symbol")
    rows: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for symbol, bars in raw.items():
        if not isinstance(bars, list):
            raise TypeError("a symbol's bars are not a list")
        for bar in bars:
            rows["date"].append(bar["t"])
            rows["tic"].append(str(symbol))
            for col, key in (("open", "o"), ("high", "h"), ("low", "l"), ("close", "c"), ("volume", "v")):
                value = bar[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"bar field {key!r} is not a number")
                rows[col].append(value)
    frame = pd.DataFrame(rows)
    stamps = pd.to_datetime(frame["date"], utc=True, format="ISO8601").dt.tz_convert(EXCHANGE_TZ).dt.tz_localize(None)
    frame["date"] = stamps.dt.normalize() if daily else stamps
    if frame.duplicated(["date", "tic"]).any():
        raise ValueError("duplicate (date, symbol) bars")
    return _tidy(frame)


MAX_RETRY_WAIT_S = 60.0


def patient_client_class(base: type, wait: float, timeout: float) -> type:
    """``base`` (an alpaca-py REST client class: ``StockHistoricalDataClient``, ``TradingClient``) with a
    per-request timeout and exponential backoff: what alpaca-py 0.44 lacks, shared by downloads and trading.

    alpaca-py retries a request answered 429/504 after sleeping ``self._retry_wait``, up to ``self._retry`` times (set
    ``_retry`` on the instance: the clients do not forward ``retry_attempts``, and 0 there means "the default"). Here
    each read of that wait doubles it (wait, 2 x wait, 4 x wait, ..., at most MAX_RETRY_WAIT_S seconds). alpaca-py
    passes no timeout to requests, so a server that accepts and never answers would block forever; every request gets
    ``timeout`` seconds and then raises ``requests.exceptions.Timeout``.
    """

    class PatientClient(base):  # type: ignore[misc, valid-type]
        _waits_taken = 0

        @property
        def _retry_wait(self) -> float:
            seconds = min(wait * 2**self._waits_taken, MAX_RETRY_WAIT_S)
            self._waits_taken += 1
            return seconds

        @_retry_wait.setter
        def _retry_wait(self, _value: float) -> None:  # RESTClient.__init__ sets its default; ours wins
            pass

        def _one_request(self, method: str, url: str, opts: dict, retry: int) -> Any:
            return super()._one_request(method, url, {**opts, "timeout": timeout}, retry)

    PatientClient.__name__ = PatientClient.__qualname__ = f"Patient{base.__name__}"
    return PatientClient


def _api_error_message(err: Exception, url: str, retries: int) -> str:
    status = getattr(err, "status_code", None)
    detail = ""
    try:
        body = json.loads(str(err))
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            detail = body["message"][:200]
    except (ValueError, TypeError):
        detail = first_line(err, 200)
    where = redact_url(url)
    if status in (401, 403) and "subscription" not in detail.lower():
        return (
            f"Alpaca rejected the API keys (HTTP {status} from {where}); check ALPACA_API_KEY/"
            "ALPACA_SECRET_KEY (or APCA_API_KEY_ID/APCA_API_SECRET_KEY) and that they are "
            "market-data keys"
        )
    if status == 429:
        return (
            f"Alpaca rate limit (HTTP 429) still hit after {retries} retries from {where}; wait a minute "
            f"and run again (downloads already cached are reused)"
        )
    hint = f": {detail}" if detail else ""
    if status == 403:
        return f"Alpaca refused the request (HTTP 403){hint}; try --feed iex or an end date further back"
    return f"Alpaca data API answered HTTP {status} from {where}{hint}"


def _download(
    tickers: list[str],
    window: tuple[pd.Timestamp, pd.Timestamp],
    timeframe: Any,
    adjustment: str,
    feed: str,
    url: str,
    creds: Credentials,
    retries: int,
    wait: float,
    timeout: float,
) -> pd.DataFrame:
    import requests
    from alpaca.common.exceptions import APIError
    from alpaca.data.enums import Adjustment, DataFeed
    from alpaca.data.historical.stock import StockHistoricalDataClient
    from alpaca.data.requests import StockBarsRequest

    request = StockBarsRequest(
        symbol_or_symbols=tickers,
        timeframe=timeframe,
        start=window[0].to_pydatetime(),
        end=window[1].to_pydatetime(),
        adjustment=Adjustment(adjustment),
        feed=DataFeed(feed),
    )
    client = patient_client_class(StockHistoricalDataClient, wait, timeout)(
        creds.key, creds.secret, raw_data=True, url_override=url
    )
    client._retry = retries
    daily = timeframe.unit.value in ("Day", "Week", "Month")
    try:
        raw = client.get_stock_bars(request)
        return _frame_from_raw(raw if raw else {}, daily)
    except APIError as err:
        message = _api_error_message(err, url, retries)
        # A proxy could echo request headers into its error body; never pass the keys on.
        for secret in (creds.key, creds.secret):
            message = message.replace(secret, "***")
        raise UserError(message) from None
    except requests.exceptions.JSONDecodeError:
        raise UserError(
            f"malformed response from the Alpaca data API at {redact_url(url)} (not JSON); is the data URL right?"
        ) from None
    except requests.exceptions.ConnectionError:
        raise UserError(
            f"cannot connect to the Alpaca data API at {redact_url(url)} (no network, DNS failure or "
            f"connection refused); check the network or {URL_VAR}/--data_url"
        ) from None
    except requests.exceptions.Timeout:
        raise UserError(
            f"the Alpaca data API at {redact_url(url)} did not answer within {timeout:g} s "
            f"({TIMEOUT_VAR}); try again later"
        ) from None
    except requests.exceptions.RequestException as err:
        raise UserError(f"request to the Alpaca data API at {redact_url(url)} failed: {type(err).__name__}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        # JSON decode errors, alpaca-py's "does not match any known keys", and our own shape checks.
        raise UserError(
            f"malformed response from the Alpaca data API at {redact_url(url)} ({type(err).__name__}); "
            "is the data URL right?"
        ) from None


def fetch_bars(
    tickers: list[str],
    start: str,
    end: str,
    *,
    timeframe: str = "1Day",
    adjustment: str = "all",
    feed: str = "iex",
    cache_dir: str | Path = "data_cache/alpaca",
    refresh: bool = False,
    data_url: str | None = None,
    max_retries: int | None = None,
    retry_wait_seconds: float | None = None,
    timeout_seconds: float | None = None,
) -> pd.DataFrame:
    """Bars for ``tickers`` over [start, end] (New York calendar dates, inclusive), from cache or Alpaca.

    :param tickers: symbols, e.g. ["AAPL", "MSFT"] (case-insensitive; duplicates dropped).
    :param timeframe: "1Day" (default), "1Hour", "15Min", "1Week", "1Month", ...
    :param adjustment: corporate-action adjustment: raw | split | dividend | all.
    :param feed: iex (free plan) | sip (all US exchanges; paid plan for recent data).
    :param cache_dir: folder of Parquet files, one per distinct request.
    :param refresh: download even when a cached file exists, and replace it.
    :param data_url: endpoint override (else ALPACA_DATA_URL, else https://data.alpaca.markets).
    :param max_retries: retries of a page answered 429 (else ALPACA_MAX_RETRIES, else 3), the first after
        ``retry_wait_seconds`` (else ALPACA_RETRY_WAIT_SECONDS, else 3); a request with no answer after
        ``timeout_seconds`` (else ALPACA_TIMEOUT_SECONDS, else 30) fails.
    :returns: long frame, columns date (datetime64[ns], tz-naive), tic (str), open/high/low/close
        (float64, dollars), volume (float64, shares); sorted by date, tic.
    :raises UserError: missing/bad keys, unknown tickers (named), no bars in range, rate limit,
        no connection, malformed response, bad arguments.
    """
    symbols = _normalise_tickers(tickers)
    frame_spec = parse_timeframe(timeframe)
    adjustment = _choice(adjustment, ALPACA_OPTIONS["adjustment"], "adjustment")
    feed = _choice(feed, ALPACA_OPTIONS["feed"], "feed")
    window = _request_window(start, end)
    path = cache_path(cache_dir, symbols, start, end, frame_spec.value, adjustment, feed)

    if not refresh and (cached := _read_cache(path, symbols)) is not None:
        return cached

    creds = load_credentials()
    url = resolve_data_url(data_url)
    retries, wait, timeout = retry_settings(max_retries, retry_wait_seconds, timeout_seconds)
    frame = _download(symbols, window, frame_spec, adjustment, feed, url, creds, retries, wait, timeout)

    # Alpaca answers only for symbols asked for; a proxy might not, and extra columns would break alignment.
    frame = frame[frame["tic"].isin(symbols)].reset_index(drop=True)
    span = f"between {start} and {end} ({frame_spec.value}, feed {feed})"
    if frame.empty:
        raise UserError(
            f"Alpaca returned no bars at all for {', '.join(symbols)} {span}; "
            "check the dates (weekends/holidays, future) and the tickers"
        )
    missing = sorted(set(symbols) - set(frame["tic"].unique()))
    if missing:
        raise UserError(
            f"Alpaca returned no bars for {', '.join(missing)} {span}: unknown ticker, or not trading in that range"
        )
    if window[1] < pd.Timestamp.now(tz="UTC"):
        atomic_write(path, lambda handle: frame.to_parquet(handle, index=False))
    else:
        # The range is not over: today's bar is still forming and later bars will come, so a cache
        # file would freeze an incomplete answer under a name that says "complete".
        print(f"note: range ends {end}, not yet over; bars not cached", file=sys.stderr)
    return frame
