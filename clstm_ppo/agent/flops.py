"""Matmul FLOPs of the policy families per env step, from the layer sizes (2 per multiply-add; gate nonlinearities,
the loss and Adam are not counted): what `benchmarks/mfu.py` divides the machine's rate by, and what the study's
scheduler weighs a cell's work by (`clstm_ppo.study.batch.batches`).

An LSTM step costs ``2 * 4H * (I + H)`` (input projection and recurrence), a Linear ``2 * I * O``. Forward per env
step, for F state numbers a day, N tickers, a T-day window, stage-1 width H1, D features and stage-2 width H2:

- clstm: ``P * 2*4*H1*F + T * 2*4*H1*H1 + Linear(H1, D) + Linear(D, D) + 2 * LSTM(D -> H2) + heads``
- lstm: ``Linear(F, D) + Linear(D, D) + 2 * LSTM(D -> H2) + heads``
- mlp (and shared, approximately): ``Linear(F, D) + Linear(D, D) + 2 * Linear(D, H2) + heads``

with heads ``Linear(H2, N) + Linear(H2, 1)`` and P the window rows whose input projection is computed per env step
(T unless a kernel projects each distinct row once: ``rows``). Training per env step is one rollout forward and, per
epoch, a forward and a backward (about two forwards): ``(1 + 3 * epochs)`` forwards.
"""

from __future__ import annotations

from typing import Any

from envs.state import StateLayout


def lstm_flops(inp: int, hidden: int) -> int:
    return 2 * 4 * hidden * (inp + hidden)


def linear_flops(inp: int, out: int) -> int:
    return 2 * inp * out


def forward_flops(policy: str, F: int, N: int, T: int, H1: int, D: int, H2: int, rows: float | None = None) -> float:
    """Matmul FLOPs of one forward for one env step (see the module docstring); ``rows``: P (None: T)."""
    heads = linear_flops(H2, N) + linear_flops(H2, 1)
    if policy == "clstm":
        projected = T if rows is None else rows
        stage1 = projected * 2 * 4 * H1 * F + T * 2 * 4 * H1 * H1
        return stage1 + linear_flops(H1, D) + linear_flops(D, D) + 2 * lstm_flops(D, H2) + heads
    features = linear_flops(F, D) + linear_flops(D, D)
    if policy == "lstm":
        return features + 2 * lstm_flops(D, H2) + heads
    return features + 2 * linear_flops(D, H2) + heads


def training_flops_per_step(cfg: Any, num_tickers: int) -> float:
    """Matmul FLOPs of training per env step of the network ``cfg`` (a `clstm_ppo.config.TrainConfig`) builds for
    ``num_tickers`` tickers: one rollout forward and ``epochs`` x (forward + backward)."""
    features = StateLayout(num_tickers, len(cfg.data.indicator_list)).num_features
    m = cfg.model
    forward = forward_flops(
        m.policy, features, num_tickers, cfg.data.window, m.stage1_hidden, m.feature_dim, m.stage2_hidden
    )
    return forward * (1 + 3 * cfg.ppo.epochs)
