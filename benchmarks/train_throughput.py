"""Whole-loop training throughput of clstm-ppo: env steps/s, time per update by phase, peak memory.

    python benchmarks/train_throughput.py --device cpu --threads 1 --world_sizes 1,2 --policies clstm,lstm,mlp
    python benchmarks/train_throughput.py --device cuda --num_envs 256,1024,4096 --minibatches 4
    python benchmarks/train_throughput.py --device cuda --num_envs 1024 --minibatches 4 --mixed_precision bf16

What is timed: the Trainer's own step, ``Trainer.update`` (``RolloutCollector.collect``, bootstrap value,
``compute_gae``, ``ppo_update`` through the DDP wrapper when the world is larger than one), with today's default
settings (``--preset paper``: the paper's; both have window 30, stage-1 LSTM 181->128, 128 features, actor/critic
LSTM 512, n_steps 128 and 10 epochs; the defaults take minibatches of 4 env columns where the paper takes one) over
synthetic data: 30 tickers x 2,520 days, the paper's 4 indicators (F = 181). World size 1 runs the Trainer in one
process; world size 2+ spawns gloo (CPU) or NCCL (GPU) workers through ``clstm_ppo.training.distributed.launch``,
the launcher the train script uses. Each configuration runs in a fresh process (so peak RSS is its own): a warm-up
update with 1 epoch, then ``--updates`` timed updates (the mean is printed).

"env steps/s" counts every worker's env steps (one day of one episode = 1) over the whole update
(rollout + update). "rollout obs" is what the rollout buffer keeps of the observations (`WindowStore`:
distinct rows + row numbers), with the dense ``[S, B, T, F]`` float32 size it replaces in brackets.
Phases per update (seconds, rank 0, CUDA synchronised around each phase):
rollout (incl. bootstrap and GAE), forward (incl. the loss), backward (incl. DDP's gradient all-reduce,
which overlaps it), optimizer (clip + Adam + zero_grad). "all-reduce" is a separate measurement: a bare
``all_reduce`` of a gradient-sized float32 buffer on the same process group (median of 20), times
the optimizer steps per update: an upper bound of what DDP's bucketed, overlapped all-reduce costs.

8-GPU projection: ring all-reduce moves 2(n-1)/n of the gradient bytes per rank, so the all-reduce
time measured at n=2 is scaled by 1.75 for n=8 (same link speed); efficiency = t(1 worker) /
(t(1 worker) + all-reduce(8)), with t(1 worker) the per-update time without communication. On one
GPU no all-reduce can be measured: the projection then uses ``--bus_gbps`` (an assumed NCCL bus
bandwidth, default 100 GB/s, conservative for NVLink with ~11 MB messages) and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.config import TrainConfig, preset  # noqa: E402
from clstm_ppo.market import build_market  # noqa: E402
from clstm_ppo.training.distributed import Comm, WorldLayout, find_free_port  # noqa: E402
from clstm_ppo.training.launch import launch  # noqa: E402
from clstm_ppo.training.ppo import PhaseTimer  # noqa: E402


def machine_name(device: str) -> str:
    """One line naming the machine: CPU model and cores, or the GPU."""
    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible), torch {torch.__version__}"
    model = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch {torch.__version__}"


def bench_config(opts: dict[str, Any]) -> Any:
    """The TrainConfig of one benchmark configuration: today's defaults (or ``opts["preset"]``) + the options."""
    overrides: dict[str, Any] = dict(
        policy=opts["policy"],
        num_envs=opts["num_envs"],
        mixed_precision=opts["mixed_precision"],
        threads=opts["threads"],
        progress=False,
        num_episodes=10**9,
        compile=opts["compile"],
        checkpoint_dir=opts["tmp"],
        run_name="bench",
        num_gpus=1 if opts["device"] == "cuda" else 0,
        window_kernel=opts.get("window_kernel", "auto"),
    )
    if opts.get("minibatch_steps"):
        overrides["batch_size"] = opts["minibatch_steps"]
    elif opts["minibatches"]:
        overrides["batch_size"] = 128 * opts["num_envs"] // opts["minibatches"]
    elif not opts.get("preset"):
        overrides["batch_size"] = 128 * min(opts["num_envs"], 4)  # the default minibatch, fitted to few envs
    if opts.get("preset"):
        return preset(opts["preset"], **overrides).validate()
    return TrainConfig.from_dict(overrides).validate()


def _grad_allreduce_seconds(comm: Comm, numel: int, repeats: int = 20) -> float:
    """Median seconds of one all_reduce of a gradient-sized float32 buffer on this process group."""
    import torch.distributed as dist

    buf = torch.ones(numel, dtype=torch.float32, device=comm.device)
    sync = torch.cuda.synchronize if comm.device.type == "cuda" else (lambda: None)
    times = []
    for i in range(repeats + 3):
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(comm: Comm, payload: tuple[dict[str, Any], Any, str]) -> None:
    """One rank: build the Trainer, warm up, time ``updates`` updates, report (rank 0 writes the JSON)."""
    from clstm_ppo.training.trainer import Trainer

    opts, market, out_path = payload
    cfg = bench_config(opts)
    if comm.device.type == "cpu":
        torch.set_num_threads(opts["threads"])
    else:
        torch.cuda.reset_peak_memory_stats(comm.device)
    trainer = Trainer([cfg], market, comm, [Path(opts["tmp"]) / "bench"])
    trainer.update(ppo=dataclasses.replace(cfg.ppo, epochs=1))  # warm-up: kernels, allocator, oneDNN primitives
    rollout_s, update_s, phases = [], [], []
    for _ in range(opts["updates"]):
        timer = PhaseTimer(comm.device)
        trainer.update(timer=timer)  # the trainer's own step: rollout, GAE, PPO epochs
        seconds = dict(timer.seconds)
        rollout_s.append(seconds["rollout"])
        update_s.append(seconds["update"])
        phases.append(seconds)
    numel = sum(p.numel() for p in trainer.policy.parameters())
    allreduce = _grad_allreduce_seconds(comm, numel) if comm.distributed else 0.0
    if comm.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(comm.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mean = statistics.mean
    local = dict(
        rank=comm.rank,
        rollout=mean(rollout_s),
        update=mean(update_s),
        forward=mean(p.get("forward", 0.0) for p in phases),
        backward=mean(p.get("backward", 0.0) for p in phases),
        optimizer=mean(p.get("optimizer", 0.0) for p in phases),
        allreduce_one=allreduce,
        peak_bytes=peak,
        obs_store_bytes=trainer.buf.obs.nbytes(),
        obs_rows_per_env=trainer.buf.obs.rows_per_env,
        dense_obs_bytes=cfg.ppo.rollout_steps * cfg.data.window * market.num_features * 4,
    )
    gathered = comm.gather_objects(local)
    if comm.master:
        steps = cfg.ppo.rollout_steps * comm.world_size
        per_update = local["rollout"] + local["update"]
        result = dict(
            opts={k: v for k, v in opts.items() if k != "tmp"},
            world=comm.world_size,
            params=numel,
            grad_bytes=numel * 4,
            optimizer_steps=cfg.ppo.epochs * cfg.ppo.num_minibatches,
            env_steps_per_update=steps,
            steps_per_second=steps / per_update,
            rank0=local,
            peak_bytes_max=max(g["peak_bytes"] for g in gathered),
            batch_size=cfg.ppo.batch_size,
        )
        Path(out_path).write_text(json.dumps(result), encoding="utf-8")


def run_one(opts: dict[str, Any]) -> None:
    """Child process: prepare the market and run one configuration (spawning ranks when world > 1)."""
    cfg = bench_config(opts)
    market = build_market(cfg.data, seed=cfg.run.seed)
    world = opts["world"]
    if opts["device"] == "cuda":
        backend = "nccl" if world > 1 else "none"
        layout = WorldLayout(world, "cuda", backend, "127.0.0.1", find_free_port() if world > 1 else 0, False)
    else:
        layout = WorldLayout(
            world, "cpu", "gloo" if world > 1 else "none", "127.0.0.1", find_free_port() if world > 1 else 0, False
        )
    code = launch(layout, _worker, (opts, market, opts["out"]))
    sys.exit(code)


def spawn_config(opts: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """Run one configuration in a fresh Python process; its result dict, or None (reason printed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        child = {**opts, "tmp": tmp, "out": str(out)}
        env = {**os.environ, "OMP_NUM_THREADS": str(opts["threads"])}
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--_child", json.dumps(child)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            print(f"  skipped {describe(opts)}: over {timeout:.0f} s", flush=True)
            return None
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            print(f"  failed {describe(opts)}: {' | '.join(tail)}", flush=True)
            return None
        return json.loads(out.read_text(encoding="utf-8"))


def describe(opts: dict[str, Any]) -> str:
    return (
        f"{opts['policy']} world {opts['world']} envs {opts['num_envs']} threads {opts['threads']} "
        f"{opts['mixed_precision']} kernel {opts.get('window_kernel', 'auto')}"
    )


def table(results: list[dict[str, Any]], device: str) -> str:
    head = (
        "| policy | window kernel | workers x threads | envs/worker | minibatch | precision | env steps/s | "
        "rollout s | forward s | backward s (+DDP) | optimizer s | all-reduce s (bare x steps) | "
        "rollout obs (dense) | peak mem/worker |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        o, r0 = r["opts"], r["rank0"]
        workers = f"{r['world']} x {o['threads']}" if device == "cpu" else f"{r['world']} GPU"
        ar = r0["allreduce_one"] * r["optimizer_steps"]
        unit = "RSS" if device == "cpu" else "CUDA"
        kernel = o.get("window_kernel", "auto") if o["policy"] == "clstm" else "-"
        obs = f"{r0['obs_store_bytes'] / 2**20:,.1f} MiB ({r0['dense_obs_bytes'] / 2**20:,.0f})"
        lines.append(
            f"| {o['policy']} | {kernel} | {workers} | {o['num_envs']} | {r['batch_size']} | {o['mixed_precision']} | "
            f"{r['steps_per_second']:,.1f} | {r0['rollout']:.2f} | {r0['forward']:.2f} | {r0['backward']:.2f} | "
            f"{r0['optimizer']:.2f} | {ar:.3f} | {obs} | {r['peak_bytes_max'] / 2**20:,.0f} MiB {unit} |"
        )
    return "\n".join(lines)


def projection(results: list[dict[str, Any]], bus_gbps: float) -> list[str]:
    """Projected 8-worker efficiency lines, arithmetic shown."""
    out = []
    by_key: dict[tuple, dict[int, dict[str, Any]]] = {}
    for r in results:
        o = r["opts"]
        key = (o["policy"], o["num_envs"], o["mixed_precision"], o["threads"], o.get("window_kernel", "auto"))
        by_key.setdefault(key, {})[r["world"]] = r
    for (policy, envs, prec, _threads, kernel), worlds in by_key.items():
        one = worlds.get(1)
        multi = [w for w in sorted(worlds) if w > 1]
        if one is None:
            continue
        t1 = one["rank0"]["rollout"] + one["rank0"]["update"]
        steps = one["optimizer_steps"]
        if multi:
            w = multi[0]
            ar_w = worlds[w]["rank0"]["allreduce_one"] * steps
            ar_8 = ar_w * (2 * 7 / 8) / (2 * (w - 1) / w)
            source = f"measured bare all-reduce at n={w}: {ar_w:.3f} s/update, x (2*7/8)/(2*{w - 1}/{w})"
        else:
            per = one["grad_bytes"] * 2 * 7 / 8 / (bus_gbps * 1e9)
            ar_8 = per * steps
            source = (
                f"ASSUMED bus bandwidth {bus_gbps:g} GB/s: {one['grad_bytes'] / 1e6:.1f} MB x 2*7/8 / bw "
                f"= {per * 1e3:.3f} ms x {steps} steps"
            )
        eff = t1 / (t1 + ar_8)
        label = f"{policy} ({kernel} window kernel)" if policy == "clstm" else policy
        out.append(
            f"- {label}, {envs} envs/worker, {prec}: t(1 worker) = {t1:.2f} s/update; all-reduce(8) = "
            f"{ar_8:.3f} s ({source}); efficiency = {t1:.2f} / ({t1:.2f} + {ar_8:.3f}) = {eff:.1%}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads per CPU worker (pass it explicitly)")
    p.add_argument("--world_sizes", default="1", help="comma list, e.g. 1,2 (CPU: gloo processes; GPU: GPUs)")
    p.add_argument("--policies", default="clstm", help="comma list of clstm,lstm,mlp")
    p.add_argument("--num_envs", default="", help="comma list of envs per worker (default 8 on CPU, 1024 on GPU)")
    p.add_argument(
        "--minibatches",
        type=int,
        default=0,
        help="minibatches per epoch (0: the settings' minibatch, 128 steps x at most 4 env columns by default)",
    )
    p.add_argument(
        "--minibatch_steps",
        type=int,
        default=0,
        help="env steps per minibatch, the same at every env count (memory sweeps; overrides --minibatches)",
    )
    p.add_argument(
        "--preset", default="", choices=("", "paper"), help="settings: today's defaults (default) or a preset"
    )
    p.add_argument("--mixed_precision", default="none", choices=("none", "bf16", "fp16"))
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--window_kernels",
        default="auto",
        help="comma list of window-LSTM kernels to compare (clstm): auto, shared, fused",
    )
    p.add_argument("--updates", type=int, default=1, help="timed updates per configuration (after a warm-up)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per configuration")
    p.add_argument(
        "--bus_gbps", type=float, default=100.0, help="assumed all-reduce bus bandwidth for 1-GPU projections"
    )
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        run_one(json.loads(args._child))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    envs = [int(x) for x in (args.num_envs or ("8" if args.device == "cpu" else "1024")).split(",")]
    results = []
    print(f"machine: {machine_name(args.device)}", flush=True)
    configs = [
        (policy, kernel, n, world)
        for policy in args.policies.split(",")
        for kernel in (args.window_kernels.split(",") if policy == "clstm" else ["auto"])
        for n in envs
        for world in (int(x) for x in args.world_sizes.split(","))
    ]
    for policy, kernel, n, world in configs:
        opts = dict(
            device=args.device,
            policy=policy,
            num_envs=n,
            world=world,
            threads=args.threads,
            mixed_precision=args.mixed_precision,
            compile=args.compile,
            updates=args.updates,
            minibatches=args.minibatches,
            minibatch_steps=args.minibatch_steps,
            window_kernel=kernel,
            preset=args.preset,
        )
        t0 = time.perf_counter()
        r = spawn_config(opts, args.timeout)
        if r is not None:
            results.append(r)
            print(
                f"  {describe(opts)}: {r['steps_per_second']:,.1f} env steps/s ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    print()
    print(
        f"Training throughput, {args.preset + ' preset' if args.preset else 'default settings'}, synthetic 30 tickers x 2,520 days (F=181, T=30); machine: "
        f"{machine_name(args.device)}"
    )
    print()
    print(table(results, args.device))
    print()
    print("Projected 8-worker data-parallel efficiency:")
    for line in projection(results, args.bus_gbps):
        print(line)
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(machine=machine_name(args.device), results=results), indent=1), encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
