"""The training loop of K >= 1 seeds on one worker (rank): rollout -> GAE -> PPO update, then the callbacks.

A run is one seed. ``--seed 1-8`` and a study's batch of cells are K seeds trained as one batch (PureJaxRL's idea:
seeds as a batch dimension), on one rank or on several, each rank holding the same K seeds and its own envs of each.
The `Trainer` holds what the seeds share: the policy (K = 1 the family's own `ActorCritic`, through torch.compile and
DDP where asked; K > 1 the seeds' networks stacked, `CellPolicy`, their gradients averaged over the ranks per seed in
`ppo_update`), the envs and their `RolloutCollector`, the rollout buffer, the ranks (``comm``) and the stop. Each
`Seed` holds everything its run alone has (`clstm_ppo.training.seed`; docs/study.md "Each cell keeps its own") and is
the run its callbacks see.

`Trainer.update` is one iteration of the algorithm and nothing else; `Trainer.train` repeats it until every seed has
spent its episode budget, gathering every worker's finished episodes to every rank after each update and calling
each seed's callbacks. Every worker issues the same collectives in the same order: the stop decision comes from the
all-gathered episode counts and the all-reduced stop flag. A seed of a batch fails alone: ``max_bad_updates`` bad
updates in a row, or (in one process) an error in one of its callbacks, ends that seed (`Seed.error`) and the others
go on; a run of one seed raises.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_cells, evaluate_policy
from clstm_ppo.agent.moments import moment_sums
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.config import OUTPUT_SETTINGS, PPOConfig, TrainConfig
from clstm_ppo.training.callbacks import Callback
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import PhaseTimer, UpdateStats, autocast_factory, no_timer, ppo_update
from clstm_ppo.training.progress import Counters, UpdateResult
from clstm_ppo.training.resume import load_weights
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, compute_gae
from clstm_ppo.training.run_folder import LATEST, resolve_resume
from clstm_ppo.training.seed import Seed
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


class Update(NamedTuple):
    """What one `Trainer.update` did for one seed on this rank."""

    rows: Tensor  # [k, len(EPISODE_KEYS)] float64: this worker's finished episodes
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    rollout_seconds: float  # this rank's rollout and GAE (the batch's)
    update_seconds: float  # this rank's PPO epochs (the batch's)


class Trainer:
    """K >= 1 seeds trained on one worker (rank). Rank 0 alone prints and writes files, through each seed's callbacks.

    It holds what the seeds share: the policy (``policy``; ``trained``, what the loss runs through), the envs and
    their collector (``rollout``), the rollout buffer (``buf``), the ranks (``comm``), the stop (``stop``,
    ``stopping``), and the seeds (``seeds``). Each `Seed` owns its settings, run folder, callbacks, network, optimizer
    side (`SeedLearner`: optimizer, GradScaler, shuffle generator, PPO settings, active), acting side (`SeedActor`:
    action noise, env seed, reward normaliser, rollout stats), global RNG state, counters and error: a per-seed
    setting or schedule is added there.

    :param cfgs: each seed's settings (they may differ in `PER_CELL` only); a seed's ``resume`` and ``init_weights``
        continue or seed it as they would its run alone.
    :param run_dirs: each seed's run folder.
    :param callbacks: each seed's hooks, run after the product's (`with_defaults`); default none.
    """

    def __init__(
        self,
        cfgs: list[TrainConfig],
        market: PreparedMarket,
        comm: Comm,
        run_dirs: list[Path],
        callbacks: list[list[Callback]] | None = None,
    ) -> None:
        check_batchable(cfgs)
        self.market, self.comm, self.device = market, comm, comm.device
        self.alone = len(cfgs) == 1  # a run: the family's own network, and its errors propagate as they are
        self.steps_per_update = cfgs[0].ppo.rollout_steps * comm.world_size  # of one seed, over all workers
        ppo, system = cfgs[0].ppo, cfgs[0].system
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = system.tf32
            torch.backends.cudnn.allow_tf32 = system.tf32
        models, rngs = [], []
        for cfg in cfgs:
            torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
            models.append(build_model(cfg, market).to(self.device))
            rngs.append(torch.get_rng_state())  # nothing draws from it after
        self.policy = models[0] if self.alone else CellPolicy(models)
        self.autocast = autocast_factory(system.mixed_precision, self.device)
        hooks = callbacks or [[] for _ in cfgs]
        self.seeds = [
            Seed(self, k, cfg, run_dir, model, rng, list(hook))
            for k, (cfg, run_dir, model, rng, hook) in enumerate(zip(cfgs, run_dirs, models, rngs, hooks, strict=True))
        ]
        env = VectorStockTradingEnv(
            market,
            split="train",
            num_envs=len(cfgs) * ppo.num_envs,
            config=cfgs[0].env,
            device=self.device if system.env_device == "auto" else torch.device(system.env_device),
            seed=[seed.actor.env_seed for seed in self.seeds],
            pool=True,  # a synthetic source's train_draws: episodes on every draw's training days
        )
        actors = [seed.actor for seed in self.seeds]
        self.rollout = RolloutCollector(
            env, self.policy, actors, gamma=ppo.gamma, device=self.device, autocast=self.autocast
        )
        self.buf = RolloutBuffer.allocate(
            ppo.n_steps, env.num_envs, (market.window, market.num_features), self.policy.spec.action_dim, self.device
        )
        for seed in self.seeds:
            if seed.cfg.run.resume:
                seed.resume(resolve_resume(seed.cfg.run.resume, seed.run_dir))
            elif seed.cfg.run.init_weights:
                seed.model.load_state_dict(load_weights(seed.cfg.run.init_weights, seed.cfg, market))
        self.trained = self._loss_forward(system.compile)  # the loss forward goes through this (DDP when distributed)
        self.stop = StopRequest()
        self.stopping = False  # every rank agreed to stop after the current update (the all-reduced stop flag)
        self.iteration = 0  # updates in this process: when the batch's validation runs are current
        self._validated: tuple[int, list[PolicyRun]] | None = None

    def _loss_forward(self, compile_it: bool) -> Any:
        """What the PPO epochs run the loss through: K = 1 the network, compiled where asked, in DDP when
        distributed; K > 1 the `CellPolicy` (its own loss forward compiled where asked; `ppo_update` averages each
        seed's gradients over the ranks itself)."""
        if not self.alone:
            if compile_it:
                self.policy.compile()
            return self.policy
        trained = torch.compile(self.policy) if compile_it else self.policy
        if self.comm.distributed:
            trained = DDP(trained, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return trained

    # ------------------------------------------------------------------ the algorithm
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
        learners = [dataclasses.replace(s.learner, ppo=ppo) if ppo else s.learner for s in self.seeds]
        for seed, learner in zip(self.seeds, learners, strict=True):
            if seed.active:
                seed.anneal(learner.ppo)
        t0 = time.perf_counter()
        with phase("rollout"):
            rows = self.rollout.collect(self.buf)
            for seed in self.active_seeds():
                for callback in seed.callbacks:
                    self._guarded(seed, callback.on_rollout_end, seed)
            first = learners[0].ppo
            last_value = self.rollout.bootstrap_value()
            advantages, returns = compute_gae(
                self.buf.rewards, self.buf.values, self.buf.dones, last_value, first.gamma, first.gae_lambda
            )
        t1 = time.perf_counter()
        with phase("update"):
            stats = ppo_update(
                self.trained, learners, self.buf, advantages, returns, self.comm, autocast=self.autocast, timer=timer
            )
            self.sync_normalisers()
        t2 = time.perf_counter()
        return [Update(rows[k], s, t1 - t0, t2 - t1) if s is not None else None for k, s in enumerate(stats)]

    def sync_normalisers(self) -> None:
        """Merge each active seed's normaliser statistics over all ranks after the update: the observation
        normaliser's running moments (``--norm_obs``, this rollout's states added up over the workers) and the reward
        normaliser's (``--norm_reward``), so every rank acts on the same statistics in the next rollout."""
        for seed in self.active_seeds():
            if seed.cfg.model.norm_obs:
                sums = moment_sums(seed.buf.obs.newest.flatten(0, 1))
                seed.model.update_obs_stats(self.comm.all_reduce_sum(sums))
            seed.actor.reward_norm.sync(self.comm)

    def gather(self, seed: Seed, update: Update) -> UpdateResult:
        """``seed``'s finished episodes and rollout statistics of every worker gathered to every rank, its counters
        advanced: the same `UpdateResult` and counters on every rank."""
        comm = self.comm
        assert seed.actor.stats is not None  # set by the rollout that made ``update``
        behaviour = seed.actor.stats.all_reduced(comm).as_dict()
        ranks = torch.full((update.rows.shape[0], 1), float(comm.rank), dtype=torch.float64)
        episodes = comm.all_gather_rows(torch.cat([update.rows, ranks], dim=1))  # every rank sees every episode
        result = UpdateResult(episodes, update.stats, behaviour, update.rollout_seconds, update.update_seconds)
        c = seed.counters
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
        starts = [time.perf_counter() - seed.counters.elapsed for seed in self.seeds]
        for seed in self.active_seeds():
            for callback in seed.callbacks:
                self._guarded(seed, callback.on_training_start, seed)
        self.stop.install()
        try:
            for seed in self.active_seeds():
                if seed.counters.episodes >= seed.cfg.ppo.num_episodes:
                    self._finish(seed)
            while self.active_seeds():
                updates = self.update()
                results = {s: self.gather(s, u) for s in self.active_seeds() if (u := updates[s.index]) is not None}
                self.stopping = self.comm.all_reduce_sum(torch.tensor([float(self.stop.signum is not None)])).item() > 0
                for seed in results:
                    seed.counters.elapsed = time.perf_counter() - starts[seed.index]
                for seed, result in results.items():  # every seed's normalisers are synced (`update`) before any hook
                    for callback in seed.callbacks:
                        self._guarded(seed, callback.on_update_end, seed, result)
                for seed in results:
                    self._judge(seed)
                if self.stopping:
                    for seed in self.active_seeds():
                        seed.line(f"{seed.tag} stop requested: checkpoint saved, exiting")
                    raise StoppedBySignal(self.stop.signum or signal.SIGTERM)
        finally:
            for seed in self.active_seeds():
                self._end(seed)
        return [seed.counters for seed in self.seeds]

    def active_seeds(self) -> list[Seed]:
        """The seeds still training."""
        return [seed for seed in self.seeds if seed.active]

    def _judge(self, seed: Seed) -> None:
        """After an update's hooks: a seed with ``max_bad_updates`` bad updates in a row fails; one that spent its
        budget finishes."""
        if not seed.active:
            return
        if seed.counters.bad_updates >= seed.cfg.run.max_bad_updates:
            self._fail(seed, diverged(seed.counters, seed.run_dir))
        elif seed.counters.episodes >= seed.cfg.ppo.num_episodes:
            self._finish(seed)

    def _guarded(self, seed: Seed, hook: Any, *args: Any) -> None:
        """Call a seed's callback hook. In a batch in one process an error in it fails that seed only; a run's (and
        a batch's on several ranks, where the others would wait on this one's collectives) propagates."""
        if not seed.active:
            return
        if self.alone or self.comm.distributed:
            hook(*args)
            return
        try:
            hook(*args)
        except StoppedBySignal:
            raise
        except Exception as err:  # a seed fails alone
            self._fail(seed, err)

    def _fail(self, seed: Seed, err: BaseException) -> None:
        """``seed`` failed: a run raises; a seed of a batch ends alone (`Seed.error`)."""
        self._contain(err)
        seed.error = err
        seed.line(f"{seed.tag} failed: {err}")
        self._end(seed)

    def _finish(self, seed: Seed) -> None:
        """``seed`` spent its budget: its replicas checked, then its end."""
        self.verify_replicas(seed)
        self._end(seed)

    def _end(self, seed: Seed) -> None:
        """``seed`` trains no more: its callbacks' ``on_training_end`` (in a batch, an error there is its own)."""
        seed.active = False
        for callback in seed.callbacks:
            try:
                callback.on_training_end(seed)
            except Exception as err:  # closing its log failed: the seed's error unless it has one already
                self._contain(err)
                seed.error = seed.error or err

    def _contain(self, err: BaseException) -> None:
        """A run's error propagates as it is; a seed of a batch keeps its own (the caller records it)."""
        if self.alone:
            raise err

    def verify_replicas(self, seed: Seed) -> None:
        """Check that every rank holds the same weights of ``seed`` (what DDP promises); raise if not."""
        if not self.comm.distributed:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in seed.model.parameters()])
            probe = torch.stack(
                [flat.sum(), flat.square().sum(), (flat * torch.arange(flat.numel(), device=flat.device)).sum()]
            )
        probes = self.comm.all_gather_rows(probe.cpu().unsqueeze(0))  # [world, 3]
        if not bool((probes == probes[0]).all()):
            raise RuntimeError("replicas diverged: ranks hold different weights after training")
        seed.line(f"{seed.tag} replicas in sync: {self.comm.world_size} ranks hold identical weights")

    def validation_runs(self) -> list[PolicyRun]:
        """Every seed's deterministic policy at the current weights on the validation split (what best.pt is chosen
        by); a batch's computed once per iteration for all its seeds (`evaluate_cells`, the stacked network)."""
        env = self.seeds[0].cfg.env
        if self.alone:
            return [evaluate_policy(self.seeds[0].model, self.market, "validation", env, device=self.device)]
        if self._validated is None or self._validated[0] != self.iteration:
            runs = evaluate_cells(self.policy, self.market, "validation", env, device=self.device)
            self._validated = (self.iteration, runs)
        return self._validated[1]

    def episode_days(self) -> float:
        """Trading days of one training episode (the training split's length when episodes are 'full')."""
        train_days = self.market.splits.train.num_days
        return float(min(self.seeds[0].cfg.env.episode_days or train_days, train_days))

    def layout_line(self, seed: Seed) -> str:
        """One line on where and how ``seed`` trains."""
        comm, cells = self.comm, len(self.seeds)
        devices = str(self.device) if comm.world_size == 1 else f"{self.device.type} x {comm.world_size}"
        batch = "" if self.alone else f" | seed {seed.index + 1} of {cells} as one batch ({type(self.policy).__name__})"
        return (
            f"world size {comm.world_size} | backend {comm.backend} | devices {devices} | "
            f"{seed.cfg.ppo.num_envs} envs per worker{batch} | policy {self.policy.spec.policy} | "
            f"{self.market.num_tickers} tickers, F={self.market.num_features}, T={self.market.window} | "
            f"{describe_execution(seed.cfg.env.execution, self.market.data)}"
        )


def diverged(counters: Counters, run_dir: Path) -> UserError:
    """The error that ends a run after ``max_bad_updates`` bad updates in a row (naming the checkpoint kept)."""
    latest = run_dir / LATEST
    kept = f"the last good checkpoint is kept: {latest}" if latest.is_file() else "no checkpoint had been written yet"
    return UserError(
        f"stopped: {counters.bad_updates} updates in a row had NaN/inf loss or gradients (their optimizer steps "
        f"were skipped); {kept}; try a lower learning rate or --max_grad_norm"
    )
