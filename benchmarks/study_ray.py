"""One small study run two ways in this run, alternating: on this machine's own process pool, and through ``--ray`` on
a real Ray cluster of two nodes on this machine (a head and a node that joins it, one CPU each, in a network namespace
that holds only loopback: `tests.ray_cluster`; root only). The same grid, ``--workers`` and ``--threads``, so the same
batches; the difference is Ray's cost: joining the cluster, shipping the inputs once, a task per job, and each job's
cells packed, fetched and written back.

    python benchmarks/study_ray.py                      # 4 seeds of the demo network, 200 episodes, 2 workers
    python benchmarks/study_ray.py --cells 8 --num_episodes 400 --repeats 2

The cells are ``--preset demo --policies clstm`` on its synthetic lead-lag market (without its training pool), one
walk-forward window (``--retrain none``) traded from ``--trade_start``. Prints a markdown table naming the machine:
each study command's wall time (on the cluster: from the driver's start, the cluster already up), the cells'
training seconds, Ray's overhead against the local pool of the same round, and whether the two ``cells.csv`` agree
cell for cell (every column but the timings and the ledger-dependent DSRs). The cluster's own start (not in the
study's time) is printed below the table.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.study_batched import DEMO_MARKET, _head  # noqa: E402
from benchmarks.train_throughput import machine_name  # noqa: E402
from tests.ray_cluster import loopback_namespace_works, run_scenario  # noqa: E402

TIMINGS = ["seconds", "train_seconds", "dsr", "dsr_active"]


def study_args(out: Path, opts: argparse.Namespace) -> list[str]:
    """The study command's words after ``python -m clstm_ppo.cli`` (without ``--ray``)."""
    return [
        *("study", "--out", str(out), "--preset", "demo", "--data", DEMO_MARKET, "--policies", "clstm"),
        *("--seeds", f"1-{opts.cells}", "--num_episodes", str(opts.num_episodes), "--retrain", "none"),
        *("--trade_start", opts.trade_start, "--workers", str(opts.workers), "--threads", str(opts.threads)),
        *("--bootstrap", "500", "--ledger", str(out.parent / f"{out.name}-ledger.jsonl")),
    ]


def cells_of(folder: Path) -> dict[str, float]:
    """The cells' summed training seconds (per job) from their status files."""
    statuses = [json.loads(p.read_text()) for p in (folder / "cells").glob("*/status.json")]
    jobs = {tuple(s.get("batch") or [i]) for i, s in enumerate(statuses)}
    return {"train": sum(s.get("train_seconds", math.nan) for s in statuses) / (len(statuses) / len(jobs))}


def local_run(work: Path, name: str, opts: argparse.Namespace) -> dict[str, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "clstm_ppo.cli", *study_args(work / name, opts)], cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"error: the local study {name} failed ({proc.returncode})")
    return {"wall": time.perf_counter() - start, **cells_of(work / name)}


def ray_run(work: Path, name: str, opts: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """The study through ``--ray`` on a fresh two-node cluster: its figures, and the cluster's start seconds."""
    argv = ["{python}", "-m", "clstm_ppo.cli", *study_args(work / name, opts), "--ray", "{address}"]
    result = run_scenario({"steps": [{"argv": argv, "cwd": str(ROOT)}]}, work / f"{name}-scenario", timeout=7200)
    step = result["steps"][0]
    if step["returncode"] != 0:
        raise SystemExit(f"error: the Ray study {name} failed:\n{step['stdout_tail']}\n{step['stderr_tail']}")
    if set(result["node_ips"]) != {"127.0.0.1"}:
        raise SystemExit(f"error: the nodes registered as {result['node_ips']}, not 127.0.0.1")
    return {"wall": step["seconds"], **cells_of(work / name)}, result["seconds"]


def same_outcomes(a: Path, b: Path) -> bool:
    read = [pd.read_csv(f / "cells.csv", index_col=0).drop(columns=TIMINGS).sort_index() for f in (a, b)]
    return read[0].equals(read[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=4, help="seeds of the demo network")
    parser.add_argument("--num_episodes", type=int, default=200, help="training episodes per cell")
    parser.add_argument("--trade_start", default="2021-01-04", help="first traded day of the demo market")
    parser.add_argument("--workers", type=int, default=2, help="jobs at once (the cluster has 2 CPUs)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="rounds, each the local pool then the cluster")
    parser.add_argument("--work", default="", help="folder for the studies (default: a temporary one)")
    opts = parser.parse_args(argv)
    if not loopback_namespace_works():
        raise SystemExit("error: needs root and `unshare -n` (the cluster runs in a loopback-only network namespace)")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(opts.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for r in range(opts.repeats):
            local = local_run(work, f"local{r}", opts)
            remote, cluster = ray_run(work, f"ray{r}", opts)
            rounds.append((local, remote, cluster, same_outcomes(work / f"local{r}", work / f"ray{r}")))
    print(f"Machine: {machine_name('cpu')}; {opts.workers} worker(s) x {opts.threads} thread(s); code {_head()}")
    print(
        f"Study: {opts.cells} seeds of `--preset demo --policies clstm`, {opts.num_episodes} episodes each, "
        f"`--retrain none --trade_start {opts.trade_start}`; Ray: 2 nodes x 1 CPU on 127.0.0.1"
    )
    print()
    print("| round | run | wall s | training s (per job, summed) | Ray's overhead s (x) | same outcomes |")
    print("|---:|---|---:|---:|---:|---|")
    for r, (local, remote, _, same) in enumerate(rounds, 1):
        extra = remote["wall"] - local["wall"]
        print(f"| {r} | local pool | {local['wall']:.1f} | {local['train']:.1f} | | |")
        print(
            f"| {r} | `--ray` | {remote['wall']:.1f} | {remote['train']:.1f} | {extra:+.1f} "
            f"({remote['wall'] / local['wall']:.2f}x) | {'yes' if same else 'NO'} |"
        )
    starts = ", ".join(f"{c['start']:.1f}" for _, _, c, _ in rounds)
    print(f"\nThe cluster's start (head, then the node joining; not in the study's time): {starts} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
