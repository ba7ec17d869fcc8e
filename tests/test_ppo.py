"""The PPO update and its optimizer step: statistics, KL early stop, NaN steps skipped (plain and fused Adam),
gradient accumulation, both window kernels, the host-side episode cuts and the phase timer."""

from __future__ import annotations

import math
import time

import torch

from clstm_ppo.agent.recurrence import cut_days
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import PhaseTimer, SeedLearner, ppo_update
from clstm_ppo.training.rollout import compute_gae
from tests.conftest import fake_rollout, ppo_cfg, small_model


def test_ppo_update_changes_parameters_and_reports_statistics():
    model = small_model("clstm")
    buf = fake_rollout(model)
    cfg = ppo_cfg()
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    stats = ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
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
    stats = ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
    assert stats.epochs_run == 1


def test_nan_gradients_skip_the_step():
    model = small_model("mlp")
    buf = fake_rollout(model)
    buf.rewards[0, 0] = float("nan")
    cfg = ppo_cfg(epochs=1, norm_adv=False)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    stats = ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
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
        ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


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
        ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
        results.append([p.detach().clone() for p in model.parameters()])
    assert any(not torch.equal(a, b) for a, b in zip(results[0], small_model("clstm").parameters(), strict=True))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _update(fused: bool, nan: bool) -> tuple[list[torch.Tensor], int, set[float]]:
    model = small_model("clstm")
    buf = fake_rollout(model, steps=12, envs=4)
    if nan:
        buf.rewards[0, 0] = float("nan")  # poisons the minibatch holding env column 0
    cfg = ppo_cfg(epochs=2, norm_adv=False)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    stats = ppo_update(model, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, Comm())[0]
    steps = {float(s["step"]) for s in opt.state.values()}
    return [p.detach().clone() for p in model.parameters()], stats.skipped_steps, steps


def test_fused_adam_skips_nan_steps_like_the_plain_loop():
    plain, plain_skipped, plain_steps = _update(fused=False, nan=True)
    fused, fused_skipped, fused_steps = _update(fused=True, nan=True)
    assert plain_skipped == fused_skipped >= 1
    assert plain_steps == fused_steps  # skipped steps do not advance Adam's step count
    assert all(torch.isfinite(p).all() for p in fused)
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_adam_update_matches_plain_without_nans():
    plain, _, _ = _update(fused=False, nan=False)
    fused, skipped, _ = _update(fused=True, nan=False)
    assert skipped == 0
    for a, b in zip(plain, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_host_cut_days_are_the_days_where_some_env_starts():
    starts = torch.tensor([[True, False], [False, False], [False, True], [True, True], [False, False]])
    assert cut_days(starts) == [2, 3]  # day 0 needs no cut: the stored state is reset there anyway
    assert cut_days(starts[:1]) == []


def test_phase_timer_sums_each_phase_and_timing_an_update_changes_nothing():
    timer = PhaseTimer("cpu")
    for _ in range(2):
        with timer("wait"):
            time.sleep(0.01)
    assert timer.seconds["wait"] >= 0.02  # summed over calls
    results = []
    for timed in (False, True):
        model = small_model("clstm")
        buf = fake_rollout(model)
        cfg = ppo_cfg(epochs=1)
        adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
        timer = PhaseTimer("cpu") if timed else None
        learner = SeedLearner(cfg, torch.optim.Adam(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0))
        ppo_update(model, [learner], buf, adv, ret, Comm(), timer=timer)
        results.append([p.detach().clone() for p in model.parameters()])
    assert set(timer.seconds) == {"forward", "backward", "optimizer"}
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
