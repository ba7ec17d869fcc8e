"""Stage 1 of the CLSTM: an LSTM over each observation's T-day window, returning its last output.

Two kernels compute the same function of the same ``nn.LSTM`` parameters (one layer, PyTorch gate order i, f, g, o;
``h = c = 0`` before each window's oldest day), so checkpoints do not depend on the kernel:

- ``shared``: the input projection ``W_ih x + b_ih + b_hh`` is one matmul over the *distinct* rows of `Windows`
  (consecutive windows of an episode share T - 1 of T rows), then only the recurrence runs per window, in
  `WindowLSTM`. At the paper's sizes (F = 181, H = 128, T = 30) and 1.47 projected rows per window (a 128-step
  rollout with episode restarts, ``benchmarks/mfu.py``) this removes 56% of stage 1's FLOPs in the PPO update.
- ``fused``: ``nn.LSTM`` over the dense ``[T, F]`` window of every observation (cuDNN on CUDA, oneDNN on the CPU).

``auto`` picks ``shared`` on the CPU for windows that share rows (the PPO update) and ``fused`` otherwise: on CUDA,
and for a rollout step's dense windows, which share nothing (measured: ``benchmarks/README.md``).
``tests/test_window_lstm.py`` checks the kernels against each other and the hand-written gradients against autograd.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from clstm_ppo.agent.windows import Windows

WINDOW_KERNELS = ("auto", "shared", "fused")


def lstm_gates(a: Tensor, c_prev: Tensor, c_next: Tensor, tanh_c: Tensor, h_next: Tensor) -> None:
    """One LSTM day, in place, on any leading shape (``[M, .]``, or ``[C, M, .]`` for C stacked cells).

    :param a: ``[..., 4H]`` gate pre-activations (i, f, g, o, PyTorch's order), overwritten by the activations.
    :param c_prev: ``[..., H]`` the cell state entering the day (already zeroed where an episode starts).
    :param c_next: / :param tanh_c: / :param h_next: ``[..., H]`` written: the new cell state, its tanh and the new
        hidden state ``o tanh(c)``.

    Each tanh is computed as ``2 sigmoid(2x) - 1``: torch's CPU tanh profiled ~8x slower per element than sigmoid.
    """
    hid = a.shape[-1] // 4
    g = a[..., 2 * hid : 3 * hid]
    g.mul_(2.0)  # g: tanh(z) = 2 sigmoid(2z) - 1, with i, f, o's sigmoid
    a.sigmoid_()
    g.mul_(2.0).sub_(1.0)
    torch.mul(a[..., hid : 2 * hid], c_prev, out=c_next)
    c_next.addcmul_(a[..., :hid], g)
    torch.mul(c_next, 2.0, out=tanh_c).sigmoid_().mul_(2.0).sub_(1.0)
    torch.mul(a[..., 3 * hid :], tanh_c, out=h_next)


@functools.cache
def _one(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dim 1.0 on ``device`` (made once: no allocation or fill kernel per LSTM day)."""
    return torch.ones((), device=device, dtype=dtype)


def lstm_gate_gradients(
    a: Tensor, tanh_c: Tensor, c_prev: Tensor, dh: Tensor, dc: Tensor, d: Tensor, slope: Tensor, tmp: Tensor
) -> None:
    """The backward of `lstm_gates` for one day, in place, on any leading shape.

    :param a: ``[..., 4H]`` the day's gate activations; :param tanh_c: ``[..., H]`` tanh of its new cell state;
        :param c_prev: ``[..., H]`` the cell state that entered it.
    :param dh: ``[..., H]`` dL/dh of the day's output; :param dc: ``[..., H]`` dL/dc carried from the next day,
        left as dL/dc_prev (before any reset's mask).
    :param d: ``[..., 4H]`` written: dL/d(gate pre-activations). ``slope`` ``[..., 4H]`` and ``tmp`` ``[..., H]``
        are scratch.
    """
    hid = a.shape[-1] // 4
    i, f, g, o = a[..., :hid], a[..., hid : 2 * hid], a[..., 2 * hid : 3 * hid], a[..., 3 * hid :]
    one = _one(a.device, a.dtype)  # the 1 of "1 - x^2", broadcast by addcmul: one kernel each, not three
    torch.addcmul(a, a, a, value=-1.0, out=slope)  # sigmoid' = a - a^2
    torch.addcmul(one, g, g, value=-1.0, out=slope[..., 2 * hid : 3 * hid])  # tanh' = 1 - g^2
    torch.addcmul(one, tanh_c, tanh_c, value=-1.0, out=tmp).mul_(o)
    dc.addcmul_(tmp, dh)  # dL/dc_t = carried + dh_t o (1 - tanh(c_t)^2)
    torch.mul(dh, tanh_c, out=d[..., 3 * hid :])  # do
    torch.mul(dc, g, out=d[..., :hid])  # di
    torch.mul(dc, c_prev, out=d[..., hid : 2 * hid])  # df
    torch.mul(dc, i, out=d[..., 2 * hid : 3 * hid])  # dg
    d.mul_(slope)
    dc.mul_(f)


class WindowLSTM(torch.autograd.Function):
    """Last output ``h_T`` of a one-layer LSTM from zero state over windows of precomputed input gates.

    forward(projected ``[R, 4H]`` = W_ih x_r + b_ih + b_hh for each distinct row r, index ``[T, M]`` int64 = the row
    of day t of window m, w_hh ``[4H, H]``) -> h_T ``[M, H]``. Each day's gate inputs are gathered from ``projected``
    straight into that day's gate buffer (no ``[T, M, 4H]`` copy). Saves the gate activations ``[T, M, 4H]``, the
    hidden states entering each day, the cell states and their tanh ``[T, M, H]`` each. The backward does one
    ``[M, 4H] x [4H, H]`` matmul per day, one ``[4H, T M] x [T M, H]`` matmul for ``dW_hh``, and adds each day's gate
    gradients into the rows they came from. Runs with autocast off, in float32 (float64 stays float64, for gradcheck).

    Stacked cells (`clstm_ppo.agent.stacked`): with ``w_hh`` ``[C, 4H, H]`` (C networks' weights), the M windows
    are C groups of M / C, group c run with ``w_hh[c]`` (``bmm`` in place of ``mm``; the gate arithmetic is the
    same `lstm_gates`), and the gradient of ``w_hh`` is ``[C, 4H, H]``.
    """

    @staticmethod
    def forward(ctx, projected: Tensor, index: Tensor, w_hh: Tensor) -> Tensor:  # type: ignore[override]
        with torch.autocast(projected.device.type, enabled=False):
            dtype = torch.float32 if projected.dtype in (torch.float16, torch.bfloat16) else projected.dtype
            projected, w_hh = projected.to(dtype), w_hh.to(dtype)
            days, m = index.shape
            four_h = projected.shape[1]
            hid = four_h // 4
            cells = w_hh.shape[0] if w_hh.dim() == 3 else 0  # C stacked networks (0: one, unstacked)
            acts = projected.new_empty(days, m, four_h)  # i, f, g, o after their nonlinearities
            cell_states = projected.new_empty(days + 1, m, hid)  # c_0 = 0, c_1 .. c_T
            cell_states[0].zero_()
            tanh_cells = projected.new_empty(days, m, hid)
            hidden = projected.new_empty(days + 1, m, hid)  # h_0 = 0, h_1 .. h_T
            hidden[0].zero_()
            w_t = w_hh.transpose(-1, -2)
            for t in range(days):
                a = acts[t]
                torch.index_select(projected, 0, index[t], out=a)
                if cells:
                    a.view(cells, -1, four_h).baddbmm_(hidden[t].view(cells, -1, hid), w_t)
                else:
                    a.addmm_(hidden[t], w_t)
                lstm_gates(a, cell_states[t], cell_states[t + 1], tanh_cells[t], hidden[t + 1])
            ctx.save_for_backward(acts, cell_states, tanh_cells, hidden, w_hh, index)
            ctx.num_rows = projected.shape[0]
            return hidden[days].clone()

    @staticmethod
    def backward(ctx, grad_h: Tensor) -> tuple[Tensor, None, Tensor]:  # type: ignore[override]
        acts, cell_states, tanh_cells, hidden, w_hh, index = ctx.saved_tensors
        with torch.autocast(grad_h.device.type, enabled=False):
            days, m, four_h = acts.shape
            hid = four_h // 4
            cells = w_hh.shape[0] if w_hh.dim() == 3 else 0
            grad_gates = torch.empty_like(acts)
            grad_projected = acts.new_zeros(ctx.num_rows, four_h)
            dh = grad_h.to(acts.dtype).contiguous()
            dc = torch.zeros_like(dh)
            tmp = torch.empty_like(dh)
            slope = acts.new_empty(m, four_h)  # derivative of each gate's nonlinearity
            for t in reversed(range(days)):
                d = grad_gates[t]
                lstm_gate_gradients(acts[t], tanh_cells[t], cell_states[t], dh, dc, d, slope, tmp)
                grad_projected.index_add_(0, index[t], d)
                if t > 0:  # h_0 is the constant zero state: no gradient to carry past day 0
                    dh = torch.bmm(d.view(cells, -1, four_h), w_hh).view(m, hid) if cells else d @ w_hh
            if cells:  # per network: [4H, T M/C] x [T M/C, H] (rows regrouped by network, copied whole)
                per = m // cells
                gates = grad_gates.view(days, cells, per, four_h).transpose(0, 1).reshape(cells, -1, four_h)
                states = hidden[:days].view(days, cells, per, hid).transpose(0, 1).reshape(cells, -1, hid)
                grad_w = torch.bmm(gates.transpose(1, 2), states)
            else:
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
    kernel = resolve_kernel(kernel, windows.rows.device, rows_shared=windows.rows_shared)
    if kernel == "fused":
        dense = windows.dense()
        out, _ = lstm(dense.reshape(-1, *dense.shape[2:]))
        return out[:, -1]
    flat_rows = windows.rows.reshape(-1, windows.rows.shape[-1])  # [E R, F]
    projected = nn.functional.linear(flat_rows, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)  # [E R, 4H]
    index = windows.flat_index().permute(2, 0, 1).reshape(windows.window, -1)  # [T, L E]
    return WindowLSTM.apply(projected, index, lstm.weight_hh_l0)


def stacked_window_last_output(
    w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor, windows: Windows, cells: int
) -> Tensor:
    """`window_last_output` of C stacked networks (the ``shared`` kernel; ``projected`` by one ``baddbmm``): the
    windows' E columns are C groups of E / C, group c read by network c.

    :param w_ih: ``[C, 4H, F]``; :param w_hh: ``[C, 4H, H]``; :param b_ih: / :param b_hh: ``[C, 4H]``.
    :param windows: L x E windows over rows ``[E, R, F]`` (E = C x M, cell-major).
    :return: ``[C, L x M, H]``: each network's windows, step-major.
    """
    envs, rows_per_env, features = windows.rows.shape
    per = envs // cells
    rows = windows.rows.reshape(cells, per * rows_per_env, features)  # [C, M R, F]
    projected = torch.baddbmm((b_ih + b_hh).unsqueeze(1), rows, w_ih.transpose(1, 2))  # [C, M R, 4H]
    steps, window = windows.steps, windows.window
    index = windows.flat_index().view(steps, cells, per, window).permute(3, 1, 0, 2).reshape(window, -1)  # [T, C L M]
    out = WindowLSTM.apply(projected.reshape(-1, projected.shape[-1]), index, w_hh)  # [C L M, H]
    return out.view(cells, steps * per, -1)
