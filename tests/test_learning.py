"""Learning is tested: the first command (``--preset demo``) trained on a market with a planted signal of stated
strength beats buy-and-hold and its own untrained network on held-out days, over seeds, and keeps a stated share of
what the reference trader earns above buy-and-hold.

Market: the demo preset's (`clstm_ppo.config.PRESETS`): generator 3, 6 tickers over 10 years, a lead-lag signal of
information coefficient 0.3 at next-open fills (half-life 5 days; tickers 1, 3 and 5 follow 0, 2 and 4), trained on
16 draws of the generator (``train_draws=16``) so that the policy cannot learn one path by heart. IC 0.3 is a toy:
real daily stocks show about 0.02 (docs/data.md). The reference trader is the best of a family of traders of the
signal (tilt scales from 0, the equal-weight book, to 3, x no-trade bands), its predictor recomputed from the prices,
chosen on each seed's own training days and run on its held-out days (`clstm_ppo.evaluation.oracle`).

Each seed (market and weights) trains the default policy of the preset through the real train script on the CPU (as
many at once as the machine has cores), whose last line scores the checkpoint it deploys on the test split (the last
15% of the days, never seen in training) beside equal-weight buy-and-hold with the same costs and the reference on the
same days (the backtest confirms that line: `tests/test_backtest.py`); the same network untrained (the trainer's
initial weights) is scored here. Asserted, over the seeds:

* the market holds something to learn: each seed's reference is at least 0.5 Sharpe above buy-and-hold;
* trained minus buy-and-hold and trained minus untrained: one-sided 95% t lower bounds over seeds above 0;
* the share of the reference's excess, (mean trained - mean buy-and-hold) / (mean reference - mean buy-and-hold):
  >= 25%.

The seeds were drawn once and written here before their first run: six as
``numpy.random.default_rng(58).integers(1000, 10000, 6)``, four more as ``numpy.random.default_rng(6901).integers(1000,
10000, 4)`` (issue 69). They judge, they chose nothing (the preset was chosen on seeds 201-208 and its state's
portfolio block on issue 69's first 24 robustness seeds; its claims are measured by ``benchmarks/demo_seeds.py`` and
recorded in docs/learning.md).

Ten seeds, because a verdict must not hinge on the last bit: the same seed trains to other weights on a CPU whose
kernels round otherwise, so a seed's result is a draw. Over 48 fresh seeds, each trained under two kernel settings,
none trailed buy-and-hold; the one-sided 95% upper bound of that rate is 6.1%, and at that rate, with a failing seed
as bad as the worst seen before issue 69's fix, ten seeds fail this test in under 1% of draws
(`benchmarks/learning_test_size.py`; docs/learning.md, "The same verdict on any machine").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.cli.train import parse_config
from clstm_ppo.evaluation.oracle import MIN_ORACLE_EXCESS, excess_share
from clstm_ppo.evaluation.statistics import t_interval
from clstm_ppo.market import build_market
from tests.conftest import SCRIPT, clean_env

LEARN = ["--preset", "demo", "--num_gpus", "0", "--no-progress", "--log_every", "100000", "--eval_every", "100000"]
"""The first command, logging and validating only at the end: the weights are the same bits as with its every-10-updates
validation (which draws nothing: tests/test_trainer.py), a quarter less work, and the test reads latest.pt only."""
SEEDS = (5590, 3781, 6110, 8918, 9571, 3187, 4844, 1145, 2240, 2336)
"""Market and weight seeds drawn once, never picked (the module docstring says how)."""
SHARE = 0.25
"""The smallest share of the reference's excess over buy-and-hold the trained network must keep (issues 58, 70)."""


HELD_OUT = re.compile(
    r"held-out test .*: latest\.pt Sharpe (?P<trained>-?[\d.]+) .* \| buy-and-hold Sharpe (?P<buy_and_hold>-?[\d.]+), "
    r".* the reference trader \((?P<member>[^)]*), chosen on the training days\) Sharpe (?P<reference>-?[\d.]+) after "
    r"costs, "
)
"""The figures of a run's last line (`clstm_ppo.evaluation.backtest.held_out_line`), to two decimals."""


def held_out_and_untrained(seed: int, last_line: str) -> dict:
    """The trained, buy-and-hold and reference Sharpe ratios of ``seed``'s run on its held-out days (its last line),
    the reference's member, and the same network untrained on them."""
    match = HELD_OUT.search(last_line)
    assert match, last_line
    cfg = parse_config([*LEARN, "--seed", str(seed)])
    market = build_market(cfg.data, seed=cfg.run.seed)
    torch.manual_seed(cfg.run.seed)  # the trainer's initial weights
    untrained = evaluate_policy(build_model(cfg, market), market, "test", cfg.env).sharpe
    figures = {k: v if k == "member" else float(v) for k, v in match.groupdict().items()}
    return {**figures, "untrained": untrained}


def last_lines(tmp_path, seeds: tuple[int, ...], at_once: int) -> dict[int, str]:
    """Each seed's run through the real train script (one thread each), ``at_once`` at a time: the last line it
    printed. More runs than cores would only take turns, and each would take longer (ten at once on two cores: about
    32 CPU-s a run instead of 27, their caches evicting one another)."""

    def run(seed: int) -> str:
        argv = [sys.executable, SCRIPT, *LEARN, "--seed", str(seed), "--run_name", f"s{seed}", "--threads", "1"]
        argv += ["--checkpoint_dir", str(tmp_path / "ck")]
        done = subprocess.run(argv, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=1500)
        assert done.returncode == 0, f"seed {seed}: {done.stderr[-2000:]}"
        return done.stdout.strip().splitlines()[-1]

    with ThreadPoolExecutor(max_workers=at_once) as pool:  # a run starts as soon as one ends
        return dict(zip(seeds, pool.map(run, seeds), strict=True))


@pytest.mark.slow
def test_the_first_run_learns_the_planted_signal_out_of_sample(tmp_path):
    lines = last_lines(tmp_path, SEEDS, at_once=max(1, os.cpu_count() or 1))
    results = {seed: held_out_and_untrained(seed, lines[seed]) for seed in SEEDS}
    for seed, r in results.items():
        print(", ".join(f"{k} {v}" if k == "member" else f"{k} {v:.3f}" for k, v in r.items()), f"(seed {seed})")
    numbers = ("trained", "buy_and_hold", "untrained", "reference")
    col = {k: np.array([r[k] for r in results.values()]) for k in numbers}
    assert (col["reference"] - col["buy_and_hold"] >= MIN_ORACLE_EXCESS).all(), results  # something to learn
    assert t_interval(col["trained"] - col["buy_and_hold"])[2] > 0, results
    assert t_interval(col["trained"] - col["untrained"])[2] > 0, results
    share = excess_share(*(float(col[k].mean()) for k in ("trained", "buy_and_hold", "reference")))
    assert share is not None and share >= SHARE, (share, results)
