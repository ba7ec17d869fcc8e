"""The "weights" portfolio encoding: cash and holdings as fractions of the portfolio value."""

from __future__ import annotations

import torch

from envs.config import EnvConfig
from envs.data import split_days
from envs.features import PreparedMarket
from envs.synthetic import generate_market
from envs.vector_env import VectorStockTradingEnv

SHARES = dict(action_mode="shares", reward="value")  # the paper's actions and reward, which these cases work by hand


def test_weights_encoding_sums_to_one_and_matches_the_portfolio():
    data = generate_market(num_tickers=3, num_days=400, seed=5)
    market = PreparedMarket.prepare(data, split_days(data, window=4), window=4)
    n = market.num_tickers
    envs = {
        mode: VectorStockTradingEnv(
            market, num_envs=5, seed=3, config=EnvConfig(hmax=500, episode_length=40, portfolio_features=mode, **SHARES)
        )
        for mode in ("shares", "weights")
    }
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        actions = torch.rand(5, n, generator=gen) * 2 - 1
        out = {mode: env.step(actions) for mode, env in envs.items()}
        obs_w, info_w = out["weights"][0], out["weights"][4]
        last = obs_w[:, -1]
        weights_total = last[:, 0] + last[:, 1 + n : 1 + 2 * n].sum(dim=1)
        torch.testing.assert_close(weights_total, torch.ones(5), rtol=1e-5, atol=1e-5)
        assert bool((last[:, 1 + n : 1 + 2 * n] >= 0).all())
        cash_w = last[:, 0].double() * info_w["portfolio_value"].double()
        torch.testing.assert_close(cash_w, info_w["cash"].double(), rtol=1e-5, atol=1.0)
        # the encoding changes the observation only, never the trading
        torch.testing.assert_close(out["shares"][1], out["weights"][1])
        market_cols = slice(1 + 2 * n, None)
        torch.testing.assert_close(out["shares"][0][..., market_cols], obs_w[..., market_cols])


def test_the_turnover_penalty_charges_the_reward_and_never_the_portfolio():
    data = generate_market(num_tickers=3, num_days=300, seed=6)
    market = PreparedMarket.prepare(data, split_days(data, window=4), window=4)
    penalty = 0.002
    envs = {
        c: VectorStockTradingEnv(market, num_envs=4, seed=2, config=EnvConfig(episode_length=30, turnover_penalty=c))
        for c in (0.0, penalty)
    }
    gen = torch.Generator().manual_seed(1)
    charged = 0
    for _ in range(25):
        before = envs[0.0]._s["value"].clone()
        actions = torch.rand(4, market.num_tickers, generator=gen) * 2 - 1
        out = {c: env.step(actions) for c, env in envs.items()}
        info = out[0.0][4]
        # the same trades, cash and values: the penalty is not paid
        torch.testing.assert_close(out[penalty][4]["portfolio_value"], info["portfolio_value"], rtol=0, atol=0)
        traded = (info["shares_traded"].abs() * info["fill_prices"]).sum(1)
        value = info["portfolio_value"]
        want = 100.0 * torch.log((value - penalty * traded) / before)
        torch.testing.assert_close(out[penalty][1], want.float())
        charged += int((out[penalty][1] < out[0.0][1]).sum())
        assert bool((out[penalty][1] <= out[0.0][1]).all())
    assert charged > 20  # most env-days trade with random target weights
