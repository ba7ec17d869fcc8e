"""One seed of a `clstm_ppo.training.trainer.Trainer`: everything its run alone would have, in one object.

A run is one seed; ``--seed 1-8`` and a study's batch of cells are K seeds trained as one batch. A `Seed` owns:

- its settings (``cfg``: its seed, its learning rates and loss weights, its budget, its files: `trainer.PER_CELL`),
  its run folder (``run_dir``) and its callbacks (the product's `Logger` and `Checkpointer`, then the caller's);
- its network (``model``: the family's `ActorCritic`; under K > 1 its weights are views of the stacked ones);
- its optimizer side (``learner``, a `SeedLearner`: optimizer, GradScaler, minibatch-shuffle generator, PPO
  settings, whether it still trains), its initial learning rates (``base_lrs``, what ``--anneal_lr`` scales);
- its acting side (``actor``, a `SeedActor`: action noise, its envs' first reset, reward normaliser, rollout stats);
- the global RNG state captured after its weights were drawn (``torch_rng``: never advanced, but its checkpoints
  keep it and a resume restores it, so that a checkpoint of any release compares alike);
- its counters (`Counters`) and, in a batch, the error that ended it (``error``).

A seed is also the run its callbacks see (`clstm_ppo.training.callbacks.RunState`): what the seeds share (the market,
the ranks, the rollout buffer, the stop) it reads from its trainer.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from clstm_ppo.agent.evaluate import PolicyRun
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.config import PPOConfig, TrainConfig
from clstm_ppo.training.callbacks import Callback, Logger, with_defaults
from clstm_ppo.training.checkpoint import checkpoint_payload, load_checkpoint
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import SeedLearner, build_optimizer
from clstm_ppo.training.progress import Counters
from clstm_ppo.training.reward_norm import RewardNormalizer
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, SeedActor
from envs.features import PreparedMarket


class Shared(Protocol):
    """What a seed reads of the trainer that holds it: what the seeds share (`clstm_ppo.training.trainer.Trainer`)."""

    market: PreparedMarket  # the market every seed trains on
    comm: Comm  # the ranks
    device: torch.device  # where the policy runs
    steps_per_update: int  # env steps of one update of one seed, over all workers
    alone: bool  # one seed (a run) rather than a batch
    stopping: bool  # every rank agreed to stop after the current update
    buf: RolloutBuffer  # this rank's rollout, every seed's columns
    rollout: RolloutCollector  # the envs and what acting keeps (each seed's columns: ``envs_of``)

    def validation_runs(self) -> list[PolicyRun]:
        """Every seed's deterministic policy on the validation split, at the current weights."""
        ...

    def episode_days(self) -> float:
        """Trading days of one training episode."""
        ...

    def layout_line(self, seed: Seed) -> str:
        """One line on where and how ``seed`` trains."""
        ...


class Seed:
    """Seed ``index`` of ``trainer`` (see the module docstring for what it owns; `Shared` what it reads of the
    trainer), built after its network.

    :param model: its network, weights drawn with the global RNG seeded by its seed (``torch_rng`` the state after).
    :param callbacks: hooks run after the product's (`with_defaults`).
    """

    def __init__(
        self,
        trainer: Shared,
        index: int,
        cfg: TrainConfig,
        run_dir: Path,
        model: ActorCritic,
        torch_rng: Tensor,
        callbacks: list[Callback],
    ) -> None:
        comm, ppo, seed = trainer.comm, cfg.ppo, cfg.run.seed
        self.trainer, self.index = trainer, index
        self.cfg, self.run_dir, self.model, self.torch_rng = cfg, run_dir, model, torch_rng
        self.market, self.comm = trainer.market, comm
        self.learner = SeedLearner(
            ppo,
            build_optimizer(ppo, model, comm.world_size),  # over its own parameters (K > 1: views of the stacked ones)
            shuffle=torch.Generator().manual_seed(seed * 6151 + 7877 * comm.rank + 2),
            scaler=torch.amp.GradScaler("cuda") if cfg.system.mixed_precision == "fp16" else None,
        )
        self.base_lrs = self.learner.lrs()
        self.actor = SeedActor(
            noise=torch.Generator(device=trainer.device).manual_seed(seed * 7919 + 104729 * comm.rank + 1),
            env_seed=seed + comm.rank * ppo.num_envs,
            reward_norm=RewardNormalizer(ppo.num_envs, ppo.gamma, trainer.device, enabled=ppo.norm_reward),
        )
        self.counters = Counters()
        self.callbacks = with_defaults(callbacks)
        self.error: BaseException | None = None  # why it failed (a seed of a batch fails alone)
        self.steps_per_update = trainer.steps_per_update
        self.tag = "[Rank 0]" if trainer.alone else f"[seed {seed}]"  # its console lines' prefix

    # ------------------------------------------------------------------ its state
    @property
    def active(self) -> bool:
        """It still trains (not finished, not failed)."""
        return self.learner.active

    @active.setter
    def active(self, value: bool) -> None:
        self.learner.active = value

    def anneal(self, ppo: PPOConfig) -> None:
        """``--anneal_lr``: its learning rates fall linearly from their initial values to 0 over the updates its
        budget is expected to take (``ppo`` the settings of this update: its own, or a benchmark's)."""
        if not ppo.anneal_lr:
            return
        episode_days = self.trainer.episode_days()
        expected = max(1, math.ceil(ppo.num_episodes * episode_days / self.steps_per_update))
        frac = max(0.0, 1.0 - self.counters.update / expected)
        self.learner.set_lrs([base * frac for base in self.base_lrs])

    def resume(self, path: Path) -> None:
        """Continue from ``path`` (a checkpoint of its run, alone or batched); `resume.check_resume` already
        checked, before any worker started, that its tickers and model match this run."""
        ckpt = load_checkpoint(path, map_location="cpu")
        self.model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.learner.optimizer.load_state_dict(ckpt.optimizer_state)
        if self.learner.scaler is not None and ckpt.scaler_state:
            self.learner.scaler.load_state_dict(ckpt.scaler_state)
        self.counters = Counters.from_dict(ckpt.counters)
        comm, rollout = self.comm, self.trainer.rollout
        states = ckpt.worker_states or []
        if len(states) == comm.world_size:
            state = states[comm.rank]
            self.torch_rng = state["torch_rng"]
            self.learner.shuffle.set_state(state["shuffle_gen"])
            rollout.load_state_dict(state, self.index)
            return
        if states:  # the statistics are every rank's: keep them
            self.actor.reward_norm.load_state_dict(states[0]["reward_norm"], envs=False)
        if comm.master:
            print(
                f"{self.tag} resuming {path} with world size {comm.world_size} (saved with {len(states)}): "
                f"weights, optimizer and counters restored; environments start fresh",
                flush=True,
            )

    # ------------------------------------------------------------------ the run its callbacks see (RunState)
    @property
    def layout_line(self) -> str:
        return self.trainer.layout_line(self)

    @property
    def stopping(self) -> bool:
        return self.trainer.stopping

    @property
    def buf(self) -> RolloutBuffer:
        """Its columns of the rollout (views: a callback that writes them writes the batch's)."""
        return self.trainer.buf.columns(self.trainer.rollout.envs_of(self.index))

    def figures(self) -> dict[str, float]:
        lrs = self.learner.lrs()
        reward_scale = {"reward_scale": self.actor.reward_norm.scale} if self.cfg.ppo.norm_reward else {}
        return {
            "policy_std": self.model.log_std.detach().exp().mean().item(),
            **reward_scale,
            "lr_clstm": lrs[0],
            "lr_actor_critic": lrs[1],
        }

    def validation_run(self) -> PolicyRun:
        return self.trainer.validation_runs()[self.index]

    def worker_state(self) -> dict[str, Any]:
        """The global RNG, the minibatch shuffle's generator and the rollout's state (`RolloutCollector.state_dict`)."""
        rollout = self.trainer.rollout.state_dict(self.index)
        return {"torch_rng": self.torch_rng, "shuffle_gen": self.learner.shuffle.get_state(), **rollout}

    def checkpoint_payload(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        scaler = self.learner.scaler
        return checkpoint_payload(
            cfg=self.cfg,
            model=self.model,
            market=self.market,
            optimizer_state=self.learner.optimizer.state_dict(),
            scaler_state=scaler.state_dict() if scaler is not None else None,
            counters=asdict(self.counters),
            worker_states=worker_states,
            world_size=self.comm.world_size,
        )

    def line(self, text: str) -> None:
        logger = next((cb for cb in self.callbacks if isinstance(cb, Logger)), None)
        if logger is not None:
            logger.line(text)
