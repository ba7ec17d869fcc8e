"""A synthetic source's ``train_draws=K``: training runs on K draws of the generator (the market's own and K - 1 more,
each from its own seed), validation and test on the market's own days; the training env's episodes each stay in one
draw and see exactly what an env on that draw alone would show."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from clstm_ppo.config import TrainConfig
from clstm_ppo.market import build_market
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.sources import load_market_data
from envs.vector_env import VectorStockTradingEnv
from tests.conftest import clean_env

SOURCE = "synthetic:tickers=4,days=400,signal_ic=0.2,signal_halflife=5"


def _cfg(source: str) -> TrainConfig:
    return TrainConfig.from_dict({"data": source, "window": 5, "episode_length": 20, "seed": 3})


def test_the_pool_is_k_minus_1_more_draws_with_the_markets_own_spec():
    cfg = _cfg(f"{SOURCE},train_draws=4")
    market = build_market(cfg.data, seed=3)
    alone = build_market(_cfg(SOURCE).data, seed=3)
    assert market.data.equals(alone.data) and market.splits == alone.splits and not alone.pool
    assert len(market.pool) == 3
    closes = [market.data.close, *(m.data.close for m in market.pool)]
    assert all(not np.allclose(a, b) for i, a in enumerate(closes) for b in closes[i + 1 :])  # other seeds, other noise
    for m in market.pool:
        assert m.splits == market.splits and m.data.tickers == market.data.tickers
        np.testing.assert_array_equal(m.normalization.close_mean, market.normalization.close_mean)
    again = build_market(cfg.data, seed=3)  # deterministic, so a resumed run rebuilds the same pool
    assert all(a.data.equals(b.data) for a, b in zip(market.pool, again.pool, strict=True))


def test_each_episode_stays_in_one_draw_and_sees_what_that_draw_alone_shows(one_torch_thread):
    cfg = _cfg(f"{SOURCE},train_draws=4")
    market = build_market(cfg.data, seed=3)
    days, train = market.data.num_days, market.splits.train
    env = VectorStockTradingEnv(market, split="train", num_envs=16, config=cfg.env, seed=5, pool=True)
    obs, _ = env.reset()
    visited = set()
    for _ in range(120):
        draw, day = env._start_np // days, env._day_np % days  # noqa: SLF001 - the env's own record of its days
        assert ((env._day_np // days) == draw).all() and (day >= train.start).all() and (day < train.stop).all()
        visited |= set(draw.tolist())
        for e in range(0, 16, 5):  # the pooled observation equals that draw's own env on the same day
            k = int(draw[e])
            own = market if k == 0 else market.pool[k - 1]
            alone = VectorStockTradingEnv(
                PreparedMarket.from_spec(own.data, market.to_spec()), num_envs=1, config=cfg.env
            )
            alone_obs, _ = alone.reset(options={"start_day": int(day[e])})
            if env._day_np[e] == env._start_np[e]:  # an episode's first day: no trade yet
                torch.testing.assert_close(obs[e], alone_obs[0])
        obs, *_ = env.step(torch.zeros(16, 4))
    assert visited == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="runs on the train split"):
        VectorStockTradingEnv(market, split="test", num_envs=2, config=cfg.env, pool=True)


def test_train_draws_is_refused_where_it_means_nothing(tmp_path):
    with pytest.raises(UserError, match="needs generator 3"):
        load_market_data("synthetic:generator=2,train_draws=3")
    command = [sys.executable, "-m", "clstm_ppo.cli", "study", "--out", "s", "--data", f"{SOURCE},train_draws=3"]
    command += ["--trade_start", "2015-01-02"]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "train_draws is a training run's option" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
