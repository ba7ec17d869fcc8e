"""Where one paper-sized PPO minibatch spends its time, kernel by kernel, and the floor under it.

    python benchmarks/lstm_kernels.py --threads 1
    python benchmarks/lstm_kernels.py --threads 1 --device cuda

One minibatch of the paper preset is one env column: 128 consecutive days of one env, so stage 1 runs
128 windows of T = 30 days x F = 181 (157 distinct days: consecutive windows overlap) through
LSTM(181 -> 128), and stage 2 runs the actor and critic LSTM(128 -> 512) over 128 days with batch 1.
Timed (median of repeats, forward + backward of a sum of the outputs):

- stage 1 with the ``fused`` kernel (nn.LSTM over 128 dense windows) and the ``shared`` kernel
  (`clstm_ppo.agent.window_lstm`: distinct rows projected once, hand-written recurrence);
- stage 2: the two nn.LSTM(128 -> 512) over 128 days at batch 1 (what the update runs), and the same
  work written as a per-day matmul loop under autograd (why stage 2 keeps PyTorch's LSTM);
- the floor of stage 2: 256 matrix-vector products with a 512 x 2048 float32 matrix (one per day
  per LSTM in the forward; the backward needs at least as many again), the memory-bound core of a
  batch-1 recurrence.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import machine_name  # noqa: E402
from clstm_ppo.agent.window_lstm import window_last_output  # noqa: E402
from clstm_ppo.agent.windows import Windows  # noqa: E402

DAYS, WINDOW, FEATURES, H1, FEAT, H2 = 128, 30, 181, 128, 128, 512


def median_ms(fn: Callable[[], object], device: str, repeats: int = 15) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def column_windows(device: str) -> Windows:
    """128 windows of one env column over its 157 distinct days: rows [1, 157, F], index [128, 1, 30]."""
    rows = torch.randn(1, DAYS + WINDOW - 1, FEATURES, device=device)
    index = (torch.arange(DAYS, device=device).view(DAYS, 1, 1) + torch.arange(WINDOW, device=device)).to(torch.int32)
    return Windows(rows, index)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, required=True, help="torch threads (pass it explicitly)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = args.device
    windows = column_windows(dev)
    window_lstm = nn.LSTM(FEATURES, H1, batch_first=True).to(dev)
    actor, critic = nn.LSTM(FEAT, H2).to(dev), nn.LSTM(FEAT, H2).to(dev)
    feats = torch.randn(DAYS, 1, FEAT, device=dev)

    def stage1(kernel: str) -> Callable[[], None]:
        return lambda: window_last_output(window_lstm, windows, kernel).sum().backward()

    def stage2_fused() -> None:
        (actor(feats)[0].sum() + critic(feats)[0].sum()).backward()

    def stage2_loop() -> None:
        total = feats.new_zeros(())
        for lstm in (actor, critic):
            gates_x = nn.functional.linear(feats[:, 0], lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
            h = c = feats.new_zeros(1, H2)
            for t in range(DAYS):
                i, f, g, o = (gates_x[t : t + 1] + h @ lstm.weight_hh_l0.t()).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                total = total + h.sum()
        total.backward()

    weight = torch.randn(4 * H2, H2, device=dev)
    vector = torch.randn(H2, device=dev)

    def floor() -> None:
        for _ in range(2 * DAYS):
            torch.mv(weight, vector)

    rows = [
        ("stage 1, fused (nn.LSTM over 128 dense windows)", median_ms(stage1("fused"), dev)),
        ("stage 1, shared (157 distinct rows projected once)", median_ms(stage1("shared"), dev)),
        ("stage 2, nn.LSTM actor + critic, batch 1 x 128 days", median_ms(stage2_fused, dev)),
        ("stage 2, the same as a per-day matmul loop (autograd)", median_ms(stage2_loop, dev, repeats=5)),
        ("floor: 256 float32 mat-vecs 2048 x 512 (stage 2 forward)", median_ms(floor, dev)),
    ]
    print(
        f"One paper-preset minibatch (1 env column x 128 days), forward + backward; machine: {machine_name(dev)}"
        + (f", {args.threads} thread(s)" if dev == "cpu" else "")
    )
    print()
    print("| kernel | ms |")
    print("|---|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
