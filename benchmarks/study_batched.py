"""One small study run three ways on this machine in this run: as it ran on the day issue 49 was written (each cell
in its own process, at ``--before``, default tag ``v0.1.0``, the commit the issue measured, checked out in a temporary
git worktree), and at this checkout with every cell alone (``--batch_cells 1``) and with the seeds trained as batches
(``--batch_cells 0``, the default: about one batch per worker); the same grid and workers.

    python benchmarks/study_batched.py                      # 8 seeds of the demo network, 2 workers, 1 thread each
    python benchmarks/study_batched.py --cells 12 --num_episodes 1000 --workers 2 --before ''   # this checkout only
    python benchmarks/study_batched.py --shape mixed --before 8bcb3cf   # 4 clstm + 4 mlp cells, paper-sized network

The cells are ``--preset demo`` (window 5, stage-1 LSTM 32, 32 features, stage-2 LSTMs 64, 32 envs x 32 days, 4
epochs, its synthetic lead-lag market; at ``v0.1.0`` the same sizes and settings on that version's lead-lag market),
``--num_episodes`` training episodes each, one walk-forward window (``--retrain none``) traded from
``--trade_start``. ``--shape mixed`` is the held-out study's shape instead (issue 59): ``--cells`` seeds each of
``--policies clstm,mlp`` with the default, paper-sized network (window 30, 128-128-512) on the example data
(``examples/data/stocks_daily_6_ohlcv.csv``, traded from 2021-01-04), where a batch of large cells must not leave a
worker idle. Prints a markdown table naming the machine: wall time of each whole study command (data
preparation, every cell's process, training, trading and report, the study's report), the cells' training seconds,
the speed-ups, the workers' idle time before the last job started (worker-seconds, from the cells' start and end
times, and as a share of the wall time: issue 59 asks under 5% each), and the largest difference of a cell's out-of-sample Sharpe between this checkout's two runs (a
batched cell computes what it computes alone up to float rounding, tests/test_cells.py). Each run keeps its own
trials ledger in the work folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import machine_name  # noqa: E402
from clstm_ppo.config import PRESETS  # noqa: E402

EXAMPLE_DATA = ROOT / "examples" / "data" / "stocks_daily_6_ohlcv.csv"
# The demo's market without its training pool (train_draws), which a study refuses: a window trains on its own days.
DEMO_MARKET = ",".join(o for o in PRESETS["demo"]["data"].split(",") if not o.startswith("train_draws="))


def run_study(
    work: Path, name: str, batch_cells: int | None, opts: argparse.Namespace, code: Path = ROOT
) -> dict[str, float]:
    """One ``clstm-ppo study`` command of the package in ``code`` (``batch_cells`` None: that version's default);
    its wall seconds and what its cells' status files say."""
    shape = (
        ("--preset", "demo", "--data", DEMO_MARKET, "--policies", opts.policy)
        if opts.shape == "demo"
        else ("--data", f"csv:{EXAMPLE_DATA}", "--policies", "clstm,mlp")
    )
    args = [
        *("--out", str(work / name), *shape, "--seeds", f"1-{opts.cells}"),
        *("--num_episodes", str(opts.num_episodes), "--retrain", "none", "--trade_start", opts.trade_start),
        *("--workers", str(opts.workers), "--threads", str(opts.threads)),
        *(("--batch_cells", str(batch_cells)) if batch_cells is not None else ()),
        *("--bootstrap", "500", "--ledger", str(work / f"{name}-ledger.jsonl")),
    ]
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args], env=env, cwd=code, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: the {name} study failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    statuses = {p.parent.name: json.loads(p.read_text()) for p in (work / name / "cells").glob("*/status.json")}
    processes = {tuple(status.get("batch") or [cell]) for cell, status in statuses.items()}
    return {
        "wall": wall,
        "train": sum(s.get("train_seconds", math.nan) for s in statuses.values()) / (len(statuses) / len(processes)),
        "processes": len(processes),
        "idle": idle_before_last_start(statuses, opts.workers),
    }


def idle_before_last_start(statuses: dict[str, dict], workers: int) -> float:
    """Worker-seconds no job ran, from the first job's start to the last job's (each job: a batch's cells, or one
    cell; its span from its cells' earliest start to their latest end). An upper bound of any one worker's idle time
    before the last job started."""
    jobs: dict[tuple[str, ...], list[float]] = {}
    for cell, status in statuses.items():
        span = jobs.setdefault(tuple(status.get("batch") or [cell]), [math.inf, -math.inf])
        span[0], span[1] = min(span[0], status["started"]), max(span[1], status["finished"])
    first, last = min(s for s, _ in jobs.values()), max(s for s, _ in jobs.values())
    busy = sum(max(0.0, min(end, last) - start) for start, end in jobs.values())
    return max(0.0, workers * (last - first) - busy)


def _git(*args: str, what: str = "") -> str:
    """``git args`` in this repository, its output stripped; with ``what`` (what the run needs it for), a failure
    ends the run in one line, else it reads as empty output."""
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if proc.returncode != 0 and what:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode
        raise SystemExit(f"error: git {' '.join(args)} failed ({what}): {last}")
    return proc.stdout.strip() if proc.returncode == 0 else ""


@contextmanager
def checkout(rev: str, folder: Path) -> Iterator[tuple[Path, str]]:
    """``rev`` of this repository in a temporary git worktree at ``folder``: (its path, its short hash)."""
    why = "a clone without tags? --before '' skips it"
    short = _git("rev-parse", "--short", f"{rev}^{{commit}}", what=why)
    _git("worktree", "add", "--detach", str(folder), rev, what=why)
    try:
        yield folder, short
    finally:
        _git("worktree", "remove", "--force", str(folder), what=why)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape",
        choices=("demo", "mixed"),
        default="demo",
        help="demo: --cells seeds of the demo network; mixed: --cells seeds each of clstm and mlp, paper-sized network, "
        "the example data (the held-out study's shape)",
    )
    parser.add_argument("--cells", type=int, default=0, help="seeds of each policy (default: 8 demo, 4 mixed)")
    parser.add_argument("--policy", default="clstm")
    parser.add_argument("--num_episodes", type=int, default=400, help="training episodes per cell")
    parser.add_argument("--trade_start", default="2021-01-04", help="first traded day of the demo market")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of runs, each round every way in turn (a shared box's load moves)",
    )
    parser.add_argument(
        "--before",
        default="v0.1.0",
        help="git revision whose study (with its own defaults) is the time to beat: issue 49 measured at v0.1.0; "
        "'' skips it",
    )
    parser.add_argument("--work", default="", help="folder for the studies (default: a temporary one)")
    opts = parser.parse_args(argv)
    opts.cells = opts.cells or (8 if opts.shape == "demo" else 4)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(opts.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        before = stack.enter_context(checkout(opts.before, Path(tmp) / "before")) if opts.before else None
        for r in range(opts.repeats):
            then = run_study(work, f"before{r}", None, opts, before[0]) if before else None
            alone = run_study(work, f"alone{r}", 1, opts)
            batched = run_study(work, f"batched{r}", 0, opts)
            sharpe = [
                pd.read_csv(work / f"{n}{r}" / "cells.csv").set_index("cell")["sharpe"] for n in ("alone", "batched")
            ]
            gap = float((sharpe[0] - sharpe[1][sharpe[0].index]).abs().max())
            rounds.append((then, alone, batched, gap))
    print(f"Machine: {machine_name('cpu')}; {opts.workers} worker(s) x {opts.threads} thread(s)")
    what = (
        f"{opts.cells} seeds of `--preset demo --policies {opts.policy}`"
        if opts.shape == "demo"
        else f"{opts.cells} seeds each of `--policies clstm,mlp` (default, paper-sized network) on the example data"
    )
    print(f"Study: {what}, {opts.num_episodes} episodes each, `--retrain none --trade_start {opts.trade_start}`")
    print()
    print(
        "| round | code | run | processes | wall s | training s (per process, summed) | idle before the last job "
        f"(worker-s, % of wall) | x faster than alone |{f' x faster than `{opts.before}` |' if before else ''} "
        "largest Sharpe gap |"
    )
    print(f"|---:|---|---|---:|---:|---:|---:|---:|{'---:|' if before else ''}---:|")
    here = _head()
    for r, (then, alone, batched, gap) in enumerate(rounds, 1):
        runs = [("`--batch_cells 1` (each cell alone)", here, alone), ("`--batch_cells 0` (batches)", here, batched)]
        if then is not None and before is not None:
            runs.insert(0, ("its defaults", f"`{opts.before}` ({before[1]})", then))
        for name, code, run in runs:
            versus_before = f" {then['wall'] / run['wall']:.2f} |" if then is not None else ""
            print(
                f"| {r} | {code} | {name} | {run['processes']} | {run['wall']:.1f} | {run['train']:.1f} | "
                f"{run['idle']:.0f} ({run['idle'] / run['wall']:.1%}) | "
                f"{alone['wall'] / run['wall']:.2f} |{versus_before} {f'{gap:.2e}' if run is batched else ''} |"
            )
    return 0


def _head() -> str:
    """This checkout's short commit (with ``+`` when it has changes git tracks)."""
    short = _git("rev-parse", "--short", "HEAD") or "?"
    return f"`{short}{'+' if _git('status', '--porcelain', '--untracked-files=no') else ''}`"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
