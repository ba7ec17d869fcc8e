"""A study's trained policies traded again on its traded days with a slower execution than they trained with.

Each seed's last weights (``latest.pt`` of a ``--retrain none`` study) act as trained, but the env moves only
``--trade_rate R`` of the way to their target each day (partial adjustment, `envs.kernel`) and skips orders under
``--band`` (the no-trade band): what slowing a policy at deploy time alone does to its Sharpe and turnover, with
no retraining. Same costs and fills as the study::

    python benchmarks/deploy_slower.py STUDY_DIR --trade_rate 1 0.5 0.25 [--band 0.01]

Prints one row per setting: the seeds' mean Sharpe (each seed's beside it) and mean turnover a year.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.signal_rule import policy_metrics  # noqa: E402
from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.study.markets import load_markets  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint, restore_policy  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path)
    p.add_argument("--trade_rate", type=float, nargs="+", default=[1.0])
    p.add_argument("--band", type=float, nargs="+", default=[0.01])
    args = p.parse_args()
    torch.set_num_threads(1)
    market = load_markets(args.study / "prepared", sorted((args.study / "prepared").glob("*.json"))[0].stem)[0]
    checkpoints = [load_checkpoint(path) for path in sorted((args.study / "cells").glob("*/periods/000/latest.pt"))]
    policies = [restore_policy(ckpt, market) for ckpt in checkpoints]
    for band in args.band:
        for rate in args.trade_rate:
            sharpe, turnover = [], []
            for ckpt, policy in zip(checkpoints, policies, strict=True):
                env = dataclasses.replace(ckpt.cfg.env, rebalance_band=band, trade_rate=rate)
                run = evaluate_policy(policy, market, "test", env)
                metrics = policy_metrics(run, env)
                sharpe.append(metrics["sharpe"])
                turnover.append(metrics["annual_turnover"])
            seeds = " ".join(f"{x:.2f}" for x in sharpe)
            print(
                f"band {band:.2f} trade_rate {rate:.2f}: Sharpe {np.mean(sharpe):.2f} ({seeds}), "
                f"turnover {np.mean(turnover):.0f}x a year"
            )


if __name__ == "__main__":
    main()
