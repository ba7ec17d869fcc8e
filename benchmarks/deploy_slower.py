"""A study's trained policies traded again on its traded days with a slower execution than they trained with.

Each seed's last weights (``latest.pt`` of a ``--retrain none`` study) act as trained, but the env moves only
``--trade_rate R`` of the way to their target each day (partial adjustment, `envs.kernel`) and skips orders under
``--band`` (the no-trade band): what slowing a policy at deploy time alone does to its Sharpe and turnover, with
no retraining. Same costs and fills as the study::

    python benchmarks/deploy_slower.py STUDY_DIR --trade_rate 1 0.5 0.25 [--band 0.01] [--cells 'clstm-trade_rate=1.0-*']

A threshold on the forecast, for ``--forecast_only`` policies (whose stocks' means are ``g x forecast + b``): with
``--shift D`` each seed trades with ``--forecast_threshold D`` (its stocks' deterministic means lowered by D,
`ActorCritic.deployed_mean`), and with ``--gain K`` with ``K g``: a stock is held only where ``K g x forecast + b``
clears D: what a no-trade threshold on the learned forecast would earn, with no retraining::

    python benchmarks/deploy_slower.py STUDY_DIR --cells 'clstm-trade_rate=1.0-*' --gain 1 2 4 --shift 0 1 2

``--shift_sd K`` sets each seed's D to K times its own spread ``s`` (the pooled standard deviation of its stock
means over its training days, `clstm_ppo.evaluation.forecast_spread`): a threshold in units of the forecast's size.
``--centred`` (with ``--shift_sd``) deploys ``--forecast_gain G`` instead: each stock's means ``G x ((m - mu_i) / s -
K)``, its distance from its training-days level in spreads, for each ``--gain G`` (docs/learning.md section 22).
``--csv FILE`` also writes one row per setting and seed.

Prints one row per setting: the seeds' mean Sharpe (each seed's beside it), mean cumulative return, turnover a year
and exposure.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.signal_rule import policy_metrics  # noqa: E402
from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import ActorCritic  # noqa: E402
from clstm_ppo.evaluation.forecast_spread import spread_and_centre  # noqa: E402
from clstm_ppo.evaluation.statistics import mean_exposure  # noqa: E402
from clstm_ppo.study.markets import load_markets  # noqa: E402
from clstm_ppo.training.checkpoint import Checkpoint, load_checkpoint, restore_policy  # noqa: E402
from envs.features import PreparedMarket  # noqa: E402


def study_policies(study: Path, cells: str) -> tuple[PreparedMarket, list[Path], list[Checkpoint], list[ActorCritic]]:
    """A ``--retrain none`` study's market and, for the cells matching the glob ``cells``, each one's last weights:
    their paths, checkpoints and restored policies; SystemExit when no cell matches."""
    market = load_markets(study / "prepared", sorted((study / "prepared").glob("*.json"))[0].stem)[0]
    paths = sorted((study / "cells").glob(f"{cells}/periods/000/latest.pt"))
    if not paths:
        raise SystemExit(f"{study}: no cell matches {cells!r}")
    checkpoints = [load_checkpoint(path) for path in paths]
    return market, paths, checkpoints, [restore_policy(ck, market) for ck in checkpoints]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path)
    p.add_argument("--trade_rate", type=float, nargs="+", default=[1.0])
    p.add_argument("--band", type=float, nargs="+", default=[0.01])
    p.add_argument("--cells", default="*", help="a glob over the study's cell folders (default: all)")
    p.add_argument("--gain", type=float, nargs="+", default=[1.0], help="--forecast_only: scale g by K")
    p.add_argument("--shift", type=float, nargs="+", default=[], help="--forecast_only: --forecast_threshold D")
    p.add_argument("--shift_sd", type=float, nargs="+", default=[], help="--forecast_only: D = K x the seed's spread")
    p.add_argument("--centred", action="store_true", help="--gain G is --forecast_gain G (needs --shift_sd)")
    p.add_argument("--csv", type=Path, help="also write one row per setting and seed here")
    args = p.parse_args()
    torch.set_num_threads(1)
    market, paths, checkpoints, policies = study_policies(args.study, args.cells)
    shifts = [("D", d) for d in args.shift] + [("K", k) for k in args.shift_sd] or [("D", 0.0)]
    thresholds = [(g, s) for g in args.gain for s in shifts]
    if thresholds != [(1.0, ("D", 0.0))] and not all(policy.spec.forecast_only for policy in policies):
        raise SystemExit("--gain, --shift and --shift_sd need --forecast_only policies (g x forecast + b)")
    if args.centred and (args.shift or not args.shift_sd):
        raise SystemExit("--centred reads --gain as --forecast_gain: it takes --shift_sd K, not --shift")
    trained = [policy.forecast_gain.detach().clone() for policy in policies]
    measured = [
        spread_and_centre(policy, market, ckpt.cfg.env) if args.shift_sd else (math.nan, None)
        for ckpt, policy in zip(checkpoints, policies, strict=True)
    ]
    spreads = [spread for spread, _ in measured]
    rows = []
    for band, rate, (gain, (unit, shift)) in itertools.product(args.band, args.trade_rate, thresholds):
        sharpe, turnover, exposure, ret = [], [], [], []
        for path, ckpt, policy, g, (spread, centre) in zip(
            paths, checkpoints, policies, trained, measured, strict=True
        ):
            if args.centred:  # --forecast_gain G: G x ((m - mu) / s - K), the trained g kept
                threshold = gain * shift
                policy.spec = dataclasses.replace(
                    policy.spec,
                    forecast_threshold=threshold,
                    forecast_centre=tuple(centre),
                    forecast_scale=gain / spread,
                )
            else:
                with torch.no_grad():
                    policy.forecast_gain.copy_(g * gain)
                threshold = shift * spread if unit == "K" else shift
                policy.spec = dataclasses.replace(policy.spec, forecast_threshold=threshold)
            env = dataclasses.replace(ckpt.cfg.env, rebalance_band=band, trade_rate=rate)
            run = evaluate_policy(policy, market, "test", env)
            metrics = policy_metrics(run, env)
            sharpe.append(metrics["sharpe"])
            turnover.append(metrics["annual_turnover"])
            exposure.append(mean_exposure(run.values, run.holdings_value))
            ret.append(metrics["cumulative_return"])
            rows.append(
                {"cell": path.parents[2].name, "band": band, "trade_rate": rate, "gain": gain, "centred": args.centred,
                 "unit": unit,
                 "shift": shift, "spread": spread, "threshold": threshold, "sharpe": sharpe[-1],
                 "annual_turnover": turnover[-1], "exposure": exposure[-1], "cumulative_return": ret[-1]}
            )  # fmt: skip
        seeds = " ".join(f"{x:.2f}" for x in sharpe)
        name = f"shift {shift:g}" if unit == "D" else f"shift {shift:g} x spread"
        print(
            f"band {band:.2f} trade_rate {rate:.2f} gain x{gain:g} {name}: Sharpe {np.mean(sharpe):.2f} "
            f"({seeds}), return {np.mean(ret):.1%}, turnover {np.mean(turnover):.0f}x a year, exposure {np.mean(exposure):.0%}"
        )
    if args.shift_sd:
        print("spread s per seed: " + " ".join(f"{x:.3f}" for x in spreads))
    if args.csv:
        pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
