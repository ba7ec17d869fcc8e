"""Stage 2's recurrence across trading days for C stacked networks at once (`clstm_ppo.agent.stacked`).

``nn.LSTM`` takes one set of weights, and ``vmap`` has no batching rule for ``aten::lstm`` (torch 2.13), so C
networks' LSTMs (the actor's and the critic's of K cells: C = 2K) run as one hand-written recurrence over stacked
weights: the input projection of every day is one ``baddbmm`` before the loop (the caller's), each day one
``[C, M, H] x [C, H, 4H]`` ``baddbmm`` and the gate arithmetic of `clstm_ppo.agent.window_lstm.lstm_gates`, the
one LSTM cell of the package. The backward is written by hand as `WindowLSTM`'s is (one ``bmm`` per day and one for
``dW_hh``), which keeps autograd's bookkeeping out of the L-day loop.

Episode starts zero the state entering a day, as `clstm_ppo.agent.recurrence.run_lstm` does; only the days where
some env starts (known on the host) are masked, and masking multiplies by exactly 1.0 elsewhere, so a network's
numbers do not depend on the other networks' episode starts. ``tests/test_stacked.py`` checks the kernel against
``nn.LSTM`` through `run_lstm` and its gradients against autograd in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from clstm_ppo.agent.window_lstm import lstm_gate_gradients, lstm_gates


class StackedLSTM(torch.autograd.Function):
    """L days of C one-layer LSTMs (C networks, M sequences each) with state resets.

    forward(xproj ``[C, L, M, 4H]`` = W_ih x + b_ih + b_hh of each day, w_hh ``[C, 4H, H]``, h0 and c0
    ``[C, M, H]`` the state before day 0, keep ``[C, L, M, 1]`` 0.0 where a sequence starts an episode on that day
    else 1.0, cuts: the days whose entering state is masked by ``keep`` (day 0 and every day some sequence starts))
    -> outputs ``[C, L, M, H]``, then h and c after day L-1 ``[C, M, H]`` (not differentiable).

    Every buffer is network-major (``[C, L, ...]``), as ``xproj`` and the heads that read the outputs are: a day is
    a strided view, each network's rows stay contiguous, and ``dW_hh`` is one ``bmm`` over each network's L x M rows
    with nothing transposed or copied. Gradients flow to ``xproj`` and ``w_hh`` only: the initial state is the
    rollout's record (data, as in `run_lstm`'s callers). Runs with autocast off, in float32 (float64 stays float64,
    for gradcheck).
    """

    @staticmethod
    def forward(ctx, xproj: Tensor, w_hh: Tensor, h0: Tensor, c0: Tensor, keep: Tensor, cuts: tuple[int, ...]):  # type: ignore[override]
        with torch.autocast(xproj.device.type, enabled=False):
            dtype = torch.float32 if xproj.dtype in (torch.float16, torch.bfloat16) else xproj.dtype
            xproj, w_hh, keep = xproj.to(dtype), w_hh.to(dtype), keep.to(dtype)
            cells, days, m, four_h = xproj.shape
            hid = four_h // 4
            acts = xproj.new_empty(cells, days, m, four_h)  # i, f, g, o after their nonlinearities
            cell_in = xproj.new_empty(cells, days + 1, m, hid)  # c entering each day (masked), then the last c
            cell_in[:, 0].copy_(c0)
            tanh_cells = xproj.new_empty(cells, days, m, hid)
            hidden_in = xproj.new_empty(cells, days, m, hid)  # h entering each day (masked)
            out = xproj.new_empty(cells, days, m, hid)
            w_t = w_hh.transpose(1, 2)
            h = h0.to(dtype)
            for t in range(days):
                if t in cuts:
                    torch.mul(h, keep[:, t], out=hidden_in[:, t])
                    cell_in[:, t].mul_(keep[:, t])
                else:
                    hidden_in[:, t].copy_(h)
                a = acts[:, t]
                torch.baddbmm(xproj[:, t], hidden_in[:, t], w_t, out=a)
                lstm_gates(a, cell_in[:, t], cell_in[:, t + 1], tanh_cells[:, t], out[:, t])
                h = out[:, t]
            ctx.save_for_backward(acts, cell_in, tanh_cells, hidden_in, w_hh, keep)
            ctx.cuts = cuts
            h_last, c_last = out[:, days - 1].clone(), cell_in[:, days].clone()
            ctx.mark_non_differentiable(h_last, c_last)
            return out, h_last, c_last

    @staticmethod
    def backward(ctx, grad_out: Tensor, _grad_h: Tensor, _grad_c: Tensor):  # type: ignore[override]
        acts, cell_in, tanh_cells, hidden_in, w_hh, keep = ctx.saved_tensors
        cuts = ctx.cuts
        with torch.autocast(grad_out.device.type, enabled=False):
            cells, days, m, four_h = acts.shape
            hid = four_h // 4
            grad_out = grad_out.to(acts.dtype)
            grad_gates = torch.empty_like(acts)
            dh = grad_out[:, days - 1]  # dL/dh of day t's output: its own gradient and what day t + 1 carries back
            dc = torch.zeros_like(hidden_in[:, 0])
            tmp = torch.empty_like(dc)
            slope = torch.empty_like(acts[:, 0])
            for t in reversed(range(days)):
                d = grad_gates[:, t]
                lstm_gate_gradients(acts[:, t], tanh_cells[:, t], cell_in[:, t], dh, dc, d, slope, tmp)
                if t in cuts:  # the state entering day t was the previous day's times keep
                    dc.mul_(keep[:, t])
                if t > 0 and t in cuts:
                    dh = torch.bmm(d, w_hh).mul_(keep[:, t]).add_(grad_out[:, t - 1])
                elif t > 0:
                    dh = torch.baddbmm(grad_out[:, t - 1], d, w_hh)
            gates = grad_gates.view(cells, days * m, four_h)
            grad_w = torch.bmm(gates.transpose(1, 2), hidden_in.view(cells, days * m, hid))
        return grad_gates, grad_w, None, None, None, None


def stacked_lstm(
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
    state: tuple[Tensor, Tensor],
    starts: Tensor,
    cuts: list[int],
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """C stacked LSTMs over L days: `run_lstm` for stacked weights.

    :param x: ``[C, L, M, D]`` inputs; :param w_ih: ``[C, 4H, D]``; :param w_hh: ``[C, 4H, H]``; :param b_ih: /
        :param b_hh: ``[C, 4H]``.
    :param state: ``(h, c)`` each ``[C, M, H]`` before day 0 (not yet masked).
    :param starts: ``[L, C, M]`` bool, True where a sequence starts an episode that day (its state zeroed first).
    :param cuts: days ``>= 1`` where some sequence starts (`clstm_ppo.agent.recurrence.cut_days` of a host copy).
    :return: outputs ``[C, L, M, H]`` and the state after day L-1, each ``[C, M, H]``.
    """
    cells, days, m, features = x.shape
    xproj = torch.baddbmm((b_ih + b_hh).unsqueeze(1), x.reshape(cells, days * m, features), w_ih.transpose(1, 2))
    keep = (~starts).to(x.dtype).transpose(0, 1).unsqueeze(-1)  # [C, L, M, 1]
    out, h, c = StackedLSTM.apply(xproj.view(cells, days, m, -1), w_hh, state[0], state[1], keep, (0, *cuts))
    return out, (h, c)
