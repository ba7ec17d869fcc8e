"""--ema_decay: the moving average of the weights is what validation scores and every reader deploys."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.agent.model import ActorCritic, ModelSpec
from clstm_ppo.config import ModelConfig
from clstm_ppo.market import build_market
from clstm_ppo.training.checkpoint import load_checkpoint, restore_policy
from clstm_ppo.training.weight_average import WeightAverage
from tests.conftest import QUICK, QUICK_DATA, SCRIPT, clean_env, train


def _tiny_model() -> ActorCritic:
    """A small clstm with the next-day head and the observation normaliser's buffers."""
    config = ModelConfig(stage1_hidden=4, feature_dim=4, stage2_hidden=8, norm_obs=True)
    return ActorCritic(ModelSpec.of(config, num_features=10, num_tickers=3, window=4, next_day_head=True))


def test_the_average_is_the_closed_form_ema_and_buffers_are_copied():
    torch.manual_seed(0)
    model = _tiny_model()
    start = {k: v.clone() for k, v in model.named_parameters()}
    decay, iterates = 0.7, []
    average = WeightAverage(model, decay)
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        for b in model.buffers():
            b.add_(1.0)
        iterates.append({k: v.detach().clone() for k, v in model.named_parameters()})
        average.update(model)
    k = len(iterates)
    for name, mine in average.model.named_parameters():
        expected = decay**k * start[name] + sum(
            (1 - decay) * decay ** (k - 1 - i) * w[name] for i, w in enumerate(iterates)
        )
        torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-6)
        assert not mine.requires_grad
    for mine, theirs in zip(average.model.buffers(), model.buffers(), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.slow
def test_validation_and_backtests_deploy_the_average(tmp_path):
    result = train(tmp_path, "--num_episodes", "24", "--run_name", "ema", "--ema_decay", "0.5", "--eval_every", "1")
    assert result.returncode == 0, result.stderr
    best = load_checkpoint(tmp_path / "ck" / "ema" / "best.pt")
    latest = load_checkpoint(tmp_path / "ck" / "ema" / "latest.pt")
    for ckpt in (best, latest):
        assert ckpt.average_state is not None and ckpt.deployed_state is ckpt.average_state
        assert any(not torch.equal(v, ckpt.model_state[k]) for k, v in ckpt.average_state.items())
    market = build_market(best.cfg.data, seed=best.cfg.run.seed)
    policy = restore_policy(best, market)
    assert all(torch.equal(v, best.average_state[k]) for k, v in policy.state_dict().items())
    # best.pt was chosen by the average's validation Sharpe, the number a backtest of it gives again
    run = evaluate_policy(policy, market, "validation", best.cfg.env)
    assert run.sharpe == pytest.approx(best.counters["best_score"], abs=1e-9)


def test_without_it_a_checkpoint_deploys_the_trained_weights(tmp_path):
    cmd = [sys.executable, SCRIPT, *QUICK_DATA, *QUICK, "--checkpoint_dir", str(tmp_path), "--run_name", "plain"]
    done = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    ckpt = load_checkpoint(tmp_path / "plain" / "latest.pt")
    assert ckpt.average_state is None and ckpt.deployed_state is ckpt.model_state


@pytest.mark.parametrize("value", ["1", "-0.1"])
def test_a_decay_outside_0_1_is_one_line(tmp_path, value):
    result = train(tmp_path, "--num_episodes", "4", "--ema_decay", value, "--dry_run")
    assert result.returncode != 0
    assert "--ema_decay must be in [0, 1)" in result.stderr and "Traceback" not in result.stderr
