"""The first command's result over seeds: ``--preset demo`` trained on each seed's own market, then its deployed
checkpoint, the same network untrained, equal-weight buy-and-hold and the reference trader on that market's held-out
days.

    PYTHONPATH=. python benchmarks/demo_seeds.py --seeds 101-108 --workers 2 --out demo-101-108.json

Each seed runs the real training script (``--preset demo --seed S``, one process per seed, ``--workers`` at a time)
into ``--dir``; the figures are then read in this process: the deployed checkpoint's Sharpe on the test split, the
untrained network's (the trainer's initial weights: ``torch.manual_seed(S)``), buy-and-hold's and the reference
trader's (`clstm_ppo.evaluation.oracle`: the best of its family on the market's own training days, then run on the
test days; JSON key ``oracle``, with its member), all after costs on the same days. The table gives them by seed;
below it, the means, the share of the reference's excess over buy-and-hold that the trained network keeps (mean
trained - mean buy-and-hold) / (mean reference - mean buy-and-hold) with its 95% t interval over the seeds (delta
method), the paired test of share >= ``--target`` (the t interval of trained - buy-and-hold - target x (reference -
buy-and-hold)), and 95% t-intervals of the paired differences trained - buy-and-hold and trained - untrained.

A second table reads the same three on the market's own training days: all of them (where the member was chosen, so
the reference is in sample there), the same without the predictor's first 250 days (before its scale settles), and
the last training days, as many as the test's (the length of a held-out run). ``--config FILE`` trains with those
settings on top of the preset (a development variant); the JSON written to ``--out`` holds every seed's figures, the
command and the commit, for the docs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.evaluation.backtest import open_checkpoint, restore_policy
from clstm_ppo.evaluation.metrics import daily_returns
from clstm_ppo.evaluation.oracle import (
    SHARE_TARGET,
    member_run,
    reference_run,
    run_figures,
    seed_share_words,
    share_over_seeds,
)
from clstm_ppo.evaluation.statistics import t_interval
from clstm_ppo.market import build_market
from clstm_ppo.study.grid import parse_seeds
from clstm_ppo.training.run_folder import deployed_checkpoint
from envs.data import DayRange
from envs.oracle import parse_signal, require_planted_rule, signal_predictor

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 250
"""Days of the predictor's trailing scale (`envs.predictor.SCALE_HALFLIFE`) left out of the "settled" training days."""
TRAINING_DAYS = {
    "all": "all training days",
    "settled": f"after the first {WARM_UP}",
    "last": "the last, as many as the test's",
}
"""The stretches of its own training days a seed is read on (module docstring)."""


def train(seed: int, folder: Path, config: str | None) -> float:
    """Train ``--preset demo --seed seed`` into ``folder/s<seed>``; the wall time in seconds."""
    command = [sys.executable, str(ROOT / "train_distributed_clstm_ppo.py"), "--preset", "demo", "--seed", str(seed)]
    command += ["--run_name", f"s{seed}", "--checkpoint_dir", str(folder), "--num_gpus", "0", "--no-progress"]
    command += ["--config", config] if config else []
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed: {done.stderr[-2000:]}")
    (folder / f"s{seed}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    return time.perf_counter() - start


def figures(
    seed: int,
    folder: Path,
    name: str | None = None,
    signal: str | None = None,
    returns: bool = False,
    stretches: bool = True,
) -> dict[str, Any]:
    """Trained, untrained, buy-and-hold and reference Sharpe ratios of seed's run on its test days, the reference's
    member, the trained network's and the reference's turnover and exposure there, how the trained book moves (its
    largest stock's mean weight: near 1 for a book frozen into one stock; the mean over stocks of each weight's
    standard deviation over the days: near 0 for a static book), and the trained network, buy-and-hold and the
    reference on stretches of its own training days (`TRAINING_DAYS`).

    :param name: the run's folder in ``folder`` (default ``s<seed>``, as `train` names it).
    :param signal: the reference's signal (`envs.oracle.parse_signal`: a rule, or ``col:NAME``, a forecast column of
        the run's data); default the rule its synthetic market planted.
    :param returns: add the trained network's and buy-and-hold's daily returns on the test days (``[D]`` each).
    :param stretches: read the training days' stretches too (False: the test days only).
    """
    run_dir = folder / (name or f"s{seed}")
    cfg = open_checkpoint(run_dir / "latest.pt").cfg
    ck = open_checkpoint(deployed_checkpoint(run_dir, True, cfg.run.deploy))
    market = build_market(cfg.data, seed=cfg.run.seed)
    trained = restore_policy(ck, market)
    torch.manual_seed(cfg.run.seed)  # the trainer's initial weights
    untrained = build_model(cfg, market)
    signal = parse_signal(signal) if signal else require_planted_rule(cfg.data.source)
    reference = reference_run(market, "test", cfg.env, signal)
    run = evaluate_policy(trained, market, "test", cfg.env)
    learned = run_figures(run, market, market.splits.test, cfg.env)
    weights = run.holdings * run.prices / run.values[:, None]  # [D, N] each stock's share of the book
    row: dict[str, Any] = {
        "seed": seed,
        "trained": learned.run.sharpe,
        "trained_turnover": learned.annual_turnover,
        "trained_exposure": learned.exposure,
        "trained_top_weight": float(weights.mean(axis=0).max()),
        "trained_weight_sd": float(weights.std(axis=0).mean()),
        "oracle_member": reference.member._asdict(),
        "oracle_turnover": reference.figures.annual_turnover,
        "oracle_exposure": reference.figures.exposure,
        "untrained": evaluate_policy(untrained, market, "test", cfg.env).sharpe,
        "buy_and_hold": reference.buy_and_hold_sharpe,
        "oracle": reference.sharpe,
        "test_days": market.splits.test.num_days,
    }
    if returns:  # the daily simple returns the Sharpe ratios above are of (`run_figures`'s backtest record)
        row["trained_returns"] = daily_returns(learned.record.values)
        row["buy_and_hold_returns"] = daily_returns(learned.record.baseline_values)
    if not stretches:
        return row
    predictor = signal_predictor(market.data, signal, market.splits.train)
    for stretch, days in training_stretches(market.splits.train, market.splits.test.num_days).items():
        mine = run_figures(evaluate_policy(trained, market, days, cfg.env), market, days, cfg.env)
        theirs = member_run(market, days, cfg.env, predictor, reference.member)
        row[f"training_{stretch}"] = {
            "days": days.num_days,
            "trained": mine.sharpe,
            "buy_and_hold": mine.buy_and_hold_sharpe,
            "oracle": theirs.sharpe,
        }
    return row


def training_stretches(train: DayRange, test_days: int) -> dict[str, DayRange]:
    """The stretches of the training days ``train`` a seed is read on (`TRAINING_DAYS`)."""
    return {
        "all": train,
        "settled": DayRange(train.start + WARM_UP, train.stop),
        "last": DayRange(max(train.start, train.stop - test_days), train.stop),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="101-108", help="seeds, the study's syntax (101-108, 1,3,5)")
    parser.add_argument("--workers", type=int, default=2, help="training processes at a time")
    parser.add_argument("--dir", default="demo-seeds", help="where the runs go")
    parser.add_argument("--config", default=None, help="a --config file of settings on top of the preset")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument(
        "--target", type=float, default=SHARE_TARGET, help=f"the share the paired test is of (default {SHARE_TARGET})"
    )
    parser.add_argument(
        "--evaluate_only", action="store_true", help="read the runs already in --dir again (no training; wall s 0)"
    )
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    if args.evaluate_only:
        walls = dict.fromkeys(seeds, 0.0)
    else:
        with ThreadPoolExecutor(args.workers) as pool:
            walls = dict(zip(seeds, pool.map(lambda s: train(s, folder, args.config), seeds), strict=True))
    torch.set_num_threads(1)
    rows = [{**figures(s, folder), "wall_s": walls[s]} for s in seeds]
    print(
        "| seed | trained | untrained | buy-and-hold | reference (member) | trained turnover, exposure | "
        "top weight, weight sd | wall s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['trained']:.2f} | {r['untrained']:.2f} | {r['buy_and_hold']:.2f} | "
            f"{r['oracle']:.2f} ({member_words(r['oracle_member'])}) | {r['trained_turnover']:.1f}x, "
            f"{r['trained_exposure']:.0%} | {r['trained_top_weight']:.0%}, {r['trained_weight_sd']:.2f} | {r['wall_s']:.0f} |"
        )
    col = {k: np.array([r[k] for r in rows]) for k in ("trained", "untrained", "buy_and_hold", "oracle")}
    mean = {k: float(v.mean()) for k, v in col.items()}
    share = share_over_seeds(col["trained"], col["buy_and_hold"], col["oracle"], target=args.target)
    minus_bh = t_interval(col["trained"] - col["buy_and_hold"])
    minus_untrained = t_interval(col["trained"] - col["untrained"])
    members = ", ".join(f"{r['seed']}: {member_words(r['oracle_member'])}" for r in rows)
    print(
        f"\nmeans: trained {mean['trained']:.2f}, untrained {mean['untrained']:.2f}, buy-and-hold "
        f"{mean['buy_and_hold']:.2f}, reference {mean['oracle']:.2f} (excess {mean['oracle'] - mean['buy_and_hold']:+.2f})"
    )
    print(f"the reference trader's member, chosen on each seed's training days: {members}")
    print(seed_share_words(share))
    for name, (lo, hi, one) in (("trained - buy-and-hold", minus_bh), ("trained - untrained", minus_untrained)):
        diff = col["trained"] - col["buy_and_hold" if "buy" in name else "untrained"]
        print(
            f"{name}: {diff.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] (95% t over {len(rows)} seeds; one-sided lower "
            f"bound {one:+.2f}); ahead on {int((diff > 0).sum())}/{len(rows)} seeds"
        )
    on_training_days = training_days_table(rows, args.target)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT
        )
        record = {
            "command": " ".join(sys.argv),
            "commit": commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else ""),
            "config": json.loads(Path(args.config).read_text()) if args.config else {},
            "seeds": rows,
            "share": share.share,
            "share_interval": [share.lo, share.hi],
            "share_test": share._asdict(),
            "training_days": on_training_days,
            "trained_minus_buy_and_hold": minus_bh,
            "trained_minus_untrained": minus_untrained,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def member_words(member: dict[str, float]) -> str:
    """``tilt 0.75, band 0%``: a reference member in a table's cell."""
    return f"tilt {member['scale']:g}, band {member['band']:.0%}"


def training_days_table(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Print the trained network, buy-and-hold and the reference on each stretch of the seeds' own training days
    (means over the seeds) with the share of the reference's excess there; return them for the JSON."""
    print("\non each seed's own training days (the reference chosen on all of them: in sample there):")
    print("| days | trained | buy-and-hold | reference | share of the reference's excess |")
    print("|---|---:|---:|---:|---|")
    out = {}
    for stretch, words in TRAINING_DAYS.items():
        col = {k: np.array([r[f"training_{stretch}"][k] for r in rows]) for k in ("trained", "buy_and_hold", "oracle")}
        share = share_over_seeds(col["trained"], col["buy_and_hold"], col["oracle"], target=target)
        days = sorted({r[f"training_{stretch}"]["days"] for r in rows})
        print(
            f"| {words} ({'/'.join(map(str, days))}) | {col['trained'].mean():.2f} | {col['buy_and_hold'].mean():.2f} | "
            f"{col['oracle'].mean():.2f} | {seed_share_words(share)} |"
        )
        out[stretch] = {**{k: float(v.mean()) for k, v in col.items()}, "share": share._asdict()}
    return out


if __name__ == "__main__":
    main()
