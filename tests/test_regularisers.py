"""Observation and reward normalisation and weight decay."""

from __future__ import annotations

import numpy as np
import torch

from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.moments import merge_moments, moment_sums
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import optimizer_step
from clstm_ppo.training.reward_norm import REWARD_CLIP, RewardNormalizer
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, SeedActor
from envs.config import EnvConfig
from envs.vector_env import VectorStockTradingEnv
from tests.conftest import net_spec


def mlp_for(market, obs_norm: bool = False, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return make_policy(
        net_spec(
            "mlp",
            market.num_features,
            market.num_tickers,
            market.window,
            feature_dim=8,
            stage2_hidden=16,
            init_log_std=0.0,
            obs_norm=obs_norm,
        )
    )


def collector_for(
    market, model, *, envs: int = 4, episode_length: int = 7, norm_reward: bool = False
) -> RolloutCollector:
    env = VectorStockTradingEnv(market, num_envs=envs, config=EnvConfig(episode_length=episode_length), seed=3)
    cpu = torch.device("cpu")
    actor = SeedActor(torch.Generator().manual_seed(1), 3, RewardNormalizer(envs, 0.9, cpu, enabled=norm_reward))
    return RolloutCollector(env, model, [actor], gamma=0.9, device=cpu)


def test_merged_moments_equal_the_statistics_of_all_rows():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 40, 1, 17)]
    count, mean, var = (
        torch.zeros((), dtype=torch.float64),
        torch.zeros(4, dtype=torch.float64),
        torch.ones(4, dtype=torch.float64),
    )
    for x in batches:
        t = torch.tensor(x)
        count, mean, var = merge_moments(count, mean, var, moment_sums(t))
    everything = np.concatenate(batches)
    assert count.item() == len(everything)
    np.testing.assert_allclose(mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), everything.var(0), rtol=1e-10)
    same = merge_moments(count, mean, var, torch.zeros(9, dtype=torch.float64))  # an empty batch changes nothing
    assert same[0] is count and same[1] is mean


def test_observation_normaliser_standardises_states_and_travels_with_the_weights(window_market):
    m = window_market
    model = mlp_for(m, obs_norm=True)
    rows = torch.randn(50, m.num_features, dtype=torch.float64) * 4 + 2
    model.update_obs_stats(moment_sums(rows))
    obs = torch.randn(1, 3, m.window, m.num_features) * 4 + 2
    starts = torch.zeros(1, 3, dtype=torch.bool)
    expected = ((obs.double() - rows.mean(0)) / (rows.var(0, unbiased=False) + 1e-8).sqrt()).clamp(-10, 10).float()
    plain = mlp_for(m)  # same seed: the same weights, no normaliser
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("obs_")})
    state = model.initial_state(3)
    got, want = model(obs, state, starts), plain(expected, state, starts)
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-5, atol=1e-6)  # the action mean
    restored = mlp_for(m, obs_norm=True, seed=9)
    restored.load_state_dict(model.state_dict())  # the statistics are part of the weights
    torch.testing.assert_close(restored(obs, state, starts).mean, got.mean)


def test_reward_normalisation_scales_rewards_and_records_discounted_returns(window_market):
    """Same policy, envs and noise with and without --norm_reward: the rewards differ only by the scale (and the
    clip), the recorded sums are those of the discounted raw returns, restarting after each episode, and `sync`
    merges them into moments equal to numpy's statistics of those returns, which set the next scale."""
    m = window_market
    model = mlp_for(m)
    plain = collector_for(m, model, episode_length=60)  # no episode ends in 40 steps: no truncation bootstrap
    scaled = collector_for(m, model, episode_length=60, norm_reward=True)
    norm = scaled.seeds[0].reward_norm
    norm.moments = (1.0, 0.0, 1 / 49 - 1e-8)  # a scale of 7
    steps = 40
    bufs = [RolloutBuffer.allocate(steps, 4, (m.window, m.num_features), m.num_tickers, "cpu") for _ in range(2)]
    plain.collect(bufs[0])
    scaled.collect(bufs[1])
    raw = bufs[0].rewards.double()
    assert not bufs[0].dones.any()
    torch.testing.assert_close(bufs[1].rewards, (bufs[0].rewards * 7.0).clamp(-REWARD_CLIP, REWARD_CLIP))
    disc, seen = torch.zeros(4, dtype=torch.float64), []
    for s in range(steps):
        disc = disc * 0.9 + raw[s]
        seen.append(disc)
    seen = torch.cat(seen).numpy()
    np.testing.assert_allclose(norm.batch.numpy(), [steps * 4, seen.sum(), np.square(seen).sum()], rtol=1e-6)
    torch.testing.assert_close(norm.discounted, disc)
    norm.moments = (0.0, 0.0, 1.0)
    norm.sync(Comm())  # one worker: its own returns
    count, mean, var = norm.moments
    assert count == steps * 4 and not norm.batch.any()
    np.testing.assert_allclose([mean, var], [seen.mean(), seen.var()], rtol=1e-9)
    assert norm.scale == 1 / np.sqrt(var + 1e-8)
    again = collector_for(m, model, norm_reward=True).seeds[0].reward_norm
    again.load_state_dict(norm.state_dict())
    assert again.moments == norm.moments and torch.equal(again.discounted, norm.discounted)


# ---------------------------------------------------------------------------------------- weight decay


def test_weight_decay_shrinks_weight_matrices_only_and_not_on_skipped_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)  # Adam moves nothing on zero gradients: only the decay acts
    _, skipped = optimizer_step(opt, params, max_grad_norm=1.0, weight_decay=0.5)
    assert skipped.item() == 0
    for p, b in zip(params, before, strict=True):
        want = b * (1 - 0.1 * 0.5) if p.dim() >= 2 else b
        torch.testing.assert_close(p.detach(), want)
    after = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    _, skipped = optimizer_step(opt, params, max_grad_norm=1.0, weight_decay=0.5)
    assert skipped.item() == 1
    for p, a in zip(params, after, strict=True):
        assert torch.equal(p.detach(), a)
