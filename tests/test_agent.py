"""The agent's math: GAE, recurrent state handling, rollout/update consistency, PPO update."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clstm_ppo.agent.model import ActorCritic, ModelConfig, run_lstm
from clstm_ppo.config import TrainConfig, preset
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import ppo_update
from clstm_ppo.training.rollout import RolloutBuffer, compute_gae
from envs.errors import UserError


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
    adv, ret = compute_gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(dones), torch.tensor(last), 0.97, 0.9)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-10, atol=1e-10)


def test_gae_does_not_bootstrap_across_termination():
    rewards = torch.tensor([[1.0], [1.0]])
    values = torch.tensor([[0.0], [0.0]])
    dones = torch.tensor([[True], [False]])
    adv, _ = compute_gae(rewards, values, dones, torch.tensor([100.0]), gamma=0.5, gae_lambda=1.0)
    assert adv[0, 0].item() == pytest.approx(1.0)  # the 100 after step 1 must not leak into step 0
    assert adv[1, 0].item() == pytest.approx(1.0 + 0.5 * 100.0)


def test_run_lstm_chunks_equal_step_by_step():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 8)
    x = torch.randn(20, 4, 6)
    starts = torch.rand(20, 4) < 0.15
    h0, c0 = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    out, (h, c) = run_lstm(lstm, x, (h0, c0), starts)
    hs, cs, outs = h0, c0, []
    for t in range(20):
        keep = (~starts[t]).float().view(1, -1, 1)
        o, (hs, cs) = lstm(x[t : t + 1], (hs * keep, cs * keep))
        outs.append(o)
    torch.testing.assert_close(out, torch.cat(outs), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, hs, rtol=1e-5, atol=1e-6)


def small_model(policy: str = "clstm", tickers: int = 3, window: int = 5, features: int = 16) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(ModelConfig(policy=policy, num_features=features, num_tickers=tickers, window=window,
                                   stage1_hidden=12, feature_dim=10, stage2_hidden=14))


def fake_rollout(model: ActorCritic, steps: int = 12, envs: int = 4, seed: int = 0) -> RolloutBuffer:
    """A rollout collected step by step with model.act on random episode starts and random windows that
    move on by one random row per step, as the env's do (a fresh random window at each episode start)."""
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    buf = RolloutBuffer.allocate(steps, envs, (cfg.window, cfg.num_features), cfg.num_tickers, "cpu")
    state = model.initial_state(envs)
    buf.initial_state = tuple(s.clone() for s in state)
    start = torch.ones(envs, dtype=torch.bool)
    obs = torch.randn(envs, cfg.window, cfg.num_features, generator=gen)
    for s in range(steps):
        fresh = torch.randn(envs, cfg.window, cfg.num_features, generator=gen)
        moved = torch.cat([obs[:, 1:], fresh[:, :1]], dim=1)
        obs = torch.where(start.view(-1, 1, 1), fresh, moved) if s else fresh
        buf.obs.record(s, obs, anchor=bool(start.any()))
        buf.starts[s] = start
        action, log_prob, value, state = model.act(obs, state, start, generator=gen)
        buf.actions[s], buf.log_probs[s], buf.values[s] = action, log_prob, value
        buf.rewards[s] = torch.randn(envs, generator=gen)
        done = torch.rand(envs, generator=gen) < 0.2
        buf.dones[s] = done
        start = done
    return buf


@pytest.mark.parametrize("policy", ["clstm", "lstm", "mlp"])
def test_update_recomputes_rollout_log_probs_and_values(policy):
    """Before any optimizer step, the update's forward must reproduce what the rollout recorded."""
    model = small_model(policy)
    buf = fake_rollout(model)
    windows = buf.obs.windows()
    assert windows.rows.shape[1] < buf.n_steps * model.cfg.window  # rows really are shared
    for obs in (windows, windows.dense()):  # compact and dense windows alike
        log_prob, _, value, _, _ = model(obs, buf.initial_state, buf.starts, buf.actions)
        torch.testing.assert_close(log_prob, buf.log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value, buf.values, rtol=1e-5, atol=1e-5)
    # and column subsets (a minibatch) give the same numbers
    cols = torch.tensor([2, 0])
    lp_cols, _, v_cols, _, _ = model(windows.select(cols), tuple(s[:, cols] for s in buf.initial_state),
                                     buf.starts[:, cols], buf.actions[:, cols])
    torch.testing.assert_close(lp_cols, buf.log_probs[:, cols], rtol=1e-5, atol=1e-5)


def test_state_reset_at_episode_start_forgets_the_past():
    model = small_model("clstm")
    buf = fake_rollout(model, steps=6, envs=2)
    starts = buf.starts.clone()
    starts[3] = True
    dense = buf.obs.windows().dense()
    _, _, v1, _, _ = model(dense, buf.initial_state, starts, buf.actions)
    obs2 = dense.clone()
    obs2[:3] = torch.randn_like(obs2[:3])  # change everything before the reset
    _, _, v2, _, _ = model(obs2, buf.initial_state, starts, buf.actions)
    torch.testing.assert_close(v1[3:], v2[3:])
    assert not torch.allclose(v1[:3], v2[:3])


def test_parameter_groups_split_stage1_from_actor_critic():
    model = small_model("clstm")
    stage1 = {id(p) for p in model.stage1_parameters()}
    stage2 = {id(p) for p in model.stage2_parameters()}
    assert stage1 and stage2 and not stage1 & stage2
    assert stage1 | stage2 == {id(p) for p in model.parameters()}
    assert id(model.window_lstm.weight_ih_l0) in stage1 and id(model.actor_lstm.weight_ih_l0) in stage2


def ppo_cfg(**kw) -> TrainConfig:
    base = dict(num_envs=4, n_steps=12, batch_size=24, epochs=3, ent_coef=0.01)
    return TrainConfig(**{**base, **kw}).validate()


def test_ppo_update_changes_parameters_and_reports_statistics():
    model = small_model("clstm")
    buf = fake_rollout(model)
    cfg = ppo_cfg()
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stats = ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
    assert stats.epochs_run == 3 and stats.skipped_steps == 0
    assert all(math.isfinite(v) for v in (stats.policy_loss, stats.value_loss, stats.entropy, stats.grad_norm))
    assert 0.0 <= stats.clip_fraction <= 1.0 and stats.approx_kl >= 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_kl_early_stop_cuts_epochs():
    model = small_model("mlp")
    buf = fake_rollout(model)
    cfg = ppo_cfg(epochs=10, target_kl=1e-9)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    stats = ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
    assert stats.epochs_run == 1


def test_nan_gradients_skip_the_step():
    model = small_model("mlp")
    buf = fake_rollout(model)
    buf.rewards[0, 0] = float("nan")
    cfg = ppo_cfg(epochs=1, norm_adv=False)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    stats = ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
    assert stats.skipped_steps >= 1
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_gradient_accumulation_equals_one_big_minibatch():
    cfg1 = ppo_cfg(epochs=1, batch_size=48)
    cfg2 = ppo_cfg(epochs=1, batch_size=48, gradient_accumulation_steps=2)
    results = []
    for cfg in (cfg1, cfg2):
        model = small_model("clstm")
        buf = fake_rollout(model)
        adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_config_rejects_batch_that_does_not_divide_rollout():
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig(num_envs=4, n_steps=128, batch_size=100).validate()
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig(num_envs=3, n_steps=128, batch_size=256).validate()
    with pytest.raises(UserError, match="num_episodes"):
        TrainConfig(num_episodes=0).validate()


def test_paper_preset_has_the_papers_settings():
    cfg = preset("paper", num_envs=8)
    assert (cfg.window, cfg.stage1_hidden, cfg.feature_dim, cfg.stage2_hidden) == (30, 128, 128, 512)
    assert (cfg.gamma, cfg.n_steps, cfg.vf_coef, cfg.ent_coef, cfg.clip_coef, cfg.max_grad_norm) == (
        0.99, 128, 0.5, 0.01, 0.2, 0.5)
    assert cfg.learning_rate_clstm == cfg.learning_rate_actor_critic == 3e-4 and cfg.adam_eps == 1e-8
    cfg.validate()


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
    adv, _ = compute_gae(torch.tensor(folded), torch.tensor(values), torch.tensor(terminated | truncated),
                         torch.tensor(last), gamma, lam)
    expected = gae_reference_with_truncation(rewards, values, terminated, truncated, final_values, last, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    assert truncated.any() and terminated.any()


def test_ppo_update_is_the_same_with_shared_and_fused_window_kernels():
    """The kernel choice changes speed, not training: one PPO update lands on the same parameters."""
    results = []
    for kernel in ("shared", "fused"):
        model = small_model("clstm")
        model.window_kernel = kernel
        buf = fake_rollout(model)
        cfg = ppo_cfg(epochs=2)
        adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
        results.append([p.detach().clone() for p in model.parameters()])
    assert any(not torch.equal(a, b) for a, b in zip(results[0], small_model("clstm").parameters(), strict=True))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
