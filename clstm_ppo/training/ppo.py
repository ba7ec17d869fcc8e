"""The PPO update over whole-sequence minibatches, data-parallel through DDP.

A minibatch is a set of env columns: all S days of those envs, re-run from the recurrent state
stored at the rollout's start with state resets at episode starts (CleanRL's recurrent PPO).
The loss forward always goes through ``model`` as given -- the DDP wrapper when training on
several workers -- so every backward all-reduces gradients.

Collectives per update, identical on every rank: one all-reduce of advantage/return statistics,
the DDP gradient all-reduces (one per minibatch; micro-batches before the last run under
``no_sync``), one all-reduce of the approx KL per epoch (for the shared early-stop decision) and
one all-reduce of the logged statistics. A NaN/inf gradient is seen alike on every rank because the
gradients were all-reduced before the check, so skipping such a step needs no extra collective.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from clstm_ppo.agent.model import ActorCritic, RecurrentState
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
    """Wall seconds per named phase, summed over calls (benchmarks; training passes none).

    On CUDA the stream is synchronised around each phase so the time lands where the work runs;
    that costs throughput, so only benchmarks that report the split use it.
    """

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
    """Adam with two parameter groups: stage 1 at learning_rate_clstm, the rest at learning_rate_actor_critic
    (`adam_groups`, `adam_options`).

    ``fused=True`` (CPU and CUDA): the per-parameter Python loop of the default implementation cost
    ~6% of a paper-preset update on a CPU (clip + Adam 16.6 -> 2.6 ms on a core; benchmarks/README.md).
    """
    return torch.optim.Adam(adam_groups(ppo, model, world_size), **adam_options(ppo))


def adam_groups(ppo: PPOConfig, model: ActorCritic, world_size: int) -> list[dict[str, Any]]:
    """`build_optimizer`'s parameter groups: ``params``, ``lr`` (scaled by the world size under ``scale_lr``), ``name``."""
    scale = world_size if ppo.scale_lr else 1
    return [
        {"params": model.stage1_parameters(), "lr": ppo.learning_rate_clstm * scale, "name": "clstm"},
        {"params": model.stage2_parameters(), "lr": ppo.learning_rate_actor_critic * scale, "name": "actor_critic"},
    ]


def adam_options(ppo: PPOConfig) -> dict[str, Any]:
    """`build_optimizer`'s keyword arguments to ``torch.optim.Adam`` besides the groups."""
    return {"eps": ppo.adam_eps, "fused": True}


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
    """Clip the (already all-reduced) gradients, step unless they are NaN/inf, decay the weight matrices by
    ``weight_decay`` (`decay_weights`), zero the gradients.

    Every rank holds the same gradients after DDP's all-reduce, so every rank takes the same decision
    without a collective. With fp16 the GradScaler skips by itself (dynamic loss scaling); the fused
    Adam kernel is told through ``found_inf`` and skips on the device (no host sync per minibatch, which
    on a GPU would stall the launch queue); other optimizers check on the host.

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
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, skipped


def advantage_statistics(
    advantages: Tensor, returns: Tensor, values: Tensor, comm: Comm
) -> tuple[float, float, float, float]:
    """Global mean and std of advantages, the std of returns and the explained variance of values, over all workers.

    :return: ``(adv_mean, adv_std, return_std, explained_variance)``.
    """
    err = returns - values
    f64 = torch.float64
    sums = comm.all_reduce_named(
        {
            "n": torch.tensor(float(advantages.numel()), device=advantages.device, dtype=f64),
            "a1": advantages.double().sum(),
            "a2": advantages.double().square().sum(),
            "r1": returns.double().sum(),
            "r2": returns.double().square().sum(),
            "e1": err.double().sum(),
            "e2": err.double().square().sum(),
        }
    )
    n, a1, a2, r1, r2, e1, e2 = (float(sums[k]) for k in ("n", "a1", "a2", "r1", "r2", "e1", "e2"))
    adv_mean = a1 / n
    adv_std = math.sqrt(max(a2 / n - adv_mean**2, 0.0) * n / max(n - 1, 1))
    var_ret = r2 / n - (r1 / n) ** 2
    var_err = e2 / n - (e1 / n) ** 2
    explained = float("nan") if var_ret <= 1e-12 else 1.0 - var_err / var_ret
    return adv_mean, adv_std, math.sqrt(max(var_ret, 0.0)), explained


class LossCoefficients(Protocol):
    """What `ppo_loss` reads of its settings: `PPOConfig`, or per-cell tensors for K cells trained as one
    (`clstm_ppo.training.cell_ppo`), each broadcasting against the terms (``clip_coef``) or their means (the rest;
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
    (``[S, K, M] -> [K]``: K cells' losses side by side, `clstm_ppo.training.cell_ppo`)."""
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
        on_device = dict(
            starts=self.starts[:, cols],
            actions=self.actions[:, cols],
            log_probs=self.log_probs[:, cols],
            values=self.values[:, cols],
            advantages=self.advantages[:, cols],
            returns=self.returns[:, cols],
        )
        return UpdateBatch(
            windows=self.windows.select(cols),
            host_starts=self.host_starts[:, host_cols],
            initial_state=self.initial_state.envs(cols),
            **on_device,
        )


def minibatch_loss(
    model: nn.Module,
    batch: UpdateBatch,
    ppo: PPOConfig,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one (micro-)batch of env columns through ``model`` (the DDP wrapper when distributed), and its
    parts by name: PPO's clipped surrogate, value and entropy terms."""
    with autocast():
        out = model(batch.windows, batch.initial_state, batch.starts, batch.actions, host_starts=batch.host_starts)
    return ppo_loss(
        out.log_prob, out.entropy, out.value, batch.log_probs, batch.values, batch.advantages, batch.returns, ppo
    )


def minibatch_gradients(
    model: nn.Module,
    batch: UpdateBatch,
    columns: Tensor,
    host_columns: Tensor,
    ppo: PPOConfig,
    autocast: Callable[[], contextlib.AbstractContextManager],
    scaler: torch.amp.GradScaler | None,
    phase: Callable[[str], contextlib.AbstractContextManager],
) -> dict[str, Tensor]:
    """Forward and backward of one minibatch, the env columns ``columns`` ``[k]`` (``host_columns`` on the CPU), in
    ``gradient_accumulation_steps`` micro-batches: gradients accumulate, and DDP all-reduces them after the last
    micro-batch only (``no_sync`` before it). Returns the loss parts averaged over the micro-batches."""
    micro = ppo.gradient_accumulation_steps
    size = len(columns) // micro
    ddp = hasattr(model, "no_sync")
    parts: dict[str, Tensor] = {}
    for m in range(micro):
        cut = slice(m * size, (m + 1) * size)
        with contextlib.nullcontext() if (m == micro - 1 or not ddp) else model.no_sync():
            with phase("forward"):
                loss, micro_parts = minibatch_loss(model, batch.columns(columns[cut], host_columns[cut]), ppo, autocast)
            with phase("backward"):
                (scaler.scale(loss / micro) if scaler is not None else loss / micro).backward()
        parts = {k: parts.get(k, 0.0) + v / micro for k, v in micro_parts.items()}
    return parts


def update_batch(
    model: nn.Module, buf: RolloutBuffer, advantages: Tensor, returns: Tensor, ppo: PPOConfig, comm: Comm
) -> tuple[UpdateBatch, tuple[float, float, float, float]]:
    """The rollout as the update reads it (advantages normalised with all workers' statistics), and those
    statistics (`advantage_statistics`)."""
    statistics = advantage_statistics(advantages, returns, buf.values, comm)
    adv_mean, adv_std = statistics[:2]
    if ppo.norm_adv:
        advantages = (advantages - adv_mean) / (adv_std + 1e-8)
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


def shuffled_minibatches(
    num_envs: int, per_minibatch: int, generator: torch.Generator, device: torch.device
) -> Iterator[tuple[Tensor, Tensor]]:
    """One epoch's minibatches: env columns in a fresh order from ``generator`` (CPU), ``per_minibatch`` at a time,
    as ``(columns on device [k], the same on the CPU [k])``."""
    host_order = torch.randperm(num_envs, generator=generator)
    order = host_order.to(device)
    for start in range(0, num_envs, per_minibatch):
        yield order[start : start + per_minibatch], host_order[start : start + per_minibatch]


def ppo_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    buf: RolloutBuffer,
    advantages: Tensor,
    returns: Tensor,
    ppo: PPOConfig,
    comm: Comm,
    *,
    generator: torch.Generator,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    timer: PhaseTimer | None = None,
) -> UpdateStats:
    """Run ``ppo.epochs`` epochs of PPO over this worker's rollout ``buf``.

    Every minibatch is ``gradient_accumulation_steps`` micro-batches (gradients all-reduced after the last one
    only: ``no_sync`` before it), then one optimizer step. With ``target_kl`` the epochs stop early once the
    all-workers mean approx KL of an epoch exceeds it (one all-reduce per epoch, so every rank stops together).

    :param model: the ActorCritic, possibly wrapped by torch.compile and/or DDP.
    :param advantages: ``[S, B]``; :param returns: ``[S, B]`` (from `compute_gae`).
    :param generator: CPU generator that shuffles env columns (per worker).
    :param timer: optional `PhaseTimer` summing forward (with the loss), backward (with DDP's
        overlapped gradient all-reduce) and optimizer (clip, step, zero_grad) seconds.
    """
    phase = timer if timer is not None else no_timer
    device = buf.actions.device
    batch, (_, adv_std, return_std, explained) = update_batch(model, buf, advantages, returns, ppo, comm)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in SUMMED_STATS}
    skipped = torch.zeros((), device=device)  # steps skipped for NaN/inf, counted on the device (no sync)
    steps = epochs_run = 0
    for _epoch in range(ppo.epochs):
        epoch_kl = torch.zeros((), dtype=torch.float64, device=device)
        for columns, host_columns in shuffled_minibatches(buf.num_envs, ppo.envs_per_minibatch, generator, device):
            parts = minibatch_gradients(model, batch, columns, host_columns, ppo, autocast, scaler, phase)
            with phase("optimizer"):
                grad_norm, skipped_now = optimizer_step(optimizer, params, ppo.max_grad_norm, scaler, ppo.weight_decay)
            skipped += skipped_now
            parts["grad_norm"] = grad_norm.detach().float()
            for name in SUMMED_STATS:
                sums[name] += parts[name].double()
            epoch_kl += parts["approx_kl"].double()
            steps += 1
        epochs_run += 1
        if ppo.target_kl > 0:
            mean_kl = comm.all_reduce_sum(epoch_kl / ppo.num_minibatches).item() / comm.world_size
            if mean_kl > ppo.target_kl:
                break
    means = comm.all_reduce_named({k: v / max(steps, 1) for k, v in sums.items()})
    return UpdateStats(
        **{k: float(v) / comm.world_size for k, v in means.items()},
        explained_variance=explained,
        advantage_std=adv_std,
        return_std=return_std,
        epochs_run=epochs_run,
        skipped_steps=int(skipped.item()),
    )
