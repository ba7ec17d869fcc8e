"""Stage 1 of the CLSTM: an LSTM over each observation's T-day window, returning its last output.

Two kernels compute the same function of the same ``nn.LSTM`` parameters (one layer, PyTorch gate
order i, f, g, o; ``h = c = 0`` before each window's oldest day), so checkpoints do not depend on
the kernel:

- ``shared``: the input projection ``W_ih x + b_ih + b_hh`` is one matmul over the *distinct* rows
  of `Windows` (consecutive windows of an episode share T - 1 of T rows), then only the recurrence
  runs per window, in `WindowLSTM` (hand-written forward and backward; ``dW_hh`` is one matmul at
  the end). At the paper's sizes (F = 181, H = 128, T = 30) and 1.47 projected rows per window (a
  128-step rollout with episode restarts, measured by ``benchmarks/mfu.py``) this removes 56% of stage
  1's FLOPs in the PPO update.
- ``fused``: ``nn.LSTM`` over the dense ``[T, F]`` window of every observation (cuDNN on CUDA,
  oneDNN on the CPU), re-projecting all T rows of each window.

``auto`` picks ``shared`` on the CPU for windows that share rows (the PPO update) and ``fused``
otherwise: on CUDA, where the GPU figures in the README were measured, and for a rollout step's
dense windows, which share nothing. Measured effect on one CPU core: ``benchmarks/README.md``.
(A hand-written kernel for stage 2 was tried and dropped: for its batch-1, 128-day sequences
oneDNN's LSTM was ~1.7x faster; stage 2 is near its memory-bound floor, ``benchmarks/lstm_kernels.py``.) ``tests/test_window_lstm.py`` checks the
kernels against each other and the hand-written gradients against autograd in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from clstm_ppo.agent.windows import Windows

WINDOW_KERNELS = ("auto", "shared", "fused")


def _tanh_(x: Tensor) -> Tensor:
    """In-place tanh as ``2 sigmoid(2x) - 1``: torch's CPU tanh profiled ~8x slower per element than sigmoid."""
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


class WindowLSTM(torch.autograd.Function):
    """Last output ``h_T`` of a one-layer LSTM from zero state over windows of precomputed input gates.

    forward(projected ``[R, 4H]`` = W_ih x_r + b_ih + b_hh for each distinct row r, index ``[T, M]``
    int64 = the row of day t of window m, w_hh ``[4H, H]``) -> h_T ``[M, H]``. Each day's gate
    inputs are gathered from ``projected`` straight into that day's gate buffer, so no ``[T, M, 4H]``
    copy of the inputs is made. Saves the gate activations ``[T, M, 4H]``, the hidden states entering
    each day, the cell states and their tanh ``[T, M, H]`` each. The backward does one ``[M, 4H] x
    [4H, H]`` matmul per day, one ``[4H, T M] x [T M, H]`` matmul for ``dW_hh``, and adds each day's
    gate gradients into the rows they came from. Runs with autocast off, in float32 (float64 stays
    float64, for gradcheck).
    """

    @staticmethod
    def forward(ctx, projected: Tensor, index: Tensor, w_hh: Tensor) -> Tensor:  # type: ignore[override]
        with torch.autocast(projected.device.type, enabled=False):
            dtype = torch.float32 if projected.dtype in (torch.float16, torch.bfloat16) else projected.dtype
            projected, w_hh = projected.to(dtype), w_hh.to(dtype)
            days, m = index.shape
            four_h = projected.shape[1]
            hid = four_h // 4
            acts = projected.new_empty(days, m, four_h)  # i, f, g, o after their nonlinearities
            cells = projected.new_empty(days + 1, m, hid)  # c_0 = 0, c_1 .. c_T
            cells[0].zero_()
            tanh_cells = projected.new_empty(days, m, hid)
            hidden = projected.new_empty(days + 1, m, hid)  # h_0 = 0, h_1 .. h_T
            hidden[0].zero_()
            w_t = w_hh.t()
            for t in range(days):
                a = acts[t]
                torch.index_select(projected, 0, index[t], out=a)
                a.addmm_(hidden[t], w_t)
                a[:, 2 * hid : 3 * hid].mul_(2.0)  # g: tanh(z) = 2 sigmoid(2z) - 1, with i, f, o's sigmoid
                a.sigmoid_()
                a[:, 2 * hid : 3 * hid].mul_(2.0).sub_(1.0)
                torch.mul(a[:, hid : 2 * hid], cells[t], out=cells[t + 1])
                cells[t + 1].addcmul_(a[:, :hid], a[:, 2 * hid : 3 * hid])
                _tanh_(tanh_cells[t].copy_(cells[t + 1]))
                torch.mul(a[:, 3 * hid :], tanh_cells[t], out=hidden[t + 1])
            ctx.save_for_backward(acts, cells, tanh_cells, hidden, w_hh, index)
            ctx.num_rows = projected.shape[0]
            return hidden[days].clone()

    @staticmethod
    def backward(ctx, grad_h: Tensor) -> tuple[Tensor, None, Tensor]:  # type: ignore[override]
        acts, cells, tanh_cells, hidden, w_hh, index = ctx.saved_tensors
        with torch.autocast(grad_h.device.type, enabled=False):
            days, m, four_h = acts.shape
            hid = four_h // 4
            grad_gates = torch.empty_like(acts)
            grad_projected = acts.new_zeros(ctx.num_rows, four_h)
            dh = grad_h.to(acts.dtype).contiguous()
            dc = torch.zeros_like(dh)
            tmp = torch.empty_like(dh)
            slope = acts.new_empty(m, four_h)  # derivative of each gate's nonlinearity
            for t in reversed(range(days)):
                a, tc, d = acts[t], tanh_cells[t], grad_gates[t]
                i, f, g, o = a[:, :hid], a[:, hid : 2 * hid], a[:, 2 * hid : 3 * hid], a[:, 3 * hid :]
                slope.copy_(a).neg_().add_(1.0).mul_(a)  # sigmoid' = a (1 - a)
                torch.mul(g, g, out=slope[:, 2 * hid : 3 * hid]).neg_().add_(1.0)  # tanh' = 1 - g^2
                torch.mul(tc, tc, out=tmp).neg_().add_(1.0).mul_(o).mul_(dh)
                dc.add_(tmp)  # dL/dc_t = carried + dh_t o (1 - tanh(c_t)^2)
                torch.mul(dh, tc, out=d[:, 3 * hid :])  # do
                torch.mul(dc, g, out=d[:, :hid])  # di
                torch.mul(dc, cells[t], out=d[:, hid : 2 * hid])  # df
                torch.mul(dc, i, out=d[:, 2 * hid : 3 * hid])  # dg
                d.mul_(slope)
                dc.mul_(f)
                grad_projected.index_add_(0, index[t], d)
                if t > 0:  # h_0 is the constant zero state: no gradient to carry past day 0
                    dh = d @ w_hh
            grad_w = grad_gates.reshape(days * m, four_h).t() @ hidden[:days].reshape(days * m, hid)
        return grad_projected, None, grad_w


def resolve_kernel(kernel: str, device: torch.device, rows_shared: bool = True) -> str:
    """``auto`` -> ``shared`` on the CPU when windows share rows, else ``fused``; others unchanged."""
    if kernel not in WINDOW_KERNELS:
        raise ValueError(f"unknown window kernel {kernel!r}; choose from {WINDOW_KERNELS}")
    if kernel == "auto":
        return "shared" if device.type == "cpu" and rows_shared else "fused"
    return kernel


def window_last_output(lstm: nn.LSTM, windows: Windows, kernel: str = "auto") -> Tensor:
    """Last LSTM output of every window (state zero at its oldest day): ``[L x E, H]``, step-major.

    :param lstm: a one-layer, unidirectional ``nn.LSTM(F, H)`` with ``batch_first=True``.
    :param windows: L x E windows over rows ``[E, R, F]``.
    :param kernel: ``auto`` | ``shared`` | ``fused`` (module docstring).
    """
    kernel = resolve_kernel(kernel, windows.rows.device, rows_shared=windows.given_dense is None)
    if kernel == "fused":
        dense = windows.dense()
        out, _ = lstm(dense.reshape(-1, *dense.shape[2:]))
        return out[:, -1]
    flat_rows = windows.rows.reshape(-1, windows.rows.shape[-1])  # [E R, F]
    projected = nn.functional.linear(flat_rows, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)  # [E R, 4H]
    index = windows.flat_index().permute(2, 0, 1).reshape(windows.window, -1)  # [T, L E]
    return WindowLSTM.apply(projected, index, lstm.weight_hh_l0)
