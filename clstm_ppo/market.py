"""From the data settings to the PreparedMarket an env runs on: load, split, fit features (or reuse fitted ones)."""

from __future__ import annotations

import dataclasses
from typing import Any

from clstm_ppo.config import DataConfig
from envs.data import MarketData, Splits, split_days
from envs.errors import shown_list
from envs.features import PreparedMarket
from envs.sources import load_market_data, training_pool


def load_data(
    cfg: DataConfig,
    *,
    seed: int,
    source: str | None = None,
    start: str | None = None,
    end: str | None = None,
    tickers: list[str] | None = None,
    every_ticker: bool = False,
) -> MarketData:
    """Market data named by ``cfg.source`` (or ``source``), restricted to the configured tickers and dates.

    The one loader of training, backtest, study and trading: a run's Alpaca settings (timeframe, adjustment,
    feed, cache folder, endpoint) always come with it, so a run is evaluated on the bars it was trained on.

    :param seed: the run's seed, which a synthetic market without its own ``seed=`` is drawn from.
    :param start: / :param end: override ``cfg.start`` / ``cfg.end`` (inclusive YYYY-MM-DD).
    :param tickers: override ``cfg.ticker_list``; ``every_ticker`` reads all of a file's tickers (the caller
        checks them, e.g. against a checkpoint's universe).
    """
    source = source or cfg.source
    alpaca_kwargs: dict[str, Any] = {}
    if is_alpaca(source):
        alpaca_kwargs = {"cache_dir": cfg.data_cache_dir, "refresh": cfg.refresh_data, "data_url": cfg.data_url or None}
    names = tickers if tickers is not None else cfg.ticker_list
    return load_market_data(
        source,
        tickers=None if every_ticker and not alpaca_kwargs else names,
        start=(start if start is not None else cfg.start) or None,
        end=(end if end is not None else cfg.end) or None,
        seed=seed,
        gap_policy=cfg.gap_policy,
        max_price_ratio=cfg.max_price_ratio,
        **alpaca_kwargs,
    )


def is_alpaca(source: str) -> bool:
    """Does the data-source string name Alpaca (the one source that needs tickers, dates and keys)?"""
    return source.split(":", 1)[0].strip().lower() == "alpaca"


def data_splits(data: MarketData, cfg: DataConfig) -> Splits:
    """The train / validation / test days of ``data`` from the configured dates (defaults: 70% / 15% / 15%)."""
    return split_days(
        data,
        window=cfg.window,
        train_end=cfg.train_end or None,
        validation_end=cfg.validation_end or None,
        test_end=cfg.test_end or None,
    )


def describe_data(cfg: DataConfig, *, seed: int) -> str:
    """What a run of ``cfg`` (and ``seed``) will see: the source, its tickers and dates, and each split's first day,
    last day and length."""
    data = load_data(cfg, seed=seed)
    names = shown_list(data.tickers, 10)
    lines = [
        f"data: {cfg.source} | {data.num_tickers} tickers ({names}) | {data.date_str(0)} .. {data.date_str(-1)} "
        f"({data.num_days} trading days; the first {cfg.window - 1} are the window's lookback)"
    ]
    for name, days in data_splits(data, cfg).as_dict().items():
        lines.append(
            f"  {name:<10} none"
            if days is None
            else f"  {name:<10} {data.date_str(days.start)} .. {data.date_str(days.stop - 1)} ({days.num_days} days)"
        )
    return "\n".join(lines)


def build_market(
    cfg: DataConfig, *, seed: int, data: MarketData | None = None, splits: Splits | None = None
) -> PreparedMarket:
    """Load data (unless given), split it by date (unless ``splits`` are given), fit normalisation and the
    turbulence threshold on the training split. A synthetic source with ``train_draws=K`` also draws the K - 1 more
    markets training runs on (`envs.sources.training_pool`), prepared with this market's normalisation,
    threshold and splits (``PreparedMarket.pool``)."""
    loaded = data is None
    data = data if data is not None else load_data(cfg, seed=seed)
    splits = splits if splits is not None else data_splits(data, cfg)
    market = PreparedMarket.prepare(
        data,
        splits,
        window=cfg.window,
        use_turbulence=cfg.use_turbulence,
        price_mode=cfg.price_features,
        indicator_names=cfg.indicator_list,
    )
    if not loaded:
        return market
    drawn = training_pool(cfg.source, seed, tickers=cfg.ticker_list, start=cfg.start or None, end=cfg.end or None)
    if not drawn:
        return market
    spec = market.to_spec()
    pool = tuple(PreparedMarket.from_spec(more, spec, splits=market.splits, lean=True) for more in drawn)
    return dataclasses.replace(market, pool=pool)


def rebuild_market(data: MarketData, spec: dict[str, Any]) -> PreparedMarket:
    """The market of a checkpoint: stored normalisation/threshold applied to (possibly new) data (an older
    checkpoint's spec as `clstm_ppo.migrate.market_spec` reads it)."""
    return PreparedMarket.from_spec(data, spec)
