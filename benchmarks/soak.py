"""Soak test: resident memory (RSS) of the launcher and of every worker over a long CPU training run.

    python benchmarks/soak.py --seconds 180 --num_workers 2

Starts the real train script, samples /proc/<pid>/status (VmRSS) of the parent and its worker processes
every ``--interval`` seconds once training runs, stops the run with SIGTERM (the graceful path: rank 0
saves a checkpoint) and prints RSS at the first and last sample per process. A leak shows as a growing
last-minus-first column; a steady run stays within a few MB. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "train_distributed_clstm_ppo.py")
# small enough for a 2-core box, big enough that every update runs the whole loop (rollout, PPO, gather, save)
RUN = [
    "--data",
    "synthetic:tickers=10,days=1500",
    "--window",
    "10",
    "--num_envs",
    "8",
    "--n_steps",
    "32",
    "--batch_size",
    "128",
    "--epochs",
    "4",
    "--episode_length",
    "64",
    "--stage1_hidden",
    "32",
    "--feature_dim",
    "32",
    "--stage2_hidden",
    "64",
    "--num_gpus",
    "0",
    "--log_every",
    "50",
    "--no-progress",
    "--num_episodes",
    "100000000",
    "--eval_every",
    "5",
]
CHECKPOINT_EVERY = '{"checkpoint_every": 5}'  # a --config knob (no flag)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def label(pid: int, parent: int) -> str:
    if pid == parent:
        return "launcher"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"
    return "resource tracker" if "resource_tracker" in cmd else "worker"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180, help="how long to train after the first episode")
    parser.add_argument("--interval", type=float, default=5, help="seconds between samples")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        (Path(tmp) / "every5.json").write_text(CHECKPOINT_EVERY)
        cmd = [
            sys.executable,
            SCRIPT,
            *RUN,
            "--config",
            str(Path(tmp) / "every5.json"),
            "--num_workers",
            str(args.num_workers),
            "--threads",
            str(args.threads),
            "--checkpoint_dir",
            tmp,
            "--run_name",
            "soak",
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        while not any("Episode" in line for line in lines):
            if proc.poll() is not None:
                print("".join(lines), file=sys.stderr)
                return 1
            time.sleep(0.2)
        samples: dict[int, list[tuple[float, float]]] = {}
        start = time.monotonic()
        while time.monotonic() - start <= args.seconds:
            now = time.monotonic() - start
            for pid in [proc.pid, *children(proc.pid)]:
                value = rss_mb(pid)
                if value is not None:
                    samples.setdefault(pid, []).append((now, value))
            time.sleep(args.interval)
        labels = {pid: label(pid, proc.pid) for pid in samples}
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        episodes = [line for line in lines if "Episode" in line]
        print(
            f"soak: {args.num_workers} CPU workers x {args.threads} thread(s), {args.seconds:.0f} s sampled every "
            f"{args.interval:g} s; stopped by SIGTERM -> exit {code}"
        )
        print(f"last log line: {episodes[-1].strip() if episodes else '-'}")
        print()
        print("| process | pid | samples | RSS first (MB) | RSS last (MB) | last - first (MB) | max (MB) |")
        print("|---|---|---|---|---|---|---|")
        for pid, rows in samples.items():
            values = [v for _, v in rows]
            print(
                f"| {labels[pid]} | {pid} | {len(rows)} | {values[0]:.1f} | {values[-1]:.1f} | "
                f"{values[-1] - values[0]:+.1f} | {max(values):.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
