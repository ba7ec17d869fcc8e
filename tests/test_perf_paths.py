"""The fast paths added for speed give the same results as the plain ones."""

from __future__ import annotations

import torch

from clstm_ppo.agent.model import cut_days
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import PhaseTimer, ppo_update
from clstm_ppo.training.rollout import compute_gae
from tests.test_agent import fake_rollout, ppo_cfg, small_model


def _update(fused: bool, nan: bool) -> tuple[list[torch.Tensor], int, set[float]]:
    model = small_model("clstm")
    buf = fake_rollout(model, steps=12, envs=4)
    if nan:
        buf.rewards[0, 0] = float("nan")  # poisons the minibatch holding env column 0
    cfg = ppo_cfg(epochs=2, norm_adv=False)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    stats = ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
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


def test_host_cut_days_match_device_cuts_and_timer_sums_phases():
    starts = torch.tensor([[True, False], [False, False], [False, True], [True, True], [False, False]])
    assert cut_days(starts) == [2, 3]
    assert cut_days(starts[:1]) == []
    model = small_model("clstm")
    buf = fake_rollout(model)
    cfg = ppo_cfg(epochs=1)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
    timer = PhaseTimer("cpu")
    ppo_update(model, torch.optim.Adam(model.parameters(), lr=1e-3), buf, adv, ret, cfg, Comm(),
               generator=torch.Generator().manual_seed(0), timer=timer)
    assert set(timer.seconds) == {"forward", "backward", "optimizer"}
    assert all(v > 0 for v in timer.seconds.values())
