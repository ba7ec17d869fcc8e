"""Learning is tested: trained on a market with a planted signal, the policy beats buy-and-hold out of sample.

Market: 5 synthetic tickers over 10 years with a toy lead-lag signal (ticker i's shocks move ticker i+1 over the next
days, IC 0.3 at next-open fills, half-life 1 day: docs/data.md) -- learnable from the state's daily returns. Both the default policy (``clstm``,
small: a 5-day window, 32-unit stage 1, 64-unit stage 2) and ``mlp`` train with today's default action, reward,
distribution and actor (target weights, log-return reward, tanh-squashed Gaussian, the stocks' means following a
linear forecast from the window: docs/learning.md section 19) through the real train script on
CPU for 1,000 episodes (a third of the README's demo run; all four runs in parallel, about 20 s each alone); the deterministic policy of the checkpoint the run
deploys (``--deploy``, today ``latest.pt``) is backtested with the real `clstm-ppo backtest` on the held-out test split (the last 15% of days, never seen in
training) and must beat both equal-weight buy-and-hold and the same network untrained, by Sharpe ratio.
Seeds 2 and 4 are fixed; the rule that knows the signal (`clstm_ppo.evaluation.oracle`) earns 3.91 and 5.41 there,
so the trained policies keep well under a third of it. The claim over 12 seeds (on the generator-1 market), with intervals, is the study in the README (``benchmarks/learning_studies.sh``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.cli.train import parse_config
from clstm_ppo.market import build_market
from clstm_ppo.training.run_folder import deployed_checkpoint
from tests.conftest import SCRIPT, clean_env

LEARN = ["--preset", "demo", "--num_gpus", "0", "--no-progress", "--log_every", "1000", "--num_episodes", "1000"]
"""The demo preset (`clstm_ppo.config.PRESETS`): the market and small networks this docstring describes, on one
thread, for 1,000 episodes instead of its 3,000 (held-out Sharpe when measured, seeds 2 and 4: clstm 0.58 and 1.65,
mlp 0.97 and 1.95, buy-and-hold -0.01 and 1.16; on the generator-1 market of before, clstm 5.80 and 4.68)."""
SEEDS = (2, 4)
POLICIES = ("clstm", "mlp")


@pytest.mark.slow
def test_trained_policy_beats_buy_and_hold_and_untrained_on_held_out_days(tmp_path):
    runs = [(policy, seed) for policy in POLICIES for seed in SEEDS]
    procs = {
        (policy, seed): subprocess.Popen(
            [
                sys.executable,
                SCRIPT,
                *LEARN,
                "--policy",
                policy,
                "--seed",
                str(seed),
                "--run_name",
                f"{policy}{seed}",
                "--checkpoint_dir",
                str(tmp_path / "ck"),
            ],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for policy, seed in runs
    }
    for run, proc in procs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{run}: {err[-2000:]}"
    failures = []
    for policy, seed in runs:
        out = tmp_path / f"bt-{policy}{seed}"
        cfg = parse_config([*LEARN, "--policy", policy, "--seed", str(seed)])
        deployed = deployed_checkpoint(tmp_path / "ck" / f"{policy}{seed}", True, cfg.run.deploy)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "clstm_ppo.cli",
                "backtest",
                "--checkpoint",
                str(deployed),
                "--out",
                str(out),
                "--threads",
                "1",
            ],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        report = json.loads((out / "report.json").read_text())
        trained = report["metrics"]["policy"]["sharpe"]
        buy_and_hold = report["metrics"]["baseline"]["sharpe"]

        market = build_market(cfg.data, seed=cfg.run.seed)
        torch.manual_seed(cfg.run.seed)  # the trainer's initial weights
        untrained = evaluate_policy(build_model(cfg, market), market, "test", cfg.env).sharpe
        print(
            f"{policy} seed {seed} ({deployed.name}): trained {trained:.3f}, buy-and-hold {buy_and_hold:.3f}, untrained {untrained:.3f}"
        )
        if not (trained > buy_and_hold + 0.2 and trained > untrained + 0.2):
            failures.append(
                f"{policy} seed {seed}: trained {trained:.3f} vs buy-and-hold {buy_and_hold:.3f}, "
                f"untrained {untrained:.3f}"
            )
    assert not failures, "; ".join(failures)
