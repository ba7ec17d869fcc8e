"""The training loop of K >= 1 runs ("seeds") on one worker (rank): rollout -> GAE -> PPO update, then the callbacks.

A run is K = 1. ``--seed 1-8`` and a study's batch of cells are K runs trained as one batch (PureJaxRL's idea: seeds
as a batch dimension), on one rank or on several, each rank holding the same K seeds and its own envs of each.
`Trainer.update` is one iteration of the algorithm and nothing else; `Trainer.train` repeats it until every seed has
spent its episode budget, gathering every worker's finished episodes to every rank after each update and calling
each seed's callbacks, which see the seed through a `RunView` as a run. Every worker issues the same collectives in
the same order: the stop decision comes from the all-gathered episode counts and the all-reduced stop flag.

What is chosen by K, and nothing else: K = 1 trains the family's own `ActorCritic` (through torch.compile and DDP where
asked); K > 1 the seeds' networks stacked (`CellPolicy`, its loss forward compiled where asked), their gradients
averaged over the ranks per seed in `ppo_update`. Each seed keeps everything its run alone has (docs/study.md "Each
cell keeps its own"). A seed of a batch fails alone: ``max_bad_updates`` bad updates in a row, or (in one process) an
error in one of its callbacks, ends that seed (`Trainer.errors`) and the others go on; a run of one seed raises.
"""

from __future__ import annotations

import copy
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_cells, evaluate_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.moments import moment_sums
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.config import OUTPUT_SETTINGS, PPOConfig, TrainConfig, format_seeds
from clstm_ppo.training.callbacks import Callback, Logger, with_defaults
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

PER_CELL = (
    "seed",
    "learning_rate_clstm",
    "learning_rate_actor_critic",
    "ent_coef",
    "vf_coef",
    "clip_coef",
    "max_grad_norm",
    "target_kl",
    "init_log_std",
    "num_episodes",
    "anneal_lr",
    "resume",
    "init_weights",
    "save_every",
    "checkpoint_every",
    "eval_every",
    "deploy",
    "log_every",
    "max_bad_updates",
    *OUTPUT_SETTINGS,
)
"""Settings in which the seeds of one batch may differ: each has its own (the seed, the numbers the loss and the
optimizer take per seed, its budget, its files). Every other setting (the data, the network's shape, the env, the
rollout and minibatch sizes, ...) must be the same for all."""


def batch_key(cfg: TrainConfig) -> tuple[tuple[str, Any], ...]:
    """What runs must share to train as one batch: every setting but `PER_CELL`'s, by flag."""
    return tuple((flag, value) for flag, value in cfg.to_dict().items() if flag not in PER_CELL)


def check_batchable(cfgs: list[TrainConfig]) -> None:
    """ValueError naming the first setting two of ``cfgs`` differ in that a batch cannot (`batch_key`)."""
    first = dict(batch_key(cfgs[0]))
    for cfg in cfgs[1:]:
        for flag, value in batch_key(cfg):
            if value != first[flag]:
                raise ValueError(
                    f"cells differ in --{flag} ({first[flag]!r}, {value!r}): they cannot train as one batch"
                )


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

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Counters:
        """From a checkpoint's counters (keys of other versions ignored)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


class Update(NamedTuple):
    """What one `Trainer.update` did for one seed on this rank."""

    rows: Tensor  # [k, len(EPISODE_KEYS)] float64: this worker's finished episodes
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    rollout_seconds: float  # this rank's rollout and GAE (the batch's)
    update_seconds: float  # this rank's PPO epochs (the batch's)


@dataclass
class UpdateResult:
    """What one update did for one seed over all workers (`Trainer.gather`), the same on every rank."""

    episodes: Tensor  # [k, len(EPISODE_KEYS) + 1] float64: every worker's finished episodes, then each one's rank
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    behaviour: dict[str, Any]  # what the policy did (`RolloutStats.as_dict`, all workers)
    rollout_seconds: float  # this rank's rollout and GAE
    update_seconds: float  # this rank's PPO epochs

    @property
    def bad(self) -> bool:
        """Some optimizer step was skipped for NaN/inf gradients, or the loss was not finite."""
        return self.stats.skipped_steps > 0 or not math.isfinite(self.stats.policy_loss)


class RunView:
    """Seed k of a `Trainer` as its callbacks see a run (`clstm_ppo.training.callbacks.RunState`): its settings,
    counters, run folder, its columns of the rollout, its figures, and its checkpoint in its run's format."""

    def __init__(self, trainer: Trainer, cell: int) -> None:
        self.trainer, self.cell = trainer, cell
        self.cfg, self.market, self.comm = trainer.cfgs[cell], trainer.market, trainer.comm
        self.run_dir = trainer.run_dirs[cell]
        self.steps_per_update = trainer.steps_per_update
        self.tag, self.layout_line = trainer.tag(cell), trainer.layout_line(cell)

    @property
    def model(self) -> ActorCritic:
        """The seed's own network (under K > 1 its weights are views of the stacked ones)."""
        return self.trainer.models[self.cell]

    @property
    def counters(self) -> Counters:
        return self.trainer.counters[self.cell]

    @property
    def stopping(self) -> bool:
        return self.trainer.stopping

    @property
    def buf(self) -> RolloutBuffer:
        return self.trainer.cell_buffer(self.cell)

    def figures(self) -> dict[str, float]:
        lrs = self.trainer.lrs(self.cell)
        return {
            "policy_std": self.model.log_std.detach().exp().mean().item(),
            **(
                {"reward_scale": self.trainer.rollout.reward_norms[self.cell].scale} if self.cfg.ppo.norm_reward else {}
            ),
            "lr_clstm": lrs[0],
            "lr_actor_critic": lrs[1],
        }

    def validation_run(self) -> PolicyRun:
        return self.trainer.validation_runs()[self.cell]

    def worker_state(self) -> dict[str, Any]:
        """The global RNG, the minibatch shuffle's generator and the rollout's state (`RolloutCollector.state_dict`)."""
        t, k = self.trainer, self.cell
        return {"torch_rng": t.torch_rng[k], "shuffle_gen": t.shuffle_gens[k].get_state(), **t.rollout.state_dict(k)}

    def checkpoint_payload(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        t = self.trainer
        return checkpoint_payload(
            cfg=self.cfg,
            model=self.model,
            market=self.market,
            optimizer_state=t.optimizers[self.cell].state_dict(),
            scaler_state=t.scalers[self.cell].state_dict() if t.scalers[self.cell] is not None else None,
            counters=asdict(self.counters),
            worker_states=worker_states,
            world_size=self.comm.world_size,
        )

    def line(self, text: str) -> None:
        logger = next((cb for cb in self.trainer.callbacks[self.cell] if isinstance(cb, Logger)), None)
        if logger is not None:
            logger.line(text)


class Trainer:
    """K >= 1 seeds trained on one worker (rank). Rank 0 alone prints and writes files, through each seed's callbacks.

    :param cfgs: the run's settings, or each seed's (they may differ in `PER_CELL` only); a seed's ``resume`` and
        ``init_weights`` continue or seed it as they would its run alone.
    :param run_dirs: the run's folder, or each seed's.
    :param callbacks: hooks run after the product's (`with_defaults`): the run's list, or one list per seed.
    """

    def __init__(
        self,
        cfgs: TrainConfig | list[TrainConfig],
        market: PreparedMarket,
        comm: Comm,
        run_dirs: Path | list[Path],
        callbacks: list[Callback] | list[list[Callback]] | None = None,
    ) -> None:
        if isinstance(cfgs, TrainConfig):
            cfgs, run_dirs, callbacks = [cfgs], [run_dirs], [list(callbacks or ())]  # type: ignore[list-item]
        check_batchable(cfgs)
        self.cfgs, self.market, self.comm, self.run_dirs = list(cfgs), market, comm, list(run_dirs)  # type: ignore[arg-type]
        self.cells = len(cfgs)
        ppo, system = cfgs[0].ppo, cfgs[0].system
        device = self.device = comm.device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = system.tf32
            torch.backends.cudnn.allow_tf32 = system.tf32
        seeds = [cfg.run.seed for cfg in cfgs]
        self.models: list[ActorCritic] = []
        self.torch_rng: list[Tensor] = []  # each seed's global RNG state, as its checkpoints keep it
        for cfg in cfgs:
            torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
            self.models.append(build_model(cfg, market).to(device))
            self.torch_rng.append(torch.get_rng_state())  # nothing draws from it after
        self.policy = self.models[0] if self.cells == 1 else CellPolicy(self.models)
        self.optimizers = [  # over each seed's own parameters (K > 1: views of the stacked ones)
            build_optimizer(cfg.ppo, model, comm.world_size) for cfg, model in zip(cfgs, self.models, strict=True)
        ]
        self.base_lrs = [self.lrs(k) for k in range(self.cells)]
        self.scalers = [torch.amp.GradScaler("cuda") if system.mixed_precision == "fp16" else None for _ in cfgs]
        self.autocast = autocast_factory(system.mixed_precision, device)
        rank = comm.rank
        self.shuffle_gens = [torch.Generator().manual_seed(s * 6151 + 7877 * rank + 2) for s in seeds]
        env_seeds = [s + rank * ppo.num_envs for s in seeds]
        env = VectorStockTradingEnv(
            market,
            split="train",
            num_envs=self.cells * ppo.num_envs,
            config=cfgs[0].env,
            device=device if system.env_device == "auto" else torch.device(system.env_device),
            seed=env_seeds,
            pool=True,  # a synthetic source's train_draws: episodes on every draw's training days
        )
        self.rollout = RolloutCollector(
            env,
            self.policy,
            gamma=ppo.gamma,
            device=device,
            autocast=self.autocast,
            seeds=env_seeds,
            generators=[torch.Generator(device=device).manual_seed(s * 7919 + 104729 * rank + 1) for s in seeds],
            norm_reward=ppo.norm_reward,
        )
        self.buf = RolloutBuffer.allocate(
            ppo.n_steps, env.num_envs, (market.window, market.num_features), self.policy.spec.action_dim, device
        )
        self.counters = [Counters() for _ in cfgs]
        for k, cfg in enumerate(cfgs):
            if cfg.run.resume:
                self._resume(k, resolve_resume(cfg.run.resume, self.run_dirs[k]))
            elif cfg.run.init_weights:
                self.models[k].load_state_dict(load_weights(cfg.run.init_weights, cfg, market))
        trained = self.policy
        if system.compile and self.cells == 1:
            trained = torch.compile(trained)
        elif system.compile:
            self.policy.compile()  # its loss forward
        if comm.distributed and self.cells == 1:  # K > 1: ppo_update averages each seed's gradients itself
            trained = DDP(trained, device_ids=[device.index] if device.type == "cuda" else None)
        self.trained = trained  # the loss forward goes through this (DDP when distributed)
        self.callbacks = [with_defaults(callbacks[k] if callbacks else ()) for k in range(self.cells)]
        self.views = [RunView(self, k) for k in range(self.cells)]
        self.active = [True] * self.cells  # still training
        self.errors: list[BaseException | None] = [None] * self.cells  # why a seed of a batch failed
        self.stop = StopRequest()
        self.stopping = False  # every rank agreed to stop after the current update (the all-reduced stop flag)
        self.iteration = 0  # updates in this process: when the batch's validation runs are current
        self._validated: tuple[int, list[PolicyRun]] | None = None

    # ------------------------------------------------------------------ the algorithm
    @property
    def steps_per_update(self) -> int:
        """Env steps of one update of one seed over all workers."""
        return self.cfgs[0].ppo.rollout_steps * self.comm.world_size

    def update(self, *, timer: PhaseTimer | None = None, ppo: PPOConfig | None = None) -> list[Update | None]:
        """One iteration of every active seed on this rank (every rank calls it, with the same collectives): anneal
        the learning rates, collect ``n_steps`` days of ``num_envs`` envs per seed (each seed's callbacks'
        ``on_rollout_end`` sees its columns), bootstrap and compute advantages, run the PPO epochs, merge the
        normalisers' statistics over the ranks (`sync_normalisers`).

        :param timer: a `PhaseTimer` summing "rollout" (collect and GAE), "update" (the PPO epochs) and the update's
            own phases (benchmarks).
        :param ppo: other PPO settings for this update only, for every seed (a benchmark's short warm-up).
        :return: each active seed's `Update` (None for the others); the seconds are the batch's.
        """
        phase = timer if timer is not None else no_timer
        self.iteration += 1
        ppos = [ppo or cfg.ppo for cfg in self.cfgs]
        for k in self._active():
            if ppos[k].anneal_lr:
                est_updates = max(1, math.ceil(ppos[k].num_episodes * self.episode_days() / self.steps_per_update))
                frac = max(0.0, 1.0 - self.counters[k].update / est_updates)
                self.set_lrs(k, [base * frac for base in self.base_lrs[k]])
        t0 = time.perf_counter()
        with phase("rollout"):
            rows = self.rollout.collect(self.buf)
            for k in self._active():
                for callback in self.callbacks[k]:
                    self._guarded(k, callback.on_rollout_end, self.views[k])
            advantages, returns = compute_gae(
                self.buf.rewards,
                self.buf.values,
                self.buf.dones,
                self.rollout.bootstrap_value(),
                ppos[0].gamma,
                ppos[0].gae_lambda,
            )
        t1 = time.perf_counter()
        with phase("update"):
            stats = ppo_update(
                self.trained,
                self.optimizers,
                self.buf,
                advantages,
                returns,
                ppos,
                self.comm,
                active=list(self.active),
                generators=self.shuffle_gens,
                autocast=self.autocast,
                scalers=self.scalers,
                timer=timer,
            )
            self.sync_normalisers()
        t2 = time.perf_counter()
        return [Update(rows[k], s, t1 - t0, t2 - t1) if s is not None else None for k, s in enumerate(stats)]

    def sync_normalisers(self) -> None:
        """Merge each active seed's normaliser statistics over all ranks after the update: the observation
        normaliser's running moments (``--norm_obs``, this rollout's states added up over the workers) and the reward
        normaliser's (``--norm_reward``), so every rank acts on the same statistics in the next rollout."""
        for k in self._active():
            if self.cfgs[k].model.norm_obs:
                sums = moment_sums(self.cell_buffer(k).obs.newest.flatten(0, 1))
                self.models[k].update_obs_stats(self.comm.all_reduce_sum(sums))
            self.rollout.reward_norms[k].sync(self.comm)

    def cell_buffer(self, cell: int) -> RolloutBuffer:
        """Seed ``cell``'s columns of the rollout (views: a callback that writes them writes the batch's)."""
        return self.buf if self.cells == 1 else self.buf.columns(self.rollout.envs_of(cell))

    def gather(self, cell: int, update: Update) -> UpdateResult:
        """Seed ``cell``'s finished episodes and rollout statistics of every worker gathered to every rank, its
        counters advanced: the same `UpdateResult` and counters on every rank."""
        comm = self.comm
        behaviour = self.rollout.stats[cell].all_reduced(comm).as_dict()
        ranks = torch.full((update.rows.shape[0], 1), float(comm.rank), dtype=torch.float64)
        episodes = comm.all_gather_rows(torch.cat([update.rows, ranks], dim=1))  # every rank sees every episode
        result = UpdateResult(episodes, update.stats, behaviour, update.rollout_seconds, update.update_seconds)
        c = self.counters[cell]
        c.update += 1
        c.global_step += self.steps_per_update
        c.episodes += episodes.shape[0]
        c.skipped_steps += update.stats.skipped_steps
        c.bad_updates = c.bad_updates + 1 if result.bad else 0
        return result

    # ------------------------------------------------------------------ loop
    def train(self) -> list[Counters]:
        """Run updates until every seed has finished its ``num_episodes`` episodes over all workers (or, in a batch,
        failed), calling each seed's callbacks after each; return the counters.

        :raises StoppedBySignal: after SIGINT/SIGTERM, once every rank finished the update and rank 0 saved.
        """
        starts = [time.perf_counter() - c.elapsed for c in self.counters]
        for k in self._active():
            for callback in self.callbacks[k]:
                self._guarded(k, callback.on_training_start, self.views[k])
        self.stop.install()
        try:
            for k in self._active():
                if self.counters[k].episodes >= self.cfgs[k].ppo.num_episodes:
                    self._finish(k)
            while any(self.active):
                updates = self.update()
                results = {k: self.gather(k, updates[k]) for k in self._active() if updates[k] is not None}
                self.stopping = self.comm.all_reduce_sum(torch.tensor([float(self.stop.signum is not None)])).item() > 0
                for k in results:
                    self.counters[k].elapsed = time.perf_counter() - starts[k]
                for k, result in results.items():  # every seed's normalisers are synced (`update`) before any hook
                    for callback in self.callbacks[k]:
                        self._guarded(k, callback.on_update_end, self.views[k], result)
                for k in results:
                    c, cfg = self.counters[k], self.cfgs[k]
                    if not self.active[k]:
                        continue
                    if c.bad_updates >= cfg.run.max_bad_updates:
                        self._fail(k, diverged(c, self.run_dirs[k]))
                    elif c.episodes >= cfg.ppo.num_episodes:
                        self._finish(k)
                if self.stopping:
                    for k in self._active():
                        self.views[k].line(f"{self.tag(k)} stop requested: checkpoint saved, exiting")
                    raise StoppedBySignal(self.stop.signum or signal.SIGTERM)
        finally:
            for k in self._active():
                self._end(k)
        return self.counters

    def _active(self) -> list[int]:
        return [k for k, on in enumerate(self.active) if on]

    def _guarded(self, cell: int, hook: Any, *args: Any) -> None:
        """Call a seed's callback hook. In a batch in one process an error in it fails that seed only; a run's (and
        a batch's on several ranks, where the others would wait on this one's collectives) propagates."""
        if not self.active[cell]:
            return
        if self.cells == 1 or self.comm.distributed:
            hook(*args)
            return
        try:
            hook(*args)
        except StoppedBySignal:
            raise
        except Exception as err:  # a seed fails alone
            self._fail(cell, err)

    def _fail(self, cell: int, err: BaseException) -> None:
        """Seed ``cell`` failed: a run raises; a seed of a batch ends alone (`errors`)."""
        if self.cells == 1:
            raise err
        self.errors[cell] = err
        self.views[cell].line(f"{self.tag(cell)} failed: {err}")
        self._end(cell)

    def _finish(self, cell: int) -> None:
        """Seed ``cell`` spent its budget: its replicas checked, then its end."""
        self.verify_replicas(cell)
        self._end(cell)

    def _end(self, cell: int) -> None:
        """The seed trains no more: its callbacks' ``on_training_end`` (in a batch, an error there is its own)."""
        self.active[cell] = False
        for callback in self.callbacks[cell]:
            try:
                callback.on_training_end(self.views[cell])
            except Exception as err:  # closing its log failed: the seed's error unless it has one already
                if self.cells == 1:
                    raise
                self.errors[cell] = self.errors[cell] or err

    def verify_replicas(self, cell: int = 0) -> None:
        """Check that every rank holds the same weights of seed ``cell`` (what DDP promises); raise if not."""
        if not self.comm.distributed:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in self.models[cell].parameters()])
            probe = torch.stack(
                [flat.sum(), flat.square().sum(), (flat * torch.arange(flat.numel(), device=flat.device)).sum()]
            )
        probes = self.comm.all_gather_rows(probe.cpu().unsqueeze(0))  # [world, 3]
        if not bool((probes == probes[0]).all()):
            raise RuntimeError("replicas diverged: ranks hold different weights after training")
        self.views[cell].line(f"{self.tag(cell)} replicas in sync: {self.comm.world_size} ranks hold identical weights")

    def validation_runs(self) -> list[PolicyRun]:
        """Every seed's deterministic policy at the current weights on the validation split (what best.pt is chosen
        by); a batch's computed once per iteration for all its seeds (`evaluate_cells`, the stacked network)."""
        if self.cells == 1:
            return [evaluate_policy(self.models[0], self.market, "validation", self.cfgs[0].env, device=self.device)]
        if self._validated is None or self._validated[0] != self.iteration:
            runs = evaluate_cells(self.policy, self.market, "validation", self.cfgs[0].env, device=self.device)
            self._validated = (self.iteration, runs)
        return self._validated[1]

    def episode_days(self) -> float:
        """Trading days of one training episode (the training split's length when episodes are 'full')."""
        train_days = self.market.splits.train.num_days
        return float(min(self.cfgs[0].env.episode_days or train_days, train_days))

    def tag(self, cell: int) -> str:
        """Seed ``cell``'s console prefix: ``[Rank 0]`` for a run (rank 0 alone prints), ``[seed s]`` in a batch."""
        return "[Rank 0]" if self.cells == 1 else f"[seed {self.cfgs[cell].run.seed}]"

    def layout_line(self, cell: int) -> str:
        """One line on where and how seed ``cell`` trains."""
        comm = self.comm
        devices = str(self.device) if comm.world_size == 1 else f"{self.device.type} x {comm.world_size}"
        batch = (
            f" | seed {cell + 1} of {self.cells} as one batch ({type(self.policy).__name__})" if self.cells > 1 else ""
        )
        return (
            f"world size {comm.world_size} | backend {comm.backend} | devices {devices} | "
            f"{self.cfgs[cell].ppo.num_envs} envs per worker{batch} | policy {self.policy.spec.policy} | "
            f"{self.market.num_tickers} tickers, F={self.market.num_features}, T={self.market.window} | "
            f"{describe_execution(self.cfgs[cell].env.execution, self.market.data)}"
        )

    # ------------------------------------------------------------------ the optimizer, per seed
    def lrs(self, cell: int) -> list[float]:
        """Seed ``cell``'s learning rate per parameter group (stage 1, the rest)."""
        return [group["lr"] for group in self.optimizers[cell].param_groups]

    def set_lrs(self, cell: int, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizers[cell].param_groups, lrs, strict=True):
            group["lr"] = lr

    # ------------------------------------------------------------------ checkpoints
    def _resume(self, cell: int, path: Path) -> None:
        """Continue seed ``cell`` from ``path`` (a checkpoint of its run, alone or batched); `resume.check_resume`
        already checked, before any worker started, that its tickers and model match this run."""
        ckpt = load_checkpoint(path, map_location="cpu")
        self.models[cell].load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizers[cell].load_state_dict(ckpt.optimizer_state)
        if self.scalers[cell] is not None and ckpt.scaler_state:
            self.scalers[cell].load_state_dict(ckpt.scaler_state)
        self.counters[cell] = Counters.from_dict(ckpt.counters)
        states = ckpt.worker_states or []
        if len(states) == self.comm.world_size:
            state = states[self.comm.rank]
            self.torch_rng[cell] = state["torch_rng"]
            self.shuffle_gens[cell].set_state(state["shuffle_gen"])
            self.rollout.load_state_dict(state, cell)
            return
        if states:  # the statistics are every rank's: keep them
            self.rollout.reward_norms[cell].load_state_dict(states[0]["reward_norm"], envs=False)
        if self.comm.master:
            print(
                f"{self.tag(cell)} resuming {path} with world size {self.comm.world_size} (saved with {len(states)}): "
                f"weights, optimizer and counters restored; environments start fresh",
                flush=True,
            )


def diverged(counters: Counters, run_dir: Path) -> UserError:
    """The error that ends a run after ``max_bad_updates`` bad updates in a row (naming the checkpoint kept)."""
    latest = run_dir / LATEST
    kept = f"the last good checkpoint is kept: {latest}" if latest.is_file() else "no checkpoint had been written yet"
    return UserError(
        f"stopped: {counters.bad_updates} updates in a row had NaN/inf loss or gradients (their optimizer steps "
        f"were skipped); {kept}; try a lower learning rate or --max_grad_norm"
    )


def train_worker(
    comm: Comm, payload: tuple[list[TrainConfig], PreparedMarket, list[Path], WorldLayout, list[Callback]]
) -> None:
    """One rank's whole job (what `clstm_ppo.training.launch.launch` runs on every worker): the run, or the seeds
    as one batch (``--seed 1-8``), with the payload's callbacks after the product's (each seed its own copies).
    Raises UserError naming every seed of a batch that failed, after the others finished."""
    cfgs, market, run_dirs, layout, extra = payload
    if comm.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if layout.torchrun else layout.world_size
        torch.set_num_threads(cfgs[0].system.threads or max(1, (os.cpu_count() or 1) // max(1, local_world)))
    run_dirs = comm.broadcast_object(run_dirs)  # under torchrun every process named its own; rank 0's wins
    callbacks = [list(extra)] if len(cfgs) == 1 else [copy.deepcopy(list(extra)) for _ in cfgs]
    trainer = Trainer(cfgs, market, comm, run_dirs, callbacks)
    start = time.perf_counter()
    try:
        counters = trainer.train()
    except StoppedBySignal:
        if comm.master:
            for k, c in enumerate(trainer.counters):
                again = (
                    f"--run_name {run_dirs[0].name}"
                    if len(cfgs) == 1
                    else f"--run_name {run_dirs[0].parent.name} --seed {format_seeds([c.run.seed for c in cfgs])}"
                )
                print(
                    f"{trainer.tag(k)} stopped after {c.episodes} episodes (update {c.update}); "
                    f"continue with: {again} --resume latest",
                    flush=True,
                )
        raise
    seconds = time.perf_counter() - start
    if comm.master:
        for k, (cfg, c, err) in enumerate(zip(cfgs, counters, trainer.errors, strict=True)):
            folder = run_dirs[k] if len(cfgs) == 1 else run_dirs[k].parent
            if err is None:
                done = done_line(c, cfg, comm.world_size, seconds)
                print(f"{trainer.tag(k)} {done} | checkpoints: {folder}", flush=True)
    failed = [(cfg.run.seed, err) for cfg, err in zip(cfgs, trainer.errors, strict=True) if err is not None]
    if failed:
        raise UserError("; ".join(f"seed {seed} failed: {err}" for seed, err in failed))


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
