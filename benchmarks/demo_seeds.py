"""The first command's result over seeds: ``--preset demo`` trained on each seed's own market, then its deployed
checkpoint, the same network untrained, equal-weight buy-and-hold and the oracle on that market's held-out days.

    PYTHONPATH=. python benchmarks/demo_seeds.py --seeds 101-108 --workers 2 --out demo-101-108.json

Each seed runs the real training script (``--preset demo --seed S``, one process per seed, ``--workers`` at a time)
into ``--dir``; the figures are then read in this process: the deployed checkpoint's Sharpe on the test split and on
its own market's training days, the untrained network's (the trainer's initial weights: ``torch.manual_seed(S)``),
buy-and-hold's and the oracle's (`clstm_ppo.evaluation.oracle`), all after costs on the same days. The table gives
them by seed; below it, the means, the share of the oracle's excess over buy-and-hold that the trained network keeps
(mean trained - mean buy-and-hold) / (mean oracle - mean buy-and-hold), and 95% t-intervals over the seeds of the
paired differences trained - buy-and-hold and trained - untrained (issue 58's measures). ``--config FILE`` trains
with those settings on top of the preset (a development variant); the JSON written to ``--out`` holds every seed's
figures, the command and the commit, for the docs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.evaluation.backtest import open_checkpoint, restore_policy
from clstm_ppo.evaluation.oracle import excess_share, oracle_run, run_figures
from clstm_ppo.evaluation.statistics import ratio_t_interval, t_interval
from clstm_ppo.market import build_market
from clstm_ppo.study.grid import parse_seeds
from clstm_ppo.training.run_folder import deployed_checkpoint
from envs.oracle import require_planted_rule

ROOT = Path(__file__).resolve().parents[1]


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


def figures(seed: int, folder: Path) -> dict[str, float]:
    """Trained (test and training days), untrained, buy-and-hold and oracle Sharpe ratios of seed's run, with the
    trained network's and the oracle's turnover and exposure on the test days, and how the trained book moves there:
    its largest stock's mean weight (a book frozen into one stock shows near 1) and the mean over stocks of each
    weight's standard deviation over the days (near 0: a static book)."""
    run_dir = folder / f"s{seed}"
    cfg = open_checkpoint(run_dir / "latest.pt").cfg
    ck = open_checkpoint(deployed_checkpoint(run_dir, True, cfg.run.deploy))
    market = build_market(cfg.data, seed=cfg.run.seed)
    trained = restore_policy(ck, market)
    torch.manual_seed(cfg.run.seed)  # the trainer's initial weights
    untrained = build_model(cfg, market)
    oracle = oracle_run(market, "test", cfg.env, require_planted_rule(cfg.data.source))
    run = evaluate_policy(trained, market, "test", cfg.env)
    learned = run_figures(run, market, market.splits.test, cfg.env)
    weights = run.holdings * run.prices / run.values[:, None]  # [D, N] each stock's share of the book
    return {
        "seed": seed,
        "trained": learned.run.sharpe,
        "trained_turnover": learned.annual_turnover,
        "trained_exposure": learned.exposure,
        "trained_top_weight": float(weights.mean(axis=0).max()),
        "trained_weight_sd": float(weights.std(axis=0).mean()),
        "oracle_turnover": oracle.annual_turnover,
        "oracle_exposure": oracle.exposure,
        "trained_training_days": evaluate_policy(trained, market, "train", cfg.env).sharpe,
        "untrained": evaluate_policy(untrained, market, "test", cfg.env).sharpe,
        "buy_and_hold": oracle.buy_and_hold_sharpe,
        "oracle": oracle.sharpe,
        "test_days": market.splits.test.num_days,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="101-108", help="seeds, the study's syntax (101-108, 1,3,5)")
    parser.add_argument("--workers", type=int, default=2, help="training processes at a time")
    parser.add_argument("--dir", default="demo-seeds", help="where the runs go")
    parser.add_argument("--config", default=None, help="a --config file of settings on top of the preset")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
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
        "| seed | trained | on training days | untrained | buy-and-hold | oracle | trained turnover, exposure | "
        "top weight, weight sd | wall s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['trained']:.2f} | {r['trained_training_days']:.2f} | {r['untrained']:.2f} | "
            f"{r['buy_and_hold']:.2f} | {r['oracle']:.2f} | {r['trained_turnover']:.1f}x, "
            f"{r['trained_exposure']:.0%} | {r['trained_top_weight']:.0%}, {r['trained_weight_sd']:.2f} | {r['wall_s']:.0f} |"
        )
    col = {k: np.array([r[k] for r in rows]) for k in ("trained", "untrained", "buy_and_hold", "oracle")}
    mean = {k: float(v.mean()) for k, v in col.items()}
    share = excess_share(mean["trained"], mean["buy_and_hold"], mean["oracle"])
    minus_bh = t_interval(col["trained"] - col["buy_and_hold"])
    minus_untrained = t_interval(col["trained"] - col["untrained"])
    print(
        f"\nmeans: trained {mean['trained']:.2f}, untrained {mean['untrained']:.2f}, buy-and-hold "
        f"{mean['buy_and_hold']:.2f}, oracle {mean['oracle']:.2f} (excess {mean['oracle'] - mean['buy_and_hold']:+.2f})"
    )
    share_lo, share_hi = ratio_t_interval(col["trained"] - col["buy_and_hold"], col["oracle"] - col["buy_and_hold"])
    print(
        f"share of the oracle's excess: {'n/a' if share is None else format(share, '.1%')} [{share_lo:.0%}, {share_hi:.0%}] "
        f"(95% t over the seeds, delta method)"
    )
    for name, (lo, hi, one) in (("trained - buy-and-hold", minus_bh), ("trained - untrained", minus_untrained)):
        diff = col["trained"] - col["buy_and_hold" if "buy" in name else "untrained"]
        print(
            f"{name}: {diff.mean():+.2f} [{lo:+.2f}, {hi:+.2f}] (95% t over {len(rows)} seeds; one-sided lower "
            f"bound {one:+.2f}); ahead on {int((diff > 0).sum())}/{len(rows)} seeds"
        )
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
            "share": share,
            "share_interval": [share_lo, share_hi],
            "trained_minus_buy_and_hold": minus_bh,
            "trained_minus_untrained": minus_untrained,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
