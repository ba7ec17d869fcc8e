"""The PPO update of K cells trained as one (`clstm_ppo.training.cell_trainer`): per cell what
`clstm_ppo.training.ppo.ppo_update` does for its run alone, in one forward and backward per minibatch.

Per cell k, as alone: its advantages normalised with its own statistics (`advantage_statistics` on its columns);
its epochs' minibatches in the order its own shuffle generator draws (a cell that stopped draws nothing more, as its
run alone would not); its loss averaged over its own columns (`ppo_loss` with a mean per cell: the K losses are
summed for one backward, and no cell's gradient depends on another's loss); its clip coefficient, entropy and value
weights, gradient clip and KL target; its optimizer step (`clstm_ppo.training.cell_adam`), skipped where its
gradients are not finite; the KL early stop as a mask, so a stopped cell's weights and optimizer state stay where
its epochs ended while the others go on. Settings a cell may not differ in (epochs, minibatch size, ...) are
`clstm_ppo.training.cell_trainer.BATCHABLE`'s complement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.config import PPOConfig
from clstm_ppo.training.cell_adam import CellAdam
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import (
    SUMMED_STATS,
    PhaseTimer,
    UpdateBatch,
    UpdateStats,
    advantage_statistics,
    no_timer,
    ppo_loss,
)
from clstm_ppo.training.rollout import RolloutBuffer


class CellCoefficients(NamedTuple):
    """The loss's settings of K cells, shaped for `ppo_loss` over ``[S, K, M]`` terms."""

    clip_coef: Tensor  # [1, K, 1] float32
    clip_value: float  # the same for every cell
    ent_coef: Tensor  # [K] float32
    vf_coef: Tensor  # [K] float32

    @classmethod
    def of(cls, ppos: list[PPOConfig], device: torch.device) -> CellCoefficients:
        def per_cell(name: str) -> Tensor:
            return torch.tensor([getattr(p, name) for p in ppos], dtype=torch.float32, device=device)

        return cls(per_cell("clip_coef").view(1, -1, 1), ppos[0].clip_value, per_cell("ent_coef"), per_cell("vf_coef"))


def cell_minibatch_loss(
    policy: CellPolicy,
    batch: UpdateBatch,
    coefficients: CellCoefficients,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Each cell's loss ``[K]`` on its columns of ``batch`` (S steps x K M columns, cell-major) and its parts
    ``[K]`` by name (`clstm_ppo.training.ppo.minibatch_loss`, per cell)."""
    with autocast():
        out = policy(batch.windows, batch.initial_state, batch.starts, batch.actions, host_starts=batch.host_starts)
    steps = batch.starts.shape[0]
    shape = (steps, policy.cells, -1)

    def per_cell(t: Tensor) -> Tensor:
        return t.mean(dim=(0, 2))

    terms = (out.log_prob, out.entropy, out.value, batch.log_probs, batch.values, batch.advantages, batch.returns)
    return ppo_loss(*(t.view(shape) for t in terms), coefficients, mean=per_cell)


def cell_batch(buf: RolloutBuffer, advantages: Tensor, returns: Tensor, ppo: PPOConfig, cells: int) -> tuple[
    UpdateBatch, list[tuple[float, float, float, float]]
]:  # fmt: skip
    """The rollout as the update reads it, each cell's advantages normalised with its own statistics, and those
    statistics per cell (`advantage_statistics`: ``(mean, std, return std, explained variance)``)."""
    per = buf.num_envs // cells
    statistics, normalised = [], []
    for k in range(cells):
        cols = slice(k * per, (k + 1) * per)
        stats = advantage_statistics(advantages[:, cols], returns[:, cols], buf.values[:, cols], Comm())
        statistics.append(stats)
        adv = advantages[:, cols]
        normalised.append((adv - stats[0]) / (stats[1] + 1e-8) if ppo.norm_adv else adv)
    batch = UpdateBatch(
        windows=buf.obs.windows(),
        starts=buf.starts,
        host_starts=buf.starts.cpu(),
        actions=buf.actions,
        log_probs=buf.log_probs,
        values=buf.values,
        advantages=torch.cat(normalised, dim=1),
        returns=returns,
        initial_state=buf.initial_state,
    )
    return batch, statistics


def cell_ppo_update(
    policy: CellPolicy,
    optimizer: CellAdam,
    buf: RolloutBuffer,
    advantages: Tensor,
    returns: Tensor,
    ppos: list[PPOConfig],
    *,
    active: list[bool],
    generators: list[torch.Generator],
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    timer: PhaseTimer | None = None,
) -> list[UpdateStats | None]:
    """``ppo.epochs`` epochs of PPO for every ``active`` cell over its columns of ``buf`` (see the module
    docstring); inactive cells (finished, failed) are computed but never step.

    :param advantages: / :param returns: ``[S, K B]`` (`compute_gae` over every column).
    :param ppos: each cell's PPO settings; :param generators: each cell's minibatch-shuffle generator (CPU).
    :return: each active cell's `UpdateStats` (None for the others).
    """
    phase = timer if timer is not None else no_timer
    cells, device, ppo = policy.cells, buf.actions.device, ppos[0]
    per = buf.num_envs // cells
    batch, statistics = cell_batch(buf, advantages, returns, ppo, cells)
    coefficients = CellCoefficients.of(ppos, device)
    max_grad_norm = torch.tensor([p.max_grad_norm for p in ppos], dtype=torch.float32, device=device)
    running = list(active)  # cells still in their epochs
    sums = {name: torch.zeros(cells, dtype=torch.float64, device=device) for name in SUMMED_STATS}
    skipped = torch.zeros(cells, device=device)
    steps, epochs_run = [0] * cells, [0] * cells
    size = ppo.envs_per_minibatch // ppo.gradient_accumulation_steps
    for _epoch in range(ppo.epochs):
        if not any(running):
            break
        orders = [
            torch.randperm(per, generator=g) if run else torch.arange(per)
            for g, run in zip(generators, running, strict=True)
        ]
        mask = torch.tensor(running, device=device)
        epoch_kl = torch.zeros(cells, dtype=torch.float64, device=device)
        for start in range(0, per, ppo.envs_per_minibatch):
            parts: dict[str, Tensor] = {}
            for micro in range(ppo.gradient_accumulation_steps):
                lo = start + micro * size
                host = torch.cat([order[lo : lo + size] + k * per for k, order in enumerate(orders)])
                with phase("forward"):
                    loss, micro_parts = cell_minibatch_loss(
                        policy, batch.columns(host.to(device), host), coefficients, autocast
                    )
                with phase("backward"):
                    (loss.sum() / ppo.gradient_accumulation_steps).backward()
                parts = {k: parts.get(k, 0.0) + v / ppo.gradient_accumulation_steps for k, v in micro_parts.items()}
            with phase("optimizer"):
                grad_norm, skipped_now = optimizer.step(max_grad_norm, mask)
            skipped += skipped_now
            parts["grad_norm"] = grad_norm.detach().float()
            for name in SUMMED_STATS:
                sums[name] += torch.where(mask, parts[name].double(), 0.0)
            epoch_kl += torch.where(mask, parts["approx_kl"].double(), 0.0)
            steps = [s + run for s, run in zip(steps, running, strict=True)]
        epochs_run = [e + run for e, run in zip(epochs_run, running, strict=True)]
        for k, cell_ppo in enumerate(ppos):
            if running[k] and cell_ppo.target_kl > 0 and float(epoch_kl[k] / ppo.num_minibatches) > cell_ppo.target_kl:
                running[k] = False
    out: list[UpdateStats | None] = []
    for k in range(cells):
        if not active[k]:
            out.append(None)
            continue
        _, adv_std, return_std, explained = statistics[k]
        out.append(
            UpdateStats(
                **{name: float(sums[name][k]) / max(steps[k], 1) for name in SUMMED_STATS},
                explained_variance=explained,
                advantage_std=adv_std,
                return_std=return_std,
                epochs_run=epochs_run[k],
                skipped_steps=int(skipped[k].item()),
            )
        )
    return out
