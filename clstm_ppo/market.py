"""From settings to the PreparedMarket an env runs on: load, split, fit features (or reuse fitted ones)."""

from __future__ import annotations

from typing import Any

from clstm_ppo.config import TrainConfig
from envs.data import MarketData, split_days
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.kernel import EnvConfig
from envs.sources import load_market_data


def load_data(
    cfg: TrainConfig,
    *,
    data: str | None = None,
    start: str | None = None,
    end: str | None = None,
    tickers: list[str] | None = None,
    every_ticker: bool = False,
) -> MarketData:
    """Market data named by ``cfg.data`` (or ``data``), restricted to the configured tickers and dates.

    The one loader of training, backtest, study and trading: a run's Alpaca settings (timeframe, adjustment,
    feed, cache folder, endpoint) always come with it, so a run is evaluated on the bars it was trained on.

    :param start: / :param end: override ``cfg.start`` / ``cfg.end`` (inclusive YYYY-MM-DD).
    :param tickers: override ``cfg.ticker_list``; ``every_ticker`` reads all of a file's tickers (the caller
        checks them, e.g. against a checkpoint's universe).
    """
    source = data or cfg.data
    alpaca_kwargs = (
        dict(
            timeframe=cfg.alpaca_timeframe,
            adjustment=cfg.alpaca_adjustment,
            feed=cfg.alpaca_feed,
            cache_dir=cfg.data_cache_dir,
            refresh=cfg.refresh_data,
            data_url=cfg.data_url or None,
        )
        if is_alpaca(source)
        else {}
    )
    names = tickers if tickers is not None else cfg.ticker_list
    return load_market_data(
        source,
        tickers=None if every_ticker and not alpaca_kwargs else names,
        start=(start if start is not None else cfg.start) or None,
        end=(end if end is not None else cfg.end) or None,
        seed=cfg.seed,
        gap_policy=cfg.gap_policy,
        max_price_ratio=cfg.max_price_ratio,
        **alpaca_kwargs,
    )


def is_alpaca(source: str) -> bool:
    """Does the data-source string name Alpaca (the one source that needs tickers, dates and keys)?"""
    return source.split(":", 1)[0].strip().lower() == "alpaca"


def build_market(cfg: TrainConfig, data: MarketData | None = None) -> PreparedMarket:
    """Load data, split it by date, fit normalisation and the turbulence threshold on the training split."""
    data = data if data is not None else load_data(cfg)
    splits = split_days(
        data,
        window=cfg.window,
        train_end=cfg.train_end or None,
        validation_end=cfg.validation_end or None,
        test_end=cfg.test_end or None,
    )
    return PreparedMarket.prepare(
        data,
        splits,
        window=cfg.window,
        use_turbulence=cfg.use_turbulence,
        price_mode=cfg.price_features,
        indicator_names=cfg.indicator_list,
    )


def rebuild_market(data: MarketData, spec: dict[str, Any]) -> PreparedMarket:
    """The market of a checkpoint: stored normalisation/threshold applied to (possibly new) data."""
    return PreparedMarket.from_spec(data, spec)


def env_config(cfg: TrainConfig, *, full_episodes: bool = False) -> EnvConfig:
    """The env settings of a run; ``full_episodes`` runs each episode from the split's first day to its end."""
    try:
        return EnvConfig(
            hmax=cfg.hmax,
            initial_amount=cfg.initial_amount,
            buy_cost_pct=cfg.buy_cost_pct,
            sell_cost_pct=cfg.sell_cost_pct,
            reward_scaling=cfg.reward_scaling,
            episode_length=None if full_episodes else cfg.episode_days,
            random_start=not full_episodes,
            portfolio_features=cfg.portfolio_features,
            action_mode=cfg.action_mode,
            rebalance_band=cfg.rebalance_band,
            reward=cfg.reward,
        )
    except ValueError as err:
        raise UserError(f"invalid environment settings: {err}") from None
