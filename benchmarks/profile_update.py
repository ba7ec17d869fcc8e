"""Where one training update's time goes: a torch.profiler trace of a rollout and of a PPO update.

    python benchmarks/profile_update.py --device cuda --num_envs 1024,4096 --minibatches 4 --mixed_precision bf16 \
        --trace_dir benchmarks/traces
    python benchmarks/profile_update.py --device cpu --num_envs 8 --threads 1      # the same on a CPU

For each env count: build the Trainer (today's paper preset, as ``train_throughput.py``), run one warm-up update
(1 epoch), then profile one whole update (``Trainer.update``: rollout + GAE, then every PPO epoch) with the
rollout and the update as separate ``record_function`` ranges. Prints, per phase, a table a reader can act on:

- wall: the phase's host time (CUDA synchronised at its end);
- kernels: how many device kernels ran and their summed device time; "GPU busy" = kernel time / wall, so the
  rest of the wall is the GPU waiting for the host (launch latency, Python, synchronisations);
- launches: ``cudaLaunchKernel``-type runtime calls (each costs the host a few microseconds);
- host syncs: calls that block the host until the device is done (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``), device-to-host copies among them;
- copies: memcpy/memset counts and device time;
- the top operators by device (or CPU) time.

``--trace_dir`` writes each profile as a gzipped Chrome trace (open it in chrome://tracing or ui.perfetto.dev).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import shutil
import sys
import tempfile
import time
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


@dataclasses.dataclass
class PhaseProfile:
    """What one phase (rollout or update) spent, read off a profiler's events; times in milliseconds."""

    wall_ms: float = 0.0
    kernels: int = 0
    kernel_ms: float = 0.0
    launches: int = 0
    syncs: int = 0
    dtoh_copies: int = 0
    copies: int = 0
    copy_ms: float = 0.0

    @property
    def gpu_busy(self) -> float:
        """Summed kernel time over the phase's wall time (above 1 only if kernels overlap)."""
        return self.kernel_ms / self.wall_ms if self.wall_ms else 0.0


def _phase_of(ts: float, ranges: dict[str, tuple[float, float]]) -> str | None:
    for name, (start, end) in ranges.items():
        if start <= ts <= end:
            return name
    return None


def summarize(prof: Any, walls: dict[str, float]) -> dict[str, PhaseProfile]:
    """Split a profile's events into the rollout and update ranges and count what each spent.

    Host-side events (launches, syncs) are placed by their start time inside the phase's ``record_function``
    range; device events (kernels, copies) by their correlated launch when the profiler linked them, else by
    their own start time (device time runs behind the host, so a kernel can start after its range ended).
    """
    events = list(prof.events())
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in walls}
    # newer torch links each device event to the operator that launched it; without the link, its own time places it
    linked = {id(e): getattr(e, "linked_correlation_id", 0) for e in events}
    frontend = {e.id: e for e in events if linked[id(e)] == 0 and e.device_type != torch.autograd.DeviceType.CUDA}
    out = {name: PhaseProfile(wall_ms=walls[name] * 1e3) for name in walls}
    for e in events:
        device = e.device_type == torch.autograd.DeviceType.CUDA
        if device:
            launcher = frontend.get(linked[id(e)]) if linked[id(e)] else None
            where = _phase_of(launcher.time_range.start if launcher else e.time_range.start, ranges)
        else:
            where = _phase_of(e.time_range.start, ranges)
        if where is None:
            continue
        p = out[where]
        ms = e.time_range.elapsed_us() / 1e3
        if device and any(w in e.name for w in COPY_WORDS):
            p.copies += 1
            p.copy_ms += ms
            p.dtoh_copies += "DtoH" in e.name
        elif device:
            p.kernels += 1
            p.kernel_ms += ms
        elif e.name in LAUNCH_CALLS:
            p.launches += 1
        elif e.name in SYNC_CALLS:
            p.syncs += 1
    return out


def top_operators(prof: Any, device: bool, n: int = 12) -> list[tuple[str, int, float]]:
    """The operators (or kernels) that took the most time: (name, calls, ms), self time, device or CPU."""
    rows = []
    for avg in prof.key_averages():
        ms = (avg.self_device_time_total if device else avg.self_cpu_time_total) / 1e3
        if ms > 0:
            rows.append((avg.key[:70], avg.count, ms))
    return sorted(rows, key=lambda r: -r[2])[:n]


def profile_one(opts: dict[str, Any], trace_dir: Path | None) -> list[str]:
    """Profile one update at one env count; return the markdown lines of its tables."""
    from clstm_ppo.training.trainer import Trainer

    cuda = opts["device"] == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    cfg = bench_config(opts)
    market = build_market(cfg.data, seed=cfg.run.seed)
    comm = Comm(rank=0, world_size=1, local_rank=0, device=device)
    if not cuda:
        torch.set_num_threads(opts["threads"])
    trainer = Trainer(cfg, market, comm, Path(opts["tmp"]) / "profile")
    trainer.update(ppo=dataclasses.replace(cfg.ppo, epochs=1))  # warm-up
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    walls: dict[str, float] = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    class RangeTimer(PhaseTimer):
        """The trainer's own phase hooks, each also a named profiler range with its synchronised wall time."""

        def __call__(self, name: str):  # type: ignore[override]
            return _ranged(name, walls, sync) if name in ("rollout", "update") else super().__call__(name)

    sync()
    with profile(activities=activities, record_shapes=False) as prof:
        trainer.update(timer=RangeTimer(device))
        sync()
    phases = summarize(prof, walls)
    steps = cfg.ppo.rollout_steps
    total_s = sum(walls.values())
    head = (
        f"### {opts['num_envs']:,} envs, minibatch {cfg.ppo.batch_size:,} env steps, {opts['mixed_precision']}: "
        f"{steps:,} env steps in {total_s:.2f} s = {steps / total_s:,.0f} env steps/s (under the profiler)"
    )
    lines = [head, "", "| phase | wall ms | kernels | kernel ms | GPU busy | launches | host syncs (DtoH copies) "
             "| copies | copy ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, p in phases.items():
        lines.append(
            f"| {name} | {p.wall_ms:,.1f} | {p.kernels:,} | {p.kernel_ms:,.1f} | {p.gpu_busy:.0%} | {p.launches:,} "
            f"| {p.syncs:,} ({p.dtoh_copies:,}) | {p.copies:,} | {p.copy_ms:,.1f} |"
        )
    lines += ["", f"Top operators by self {'device' if cuda else 'CPU'} time (whole update):", ""]
    lines += ["| operator or kernel | calls | ms |", "|---|---:|---:|"]
    lines += [f"| `{k}` | {c:,} | {ms:,.1f} |" for k, c, ms in top_operators(prof, cuda)]
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        raw = Path(opts["tmp"]) / "trace.json"
        prof.export_chrome_trace(str(raw))
        target = trace_dir / f"update_{opts['device']}_{opts['num_envs']}envs_{opts['mixed_precision']}.json.gz"
        with raw.open("rb") as src, gzip.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        lines += ["", f"Chrome trace: `{target}` ({target.stat().st_size / 2**20:.1f} MiB gzipped)"]
    return lines


class _ranged:
    """A profiler range that records its CUDA-synchronised wall seconds into ``walls[name]``."""

    def __init__(self, name: str, walls: dict[str, float], sync: Any) -> None:
        self.name, self.walls, self.sync = name, walls, sync
        self.range = record_function(name)

    def __enter__(self) -> None:
        self.sync()
        self.t0 = time.perf_counter()
        self.range.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.sync()
        self.range.__exit__(*exc)
        self.walls[self.name] = self.walls.get(self.name, 0.0) + time.perf_counter() - self.t0


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
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("profile_update.py: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    envs = [int(n) for n in (args.num_envs or ("1024,4096" if args.device == "cuda" else "8")).split(",")]
    print(f"## Profile of one update, paper preset, {args.policy} ({machine_name(args.device)})\n")
    for n in envs:
        with tempfile.TemporaryDirectory() as tmp:
            opts = dict(
                device=args.device, threads=args.threads, policy=args.policy, num_envs=n, preset="paper",
                minibatches=args.minibatches, mixed_precision=args.mixed_precision, compile=args.compile, tmp=tmp,
            )  # fmt: skip
            print("\n".join(profile_one(opts, Path(args.trace_dir) if args.trace_dir else None)) + "\n", flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
