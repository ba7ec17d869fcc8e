"""``--policy shared``: one encoder for every ticker and a cross-sectional stage (`clstm_ppo.agent.shared`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clstm_ppo import cli
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.shared import ticker_windows
from tests.conftest import QUICK, fake_rollout, net_spec, small_model

K = 3  # indicators in these tests' states: F = 1 + (2 + K) N


def shared_model(tickers: int = 4, **fields) -> ActorCritic:
    torch.manual_seed(0)
    spec = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True, next_day_head=True)
    return ActorCritic(net_spec("shared", 1 + (2 + K) * tickers, tickers, 5, **{**spec, **fields}))


def permute_tickers(obs: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Observations ``[..., F]`` with the tickers of every block of N in the order ``perm``."""
    n = perm.numel()
    blocks = obs[..., 1:].reshape(*obs.shape[:-1], 2 + K, n)[..., perm]
    return torch.cat([obs[..., :1], blocks.reshape(*obs.shape[:-1], -1)], dim=-1)


def test_each_ticker_sees_its_own_columns_and_the_cash():
    n = 4
    obs = torch.arange(3 * 5 * (1 + (2 + K) * n), dtype=torch.float32).reshape(3, 5, -1)
    tickers = ticker_windows(obs, K)
    assert tickers.shape == (3, n, 5, 3 + K)
    layout_cols = [1 + b * n + 2 for b in range(2 + K)]  # ticker 2's price, holding and indicator columns
    torch.testing.assert_close(tickers[:, 2, :, :-1], obs[..., layout_cols])
    torch.testing.assert_close(tickers[:, 2, :, -1], obs[..., 0])


def test_permuting_the_tickers_permutes_the_actions_and_keeps_the_value():
    model = shared_model()
    obs = torch.randn(2, 3, 5, 1 + (2 + K) * 4)  # [L, B, T, F]
    state, starts = model.initial_state(3), torch.zeros(2, 3, dtype=torch.bool)
    perm = torch.tensor([2, 0, 3, 1])
    base = model(obs, state, starts, predict_next=True)
    moved = model(permute_tickers(obs, perm), state, starts, predict_next=True)
    torch.testing.assert_close(moved.mean, base.mean[..., perm], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(moved.next_day, base.next_day[..., perm], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(moved.value, base.value, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(base.mean[..., 0], base.mean[..., 1])  # the tickers are not all treated alike


def test_the_same_weights_act_on_any_number_of_tickers():
    small, wide = shared_model(tickers=3), shared_model(tickers=50)
    assert sum(p.numel() for p in small.parameters()) == sum(p.numel() for p in wide.parameters())
    wide.load_state_dict(small.state_dict())  # identical parameter shapes: weights move between universes
    for n in (3, 7):
        obs = torch.randn(1, 2, 5, 1 + (2 + K) * n)
        out = small(obs, small.initial_state(2), torch.ones(1, 2, dtype=torch.bool))
        assert out.mean.shape == (1, 2, n) and out.value.shape == (1, 2) and out.log_prob.shape == (1, 2)
        torch.testing.assert_close(wide(obs, wide.initial_state(2), torch.ones(1, 2, dtype=torch.bool)).mean, out.mean)
    assert small.initial_state(2).actor_h.shape == (1, 2, 0)  # no recurrence across days


def test_the_update_recomputes_the_rollouts_log_probs_and_values():
    model = small_model("shared", action_dist="tanh", skip=True)
    buf = fake_rollout(model)
    out = model(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
    torch.testing.assert_close(out.log_prob, buf.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.value, buf.values, rtol=1e-5, atol=1e-5)
    stage1 = {id(p) for p in model.stage1_parameters()}
    assert id(model.shared.window_lstm.weight_ih_l0) in stage1 and id(model.log_std) not in stage1


def test_a_shared_policy_trains_and_backtests_and_refuses_norm_obs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = ["--data", "synthetic:tickers=3,days=200"]
    run = ["--policy", "shared", *QUICK, *data, "--checkpoint_dir", str(tmp_path), "--run_name", "s"]
    assert cli.main(["train", *run]) == 0
    assert "held-out test" in capsys.readouterr().out
    assert cli.main(["backtest", "--checkpoint", str(tmp_path / "s" / "best.pt"), "--out", str(tmp_path / "bt")]) == 0
    report = json.loads((tmp_path / "bt" / "report.json").read_text())
    assert report["metrics"]["policy"]["num_days"] > 10
    capsys.readouterr()
    code = cli.main(["train", *run[:-1], "s2", "--norm_obs"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--policy shared cannot use it" in err
    assert not (tmp_path / "s2").exists()
