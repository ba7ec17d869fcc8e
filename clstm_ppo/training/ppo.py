"""The PPO update over whole-sequence minibatches, data-parallel through DDP, for a run (K = 1) and for K runs
trained as one batch (`ppo_update`).

A minibatch is a set of env columns: all S days of those envs, re-run from the recurrent state stored at the
rollout's start with state resets at episode starts (CleanRL's recurrent PPO). The loss forward always goes through
``model`` as given (the DDP wrapper when training on several workers), so every backward all-reduces gradients.

Collectives per update, identical on every rank: one all-reduce of advantage/return statistics, the DDP gradient
all-reduces (one per minibatch; micro-batches before the last run under ``no_sync``), one all-reduce of the approx KL
per epoch (for the shared early-stop decision) and one of the logged statistics. A NaN/inf gradient is seen alike on
every rank because the gradients were all-reduced before the check, so skipping such a step needs no collective.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import PPOConfig
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.rollout import RolloutBuffer
from envs.errors import UserError


@dataclass
class UpdateStats:
    """Averages over the minibatches actually run, over all workers."""

    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    explained_variance: float
    advantage_std: float  # of the raw GAE advantages (reward units), before normalisation
    return_std: float  # of the GAE returns, the value head's targets
    grad_norm: float
    epochs_run: int
    skipped_steps: int  # optimizer steps skipped for NaN/inf gradients

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


SUMMED_STATS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")
"""The `UpdateStats` averaged over minibatches (the rest are computed once per update)."""


class PhaseTimer:
    """Wall seconds per named phase, summed over calls (benchmarks; training passes none). On CUDA the stream is
    synchronised around each phase so the time lands where the work runs, at a cost in throughput."""

    def __init__(self, device: torch.device | str) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cuda = torch.device(device).type == "cuda"

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds[name] += time.perf_counter() - t0


def no_timer(_name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def autocast_factory(mixed_precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A zero-argument function returning the autocast context for the run (nullcontext for 'none')."""
    if mixed_precision == "none":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    if mixed_precision == "fp16" and device.type != "cuda":
        raise UserError("--mixed_precision fp16 needs a CUDA GPU; use bf16 or none on CPU")
    return lambda: torch.autocast(device.type, dtype=dtype)


def build_optimizer(ppo: PPOConfig, model: ActorCritic, world_size: int) -> torch.optim.Adam:
    """Adam with two parameter groups, ``name``d clstm (stage 1, at learning_rate_clstm) and actor_critic (the rest,
    at learning_rate_actor_critic), each rate times the world size under ``scale_lr``.

    ``fused=True`` (CPU and CUDA): the default implementation's per-parameter Python loop costs a measurable share
    of an update (benchmarks/README.md), and `optimizer_step` skips a NaN/inf step on the device through it.
    """
    scale = world_size if ppo.scale_lr else 1
    groups = [
        {"params": model.stage1_parameters(), "lr": ppo.learning_rate_clstm * scale, "name": "clstm"},
        {"params": model.stage2_parameters(), "lr": ppo.learning_rate_actor_critic * scale, "name": "actor_critic"},
    ]
    return torch.optim.Adam(groups, eps=ppo.adam_eps, fused=True)


@dataclass
class SeedLearner:
    """What the PPO update holds of one seed (K of them train as one batch; a run is one): its settings, its
    optimizer over its own parameters (K > 1: views of the stacked ones), its GradScaler (fp16), its
    minibatch-shuffle generator (CPU, one per worker), and whether it still trains (a finished or failed seed is
    computed with the others but never steps). Nothing of its run folder or callbacks: `ppo_update` needs none."""

    ppo: PPOConfig
    optimizer: torch.optim.Optimizer
    shuffle: torch.Generator
    scaler: torch.amp.GradScaler | None = None
    active: bool = True

    def params(self) -> list[nn.Parameter]:
        """Every parameter the optimizer steps, in group order (what its gradient clip sees)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def lrs(self) -> list[float]:
        """The learning rate per parameter group (stage 1, the rest)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def set_lrs(self, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr


@torch.no_grad()
def decay_weights(optimizer: torch.optim.Optimizer, weight_decay: float, skipped: Tensor) -> None:
    """Decoupled weight decay (AdamW's, Loshchilov & Hutter): every weight matrix (``dim >= 2``; not biases nor
    the log-std) shrinks by ``1 - lr x weight_decay`` of its group, except on a step skipped for NaN/inf
    (``skipped`` 0-dim, 1.0 there; decided on the device, no host sync)."""
    for group in optimizer.param_groups:
        weights = [p for p in group["params"] if p.dim() >= 2]
        if weights:
            factor = 1.0 - group["lr"] * weight_decay * (1.0 - skipped.to(weights[0].device))
            torch._foreach_mul_(weights, factor)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    max_grad_norm: float,
    scaler: torch.amp.GradScaler | None = None,
    weight_decay: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Clip one run's (or one seed's) already all-reduced gradients, step unless they are NaN/inf, decay the weight
    matrices by ``weight_decay`` (`decay_weights`); the caller zeroes the gradients.

    With fp16 the GradScaler skips by itself (dynamic loss scaling); the fused Adam kernel is told through
    ``found_inf`` and skips on the device (no host sync per minibatch, which on a GPU would stall the launch queue);
    other optimizers check on the host.

    :return: ``(grad_norm, skipped)``: 0-dim tensors on the gradients' device; ``skipped`` is 1.0 when this
        step was skipped for non-finite gradients (the GradScaler's own skips are not counted).
    """
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
    skipped = torch.zeros((), device=grad_norm.device)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    elif isinstance(optimizer, torch.optim.Adam) and all(g.get("fused") for g in optimizer.param_groups):
        skipped = (~torch.isfinite(grad_norm)).float()
        optimizer.found_inf = skipped  # the fused kernel skips the step (and undoes its step count) where 1
        optimizer.step()
        del optimizer.found_inf
    elif torch.isfinite(grad_norm):
        optimizer.step()
    else:
        skipped = torch.ones((), device=grad_norm.device)
    if weight_decay > 0:
        decay_weights(optimizer, weight_decay, skipped)
    return grad_norm, skipped


def scaled_loss(loss: Tensor, scalers: list[torch.amp.GradScaler | None]) -> Tensor:
    """What to differentiate: a run's loss (0-dim) or K seeds' ``[K]`` summed (no seed's gradient depends on another
    seed's loss), each times its own GradScaler's scale where fp16. One part's sum is that part, bit for bit."""
    parts = loss.reshape(-1)
    if scalers[0] is None:
        return parts.sum()
    return torch.stack([scaler.scale(part) for scaler, part in zip(scalers, parts, strict=True)]).sum()


STAT_SUMS = ("n", "a1", "a2", "r1", "r2", "e1", "e2")


def advantage_statistics(
    advantages: Tensor, returns: Tensor, values: Tensor, comm: Comm, cells: int = 1
) -> list[tuple[float, float, float, float]]:
    """Each cell's mean and std of advantages, std of returns and explained variance of values, over all workers
    (one all-reduce for every cell; a cell's columns are its block of ``[S, E]``).

    :return: per cell ``(adv_mean, adv_std, return_std, explained_variance)``.
    """
    per = advantages.shape[1] // cells
    parts: dict[str, list[Tensor]] = {name: [] for name in STAT_SUMS}
    for k in range(cells):
        cols = slice(k * per, (k + 1) * per)
        adv, ret = advantages[:, cols], returns[:, cols]
        parts["n"].append(torch.tensor(float(adv.numel()), device=advantages.device, dtype=torch.float64))
        for name, x in (("a", adv), ("r", ret), ("e", ret - values[:, cols])):
            parts[f"{name}1"].append(x.double().sum())
            parts[f"{name}2"].append(x.double().square().sum())
    sums = comm.all_reduce_named({name: torch.stack(v) for name, v in parts.items()})
    host = {name: sums[name].tolist() for name in STAT_SUMS}
    out = []
    for k in range(cells):
        n, a1, a2, r1, r2, e1, e2 = (host[name][k] for name in STAT_SUMS)
        adv_mean = a1 / n
        adv_std = math.sqrt(max(a2 / n - adv_mean**2, 0.0) * n / max(n - 1, 1))
        var_ret = r2 / n - (r1 / n) ** 2
        var_err = e2 / n - (e1 / n) ** 2
        explained = float("nan") if var_ret <= 1e-12 else 1.0 - var_err / var_ret
        out.append((adv_mean, adv_std, math.sqrt(max(var_ret, 0.0)), explained))
    return out


class LossCoefficients(Protocol):
    """What `ppo_loss` reads of its settings: `PPOConfig`, or per-cell tensors for K cells trained as one
    (`CellCoefficients`), each broadcasting against the terms (``clip_coef``) or their means (the rest;
    ``clip_value`` is one number)."""

    clip_coef: float | Tensor
    clip_value: float
    ent_coef: float | Tensor
    vf_coef: float | Tensor


def ppo_loss(
    new_log_prob: Tensor,
    entropy: Tensor,
    new_value: Tensor,
    old_log_prob: Tensor,
    old_value: Tensor,
    advantages: Tensor,
    returns: Tensor,
    ppo: LossCoefficients,
    mean: Callable[[Tensor], Tensor] = torch.mean,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO loss over any matching shapes (here ``[S, E]``); returns the loss and its parts
    (detached, named as `UpdateStats`). ``mean`` averages each term: over everything (one run), or per cell
    (``[S, K, M] -> [K]``: K cells' losses side by side, `ppo_update` of a batch)."""
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    clip = ppo.clip_coef
    pg_loss = mean(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)))
    if ppo.clip_value > 0:
        clipped = old_value + (new_value - old_value).clamp(-ppo.clip_value, ppo.clip_value)
        v_loss = 0.5 * mean(torch.max((new_value - returns).square(), (clipped - returns).square()))
    else:
        v_loss = 0.5 * mean((new_value - returns).square())
    ent = mean(entropy)
    loss = pg_loss - ppo.ent_coef * ent + ppo.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = mean((ratio - 1) - log_ratio)  # the low-variance k3 estimator
        clip_frac = mean(((ratio - 1).abs() > clip).float())
    return loss, dict(
        policy_loss=pg_loss.detach(),
        value_loss=v_loss.detach(),
        entropy=ent.detach(),
        approx_kl=approx_kl,
        clip_fraction=clip_frac,
    )


@dataclass(frozen=True)
class UpdateBatch:
    """What every minibatch of one update reads, S steps x E env columns (CleanRL's flattened ``b_*`` arrays,
    kept as columns because a minibatch re-runs whole env columns through the recurrence)."""

    windows: Windows  # S x E observation windows
    starts: Tensor  # [S, E] bool episode starts
    host_starts: Tensor  # [S, E] bool, a CPU copy (where the LSTMs cut, found without a device sync)
    actions: Tensor  # [S, E, N] the rollout's Gaussian samples
    log_probs: Tensor  # [S, E] their log-probabilities then
    values: Tensor  # [S, E] V then
    advantages: Tensor  # [S, E] (normalised when --norm_adv)
    returns: Tensor  # [S, E] the value head's targets
    initial_state: RecurrentState  # before step 0, each [1, E, H]

    def columns(self, cols: Tensor, host_cols: Tensor) -> UpdateBatch:
        """The env columns ``cols`` ``[k]`` (on the device; ``host_cols`` the same on the CPU)."""
        on_device = ("starts", "actions", "log_probs", "values", "advantages", "returns")
        return UpdateBatch(
            windows=self.windows.select(cols),
            host_starts=self.host_starts[:, host_cols],
            initial_state=self.initial_state.envs(cols),
            **{name: getattr(self, name)[:, cols] for name in on_device},
        )


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


def minibatch_loss(
    model: nn.Module | CellPolicy,
    batch: UpdateBatch,
    coefficients: LossCoefficients,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    cells: int = 1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one (micro-)batch of env columns through ``model`` (the DDP wrapper when distributed, or K
    stacked cells) and its parts by name: PPO's clipped surrogate, value and entropy terms. One run's are 0-dim;
    K cells' ``[K]``, each averaged over its own columns (no cell's gradient depends on another's loss)."""
    with autocast():
        out = model(batch.windows, batch.initial_state, batch.starts, batch.actions, host_starts=batch.host_starts)
    terms = (out.log_prob, out.entropy, out.value, batch.log_probs, batch.values, batch.advantages, batch.returns)
    if cells == 1:
        return ppo_loss(*terms, coefficients)
    steps = batch.starts.shape[0]
    # each term [S, K, M] averaged per cell over its steps and columns -> [K]
    return ppo_loss(*(t.view(steps, cells, -1) for t in terms), coefficients, mean=lambda x: x.mean(dim=(0, 2)))


def update_batch(
    buf: RolloutBuffer, advantages: Tensor, returns: Tensor, ppo: PPOConfig, comm: Comm, cells: int = 1
) -> tuple[UpdateBatch, list[tuple[float, float, float, float]]]:
    """The rollout as the update reads it, each cell's advantages normalised with its own statistics over all
    workers, and those statistics per cell (`advantage_statistics`)."""
    statistics = advantage_statistics(advantages, returns, buf.values, comm, cells)
    if ppo.norm_adv:
        per = buf.num_envs // cells
        normalised = [(advantages[:, k * per : (k + 1) * per] - s[0]) / (s[1] + 1e-8) for k, s in enumerate(statistics)]
        advantages = torch.cat(normalised, dim=1)
    batch = UpdateBatch(
        windows=buf.obs.windows(),  # [B, R, F] distinct rows + [S, B, T] row numbers, built once per update
        starts=buf.starts,
        host_starts=buf.starts.cpu(),  # one sync per update; minibatches find their LSTM cuts on the host
        actions=buf.actions,
        log_probs=buf.log_probs,
        values=buf.values,
        advantages=advantages,
        returns=returns,
        initial_state=buf.initial_state,
    )
    return batch, statistics


def running_only(values: Tensor, running: Tensor) -> Tensor:
    """A minibatch's figures ``[K]`` (0-dim for a run) as float64 ``[K]``, 0 for the cells no longer ``running``
    (``[K]`` bool)."""
    return torch.where(running, values.double(), 0.0)


def ppo_update(
    model: nn.Module | CellPolicy,
    learners: list[SeedLearner],
    buf: RolloutBuffer,
    advantages: Tensor,
    returns: Tensor,
    comm: Comm,
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    timer: PhaseTimer | None = None,
) -> list[UpdateStats | None]:
    """``epochs`` epochs of PPO over this worker's rollout ``buf``: one run (K = 1: ``model`` the ActorCritic, possibly
    wrapped by torch.compile and/or DDP) or K seeds trained as one batch (``model`` their `CellPolicy`; ``buf``'s
    columns are K blocks), each seed with its own `SeedLearner` (settings, optimizer, GradScaler with fp16, shuffle
    generator). On several ranks a batch's gradients are averaged over the ranks per seed before its step, as DDP
    averages a run's.

    Per seed, as its run alone: its advantages normalised with its own statistics (over all workers), its own shuffle
    order (a seed that stopped draws nothing more), loss over its own columns, loss weights, gradient clip, KL target
    and optimizer step (skipped where its gradients are not finite). Every minibatch is
    ``gradient_accumulation_steps`` micro-batches, then one optimizer step. With ``target_kl`` a seed's epochs stop
    once the all-workers mean approx KL of an epoch exceeds it; a stopped seed's weights and optimizer state stay
    where its epochs ended while the others go on. A seed that is not ``active`` (finished or failed) is computed
    with the others but never steps.

    :param learners: each seed's (they may differ in the numbers the loss and the optimizer take,
        `clstm_ppo.training.trainer.PER_CELL`; the rest is the first's).
    :param advantages: ``[S, E]``; :param returns: ``[S, E]`` (from `compute_gae`).
    :param timer: optional `PhaseTimer` summing forward (with the loss), backward (with DDP's overlapped gradient
        all-reduce) and optimizer (clip, step, zero_grad) seconds.
    :return: each active seed's `UpdateStats` over all workers (None for the others).
    """
    phase = timer if timer is not None else no_timer
    ppos = [learner.ppo for learner in learners]
    cells, device, ppo = len(learners), buf.actions.device, ppos[0]
    per = buf.num_envs // cells
    active = [learner.active for learner in learners]
    batch, statistics = update_batch(buf, advantages, returns, ppo, comm, cells)
    # K = 1 keeps its run's loss reduction, bit for bit (a mean over everything, not per seed)
    coefficients: LossCoefficients = ppo if cells == 1 else CellCoefficients.of(ppos, device)
    stacked = isinstance(model, CellPolicy)
    scalers = [learner.scaler for learner in learners]
    params = [learner.params() for learner in learners]
    micro = ppo.gradient_accumulation_steps
    size = ppo.envs_per_minibatch // micro
    ddp = hasattr(model, "no_sync")
    running = list(active)  # cells still in their epochs
    sums = {name: torch.zeros(cells, dtype=torch.float64, device=device) for name in SUMMED_STATS}
    skipped = torch.zeros(cells, device=device)  # steps skipped for NaN/inf, counted on the device (no sync)
    zero = torch.zeros((), device=device)
    steps, epochs_run = [0] * cells, [0] * cells
    for _epoch in range(ppo.epochs):
        if not any(running):
            break
        orders = [
            torch.randperm(per, generator=learner.shuffle) if run else torch.arange(per)
            for learner, run in zip(learners, running, strict=True)
        ]
        # [K, M]: cell k's M columns in its own shuffled order, offset to its block, on the CPU and (copied once per
        # epoch) on the device: a (micro-)batch is a slice of both
        host_cols = torch.stack([order + k * per for k, order in enumerate(orders)])
        device_cols = host_cols.to(device)
        mask = torch.tensor(running, device=device)
        epoch_kl = torch.zeros(cells, dtype=torch.float64, device=device)
        for start in range(0, per, ppo.envs_per_minibatch):
            parts: dict[str, Tensor] = {}
            for m in range(micro):
                cut = slice(start + m * size, start + (m + 1) * size)
                columns = batch.columns(device_cols[:, cut].reshape(-1), host_cols[:, cut].reshape(-1))
                with contextlib.nullcontext() if (m == micro - 1 or not ddp) else model.no_sync():
                    with phase("forward"):
                        loss, micro_parts = minibatch_loss(model, columns, coefficients, autocast, cells)
                    with phase("backward"):
                        scaled_loss(loss / micro, scalers).backward()
                parts = {k: parts.get(k, 0.0) + v / micro for k, v in micro_parts.items()}
            with phase("optimizer"):
                if stacked and comm.distributed:  # DDP's average over the ranks, per seed: one all-reduce per group
                    for grad in model.grad:
                        grad.copy_(comm.all_reduce_sum(grad).div_(comm.world_size))
                steps_taken = [
                    optimizer_step(
                        learner.optimizer, params[k], learner.ppo.max_grad_norm, scalers[k], learner.ppo.weight_decay
                    )
                    if running[k]
                    else (zero, zero)
                    for k, learner in enumerate(learners)
                ]
                if stacked:  # the seeds' optimizers step views of its gradients: zeroed in place, never dropped
                    model.stepped()
                else:
                    learners[0].optimizer.zero_grad(set_to_none=True)
                grad_norm, skipped_now = (torch.stack(column) for column in zip(*steps_taken, strict=True))
            skipped += skipped_now
            parts["grad_norm"] = grad_norm.detach().float().view_as(parts["policy_loss"])
            for name in SUMMED_STATS:
                sums[name] += running_only(parts[name], mask)
            epoch_kl += running_only(parts["approx_kl"], mask)
            steps = [s + run for s, run in zip(steps, running, strict=True)]
        epochs_run = [e + run for e, run in zip(epochs_run, running, strict=True)]
        if any(p.target_kl > 0 for p in ppos):
            mean_kl = (comm.all_reduce_sum(epoch_kl / ppo.num_minibatches) / comm.world_size).tolist()
            running = [
                run and not (p.target_kl > 0 and kl > p.target_kl)
                for run, p, kl in zip(running, ppos, mean_kl, strict=True)
            ]
    means = comm.all_reduce_named({k: v / torch.tensor(steps, device=device).clamp_min(1) for k, v in sums.items()})
    host = {k: (v / comm.world_size).tolist() for k, v in means.items()}
    skips = skipped.tolist()
    return [
        UpdateStats(
            **{name: host[name][k] for name in SUMMED_STATS},
            explained_variance=statistics[k][3],
            advantage_std=statistics[k][1],
            return_std=statistics[k][2],
            epochs_run=epochs_run[k],
            skipped_steps=int(skips[k]),
        )
        if active[k]
        else None
        for k in range(cells)
    ]
