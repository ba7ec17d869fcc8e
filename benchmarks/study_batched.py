"""One small study run twice on this machine in this run: every cell in its own process (``--batch_cells 1``, the
study before issue 49) and the seeds trained as batches (``--batch_cells 0``, the default: about one batch per
worker), the same grid, data and workers.

    python benchmarks/study_batched.py                      # 8 seeds of the demo network, 2 workers, 1 thread each
    python benchmarks/study_batched.py --cells 12 --num_episodes 1000 --workers 2

The cells are ``--preset demo`` (window 5, stage-1 LSTM 32, 32 features, stage-2 LSTMs 64, 32 envs x 32 days, 4
epochs, its synthetic lead-lag market), ``--num_episodes`` training episodes each, one walk-forward window
(``--retrain none``) traded from ``--trade_start``. Prints a markdown table naming the machine: wall time of each
whole study command (data preparation, every cell's process, training, trading and report, the study's report),
the cells' training seconds, the speed-up, and the largest difference of a cell's out-of-sample Sharpe between the
two runs (a batched cell computes what it computes alone up to float rounding, tests/test_cells.py). Each run keeps
its own trials ledger in the work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import machine_name  # noqa: E402


def run_study(work: Path, name: str, batch_cells: int, opts: argparse.Namespace) -> dict[str, float]:
    """One ``clstm-ppo study`` command; its wall seconds and what its cells' status files say."""
    args = [
        *("--out", str(work / name), "--preset", "demo", "--policies", opts.policy, "--seeds", f"1-{opts.cells}"),
        *("--num_episodes", str(opts.num_episodes), "--retrain", "none", "--trade_start", opts.trade_start),
        *("--workers", str(opts.workers), "--threads", str(opts.threads), "--batch_cells", str(batch_cells)),
        *("--bootstrap", "500", "--ledger", str(work / f"{name}-ledger.jsonl")),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: the {name} study failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    statuses = {p.parent.name: json.loads(p.read_text()) for p in (work / name / "cells").glob("*/status.json")}
    processes = {tuple(status.get("batch") or [cell]) for cell, status in statuses.items()}
    return {
        "wall": wall,
        "train": sum(s["train_seconds"] for s in statuses.values()) / (len(statuses) / len(processes)),
        "processes": len(processes),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=8, help="seeds of one configuration (the study's cells)")
    parser.add_argument("--policy", default="clstm")
    parser.add_argument("--num_episodes", type=int, default=400, help="training episodes per cell")
    parser.add_argument("--trade_start", default="2021-01-04", help="first traded day of the demo market")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="pairs of runs, alternating alone and batched (a shared box's load moves)",
    )
    parser.add_argument("--work", default="", help="folder for the studies (default: a temporary one)")
    opts = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(opts.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for r in range(opts.repeats):
            alone = run_study(work, f"alone{r}", 1, opts)
            batched = run_study(work, f"batched{r}", 0, opts)
            sharpe = [
                pd.read_csv(work / f"{n}{r}" / "cells.csv").set_index("cell")["sharpe"] for n in ("alone", "batched")
            ]
            gap = float((sharpe[0] - sharpe[1][sharpe[0].index]).abs().max())
            rows.append((alone, batched, gap))
    print(f"Machine: {machine_name('cpu')}; {opts.workers} worker(s) x {opts.threads} thread(s)")
    print(
        f"Study: {opts.cells} seeds of `--preset demo --policies {opts.policy}`, {opts.num_episodes} episodes each, "
        f"`--retrain none --trade_start {opts.trade_start}`"
    )
    print()
    print("| pair | run | processes | wall s | training s (per process, summed) | x faster | largest Sharpe gap |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r, (alone, batched, gap) in enumerate(rows, 1):
        print(
            f"| {r} | `--batch_cells 1` (each cell alone) | {alone['processes']} | {alone['wall']:.1f} | {alone['train']:.1f} | 1.00 | |"
        )
        print(
            f"| {r} | `--batch_cells 0` (batches) | {batched['processes']} | {batched['wall']:.1f} | "
            f"{batched['train']:.1f} | {alone['wall'] / batched['wall']:.2f} | {gap:.2e} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
