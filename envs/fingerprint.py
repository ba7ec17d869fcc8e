"""What identifies a loaded data set: `data_fingerprint` (exactly: a hash of its bits) and `market_witness` (the
closes of the first trading day of each month, compared to a relative tolerance). A checkpoint records both for a
synthetic market (`envs.sources.data_record`; `recorded_data_matches` reads them); the trials ledger
(`clstm_ppo.evaluation.ledger`) and the sealed hold-out (`clstm_ppo.evaluation.holdout`) use them too.

Both are independent of where the data came from and of the order of its tickers: the same file loaded twice, or
the same data written to CSV by pandas and read back, gives the same fingerprint; one more day, one ticker less or
one price changed gives another. Two loads of one market over different date ranges differ in fingerprint but agree
on the witness days they share, so a seal and the ledger recognise "the same market" by the witness, ticker by
ticker (synthetic markets all name their tickers SYN00, SYN01, ..., so names alone would confuse their draws). A
witness holds ``months x tickers`` floats (20 tickers over 7 years: 1,680 numbers, about 30 kB of JSON).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from envs.data import MarketData

_FIELDS = ("open", "high", "low", "close", "volume")


def data_fingerprint(data: MarketData) -> str:
    """``sha256`` (hex, first 20 characters) of the tickers in sorted order, the dates (day resolution) and the
    ``[D, N]`` OHLCV arrays with their columns in that ticker order (float64, little-endian bits), then each feature
    column (`MarketData.columns`, by name), so a file with a planted forecast is other data than its bars alone."""
    order = np.argsort(np.asarray(data.tickers, dtype=str), kind="stable")
    h = hashlib.sha256()
    h.update(("\n".join(data.tickers[i] for i in order) + "\n").encode())
    h.update(np.ascontiguousarray(np.asarray(data.dates).astype("datetime64[D]").astype("<i8")).tobytes())
    for name in _FIELDS:
        h.update(np.ascontiguousarray(np.asarray(getattr(data, name))[:, order].astype("<f8")).tobytes())
    for name in sorted(data.columns):  # a file's feature columns (none: the fingerprint of its bars alone)
        h.update(f"column {name}\n".encode())
        h.update(np.ascontiguousarray(data.columns[name][:, order].astype("<f8")).tobytes())
    return h.hexdigest()[:20]


WITNESS_RTOL = 1e-9
"""Relative tolerance of a witness close: float noise of a text round trip passes, a changed price does not."""


def market_witness(data: MarketData) -> dict[str, Any]:
    """The close of every ticker on the first trading day of each calendar month in ``data``.

    :return: ``{"dates": [M] "YYYY-MM-DD", "tickers": [N] (sorted), "close": [M][N] dollars}`` (JSON-able), and
        where the data has feature columns, ``"columns": {name: [M][N]}`` of their values on the same days.
    """
    days = np.asarray(data.dates).astype("datetime64[D]")
    months = days.astype("datetime64[M]")
    first = np.flatnonzero(np.r_[True, months[1:] != months[:-1]])  # first row of each month present
    order = np.argsort(np.asarray(data.tickers, dtype=str), kind="stable")
    witness: dict[str, Any] = {
        "dates": [str(d) for d in days[first]],
        "tickers": [data.tickers[i] for i in order],
        "close": np.asarray(data.close)[np.ix_(first, order)].tolist(),
    }
    if data.columns:  # ``{name: [M][N]}``, None where missing: a planted forecast makes another market
        witness["columns"] = {
            name: [[None if math.isnan(v) else v for v in row] for row in values[np.ix_(first, order)].tolist()]
            for name, values in sorted(data.columns.items())
        }
    return witness


def _shared_cells(a: dict[str, Any], b: dict[str, Any]) -> tuple[dict[str, int], dict[str, int], list[tuple[int, int]]]:
    """Where two witnesses' values meet: each witness's column of every ticker, and the row pairs ``(i, j)`` of the
    witness days both hold (``a``'s row i is ``b``'s row j)."""
    a_col = {t: i for i, t in enumerate(a["tickers"])}
    b_col = {t: i for i, t in enumerate(b["tickers"])}
    b_row = {d: i for i, d in enumerate(b["dates"])}
    return a_col, b_col, [(i, b_row[d]) for i, d in enumerate(a["dates"]) if d in b_row]


def agreeing_tickers(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Which tickers two witnesses (`market_witness`) show to be the same market.

    :return: ``(agree, differ)``: the tickers both witnesses hold that share at least one witness day and agree
        (to `WITNESS_RTOL`) on every shared one, and those that share a day but disagree on one. A ticker with no
        shared witness day is in neither: nothing tells whether it is the same market.
    """
    a_col, b_col, shared = _shared_cells(a, b)
    agree, differ = [], []
    if not shared:
        return agree, differ
    for ticker in sorted(a_col.keys() & b_col.keys()):
        same = all(
            math.isclose(a["close"][i][a_col[ticker]], b["close"][j][b_col[ticker]], rel_tol=WITNESS_RTOL)
            for i, j in shared
        )
        (agree if same else differ).append(ticker)
    return agree, differ


def same_columns(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Do two witnesses (`market_witness`) hold the same feature columns: the same names (none in a witness without
    ``"columns"``) and, on every witness day and ticker both hold, values equal to `WITNESS_RTOL` (missing matching
    missing)?"""
    a_columns, b_columns = a.get("columns", {}), b.get("columns", {})
    if a_columns.keys() != b_columns.keys():
        return False
    a_col, b_col, shared = _shared_cells(a, b)
    tickers = a_col.keys() & b_col.keys()
    for name, values in a_columns.items():
        for i, j in shared:
            for ticker in tickers:
                x, y = values[i][a_col[ticker]], b_columns[name][j][b_col[ticker]]
                if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=WITNESS_RTOL)):
                    return False
    return True


def recorded_data_matches(record: dict[str, Any], data: MarketData) -> bool:
    """Is ``data`` the data a checkpoint's ``record`` (`envs.sources.data_record`) was made from: the same fingerprint,
    or, where the record holds a witness, the same tickers and witness days with every witness close equal to
    `WITNESS_RTOL` (the same market generated again on a CPU whose numpy rounds exp's last bit differently, which
    changes the fingerprint and nothing a run computes beyond float noise)."""
    if data_fingerprint(data) == record["fingerprint"]:
        return True
    witness = record.get("witness")
    if witness is None:
        return False
    found = market_witness(data)
    if found["dates"] != witness["dates"] or found["tickers"] != witness["tickers"]:
        return False
    agree, _ = agreeing_tickers(witness, found)
    return len(agree) == len(witness["tickers"])


def same_bars(a: MarketData, b: MarketData) -> bool:
    """Whether two loads hold the same market up to float rounding: the same dates and tickers in the same order, the
    prices (open, high, low, close) equal to `WITNESS_RTOL` and the volumes (whole shares, rounded from a float) to
    one share. A price changed by 1e-6 of itself is another market."""
    if list(a.tickers) != list(b.tickers) or not np.array_equal(np.asarray(a.dates), np.asarray(b.dates)):
        return False
    prices = all(
        np.allclose(getattr(a, name), getattr(b, name), rtol=WITNESS_RTOL, atol=0.0)
        for name in ("open", "high", "low", "close")
    )
    return prices and np.allclose(a.volume, b.volume, rtol=0.0, atol=1.0)
