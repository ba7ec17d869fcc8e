"""What identifies a loaded data set exactly: `data_fingerprint`. A checkpoint records it (with the synthetic
generator's version, `envs.sources.data_record`), the trials ledger and the sealed hold-out use it
(`clstm_ppo.evaluation.fingerprint`, which also holds the month-by-month witness)."""

from __future__ import annotations

import hashlib

import numpy as np

from envs.data import MarketData

_FIELDS = ("open", "high", "low", "close", "volume")


def data_fingerprint(data: MarketData) -> str:
    """``sha256`` (hex, first 20 characters) of the tickers in sorted order, the dates (day resolution) and the
    ``[D, N]`` OHLCV arrays with their columns in that ticker order (float64, little-endian bits)."""
    order = np.argsort(np.asarray(data.tickers, dtype=str), kind="stable")
    h = hashlib.sha256()
    h.update(("\n".join(data.tickers[i] for i in order) + "\n").encode())
    h.update(np.ascontiguousarray(np.asarray(data.dates).astype("datetime64[D]").astype("<i8")).tobytes())
    for name in _FIELDS:
        h.update(np.ascontiguousarray(np.asarray(getattr(data, name))[:, order].astype("<f8")).tobytes())
    return h.hexdigest()[:20]
