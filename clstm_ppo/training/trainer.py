"""One worker's training loop: rollout -> GAE -> PPO update (through DDP), then the callbacks.

Read top to bottom, `Trainer.update` is one iteration of the algorithm and nothing else: anneal the learning rates,
collect ``n_steps`` days from ``num_envs`` envs, bootstrap and compute advantages, run the PPO epochs.
`Trainer.train` repeats it until the episode budget is spent: after each update it gathers every worker's finished
episodes to every rank (`Trainer.gather`, which advances the counters), agrees on a stop, and calls the callbacks
(`clstm_ppo.training.callbacks`: the normalisers' sync, rank 0's log, validation and checkpoints). Every worker
issues the same collectives in the same order: the stop decision comes from the all-gathered episode count and the
all-reduced stop flag, so ranks that finished different numbers of episodes stop together. The stages live
elsewhere: `clstm_ppo.training.rollout` (acting, storage, GAE), `clstm_ppo.training.ppo` (the update and the
optimizer), `clstm_ppo.training.checkpoint` and `run_folder` (the files), `clstm_ppo.training.signals` (stops).
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_policy
from clstm_ppo.agent.moments import moment_sums
from clstm_ppo.config import PPOConfig, TrainConfig
from clstm_ppo.training.callbacks import Callback, Logger, find, with_defaults
from clstm_ppo.training.checkpoint import checkpoint_payload, load_checkpoint
from clstm_ppo.training.distributed import Comm, WorldLayout
from clstm_ppo.training.ppo import PhaseTimer, UpdateStats, autocast_factory, build_optimizer, no_timer, ppo_update
from clstm_ppo.training.resume import load_weights
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, compute_gae
from clstm_ppo.training.run_folder import LATEST, resolve_resume
from clstm_ppo.training.signals import StoppedBySignal, StopRequest
from envs.errors import UserError
from envs.execution import describe_execution
from envs.features import PreparedMarket
from envs.vector_env import VectorStockTradingEnv


@dataclass
class Counters:
    """Where training stands, the same on every rank (kept in every checkpoint)."""

    update: int = 0  # updates done
    global_step: int = 0  # env steps over all workers
    episodes: int = 0  # finished episodes over all workers
    best_score: float = -math.inf  # best validation Sharpe so far (best.pt)
    bad_updates: int = 0  # consecutive updates with NaN/inf loss or gradients
    skipped_steps: int = 0  # optimizer steps skipped for NaN/inf gradients
    elapsed: float = 0.0  # seconds of training, resumes included

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Counters:
        """From a checkpoint's counters (keys of other versions ignored)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


class Update(NamedTuple):
    """What one `Trainer.update` did on this rank."""

    rows: Tensor  # [k, len(EPISODE_KEYS)] float64: this worker's finished episodes
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    rollout_seconds: float  # this rank's rollout and GAE
    update_seconds: float  # this rank's PPO epochs


@dataclass
class UpdateResult:
    """What one update did over all workers (`Trainer.gather`), the same on every rank."""

    episodes: Tensor  # [k, len(EPISODE_KEYS) + 1] float64: every worker's finished episodes, then each one's rank
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    behaviour: dict[str, Any]  # what the policy did (`RolloutStats.as_dict`, all workers)
    rollout_seconds: float  # this rank's rollout and GAE
    update_seconds: float  # this rank's PPO epochs

    @property
    def bad(self) -> bool:
        """Some optimizer step was skipped for NaN/inf gradients, or the loss was not finite."""
        return self.stats.skipped_steps > 0 or not math.isfinite(self.stats.policy_loss)


class Trainer:
    """Training state of one worker (rank). Rank 0 alone prints and writes files (through its callbacks, which see
    it as a `clstm_ppo.training.callbacks.RunState`).

    :param callbacks: hooks on the loop run after the product's (`clstm_ppo.training.callbacks.default_callbacks`),
        which they never replace; tests add theirs (e.g. a fault injector).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        market: PreparedMarket,
        comm: Comm,
        run_dir: Path,
        callbacks: list[Callback] | None = None,
    ) -> None:
        self.cfg, self.market, self.comm, self.run_dir = cfg, market, comm, run_dir
        ppo, system, seed = cfg.ppo, cfg.system, cfg.run.seed
        device = self.device = comm.device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = system.tf32
            torch.backends.cudnn.allow_tf32 = system.tf32
        torch.manual_seed(seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(cfg, market).to(device)
        self.optimizer = build_optimizer(ppo, self.model, comm.world_size)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.scaler = torch.amp.GradScaler("cuda") if system.mixed_precision == "fp16" else None
        self.autocast = autocast_factory(system.mixed_precision, device)
        self.shuffle_gen = torch.Generator().manual_seed(seed * 6151 + 7877 * comm.rank + 2)
        env_seed = seed + comm.rank * ppo.num_envs
        env = VectorStockTradingEnv(
            market,
            split="train",
            num_envs=ppo.num_envs,
            config=cfg.env,
            device=device if system.env_device == "auto" else torch.device(system.env_device),
            seed=env_seed,
            pool=True,  # a synthetic source's train_draws: episodes on every draw's training days
        )
        self.rollout = RolloutCollector(
            env,
            self.model,
            gamma=ppo.gamma,
            device=device,
            autocast=self.autocast,
            seeds=env_seed,
            generators=[torch.Generator(device=device).manual_seed(seed * 7919 + 104729 * comm.rank + 1)],
            norm_reward=ppo.norm_reward,
        )
        self.buf = RolloutBuffer.allocate(
            ppo.n_steps, ppo.num_envs, (market.window, market.num_features), self.model.spec.action_dim, device
        )
        self.counters = Counters()
        if cfg.run.resume:
            self._resume(resolve_resume(cfg.run.resume, run_dir))
        elif cfg.run.init_weights:
            self.model.load_state_dict(load_weights(cfg.run.init_weights, cfg, market))
        trained = torch.compile(self.model) if system.compile else self.model
        if comm.distributed:
            trained = DDP(trained, device_ids=[device.index] if device.type == "cuda" else None)
        self.trained = trained  # the loss forward goes through this (DDP when distributed)
        self.callbacks = with_defaults(callbacks or ())
        self.stop = StopRequest()
        self.stopping = False  # every rank agreed to stop after the current update (the all-reduced stop flag)

    # ------------------------------------------------------------------ the algorithm
    @property
    def steps_per_update(self) -> int:
        """Env steps of one update over all workers."""
        return self.cfg.ppo.rollout_steps * self.comm.world_size

    def validation_run(self) -> PolicyRun:
        """The deterministic policy at the current weights on the validation split (what best.pt is chosen by)."""
        return evaluate_policy(self.model, self.market, "validation", self.cfg.env, device=self.device)

    def update(self, *, timer: PhaseTimer | None = None, ppo: PPOConfig | None = None) -> Update:
        """One iteration of the algorithm on this rank (every rank calls it, with the same collectives): anneal the
        learning rates, collect ``n_steps`` days of ``num_envs`` envs (the callbacks' ``on_rollout_end`` sees the
        rollout), bootstrap and compute advantages, run the PPO epochs, merge the normalisers' statistics over the
        ranks (`sync_normalisers`).

        :param timer: a `PhaseTimer` summing "rollout" (collect and GAE), "update" (the PPO epochs) and the update's
            own phases (benchmarks).
        :param ppo: other PPO settings for this update only (a benchmark's short warm-up); default the run's.
        """
        ppo = ppo or self.cfg.ppo
        phase = timer if timer is not None else no_timer
        if ppo.anneal_lr:
            est_updates = max(1, math.ceil(ppo.num_episodes * self.episode_days() / self.steps_per_update))
            frac = max(0.0, 1.0 - self.counters.update / est_updates)
            for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                group["lr"] = base * frac
        t0 = time.perf_counter()
        with phase("rollout"):
            (rows,) = self.rollout.collect(self.buf)
            for callback in self.callbacks:
                callback.on_rollout_end(self)
            advantages, returns = compute_gae(
                self.buf.rewards,
                self.buf.values,
                self.buf.dones,
                self.rollout.bootstrap_value(),
                ppo.gamma,
                ppo.gae_lambda,
            )
        t1 = time.perf_counter()
        with phase("update"):
            (stats,) = ppo_update(
                self.trained,
                self.optimizer,
                self.buf,
                advantages,
                returns,
                ppo,
                self.comm,
                generators=[self.shuffle_gen],
                autocast=self.autocast,
                scaler=self.scaler,
                timer=timer,
            )
            self.sync_normalisers()
        return Update(rows, stats, t1 - t0, time.perf_counter() - t1)

    def sync_normalisers(self) -> None:
        """Merge the normalisers' statistics over all ranks after the update: the observation normaliser's running
        moments (``--norm_obs``, this rollout's states added up over the workers) and the reward normaliser's
        (``--norm_reward``), so every rank acts on the same statistics in the next rollout."""
        if self.cfg.model.norm_obs:
            sums = moment_sums(self.buf.obs.newest.flatten(0, 1))
            self.model.update_obs_stats(self.comm.all_reduce_sum(sums))
        self.rollout.reward_norms[0].sync(self.comm)

    def gather(self, update: Update) -> UpdateResult:
        """Every worker's finished episodes and rollout statistics gathered to every rank, the counters advanced:
        the same `UpdateResult` and counters on every rank."""
        comm, c = self.comm, self.counters
        behaviour = self.rollout.stats[0].all_reduced(comm).as_dict()
        ranks = torch.full((update.rows.shape[0], 1), float(comm.rank), dtype=torch.float64)
        episodes = comm.all_gather_rows(torch.cat([update.rows, ranks], dim=1))  # every rank sees every episode
        result = UpdateResult(episodes, update.stats, behaviour, update.rollout_seconds, update.update_seconds)
        advance(c, result, self.steps_per_update)
        return result

    # ------------------------------------------------------------------ loop
    def train(self) -> Counters:
        """Run updates until ``num_episodes`` episodes have finished over all workers, calling the callbacks after
        each; return the counters.

        :raises StoppedBySignal: after SIGINT/SIGTERM, once every rank finished the update and rank 0 saved.
        """
        cfg, comm, c = self.cfg, self.comm, self.counters
        for callback in self.callbacks:
            callback.on_training_start(self)
        self.stop.install()
        start = time.perf_counter() - c.elapsed
        try:
            while c.episodes < cfg.ppo.num_episodes:
                result = self.gather(self.update())
                self.stopping = comm.all_reduce_sum(torch.tensor([float(self.stop.signum is not None)])).item() > 0
                c.elapsed = time.perf_counter() - start
                for callback in self.callbacks:
                    callback.on_update_end(self, result)
                if c.bad_updates >= cfg.run.max_bad_updates:
                    raise diverged(c, self.run_dir)
                if self.stopping:
                    self.line("[Rank 0] stop requested: checkpoint saved, exiting")
                    raise StoppedBySignal(self.stop.signum or signal.SIGTERM)
            self.verify_replicas()
        finally:
            for callback in self.callbacks:
                callback.on_training_end(self)
        return c

    def line(self, text: str) -> None:
        """A console line from rank 0, through the run's `Logger` (above the progress bar)."""
        logger = find(self.callbacks, Logger)
        if logger is not None:
            logger.line(text)

    def verify_replicas(self) -> None:
        """Check that every rank holds the same weights (what DDP promises); raise if not."""
        if not self.comm.distributed:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in self.model.parameters()])
            probe = torch.stack(
                [flat.sum(), flat.square().sum(), (flat * torch.arange(flat.numel(), device=flat.device)).sum()]
            )
        probes = self.comm.all_gather_rows(probe.cpu().unsqueeze(0))  # [world, 3]
        if not bool((probes == probes[0]).all()):
            raise RuntimeError("replicas diverged: ranks hold different weights after training")
        self.line(f"[Rank 0] replicas in sync: {self.comm.world_size} ranks hold identical weights")

    def episode_days(self) -> float:
        """Trading days of one training episode (the training split's length when episodes are 'full')."""
        train_days = self.market.splits.train.num_days
        return float(min(self.cfg.env.episode_days or train_days, train_days))

    tag = "[Rank 0]"  # its console lines' prefix (rank 0 alone prints)

    @property
    def layout_line(self) -> str:
        devices = str(self.device) if self.comm.world_size == 1 else f"{self.device.type} x {self.comm.world_size}"
        return (
            f"world size {self.comm.world_size} | backend {self.comm.backend} | devices {devices} | "
            f"{self.cfg.ppo.num_envs} envs per worker | policy {self.model.spec.policy} | "
            f"{self.market.num_tickers} tickers, F={self.market.num_features}, T={self.market.window} | "
            f"{describe_execution(self.cfg.env.execution, self.market.data)}"
        )

    def figures(self) -> dict[str, float]:
        """`RunState.figures`: the mean action std, the reward scale (``--norm_reward``), the learning rates."""
        groups = self.optimizer.param_groups
        return {
            "policy_std": self.model.log_std.detach().exp().mean().item(),
            **({"reward_scale": self.rollout.reward_norms[0].scale} if self.cfg.ppo.norm_reward else {}),
            "lr_clstm": groups[0]["lr"],
            "lr_actor_critic": groups[1]["lr"],
        }

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_payload(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        """What a checkpoint of the run holds now, with every rank's ``worker_states``."""
        return checkpoint_payload(
            cfg=self.cfg,
            model=self.model,
            market=self.market,
            optimizer_state=self.optimizer.state_dict(),
            scaler_state=self.scaler.state_dict() if self.scaler is not None else None,
            counters=self.counters.as_dict(),
            worker_states=worker_states,
            world_size=self.comm.world_size,
        )

    def worker_state(self) -> dict[str, Any]:
        """Everything that makes this rank's next update bitwise reproducible (what a checkpoint keeps per rank)."""
        return worker_state(self.shuffle_gen, self.rollout.state_dict())

    def _resume(self, path: Path) -> None:
        """Continue from ``path``; `resume.check_resume` already checked, before any worker started,
        that its tickers and model match this run."""
        ckpt = load_checkpoint(path, map_location="cpu")
        self.model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        if self.scaler is not None and ckpt.scaler_state:
            self.scaler.load_state_dict(ckpt.scaler_state)
        self.counters = Counters.from_dict(ckpt.counters)
        states = ckpt.worker_states or []
        if len(states) == self.comm.world_size:
            state = states[self.comm.rank]
            torch.set_rng_state(state["torch_rng"])
            self.shuffle_gen.set_state(state["shuffle_gen"])
            self.rollout.load_state_dict(state)
            return
        if states:  # the statistics are every rank's: keep them
            self.rollout.reward_norms[0].load_state_dict(states[0]["reward_norm"], envs=False)
        if self.comm.master:
            print(
                f"[Rank 0] resuming {path} with world size {self.comm.world_size} (saved with {len(states)}): "
                f"weights, optimizer and counters restored; environments start fresh",
                flush=True,
            )


def advance(counters: Counters, result: UpdateResult, steps: int) -> None:
    """Move ``counters`` past one gathered update of ``steps`` env steps (all workers)."""
    counters.update += 1
    counters.global_step += steps
    counters.episodes += result.episodes.shape[0]
    counters.skipped_steps += result.stats.skipped_steps
    counters.bad_updates = counters.bad_updates + 1 if result.bad else 0


def diverged(counters: Counters, run_dir: Path) -> UserError:
    """The error that ends a run after ``max_bad_updates`` bad updates in a row (naming the checkpoint kept)."""
    latest = run_dir / LATEST
    kept = f"the last good checkpoint is kept: {latest}" if latest.is_file() else "no checkpoint had been written yet"
    return UserError(
        f"stopped: {counters.bad_updates} updates in a row had NaN/inf loss or gradients (their optimizer steps "
        f"were skipped); {kept}; try a lower learning rate or --max_grad_norm"
    )


def worker_state(
    shuffle_gen: torch.Generator, rollout: dict[str, Any], torch_rng: Tensor | None = None
) -> dict[str, Any]:
    """What a checkpoint keeps per rank to make its next update bitwise reproducible: the global RNG, the minibatch
    shuffle's generator and the rollout's state (`RolloutCollector.state_dict`)."""
    return {
        "torch_rng": torch.get_rng_state() if torch_rng is None else torch_rng,
        "shuffle_gen": shuffle_gen.get_state(),
        **rollout,
    }


def train_worker(comm: Comm, payload: tuple[TrainConfig, PreparedMarket, Path, WorldLayout, list[Callback]]) -> None:
    """One rank's whole job (what `clstm_ppo.training.launch.launch` runs on every worker); the payload's callbacks
    run after the product's."""
    cfg, market, run_dir, layout, extra = payload
    if comm.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if layout.torchrun else layout.world_size
        torch.set_num_threads(cfg.system.threads or max(1, (os.cpu_count() or 1) // max(1, local_world)))
    run_dir = comm.broadcast_object(run_dir)  # under torchrun every process named its own; rank 0's wins
    trainer = Trainer(cfg, market, comm, run_dir, extra)
    start = time.perf_counter()
    try:
        counters = trainer.train()
    except StoppedBySignal:
        if comm.master:
            c = trainer.counters
            print(
                f"[Rank 0] stopped after {c.episodes} episodes (update {c.update}); "
                f"continue with: --run_name {run_dir.name} --resume latest",
                flush=True,
            )
        raise
    if comm.master:
        done = done_line(counters, cfg, comm.world_size, time.perf_counter() - start)
        print(f"[Rank 0] {done} | checkpoints: {run_dir}", flush=True)


def done_line(counters: Counters, cfg: TrainConfig, world_size: int, seconds: float) -> str:
    """``done: 64 episodes, ...``, saying why there are more episodes than asked: training stops after the update
    in which the budget is reached, and each update runs every env for ``n_steps`` days."""
    asked = cfg.ppo.num_episodes
    rounded = (
        f" ({asked:,} asked; training stops at the end of the update that reaches them, and each update runs "
        f"{cfg.ppo.num_envs * world_size:,} envs x {cfg.ppo.n_steps} days)"
        if counters.episodes > asked
        else ""
    )
    return f"done: {counters.episodes:,} episodes{rounded}, {counters.global_step:,} env steps in {seconds:,.1f} s"
