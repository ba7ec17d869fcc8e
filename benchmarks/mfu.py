"""Model FLOPs utilisation (MFU) of training: model FLOPs per env step x measured env steps/s, as a
fraction of the machine's dense matmul rate measured in the same run.

    python benchmarks/mfu.py --device cpu --threads 1
    python benchmarks/mfu.py --device cpu --threads 2 --policies clstm
    python benchmarks/mfu.py --device cuda --num_envs 1024 --minibatches 4 --mixed_precision bf16

FLOPs: `clstm_ppo.agent.flops.forward_flops` (matmul FLOPs from the layer sizes, 2 per multiply-add), with
P = window rows whose input projection is computed per env step: T with the ``fused`` window kernel
(every window projects all its rows) and in the rollout (dense windows); with the ``shared`` kernel the
update projects each distinct row of the rollout once: P = rows in the rollout's store / env steps
(about 1 + T/S per anchor; measured from the run). These are the FLOPs the run executes; the
"dense-equivalent" column counts P = T everywhere (what the fused kernel would execute).
Training per env step = 1 rollout forward + epochs x (forward + backward ~ 2 forwards) of the update
(the truncation bootstrap's extra forwards are not counted: they only make MFU lower).

Peak: the median rate of square matmuls (fp32 on CPU with the same torch threads; bf16 on CUDA, which
is what --mixed_precision bf16 runs the model in; TF32 and fp32 rates printed too). Throughput comes from
benchmarks/train_throughput.py's measurement (1 worker, fresh process, paper preset).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import machine_name, spawn_config  # noqa: E402
from clstm_ppo.agent.flops import forward_flops  # noqa: E402
from clstm_ppo.config import preset  # noqa: E402


def matmul_rate(device: str, dtype: torch.dtype, n: int, seconds: float = 2.0) -> float:
    """Median FLOP/s of ``n x n`` @ ``n x n`` in ``dtype`` on ``device``."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    a @ b
    sync()
    per = max(time.perf_counter() - t0, 1e-6)
    reps = max(3, min(200, int(seconds / 5 / per)))
    rates = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        rates.append(2 * n**3 * reps / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU; pass it explicitly)")
    p.add_argument("--policies", default="clstm,lstm,mlp")
    p.add_argument("--num_envs", type=int, default=0, help="envs (default 8 on CPU, 1024 on GPU)")
    p.add_argument("--minibatches", type=int, default=0, help="as in train_throughput.py (0: the paper's 128 steps)")
    p.add_argument("--mixed_precision", default="none", choices=("none", "bf16", "fp16"))
    p.add_argument("--updates", type=int, default=1)
    p.add_argument("--window_kernel", default="auto", choices=("auto", "shared", "fused"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    envs = args.num_envs or (8 if args.device == "cpu" else 1024)
    print(f"machine: {machine_name(args.device)}", flush=True)
    if args.device == "cpu":
        peaks = {"fp32": max(matmul_rate("cpu", torch.float32, n) for n in (512, 1024, 2048))}
        peak_name = "fp32"
    else:
        peaks = {"bf16": matmul_rate("cuda", torch.bfloat16, 8192)}
        torch.backends.cuda.matmul.allow_tf32 = True
        peaks["tf32"] = matmul_rate("cuda", torch.float32, 8192)
        torch.backends.cuda.matmul.allow_tf32 = False
        peaks["fp32"] = matmul_rate("cuda", torch.float32, 8192)
        peak_name = "bf16"
    peak = peaks[peak_name]
    print("measured dense matmul: " + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s" for k, v in peaks.items()), flush=True)
    cfg = preset("paper")
    F, N, T = 181, 30, cfg.data.window
    from clstm_ppo.agent.window_lstm import resolve_kernel

    H1, D, H2 = cfg.model.stage1_hidden, cfg.model.feature_dim, cfg.model.stage2_hidden
    rows = []
    for policy in args.policies.split(","):
        opts = dict(
            device=args.device,
            policy=policy,
            num_envs=envs,
            world=1,
            threads=args.threads,
            mixed_precision=args.mixed_precision,
            compile=False,
            updates=args.updates,
            minibatches=args.minibatches,
            window_kernel=args.window_kernel,
            preset="paper",  # the network whose FLOPs are counted below
        )
        r = spawn_config(opts, 900)
        if r is None:
            continue
        sps = r["steps_per_second"]
        steps = r["env_steps_per_update"]
        upd = r["rank0"]["update"]
        kernel = resolve_kernel(args.window_kernel, torch.device(args.device)) if policy == "clstm" else "-"
        shared_rows = None
        if kernel == "shared" and policy == "clstm":  # rows projected per env step in the update
            shared_rows = r["rank0"]["obs_rows_per_env"] / cfg.ppo.n_steps
        rollout_fwd = forward_flops(policy, F, N, T, H1, D, H2)
        update_fwd = forward_flops(policy, F, N, T, H1, D, H2, shared_rows)
        per_step = rollout_fwd + 3 * cfg.ppo.epochs * update_fwd
        dense_per_step = rollout_fwd * (1 + 3 * cfg.ppo.epochs)
        upd_mfu = update_fwd * 3 * cfg.ppo.epochs * steps / upd / peak
        rows.append(
            (
                policy,
                kernel,
                shared_rows,
                update_fwd,
                per_step,
                dense_per_step,
                sps,
                per_step * sps,
                per_step * sps / peak,
                upd_mfu,
            )
        )
        print(f"  {policy}: {sps:,.1f} env steps/s", flush=True)
    print()
    print(
        f"MFU, paper preset ({envs} envs, {args.mixed_precision}), peak = measured {peak_name} matmul "
        f"{peak / 1e12:.3f} TFLOP/s; machine: {machine_name(args.device)}"
        + (f", {args.threads} thread(s)" if args.device == "cpu" else "")
    )
    print()
    print(
        "| policy | window kernel (update) | rows projected/window (update) | update fwd MFLOP/env step | "
        "train MFLOP/env step executed (dense-equivalent) | env steps/s | achieved GFLOP/s | MFU whole loop | "
        "MFU update only |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for policy, kernel, shared_rows, fwd, per_step, dense, sps, achieved, mfu, upd_mfu in rows:
        projected = "-" if policy != "clstm" else (f"{shared_rows:.2f}" if shared_rows is not None else str(T))
        print(
            f"| {policy} | {kernel} | {projected} | {fwd / 1e6:.2f} | {per_step / 1e6:.1f} ({dense / 1e6:.1f}) | "
            f"{sps:,.1f} | {achieved / 1e9:,.1f} | {mfu:.1%} | {upd_mfu:.1%} |"
        )
    print()
    for policy, _k, _r, _fwd, per_step, _dense, sps, achieved, mfu, _ in rows:
        print(
            f"- {policy}: {per_step / 1e6:.1f} MFLOP x {sps:,.1f} steps/s = {achieved / 1e9:.2f} GFLOP/s; "
            f"/ {peak / 1e9:,.1f} GFLOP/s = {mfu:.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
