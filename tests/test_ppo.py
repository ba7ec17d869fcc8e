"""The PPO update and its optimizer step: statistics, KL early stop, NaN steps skipped (plain and fused Adam),
gradient accumulation, both window kernels, the host-side episode cuts and the phase timer."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from clstm_ppo.agent.model import ActorCritic, cut_days
from clstm_ppo.agent.windows import WindowStore
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import PhaseTimer, next_day_targets, ppo_update
from clstm_ppo.training.rollout import compute_gae
from envs.config import EnvConfig
from envs.state import StateLayout
from envs.vector_env import VectorStockTradingEnv
from tests.conftest import fake_rollout, net_spec, ppo_cfg, small_model


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
        ppo_update(
            model,
            torch.optim.Adam(model.parameters(), lr=1e-3),
            buf,
            adv,
            ret,
            cfg,
            Comm(),
            generator=torch.Generator().manual_seed(0),
            timer=timer,
        )
        results.append([p.detach().clone() for p in model.parameters()])
    assert set(timer.seconds) == {"forward", "backward", "optimizer"}
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("days", [1, 3])
def test_next_day_targets_are_tomorrows_z_scored_returns_from_the_real_env(window_market, days):
    """Oracle from the market data itself: the target of step s is the z-scored log return of the day the env
    moved to, ``(log(close[d] / close[d-1]) - mean) / std``, averaged over the next ``days`` steps
    (``--forecast_days``); steps where one of those steps starts a new episode, and the rollout's last ``days``
    steps, have none."""
    envs, steps, n = 4, 20, window_market.num_tickers
    env = VectorStockTradingEnv(window_market, num_envs=envs, config=EnvConfig(episode_length=5), seed=3)
    obs, _ = env.reset()
    store = WindowStore(steps, envs, window_market.window, window_market.num_features, "cpu")
    starts = torch.zeros(steps, envs, dtype=torch.bool)
    start, anchor = torch.ones(envs, dtype=torch.bool), True
    moved_to, done_at = [], []
    gen = torch.Generator().manual_seed(0)
    for s in range(steps):
        store.record(s, obs, anchor=anchor)
        starts[s] = start
        obs, _, terminated, truncated, info = env.step(torch.rand(envs, n, generator=gen) * 2 - 1)
        moved_to.append(info["day"].clone())
        start = terminated | truncated
        done_at.append(start.clone())
        anchor = "_episode" in info
    layout = StateLayout.of_width(window_market.num_features, n)
    assert layout.prices == slice(1, 1 + n)  # the price column block follows cash
    targets, valid = next_day_targets(store.windows(), starts, layout, days)
    close = np.asarray(window_market.data.close, dtype=np.float64)
    norm = window_market.normalization
    assert sum(bool(d.any()) for d in done_at[:-1]) >= 2  # episodes really ended inside the rollout
    for s in range(steps):
        for b in range(envs):
            if s + days > steps - 1 or any(done_at[s + k][b] for k in range(days)):
                assert valid[s, b] == 0
                continue
            day = [int(moved_to[s + k][b]) for k in range(days)]  # the days of steps s + 1 .. s + days
            expected = np.mean(
                [(np.log(close[d] / close[d - 1]) - norm.close_mean) / norm.close_std for d in day], axis=0
            )
            assert valid[s, b] == 1
            np.testing.assert_allclose(targets[s, b].numpy(), expected, rtol=1e-4, atol=1e-5)
    assert valid.sum() > 0


@pytest.mark.slow  # a learning test: 2 x 5 updates of 10 epochs
def test_aux_loss_trains_the_next_day_head_through_the_window_lstm():
    """With the PPO terms switched off (no advantages, no value loss), the auxiliary loss alone must move the
    window LSTM and fit the next-day head: its error on the rollout falls over updates; with aux_coef 0 nothing
    reaches the network's stage 1."""
    errors = {}
    for coef in (0.0, 1.0):
        torch.manual_seed(0)
        model = ActorCritic(
            net_spec(
                "clstm",
                16,
                3,
                5,
                stage1_hidden=12,
                feature_dim=10,
                stage2_hidden=14,
                skip=True,
                next_day_head=True,
            )
        )
        buf = fake_rollout(model, steps=12, envs=4)
        cfg = ppo_cfg(aux_coef=coef, vf_coef=0.0, ent_coef=0.0, epochs=10)
        zeros = torch.zeros_like(buf.rewards)
        window_before = model.window_lstm.weight_hh_l0.detach().clone()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = [
            ppo_update(model, opt, buf, zeros, zeros, cfg, Comm(), generator=torch.Generator().manual_seed(k)).aux_loss
            for k in range(5)
        ]
        errors[coef] = losses
        moved = not torch.equal(window_before, model.window_lstm.weight_hh_l0)
        assert moved == (coef > 0)
    assert errors[0.0] == [0.0] * 5  # not computed when off
    assert errors[1.0][-1] < 0.7 * errors[1.0][0]


def test_the_linear_forecasters_fit_does_not_depend_on_aux_coef():
    """``--forecaster linear``'s own next-day term has weight 1 whatever ``--aux_coef``: with the head off
    (``--aux_coef 0``, no head built) or weighted 0.5 or 2, the map's weights after the same updates are identical
    (only its term reaches them; the clip is off so the head's gradients cannot rescale them), and they moved;
    ``--forecast_days 3`` fits them to other targets."""
    fitted = {}
    for coef, days in ((0.0, 1), (0.5, 1), (2.0, 1), (0.5, 3)):
        torch.manual_seed(0)
        sizes = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True)
        spec = net_spec("clstm", 16, 3, 5, forecast_skip=True, forecaster="linear", next_day_head=coef > 0, **sizes)
        model = ActorCritic(spec)
        buf = fake_rollout(model, steps=12, envs=4)
        cfg = ppo_cfg(aux_coef=coef, max_grad_norm=1e9, epochs=2, forecast_days=days)
        adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(4), cfg.gamma, cfg.gae_lambda)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        stats = ppo_update(model, opt, buf, adv, ret, cfg, Comm(), generator=torch.Generator().manual_seed(0))
        assert stats.aux_loss > 0 and hasattr(model, "next_day") == (coef > 0)
        fitted[coef, days] = model.linear_forecast.weight.detach().clone()
    assert fitted[0.0, 1].any()  # zero at the start: its own term moved it with the head off
    assert torch.equal(fitted[0.0, 1], fitted[0.5, 1]) and torch.equal(fitted[0.5, 1], fitted[2.0, 1])
    assert not torch.equal(fitted[0.5, 1], fitted[0.5, 3])  # --forecast_days reaches its targets
