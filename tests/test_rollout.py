"""Rollout storage and GAE: the index convention against a plain-loop reference, resets, truncation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clstm_ppo.training.rollout import compute_gae

SHARES = dict(action_mode="shares", reward="value")  # the paper's actions and reward, which these cases work by hand


def gae_reference(rewards, values, dones, last_value, gamma, lam):
    """Plain per-env, per-step loop straight from the GAE definition (independent of compute_gae)."""
    steps, envs = rewards.shape
    adv = np.zeros((steps, envs))
    for b in range(envs):
        for s in range(steps):
            total, discount = 0.0, 1.0
            for k in range(s, steps):
                next_v = last_value[b] if k == steps - 1 else values[k + 1, b]
                delta = rewards[k, b] + gamma * next_v * (1 - dones[k, b]) - values[k, b]
                total += discount * delta
                if dones[k, b]:
                    break
                discount *= gamma * lam
            adv[s, b] = total
    return adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_plain_loop_with_resets(seed):
    rng = np.random.default_rng(seed)
    steps, envs = 17, 5
    rewards, values = rng.normal(size=(steps, envs)), rng.normal(size=(steps, envs))
    dones = rng.random((steps, envs)) < 0.2
    last = rng.normal(size=envs)
    expected = gae_reference(rewards, values, dones, last, 0.97, 0.9)
    adv, ret = compute_gae(
        torch.tensor(rewards), torch.tensor(values), torch.tensor(dones), torch.tensor(last), 0.97, 0.9
    )
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-10, atol=1e-10)


def test_gae_does_not_bootstrap_across_termination():
    rewards = torch.tensor([[1.0], [1.0]])
    values = torch.tensor([[0.0], [0.0]])
    dones = torch.tensor([[True], [False]])
    adv, _ = compute_gae(rewards, values, dones, torch.tensor([100.0]), gamma=0.5, gae_lambda=1.0)
    assert adv[0, 0].item() == pytest.approx(1.0)  # the 100 after step 1 must not leak into step 0
    assert adv[1, 0].item() == pytest.approx(1.0 + 0.5 * 100.0)


def gae_reference_with_truncation(rewards, values, terminated, truncated, final_values, last_value, gamma, lam):
    """Plain loop: a truncated step bootstraps from V(final obs); a terminated one from nothing; the
    advantage chain is cut after either (the next step belongs to a new episode)."""
    steps, envs = rewards.shape
    adv = np.zeros((steps, envs))
    for b in range(envs):
        running = 0.0
        for s in reversed(range(steps)):
            if terminated[s, b]:
                delta, running = rewards[s, b] - values[s, b], 0.0
            elif truncated[s, b]:
                delta, running = rewards[s, b] + gamma * final_values[s, b] - values[s, b], 0.0
            else:
                next_v = last_value[b] if s == steps - 1 else values[s + 1, b]
                delta = rewards[s, b] + gamma * next_v - values[s, b]
            running = delta + gamma * lam * running
            adv[s, b] = running
    return adv


@pytest.mark.parametrize("seed", [0, 1])
def test_gae_bootstraps_on_truncation_not_on_termination(seed):
    """The trainer folds gamma * V(final obs) into a truncated step's reward, then runs compute_gae with
    done = terminated | truncated: that must equal GAE with explicit truncation handling."""
    rng = np.random.default_rng(seed)
    steps, envs, gamma, lam = 15, 6, 0.97, 0.9
    rewards, values = rng.normal(size=(steps, envs)), rng.normal(size=(steps, envs))
    ends = rng.random((steps, envs)) < 0.25
    truncated = ends & (rng.random((steps, envs)) < 0.5)
    terminated = ends & ~truncated
    final_values, last = rng.normal(size=(steps, envs)), rng.normal(size=envs)
    folded = rewards + gamma * final_values * truncated
    adv, _ = compute_gae(
        torch.tensor(folded), torch.tensor(values), torch.tensor(terminated | truncated), torch.tensor(last), gamma, lam
    )
    expected = gae_reference_with_truncation(rewards, values, terminated, truncated, final_values, last, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    assert truncated.any() and terminated.any()


def test_rollout_statistics_describe_what_the_policy_did(window_market):
    """The diagnostics logged each update agree with the rollout they summarise."""
    from clstm_ppo.agent.build import make_policy
    from clstm_ppo.training.reward_norm import RewardNormalizer
    from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, RolloutStats, SeedActor
    from envs.config import EnvConfig
    from envs.vector_env import VectorStockTradingEnv
    from tests.conftest import net_spec

    m = window_market
    torch.manual_seed(0)
    model = make_policy(
        net_spec(
            "mlp",
            m.num_features,
            m.num_tickers,
            m.window,
            feature_dim=8,
            stage2_hidden=16,
            init_log_std=0.5,
        )
    )
    # hmax far above what the cash buys: the wanted buys cannot all be paid for
    env = VectorStockTradingEnv(m, num_envs=4, config=EnvConfig(hmax=100_000, episode_length=20, **SHARES), seed=0)
    actor = SeedActor(
        torch.Generator().manual_seed(0), 0, RewardNormalizer(4, 0.99, torch.device("cpu"), enabled=False)
    )
    collector = RolloutCollector(env, model, [actor], gamma=0.99, device=torch.device("cpu"))
    buf = RolloutBuffer.allocate(30, 4, (m.window, m.num_features), m.num_tickers, "cpu")
    collector.collect(buf)
    stats = actor.stats.as_dict()
    a = buf.actions.double()
    np.testing.assert_allclose(stats["action_mean"], a.mean(dim=(0, 1)).numpy(), rtol=1e-9)
    np.testing.assert_allclose(stats["action_std"], a.std(dim=(0, 1), unbiased=False).numpy(), rtol=1e-6)
    assert stats["clipped_fraction"] == pytest.approx(float((a.abs() > 1).double().mean()))
    assert 0 < stats["clipped_fraction"] < 1  # std e^0.5: some samples beyond +-1
    assert 0 < stats["refused_buy_fraction"] < 1 and 0 < stats["exposure"] <= 1
    sums = actor.stats.named()
    doubled = RolloutStats(**{k: v * 2 for k, v in sums.items()}).as_dict()  # two workers' sums, as all-reduced
    assert doubled["action_mean"] == pytest.approx(stats["action_mean"]) and doubled["exposure"] == pytest.approx(
        stats["exposure"]
    )
