"""K runs ("cells": a study's seeds, and settings that change no shape) trained in one process as one batch, each
giving what it gives alone: `Trainer`'s loop with seeds as a batch dimension (PureJaxRL's idea; issue 49).

`CellTrainer.update` is `Trainer.update` for K cells at once: one rollout of K x B envs (the run's own
`RolloutCollector`, each cell a block of columns), one GAE over every column, one PPO update (the run's own
`ppo_update`) whose every minibatch is one forward and backward of the stacked network (`clstm_ppo.agent.stacked`)
and one step of `cell_adam`. Everything that makes a cell's numbers is its own, as in its run alone: its initial weights (drawn after ``torch.manual_seed(seed)``), its envs' start days, its
action noise and minibatch shuffles (its own generators, seeded as `Trainer` seeds them), its reward and advantage
normalisation, its learning-rate schedule, gradient clip, KL early stop and optimizer state. Only float rounding
differs (stacked matmuls; ``tests/test_cells.py``: weights within 1e-5 after 3 updates, metrics to 4 figures).

Each cell keeps its own run folder, written by the product's own callbacks (`default_callbacks`), which see the
cell through a `CellView` as they see a run (`RunState`): config.json, metrics.jsonl, latest.pt, best.pt hold what its run alone
writes, in the same format, so backtest, study and trade read them unchanged, and a cell resumes from a single
run's checkpoint as from its own. A cell fails alone: an exception in one of its callbacks, or ``max_bad_updates``
bad updates in a row (the same error as `Trainer`'s), ends that cell (recorded in `CellTrainer.errors`) and the
others go on; a finished or failed cell is still computed with the batch but never steps again.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from typing import Any

import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_cells
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.moments import moment_sums
from clstm_ppo.agent.stacked import CellPolicy, stack_policies
from clstm_ppo.config import OUTPUT_SETTINGS, TrainConfig
from clstm_ppo.training.callbacks import Callback, Logger, find, with_defaults
from clstm_ppo.training.cell_adam import AdamLayout, CellAdam
from clstm_ppo.training.checkpoint import checkpoint_payload, load_checkpoint
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import PhaseTimer, adam_groups, adam_options, autocast_factory, no_timer, ppo_update
from clstm_ppo.training.resume import load_weights
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, compute_gae
from clstm_ppo.training.run_folder import resolve_resume
from clstm_ppo.training.signals import StoppedBySignal, StopRequest
from clstm_ppo.training.trainer import Counters, Update, UpdateResult, advance, diverged, worker_state
from envs.errors import UserError
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
"""Settings in which the cells of one batch may differ: each cell has its own (the seed, the numbers the loss and the
optimizer take per cell, its budget, its files). Every other setting (the data, the network's shape, the env, the
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
    system = cfgs[0].system
    if system.mixed_precision == "fp16" or system.compile:
        raise ValueError("cells trained as one batch take no fp16 GradScaler and no torch.compile")


class CellView:
    """Cell k of a `CellTrainer` as its callbacks see a run (`clstm_ppo.training.callbacks.RunState`): its settings,
    counters, run folder, its columns of the rollout buffer, its figures, and its checkpoint in a single run's
    format."""

    def __init__(self, trainer: CellTrainer, cell: int) -> None:
        self.trainer, self.cell = trainer, cell
        self.cfg: TrainConfig = trainer.cfgs[cell]
        self.market, self.run_dir = trainer.market, trainer.run_dirs[cell]
        self.comm = trainer.comm
        self.model: ActorCritic = trainer.policy.cell(cell)

    @property
    def counters(self) -> Counters:
        return self.trainer.counters[self.cell]

    @property
    def stopping(self) -> bool:
        return self.trainer.stopping

    @property
    def steps_per_update(self) -> int:
        return self.cfg.ppo.rollout_steps

    @property
    def buf(self) -> RolloutBuffer:
        return self.trainer.cell_buffer(self.cell)

    def figures(self) -> dict[str, float]:
        lrs = [float(lr) for lr in self.trainer.optimizer.lr[self.cell]]
        reward_norm = self.trainer.rollout.reward_norms[self.cell]
        return {
            "policy_std": self.model.log_std.detach().exp().mean().item(),
            **({"reward_scale": reward_norm.scale} if self.cfg.ppo.norm_reward else {}),
            "lr_clstm": lrs[0],
            "lr_actor_critic": lrs[1],
        }

    def validation_run(self) -> PolicyRun:
        """`Trainer.validation_run` of this cell: its column of the batch's (`CellTrainer.validation_runs`)."""
        return self.trainer.validation_runs()[self.cell]

    def worker_state(self) -> dict[str, Any]:
        t = self.trainer
        return worker_state(t.shuffle_gens[self.cell], t.rollout.state_dict(self.cell), t.torch_rng[self.cell])

    def checkpoint_payload(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        """What its run alone would save now: the ``torch.optim.Adam`` state its run's optimizer would hold."""
        t = self.trainer
        return checkpoint_payload(
            cfg=self.cfg,
            model=self.model,
            market=self.market,
            optimizer_state=t.optimizer.cell_state_dict(self.cell, t.layouts[self.cell]),
            scaler_state=None,
            counters=self.counters.as_dict(),
            worker_states=worker_states,
            world_size=1,
        )

    @property
    def tag(self) -> str:
        return f"[seed {self.cfg.run.seed}]"

    @property
    def layout_line(self) -> str:
        t = self.trainer
        return (
            f"{self.run_dir}: cell {self.cell + 1} of {t.cells} trained as one batch | {self.cfg.ppo.num_envs} envs | "
            f"policy {self.model.spec.policy} ({type(t.policy).__name__}) | {self.market.num_tickers} tickers, "
            f"F={self.market.num_features}, T={self.market.window}"
        )

    def line(self, text: str) -> None:
        logger = find(self.trainer.callbacks[self.cell], Logger)
        if logger is not None:
            logger.line(text)


class CellTrainer:
    """K runs of ``cfgs`` on one ``market`` trained as one batch (see the module docstring).

    :param cfgs: each cell's settings (they may differ in `PER_CELL` only); a cell's ``resume`` / ``init_weights``
        continue or seed it as they would its run alone.
    :param run_dirs: each cell's run folder.
    :param callbacks: per cell, hooks added after the product's (tests: a fault injector on one cell).
    :param looped: run each cell's own network in turn instead of the stacked forward (`LoopedCells`).
    """

    def __init__(
        self,
        cfgs: list[TrainConfig],
        market: PreparedMarket,
        run_dirs: list[Path],
        device: torch.device | str = "cpu",
        callbacks: list[list[Callback]] | None = None,
        *,
        looped: bool = False,
    ) -> None:
        check_batchable(cfgs)
        self.cfgs, self.market, self.run_dirs = cfgs, market, run_dirs
        self.device = device = torch.device(device)
        self.comm = Comm(device=device)  # one process: the collectives of `Trainer`'s hooks are no-ops
        self.cells = len(cfgs)
        ppo, system = cfgs[0].ppo, cfgs[0].system
        seeds = [cfg.run.seed for cfg in cfgs]
        models, self.torch_rng = [], []
        for cfg in cfgs:
            torch.manual_seed(cfg.run.seed)  # the cell's initial weights, as `Trainer` draws them
            models.append(build_model(cfg, market).to(device))
            self.torch_rng.append(torch.get_rng_state())  # what its run's checkpoints keep (nothing draws after)
        self.policy: CellPolicy = stack_policies(models, looped=looped)
        self.layouts = [
            AdamLayout(adam_groups(cfg.ppo, self.policy.cell(k), 1), adam_options(cfg.ppo))
            for k, cfg in enumerate(cfgs)
        ]
        self.base_lrs = [layout.lrs for layout in self.layouts]
        self.optimizer = CellAdam(self.policy, self.base_lrs, eps=ppo.adam_eps, weight_decay=ppo.weight_decay)
        self.autocast = autocast_factory(system.mixed_precision, device)
        self.shuffle_gens = [torch.Generator().manual_seed(s * 6151 + 2) for s in seeds]  # `Trainer`'s, rank 0
        env = VectorStockTradingEnv(
            market,
            split="train",
            num_envs=self.cells * ppo.num_envs,
            config=cfgs[0].env,
            device=device if system.env_device == "auto" else torch.device(system.env_device),
            seed=seeds,
        )
        self.rollout = RolloutCollector(
            env,
            self.policy,
            gamma=ppo.gamma,
            device=device,
            autocast=self.autocast,
            generators=[torch.Generator(device=device).manual_seed(s * 7919 + 1) for s in seeds],
            seeds=seeds,
            norm_reward=ppo.norm_reward,
        )
        self.buf = RolloutBuffer.allocate(
            ppo.n_steps, env.num_envs, (market.window, market.num_features), self.policy.spec.action_dim, device
        )
        self.counters = [Counters() for _ in cfgs]
        for k, cfg in enumerate(cfgs):
            if cfg.run.resume:
                self._resume(k, resolve_resume(cfg.run.resume, run_dirs[k]))
            elif cfg.run.init_weights:
                self.policy.cell(k).load_state_dict(load_weights(cfg.run.init_weights, cfg, market))
        self.callbacks = [with_defaults(callbacks[k] if callbacks else ()) for k in range(self.cells)]
        self.views = [CellView(self, k) for k in range(self.cells)]
        self.active = [True] * self.cells  # still training
        self.errors: list[BaseException | None] = [None] * self.cells  # why a cell failed
        self.stop = StopRequest()
        self.stopping = False
        self.iteration = 0  # updates of the batch so far in this process: when the validation runs are current
        self._validated: tuple[int, list[PolicyRun]] | None = None

    # ------------------------------------------------------------------ the algorithm
    def update(self, *, timer: PhaseTimer | None = None) -> list[Update | None]:
        """One iteration of every active cell (`Trainer.update`, K at once): anneal each cell's learning rates,
        collect the rollout (each cell's ``on_rollout_end`` sees its columns), advantages, the PPO epochs.

        :return: each active cell's `Update` (None for the others); the seconds are the batch's.
        """
        phase = timer if timer is not None else no_timer
        self.iteration += 1
        for k, cfg in enumerate(self.cfgs):
            if cfg.ppo.anneal_lr and self.active[k]:
                est = max(1, math.ceil(cfg.ppo.num_episodes * self.episode_days() / cfg.ppo.rollout_steps))
                frac = max(0.0, 1.0 - self.counters[k].update / est)
                self.optimizer.lr[k] = torch.tensor(self.base_lrs[k], dtype=torch.float64) * frac
        ppo = self.cfgs[0].ppo
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
                ppo.gamma,
                ppo.gae_lambda,
            )
        t1 = time.perf_counter()
        with phase("update"):
            stats = ppo_update(
                self.policy,
                self.optimizer,
                self.buf,
                advantages,
                returns,
                [cfg.ppo for cfg in self.cfgs],
                self.comm,
                active=list(self.active),
                generators=self.shuffle_gens,
                autocast=self.autocast,
                timer=timer,
            )
            self.sync_normalisers()
        t2 = time.perf_counter()
        return [
            Update(rows[k], s, t1 - t0, t2 - t1) if s is not None and self.active[k] else None
            for k, s in enumerate(stats)
        ]

    def sync_normalisers(self) -> None:
        """`Trainer.sync_normalisers` of every active cell (one process): its rollout's states merged into its
        observation normaliser (``--norm_obs``), its rollout's returns into its reward normaliser's moments."""
        for k in self._active():
            if self.cfgs[k].model.norm_obs:
                self.policy.cell(k).update_obs_stats(moment_sums(self.cell_buffer(k).obs.newest.flatten(0, 1)))
            self.rollout.reward_norms[k].sync(self.comm)

    def cell_buffer(self, cell: int) -> RolloutBuffer:
        """Cell ``cell``'s columns of the rollout (views: a callback that writes them writes the batch's)."""
        return self.buf.columns(self.rollout.envs_of(cell))

    def gather(self, cell: int, update: Update) -> UpdateResult:
        """Cell ``cell``'s `UpdateResult` (`Trainer.gather` on one process), its counters advanced."""
        ranks = torch.zeros((update.rows.shape[0], 1), dtype=torch.float64)
        episodes = torch.cat([update.rows, ranks], dim=1)
        behaviour = self.rollout.stats[cell].as_dict()
        result = UpdateResult(episodes, update.stats, behaviour, update.rollout_seconds, update.update_seconds)
        advance(self.counters[cell], result, self.cfgs[cell].ppo.rollout_steps)
        return result

    # ------------------------------------------------------------------ loop
    def train(self) -> list[Counters]:
        """Run updates until every cell has finished its ``num_episodes`` or failed; return the counters.

        :raises StoppedBySignal: after SIGINT/SIGTERM, once every active cell finished the update and saved.
        """
        starts = [time.perf_counter() - c.elapsed for c in self.counters]
        for k in self._active():
            for callback in self.callbacks[k]:
                self._guarded(k, callback.on_training_start, self.views[k])
        self.stop.install()
        try:
            for k in self._active():
                if self.counters[k].episodes >= self.cfgs[k].ppo.num_episodes:
                    self._end(k)
            while any(self.active):
                updates = self.update()
                self.stopping = self.stop.signum is not None
                results = {k: self.gather(k, updates[k]) for k in self._active() if updates[k] is not None}
                for k in results:
                    self.counters[k].elapsed = time.perf_counter() - starts[k]
                for k, result in results.items():  # every cell's normalisers are synced (`update`) before any hook
                    for callback in self.callbacks[k]:
                        self._guarded(k, callback.on_update_end, self.views[k], result)
                for k in results:
                    c, cfg = self.counters[k], self.cfgs[k]
                    if not self.active[k]:
                        continue
                    if c.bad_updates >= cfg.run.max_bad_updates:
                        self._fail(k, diverged(c, self.run_dirs[k]))
                    elif c.episodes >= cfg.ppo.num_episodes:
                        self._end(k)
                if self.stopping:
                    for k in self._active():
                        self.views[k].line(f"{self.views[k].tag} stop requested: checkpoint saved, exiting")
                    raise StoppedBySignal(self.stop.signum or signal.SIGTERM)
        finally:
            for k in self._active():
                self._end(k)
        return self.counters

    def _active(self) -> list[int]:
        return [k for k, on in enumerate(self.active) if on]

    def _guarded(self, cell: int, hook: Any, *args: Any) -> None:
        """Call a cell's callback hook; an error in it fails that cell only (a stop still stops every cell)."""
        if not self.active[cell]:
            return
        try:
            hook(*args)
        except StoppedBySignal:
            raise
        except Exception as err:  # a cell fails alone
            self._fail(cell, err)

    def _fail(self, cell: int, err: BaseException) -> None:
        self.errors[cell] = err
        self.views[cell].line(f"{self.views[cell].tag} failed: {err}")
        self._end(cell)

    def _end(self, cell: int) -> None:
        """The cell trains no more: its callbacks' ``on_training_end`` (errors there are its own)."""
        self.active[cell] = False
        for callback in self.callbacks[cell]:
            try:
                callback.on_training_end(self.views[cell])
            except Exception as err:  # closing its log failed: the cell's error unless it has one already
                self.errors[cell] = self.errors[cell] or err

    def validation_runs(self) -> list[PolicyRun]:
        """Every cell's `Trainer.validation_run` at this iteration's weights, computed once for all the cells
        (`clstm_ppo.agent.evaluate.evaluate_cells` on the stacked network: each cell's up to float rounding)."""
        if self._validated is None or self._validated[0] != self.iteration:
            runs = evaluate_cells(self.policy, self.market, "validation", self.cfgs[0].env, device=self.device)
            self._validated = (self.iteration, runs)
        return self._validated[1]

    def episode_days(self) -> float:
        """Trading days of one training episode (`Trainer.episode_days`; the env settings are every cell's)."""
        train_days = self.market.splits.train.num_days
        return float(min(self.cfgs[0].env.episode_days or train_days, train_days))

    # ------------------------------------------------------------------ checkpoints
    def _resume(self, cell: int, path: Path) -> None:
        """Continue cell ``cell`` from ``path`` (a checkpoint of its run, alone or batched): `Trainer._resume`."""
        ckpt = load_checkpoint(path, map_location="cpu")
        self.policy.cell(cell).load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_cell_state_dict(cell, ckpt.optimizer_state)
        self.counters[cell] = Counters.from_dict(ckpt.counters)
        states = ckpt.worker_states or []
        if len(states) != 1:
            raise UserError(f"{path}: written by {len(states)} workers; a batched cell resumes one worker's run")
        state = states[0]
        self.torch_rng[cell] = state["torch_rng"]
        self.shuffle_gens[cell].set_state(state["shuffle_gen"])
        self.rollout.load_state_dict(state, cell)
