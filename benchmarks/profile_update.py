"""Where one training update's time goes: a torch.profiler trace of a rollout and of a PPO update.

    python benchmarks/profile_update.py --device cuda --num_envs 1024,4096 --minibatches 4 --mixed_precision bf16 \
        --trace_dir benchmarks/traces
    python benchmarks/profile_update.py --device cpu --num_envs 8 --threads 1      # the same on a CPU

For each env count: build the Trainer (today's paper preset, as ``train_throughput.py``), run one warm-up update
(1 epoch), then profile one whole update (``Trainer.update``: rollout + GAE, then every PPO epoch) with the
rollout and the update as separate ``record_function`` ranges. Prints, per phase, a table a reader can act on:

- wall: the phase's host time (CUDA synchronised at its end);
- kernels: how many device kernels ran and their summed device time; "GPU busy" = the time in which at least one
  kernel ran / wall, so the rest of the wall is the GPU waiting for the host (launch latency, Python, syncs);
- launches: ``cudaLaunchKernel``-type runtime calls (each costs the host a few microseconds);
- host syncs: calls that block the host until the device is done (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``), device-to-host copies among them;
- copies: memcpy/memset counts and device time;
- the top operators by device (or CPU) time.

``--trace_dir`` writes each profile as a gzipped Chrome trace (open it in chrome://tracing or ui.perfetto.dev); the
tables are computed from that trace, and ``--from_trace FILE...`` tabulates saved ones again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import bench_config, machine_name  # noqa: E402
from clstm_ppo.market import build_market  # noqa: E402
from clstm_ppo.training.distributed import Comm  # noqa: E402
from clstm_ppo.training.ppo import PhaseTimer  # noqa: E402

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPY_WORDS = ("Memcpy", "Memset", "memcpy", "memset")
PHASES = ("rollout", "update")  # the Trainer's phases that become profiler ranges


@dataclasses.dataclass
class PhaseProfile:
    """What one phase (rollout or update) spent, read off a Chrome trace; times in milliseconds."""

    wall_ms: float = 0.0
    kernels: int = 0
    kernel_ms: float = 0.0  # summed kernel durations
    busy_ms: float = 0.0  # the union of kernel intervals: time the GPU ran at least one kernel
    launches: int = 0
    syncs: int = 0
    dtoh_copies: int = 0
    copies: int = 0
    copy_ms: float = 0.0

    @property
    def gpu_busy(self) -> float:
        """Fraction of the phase's wall time in which some kernel ran."""
        return self.busy_ms / self.wall_ms if self.wall_ms else 0.0


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length in ms of the union of ``(start_us, end_us)`` intervals."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3


def summarize_trace(trace: dict[str, Any], phases: tuple[str, ...] = PHASES) -> dict[str, PhaseProfile]:
    """Split a Chrome trace (``prof.export_chrome_trace``) into the named ``record_function`` ranges.

    Host events (``cuda_runtime``/``cuda_driver``: launches, synchronisations) are placed by their start; device
    events (``kernel``, ``gpu_memcpy``, ``gpu_memset``) by the start of the runtime call that launched them (the
    trace's correlation id), else by their own start. Each phase ends with a synchronisation, so its kernels
    finish inside it.
    """
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ranges = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation"}
    ranges = {name: ranges[name] for name in phases if name in ranges}
    launched_at = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    out = {name: PhaseProfile(wall_ms=(end - start) / 1e3) for name, (start, end) in ranges.items()}
    kernels: dict[str, list[tuple[float, float]]] = {name: [] for name in ranges}

    def phase_of(ts: float) -> str | None:
        return next((name for name, (start, end) in ranges.items() if start <= ts <= end), None)

    for e in events:
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            where = phase_of(launched_at.get(e.get("args", {}).get("correlation"), e["ts"]))
        elif cat in ("cuda_runtime", "cuda_driver"):
            where = phase_of(e["ts"])
        else:
            continue
        if where is None:
            continue
        p, dur = out[where], e.get("dur", 0.0)
        if cat == "kernel":
            p.kernels += 1
            p.kernel_ms += dur / 1e3
            kernels[where].append((e["ts"], e["ts"] + dur))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            p.copies += 1
            p.copy_ms += dur / 1e3
            p.dtoh_copies += "DtoH" in e["name"]
        elif e["name"] in LAUNCH_CALLS:
            p.launches += 1
        elif e["name"] in SYNC_CALLS:
            p.syncs += 1
    for name, intervals in kernels.items():
        out[name].busy_ms = _union_ms(intervals)
    return out


def phase_table(phases: dict[str, PhaseProfile]) -> list[str]:
    """The markdown rows of `summarize_trace`'s result."""
    lines = [
        "| phase | wall ms | kernels | kernel ms (sum) | GPU busy (union / wall) | launches | host syncs "
        "| copies (device-to-host) | copy ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in phases.items():
        lines.append(
            f"| {name} | {p.wall_ms:,.1f} | {p.kernels:,} | {p.kernel_ms:,.1f} | {p.gpu_busy:.0%} | {p.launches:,} "
            f"| {p.syncs:,} | {p.copies:,} ({p.dtoh_copies:,}) | {p.copy_ms:,.1f} |"
        )
    return lines


def top_operators(prof: Any, device: bool, n: int = 12) -> list[tuple[str, int, float]]:
    """The operators (or kernels) that took the most time: (name, calls, ms), self time, device or CPU."""
    rows = []
    for avg in prof.key_averages():
        ms = (avg.self_device_time_total if device else avg.self_cpu_time_total) / 1e3
        if ms > 0 and avg.key not in PHASES:
            rows.append((avg.key[:70], avg.count, ms))
    return sorted(rows, key=lambda r: -r[2])[:n]


class RangeTimer(PhaseTimer):
    """The trainer's phase timer (CUDA synchronised around each phase) with the rollout and the update also named
    profiler ranges. Each range encloses the phase's closing synchronisation, so the phase's kernels run inside it."""

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with record_function(name) if name in PHASES else contextlib.nullcontext(), super().__call__(name):
            yield


def profile_one(opts: dict[str, Any], trace_dir: Path | None) -> list[str]:
    """Profile one update at one env count; return the markdown lines of its tables."""
    from clstm_ppo.training.trainer import Trainer

    cuda = opts["device"] == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    cfg = bench_config(opts)
    market = build_market(cfg.data, seed=cfg.run.seed)
    comm = Comm(rank=0, world_size=1, device=device)
    if not cuda:
        torch.set_num_threads(opts["threads"])
    trainer = Trainer([cfg], market, comm, [Path(opts["tmp"]) / "profile"])
    trainer.update(ppo=dataclasses.replace(cfg.ppo, epochs=1))  # warm-up
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    sync()
    with profile(activities=activities, record_shapes=False) as prof:
        trainer.update(timer=RangeTimer(device))
        sync()
    raw = Path(opts["tmp"]) / "trace.json"
    prof.export_chrome_trace(str(raw))
    phases = summarize_trace(json.loads(raw.read_text(encoding="utf-8")))
    steps = cfg.ppo.rollout_steps
    total_s = sum(p.wall_ms for p in phases.values()) / 1e3
    head = (
        f"### {opts['num_envs']:,} envs, minibatch {cfg.ppo.batch_size:,} env steps, {opts['mixed_precision']}: "
        f"{steps:,} env steps in {total_s:.2f} s = {steps / total_s:,.0f} env steps/s (under the profiler)"
    )
    lines = [head, "", *phase_table(phases)]
    lines += ["", f"Top operators by self {'device' if cuda else 'CPU'} time (whole update):", ""]
    lines += ["| operator or kernel | calls | ms |", "|---|---:|---:|"]
    lines += [f"| `{k}` | {c:,} | {ms:,.1f} |" for k, c, ms in top_operators(prof, cuda)]
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        target = trace_dir / f"update_{opts['device']}_{opts['num_envs']}envs_{opts['mixed_precision']}.json.gz"
        with raw.open("rb") as src, gzip.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        lines += ["", f"Chrome trace: `{target}` ({target.stat().st_size / 2**20:.1f} MiB gzipped)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    p.add_argument("--policy", default="clstm")
    p.add_argument("--num_envs", default="", help="comma list (default 8 on CPU, 1024,4096 on GPU)")
    p.add_argument("--minibatches", type=int, default=4, help="minibatches per epoch (0: the preset's 128 steps)")
    p.add_argument("--mixed_precision", default="none", choices=("none", "bf16", "fp16"))
    p.add_argument("--compile", action="store_true")
    p.add_argument("--trace_dir", default="", help="write gzipped Chrome traces here")
    p.add_argument("--from_trace", nargs="+", default=[], help="only tabulate saved (gzipped) Chrome traces")
    args = p.parse_args(argv)
    for path in args.from_trace:
        with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
            print("\n".join([f"### {path}", "", *phase_table(summarize_trace(json.load(f)))]) + "\n")
    if args.from_trace:
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("profile_update.py: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    envs = [int(n) for n in (args.num_envs or ("1024,4096" if args.device == "cuda" else "8")).split(",")]
    print(f"## Profile of one update, paper preset, {args.policy} ({machine_name(args.device)})\n")
    for n in envs:
        with tempfile.TemporaryDirectory() as tmp:
            opts = dict(
                device=args.device,
                threads=args.threads,
                policy=args.policy,
                num_envs=n,
                preset="paper",
                minibatches=args.minibatches,
                mixed_precision=args.mixed_precision,
                compile=args.compile,
                tmp=tmp,
            )
            print("\n".join(profile_one(opts, Path(args.trace_dir) if args.trace_dir else None)) + "\n", flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
