"""The study's markets, prepared once: indicators and turbulence over the whole data once per market setting
(window, price feature, turbulence stop), then normalisation and turbulence threshold refitted once per
retraining window. Stored as plain arrays and JSON (no pickle) for the cell processes to load.

    prepared/<key>.npz    dates [D] int64 ns, open/high/low/close/volume [D, N], indicators [D, N, K], turbulence [D],
                          columns [C, D, N] (the data's feature columns)
    prepared/<key>.json   tickers, column and indicator names, window, settings, and per period: splits (day ranges),
                          normalisation statistics and turbulence threshold
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from clstm_ppo.config import TrainConfig
from clstm_ppo.study.grid import MARKET_KEYS
from clstm_ppo.study.schedule import WalkPeriod
from envs.data import ARRAYS, DayRange, MarketData, Splits
from envs.features import Normalization, PreparedMarket, turbulence_threshold


def market_key(cfg: TrainConfig) -> str:
    """File-safe name of the market settings of ``cfg``, e.g. ``window=30,price_features=return,use_turbulence=True``."""
    settings = cfg.to_dict()
    return ",".join(f"{k}={settings[k]}" for k in MARKET_KEYS)


def prepare_markets(data: MarketData, cfg: TrainConfig, periods: list[WalkPeriod]) -> list[PreparedMarket]:
    """One PreparedMarket per period for the market settings of ``cfg`` (indicators and turbulence computed once)."""
    base = PreparedMarket.prepare(
        data,
        periods[0].splits,
        window=cfg.data.window,
        use_turbulence=cfg.data.use_turbulence,
        price_mode=cfg.data.price_features,
        indicator_names=cfg.data.indicator_list,
    )
    return [base if k == 0 else base.resplit(p.splits) for k, p in enumerate(periods)]


def _range(r: DayRange | None) -> list[int] | None:
    return None if r is None else [r.start, r.stop]


def _unrange(v: list[int] | None) -> DayRange | None:
    return None if v is None else DayRange(int(v[0]), int(v[1]))


def save_markets(folder: Path, key: str, markets: list[PreparedMarket]) -> None:
    """Write ``markets`` (one per period, one data set) as ``folder/<key>.npz`` and ``folder/<key>.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    first = markets[0]
    data = first.data
    np.savez(
        folder / f"{key}.npz",
        dates=data.dates.astype("datetime64[ns]").astype(np.int64),
        indicators=first.indicators,
        turbulence=first.turbulence,
        columns=np.stack(list(data.columns.values())) if data.columns else np.zeros((0, *data.close.shape)),
        **{name: getattr(data, name) for name in ARRAYS},
    )
    meta: dict[str, Any] = {
        "tickers": list(data.tickers),
        "close_only": bool(data.close_only),
        "columns": list(data.columns),
        "indicator_names": list(first.indicator_names),
        "window": first.window,
        "turbulence_lookback": first.turbulence_lookback,
        "use_turbulence": first.use_turbulence,
        "periods": [
            {
                "train": _range(m.splits.train),
                "validation": _range(m.splits.validation),
                "test": _range(m.splits.test),
                "normalization": m.normalization.to_dict(),
                "turbulence_threshold": None if not np.isfinite(m.turbulence_threshold) else m.turbulence_threshold,
            }
            for m in markets
        ],
    }
    (folder / f"{key}.json").write_text(json.dumps(meta), encoding="utf-8")


def load_markets(folder: Path, key: str) -> list[PreparedMarket]:
    """The markets `save_markets` wrote, one per period (arrays loaded without pickle)."""
    meta = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
    with np.load(folder / f"{key}.npz", allow_pickle=False) as z:
        arrays = {name: z[name] for name in (*ARRAYS, "dates", "indicators", "turbulence", "columns") if name in z}
    arrays.setdefault("dividends", np.zeros_like(arrays["close"]))  # prepared before dividends were read
    data = MarketData(
        dates=arrays["dates"].astype("datetime64[ns]"),
        tickers=tuple(meta["tickers"]),
        close_only=bool(meta["close_only"]),
        columns=dict(zip(meta.get("columns", []), arrays.get("columns", ()), strict=True)),
        **{name: arrays[name] for name in ARRAYS},
    )
    return [
        PreparedMarket(
            data=data,
            indicators=arrays["indicators"],
            indicator_names=tuple(meta["indicator_names"]),
            turbulence=arrays["turbulence"],
            turbulence_threshold=float("inf")
            if p["turbulence_threshold"] is None
            else float(p["turbulence_threshold"]),
            normalization=Normalization.from_dict(p["normalization"]),
            splits=Splits(train=_unrange(p["train"]), validation=_unrange(p["validation"]), test=_unrange(p["test"])),
            window=int(meta["window"]),
            turbulence_lookback=int(meta["turbulence_lookback"]),
            use_turbulence=bool(meta["use_turbulence"]),
        )
        for p in meta["periods"]
    ]


SAME_MARKET_RTOL, SAME_MARKET_ATOL = 1e-9, 1e-12
"""How close two preparations' numbers must be to count as one market: numpy on another CPU or version rounds the
last bits of a synthetic market differently (prices 2e-13 dollars apart), which is float rounding, not other data."""


def _close(x: Any, y: Any) -> bool:
    """Equal shapes and kinds; floats within the `SAME_MARKET_*` tolerances (NaN matching NaN), the rest exactly."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
        return False
    if x.dtype.kind != "f":
        return bool(np.array_equal(x, y))
    return bool(np.allclose(x, y, rtol=SAME_MARKET_RTOL, atol=SAME_MARKET_ATOL, equal_nan=True))


def same_market(a: PreparedMarket, b: PreparedMarket) -> bool:
    """Do two prepared markets hold the same data, features and fitted statistics, up to float rounding (`_close`,
    `MarketData.equals` with the same tolerances)? Dates, tickers, splits and every setting must match exactly."""
    na, nb = a.normalization.to_dict(), b.normalization.to_dict()
    return (
        a.data.equals(b.data, rtol=SAME_MARKET_RTOL, atol=SAME_MARKET_ATOL)
        and _close(a.indicators, b.indicators)
        and _close(a.turbulence, b.turbulence)
        and _close(a.turbulence_threshold, b.turbulence_threshold)
        and a.window == b.window
        and na.keys() == nb.keys()
        and all(_close(na[k], nb[k]) if isinstance(na[k], (list, float)) else na[k] == nb[k] for k in na)
        and dataclasses.astuple(a.splits) == dataclasses.astuple(b.splits)
    )


def traded_window(markets: list[PreparedMarket]) -> tuple[range, np.ndarray]:
    """The study's traded day indices (the first window's first traded day .. the last window's last) and, for
    each, whether its window's turbulence stop holds the book in cash that day (``[D] bool``,
    `envs.features.PreparedMarket.stopped_days`)."""
    days = range(markets[0].splits.test.start, markets[-1].splits.test.stop)
    turbulent = np.zeros(len(days), dtype=bool)
    for m in markets:  # each window decides on its days but the last, which the next window decides on
        stopped = m.stopped_days()
        for t in range(m.splits.test.start, m.splits.test.stop - 1):
            turbulent[t - days.start] = stopped[t]
    return days, turbulent


def paper_stop_days(markets: list[PreparedMarket]) -> np.ndarray:
    """``[D] bool`` over the traded days of `traded_window`: where the paper's turbulence stop (turbulence at or above
    the 90th percentile of each window's training days) holds a book in cash, whether the study's policies use the
    stop or not: the days of the "buy-and-hold + turbulence stop" baseline."""
    with_stop = [
        dataclasses.replace(
            m, turbulence_threshold=turbulence_threshold(m.turbulence, m.splits.train, m.turbulence_lookback, True)
        )
        for m in markets
    ]
    return traded_window(with_stop)[1]
