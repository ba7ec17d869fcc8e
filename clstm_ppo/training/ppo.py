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

import torch
from torch import Tensor, nn

from clstm_ppo.agent.model import ActorCritic, unwrap
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import TrainConfig
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
    aux_loss: float  # mean squared error of the next-day head (0 without --aux_coef)
    epochs_run: int
    skipped_steps: int  # optimizer steps skipped for NaN/inf gradients

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


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


def _no_timer(_name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def autocast_factory(mixed_precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A zero-argument function returning the autocast context for the run (nullcontext for 'none')."""
    if mixed_precision == "none":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    if mixed_precision == "fp16" and device.type != "cuda":
        raise UserError("--mixed_precision fp16 needs a CUDA GPU; use bf16 or none on CPU")
    return lambda: torch.autocast(device.type, dtype=dtype)


def build_optimizer(cfg: TrainConfig, model: ActorCritic, world_size: int) -> torch.optim.Adam:
    """Adam with two parameter groups: stage 1 at learning_rate_clstm, the rest at learning_rate_actor_critic.

    ``fused=True`` (CPU and CUDA): the per-parameter Python loop of the default implementation cost
    ~6% of a paper-preset update on a CPU (clip + Adam 16.6 -> 2.6 ms on a core; benchmarks/README.md).
    """
    scale = world_size if cfg.scale_lr else 1
    return torch.optim.Adam(
        [
            {"params": model.stage1_parameters(), "lr": cfg.learning_rate_clstm * scale, "name": "clstm"},
            {"params": model.stage2_parameters(), "lr": cfg.learning_rate_actor_critic * scale, "name": "actor_critic"},
        ],
        eps=cfg.adam_eps,
        fused=True,
    )


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
    sums = torch.stack(
        [
            torch.tensor(float(advantages.numel()), device=advantages.device, dtype=torch.float64),
            advantages.double().sum(),
            advantages.double().square().sum(),
            returns.double().sum(),
            returns.double().square().sum(),
            err.double().sum(),
            err.double().square().sum(),
        ]
    )
    n, a1, a2, r1, r2, e1, e2 = comm.all_reduce_sum(sums).tolist()
    adv_mean = a1 / n
    adv_std = math.sqrt(max(a2 / n - adv_mean**2, 0.0) * n / max(n - 1, 1))
    var_ret = r2 / n - (r1 / n) ** 2
    var_err = e2 / n - (e1 / n) ** 2
    explained = float("nan") if var_ret <= 1e-12 else 1.0 - var_err / var_ret
    return adv_mean, adv_std, math.sqrt(max(var_ret, 0.0)), explained


def next_day_targets(windows: Windows, starts: Tensor, num_tickers: int) -> tuple[Tensor, Tensor]:
    """What the next-day head learns to predict: each step's next state's price column, where one exists.

    :param windows: the rollout's ``S`` steps x ``B`` envs of windows; :param starts: ``[S, B]`` bool.
    :return: ``(targets [S, B, N], valid [S, B] float)``: the price columns ``[1, 1+N)`` of the state at step
        ``s + 1`` (tomorrow's z-scored return, or close with ``--price_features level``); not valid at the last
        step (the next state is not in the buffer) nor where step ``s + 1`` starts a new episode.
    """
    today = windows.last_rows()  # [S, B, F]
    targets = torch.zeros(*today.shape[:2], num_tickers, dtype=torch.float32, device=today.device)
    targets[:-1] = today[1:, :, 1 : 1 + num_tickers].float()
    valid = torch.zeros(today.shape[:2], dtype=torch.float32, device=today.device)
    valid[:-1] = (~starts[1:]).float()
    return targets, valid


def next_day_loss(predicted: Tensor, targets: Tensor, valid: Tensor) -> Tensor:
    """Mean squared error of ``predicted [..., N]`` against ``targets [..., N]`` over the ``valid [...]`` steps."""
    per_step = (predicted - targets).square().mean(-1)
    return (per_step * valid).sum() / valid.sum().clamp_min(1.0)


def ppo_loss(
    new_log_prob: Tensor,
    entropy: Tensor,
    new_value: Tensor,
    old_log_prob: Tensor,
    old_value: Tensor,
    advantages: Tensor,
    returns: Tensor,
    cfg: TrainConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate PPO loss over any matching shapes (here ``[S, E]``); returns loss and parts."""
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    if cfg.clip_value > 0:
        clipped = old_value + (new_value - old_value).clamp(-cfg.clip_value, cfg.clip_value)
        v_loss = 0.5 * torch.max((new_value - returns).square(), (clipped - returns).square()).mean()
    else:
        v_loss = 0.5 * (new_value - returns).square().mean()
    ent = entropy.mean()
    loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # the low-variance k3 estimator
        clip_frac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
    return loss, dict(
        policy_loss=pg_loss.detach(),
        value_loss=v_loss.detach(),
        entropy=ent.detach(),
        approx_kl=approx_kl,
        clip_fraction=clip_frac,
    )


def ppo_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    buf: RolloutBuffer,
    advantages: Tensor,
    returns: Tensor,
    cfg: TrainConfig,
    comm: Comm,
    *,
    generator: torch.Generator,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    timer: PhaseTimer | None = None,
) -> UpdateStats:
    """Run ``cfg.epochs`` epochs of PPO over this worker's rollout ``buf``.

    :param model: the ActorCritic, possibly wrapped by torch.compile and/or DDP.
    :param advantages: ``[S, B]``; :param returns: ``[S, B]`` (from `compute_gae`).
    :param generator: CPU generator that shuffles env columns (per worker).
    :param timer: optional `PhaseTimer` summing forward (with the loss), backward (with DDP's
        overlapped gradient all-reduce) and optimizer (clip, step, zero_grad) seconds.
    """
    phase = timer if timer is not None else _no_timer
    num_envs = buf.actions.shape[1]
    windows = buf.obs.windows()  # [B, R, F] distinct rows + [S, B, T] row numbers, built once per update
    per_mb = cfg.envs_per_minibatch
    per_micro = per_mb // cfg.gradient_accumulation_steps
    adv_mean, adv_std, return_std, explained = advantage_statistics(advantages, returns, buf.values, comm)
    if cfg.norm_adv:
        advantages = (advantages - adv_mean) / (adv_std + 1e-8)
    ddp = hasattr(model, "no_sync")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    host_starts = buf.starts.cpu()  # one sync per update; minibatches find their LSTM cuts on the host
    aux = cfg.aux_coef > 0
    if aux:
        if not unwrap(model).cfg.next_day_head:
            raise ValueError(
                "aux_coef > 0 needs a model built with next_day_head (build_model does so from the config)"
            )
        next_targets, next_valid = next_day_targets(windows, buf.starts, buf.actions.shape[-1])
    totals = torch.zeros(7, dtype=torch.float64, device=buf.actions.device)  # pg, v, ent, kl, clip, grad_norm, aux
    steps = epochs_run = 0
    skipped_t = torch.zeros((), device=buf.actions.device)  # steps skipped for NaN/inf, counted on the device
    for _epoch in range(cfg.epochs):
        epoch_kl = torch.zeros((), dtype=torch.float64, device=buf.actions.device)
        host_order = torch.randperm(num_envs, generator=generator)
        order = host_order.to(buf.actions.device)
        for mb_start in range(0, num_envs, per_mb):
            columns = order[mb_start : mb_start + per_mb]
            host_columns = host_order[mb_start : mb_start + per_mb]
            parts_sum = None
            for micro_start in range(0, per_mb, per_micro):
                cols = columns[micro_start : micro_start + per_micro]
                host_cols = host_columns[micro_start : micro_start + per_micro]
                last_micro = micro_start + per_micro >= per_mb
                sync = contextlib.nullcontext() if (last_micro or not ddp) else model.no_sync()
                with sync:
                    with phase("forward"):
                        with autocast():
                            state = tuple(s[:, cols] for s in buf.initial_state)
                            out = model(
                                windows.select(cols),
                                state,
                                buf.starts[:, cols],
                                buf.actions[:, cols],
                                host_starts=host_starts[:, host_cols],
                                predict_next=aux,
                            )
                        new_log_prob, entropy, new_value = out[:3]
                        loss, parts = ppo_loss(
                            new_log_prob,
                            entropy,
                            new_value,
                            buf.log_probs[:, cols],
                            buf.values[:, cols],
                            advantages[:, cols],
                            returns[:, cols],
                            cfg,
                        )
                        if aux:
                            aux_loss = next_day_loss(out[5], next_targets[:, cols], next_valid[:, cols])
                            loss = loss + cfg.aux_coef * aux_loss
                            parts["aux_loss"] = aux_loss.detach()
                        else:
                            parts["aux_loss"] = torch.zeros((), device=loss.device)
                        loss = loss / cfg.gradient_accumulation_steps
                    with phase("backward"):
                        (scaler.scale(loss) if scaler is not None else loss).backward()
                parts_sum = parts if parts_sum is None else {k: parts_sum[k] + v for k, v in parts.items()}
            with phase("optimizer"):
                grad_norm, skipped_now = optimizer_step(optimizer, params, cfg.max_grad_norm, scaler, cfg.weight_decay)
                skipped_t += skipped_now
            k = cfg.gradient_accumulation_steps
            totals += torch.stack(
                [
                    parts_sum["policy_loss"] / k,
                    parts_sum["value_loss"] / k,
                    parts_sum["entropy"] / k,
                    parts_sum["approx_kl"] / k,
                    parts_sum["clip_fraction"] / k,
                    grad_norm.detach().float(),
                    parts_sum["aux_loss"] / k,
                ]
            ).double()
            epoch_kl += parts_sum["approx_kl"].double() / k
            steps += 1
        epochs_run += 1
        if cfg.target_kl > 0:
            mean_kl = comm.all_reduce_sum(epoch_kl / cfg.num_minibatches).item() / comm.world_size
            if mean_kl > cfg.target_kl:
                break
    totals = comm.all_reduce_sum(totals / max(steps, 1)) / comm.world_size
    pg, vl, ent, kl, cf, gn, aux_mean = totals.tolist()
    return UpdateStats(
        policy_loss=pg,
        value_loss=vl,
        entropy=ent,
        approx_kl=kl,
        clip_fraction=cf,
        explained_variance=explained,
        advantage_std=adv_std,
        return_std=return_std,
        grad_norm=gn,
        aux_loss=aux_mean,
        epochs_run=epochs_run,
        skipped_steps=int(skipped_t.item()),
    )
