"""What identifies a market data set for the trials ledger and the sealed hold-out.

Two facts about loaded `envs.data.MarketData`, both independent of where it came from (a synthetic spec, a CSV, a
Parquet file, Alpaca) and of the order of its tickers:

* `data_fingerprint`: a hash of exactly what was loaded (tickers, dates, every open/high/low/close/volume as
  float64 bits). The same file loaded twice, or the same data written to CSV by pandas and read back (pandas
  writes floats in their shortest round-trip form), give the same fingerprint; one more day, one ticker less,
  or one price changed give another.
* `market_witness`: the close of every ticker on the first trading day of each calendar month in the data. Two
  loads of the same market over different date ranges (the file extended by a later download, or read from a
  later start) share the witness days in their overlap and agree on them, where their fingerprints differ. A
  seal (`clstm_ppo.evaluation.holdout`) and the trials ledger (`clstm_ppo.evaluation.ledger`) recognise "the same
  market" by the witness, ticker by ticker: synthetic markets all name their tickers SYN00, SYN01, ... so the
  names alone would confuse one synthetic draw with every other.

Size: a witness holds ``months x tickers`` floats (20 tickers over 7 years: 1,680 numbers, about 30 kB of JSON).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from envs.data import MarketData
from envs.fingerprint import data_fingerprint as data_fingerprint  # where it lives: envs (checkpoints record it)

WITNESS_RTOL = 1e-9
"""Relative tolerance of a witness close: float noise of a text round trip passes, a changed price does not."""


def market_witness(data: MarketData) -> dict[str, Any]:
    """The close of every ticker on the first trading day of each calendar month in ``data``.

    :return: ``{"dates": [M] "YYYY-MM-DD", "tickers": [N] (sorted), "close": [M][N] dollars}`` (JSON-able).
    """
    days = np.asarray(data.dates).astype("datetime64[D]")
    months = days.astype("datetime64[M]")
    first = np.flatnonzero(np.r_[True, months[1:] != months[:-1]])  # first row of each month present
    order = np.argsort(np.asarray(data.tickers, dtype=str), kind="stable")
    close = np.asarray(data.close)[np.ix_(first, order)]
    return {
        "dates": [str(d) for d in days[first]],
        "tickers": [data.tickers[i] for i in order],
        "close": close.tolist(),
    }


def agreeing_tickers(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Which tickers two witnesses (`market_witness`) show to be the same market.

    :return: ``(agree, differ)``: the tickers both witnesses hold that share at least one witness day and agree
        (to `WITNESS_RTOL`) on every shared one, and those that share a day but disagree on one. A ticker with no
        shared witness day is in neither: nothing tells whether it is the same market.
    """
    a_col = {t: i for i, t in enumerate(a["tickers"])}
    b_col = {t: i for i, t in enumerate(b["tickers"])}
    b_row = {d: i for i, d in enumerate(b["dates"])}
    shared = [(i, b_row[d]) for i, d in enumerate(a["dates"]) if d in b_row]
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
