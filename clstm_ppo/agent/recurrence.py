"""Stage 2's recurrence across trading days, shared by the families that have one (`clstm_ppo.agent.lstm` and
`clstm_ppo.agent.clstm`): an LSTM over the sequence of stage-1 features, with state resets at episode starts.

Episode starts cut the sequence instead of masking every step (`run_lstm`), so an update over L days runs a few
fused LSTM calls, not L single steps; ``tests/test_model.py`` checks it against a step loop.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def cut_days(starts: Tensor) -> list[int]:
    """Days ``d >= 1`` of ``starts [L, B]`` where some env starts an episode (where `run_lstm` cuts).

    On a GPU tensor this synchronises the stream; `clstm_ppo.training.ppo.ppo_update` passes host copies instead.
    """
    if starts.shape[0] <= 1:
        return []
    return torch.nonzero(starts[1:].any(dim=1)).flatten().add(1).tolist()


def run_lstm(
    lstm: nn.LSTM, x: Tensor, state: tuple[Tensor, Tensor], starts: Tensor, cuts: list[int] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Run ``lstm`` over days with state resets at episode starts.

    :param x: ``[L, B, D]`` inputs, day-major.
    :param state: ``(h, c)`` each ``[1, B, H]``: the state before day 0 (not yet masked).
    :param starts: ``[L, B]`` bool, True where an episode starts on that day (state zeroed first).
    :param cuts: ``cut_days(starts)`` when the caller already has it (computed from a host copy, so
        no device synchronisation here); None computes it from ``starts``.
    :return: outputs ``[L, B, H]`` and the state after day L-1.

    The sequence is cut only at days where some env starts an episode, and each piece runs as one
    fused LSTM call; a one-day call on the CPU (a rollout step) runs ``torch.lstm_cell`` instead, ~2x
    faster there. A rollout step and an update over L days give the same numbers up to float rounding.
    """
    keep = (~starts).to(x.dtype).unsqueeze(-1)  # [L, B, 1]
    if x.shape[0] == 1 and x.device.type == "cpu":  # a rollout step: the plain cell is ~2x faster on a CPU
        h, c = torch.lstm_cell(
            x[0],
            (state[0][0] * keep[0], state[1][0] * keep[0]),
            lstm.weight_ih_l0,
            lstm.weight_hh_l0,
            lstm.bias_ih_l0,
            lstm.bias_hh_l0,
        )
        return h.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0))
    bounds = [0, *(cut_days(starts) if cuts is None else cuts), x.shape[0]]
    h, c = state
    outputs = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        h, c = h * keep[lo], c * keep[lo]
        out, (h, c) = lstm(x[lo:hi], (h, c))
        outputs.append(out)
    return torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0], (h, c)
