"""What hangs on the training loop besides the algorithm: Stable-Baselines3's ``BaseCallback`` shape.

The loop (`clstm_ppo.training.trainer.Trainer`, each seed of a batch with its own callbacks) calls every callback's
hooks (`Callback`) at fixed points of each iteration, in list order, on every rank (so a hook may issue collectives:
every rank issues the same ones in the same order). A hook sees the run through `RunState`, declared here, and
nothing else of the trainer. The product's callbacks (`with_defaults`) are `Logger` and `Checkpointer`; a loop's
``callbacks=`` runs after them and never replaces them (tests add a fault injector, ``tests/faults.py``); nothing in
the loop reads a test switch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from clstm_ppo.training.checkpoint import save_checkpoint
from clstm_ppo.training.run_folder import BEST, LATEST, episode_checkpoint_name, write_config
from clstm_ppo.training.run_log import RunLog
from clstm_ppo.training.tracking import open_tracker

if TYPE_CHECKING:
    from clstm_ppo.agent.evaluate import PolicyRun
    from clstm_ppo.config import TrainConfig
    from clstm_ppo.training.distributed import Comm
    from clstm_ppo.training.progress import Counters, UpdateResult
    from clstm_ppo.training.rollout import RolloutBuffer
    from envs.features import PreparedMarket


class RunState(Protocol):
    """What a callback sees of the run it hangs on: one rank of a run, or one seed of a batch (the same figures and
    files either way). Everything a callback may read, call or change is here; it reaches no further."""

    cfg: TrainConfig  # the run's settings
    market: PreparedMarket  # the prepared market it trains on
    comm: Comm  # its ranks (one seed of a batch: a single process)
    run_dir: Path  # its run folder (rank 0 writes it)
    steps_per_update: int  # env steps of one update over all ranks
    tag: str  # its console lines' prefix: [Rank 0] for a run, [seed s] for one seed of a batch
    layout_line: str  # one line on where and how the run trains (world size, devices, envs, policy, market)

    @property
    def counters(self) -> Counters:
        """Where training stands, the same on every rank; a callback may set ``best_score``."""

    @property
    def buf(self) -> RolloutBuffer:
        """This rank's (this seed's) rollout, [n_steps, num_envs, ...]: read in ``on_rollout_end`` before the
        advantages are computed from it (a fault injector writes its rewards)."""

    @property
    def stopping(self) -> bool:
        """Every rank agreed to stop after the current update."""

    def figures(self) -> dict[str, float]:
        """The run's own figures after an update, beside its losses: ``policy_std`` (mean action std),
        ``reward_scale`` (with ``--norm_reward``), ``lr_clstm`` and ``lr_actor_critic`` (the learning rates used)."""

    def validation_run(self) -> PolicyRun:
        """The deterministic policy at the current weights on the validation split."""

    def worker_state(self) -> dict[str, Any]:
        """What makes this rank's next update bitwise reproducible (a checkpoint keeps one per rank)."""

    def checkpoint_payload(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]:
        """Everything a checkpoint of the run holds now (`clstm_ppo.training.checkpoint.checkpoint_payload`)."""

    def line(self, text: str) -> None:
        """A console line from rank 0, through the run's `Logger` (no-op elsewhere)."""


class Callback:
    """A hook on the training loop (see the module docstring); every method is a no-op until overridden."""

    def on_training_start(self, run: RunState) -> None:
        """Before the first update."""

    def on_rollout_end(self, run: RunState) -> None:
        """After the rollout (``run.buf``), before the advantages are computed from it."""

    def on_update_end(self, run: RunState, result: UpdateResult) -> None:
        """After the PPO epochs, the normalisers' sync and the episode gather (``run.counters`` already advanced)."""

    def on_training_end(self, run: RunState) -> None:
        """When the loop ends, normally or by an exception."""


class Logger(Callback):
    """Rank 0's record of the run (`RunLog`): the run folder's config.json, then each update's episodes and
    statistics to metrics.jsonl, TensorBoard, the ``--track`` tracker and the console."""

    def __init__(self) -> None:
        self.log: RunLog | None = None

    def on_training_start(self, run: RunState) -> None:
        if not run.comm.master:
            return
        cfg = run.cfg
        run.run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run.run_dir, cfg)
        self.log = RunLog(
            run.run_dir,
            num_episodes=cfg.ppo.num_episodes,
            log_every=cfg.run.log_every,
            episodes_done=run.counters.episodes,
            tensorboard=cfg.run.tensorboard,
            progress=cfg.run.progress,
            tracker=open_tracker(cfg, run.run_dir),
            tag=run.tag,
        )
        self.log.line(f"{run.tag} {run.layout_line}")

    def on_update_end(self, run: RunState, result: UpdateResult) -> None:
        if self.log is None:
            return
        c, episodes = run.counters, result.episodes
        self.log.record_update(
            episodes,
            first_episode=c.episodes - episodes.shape[0],
            global_step=c.global_step,
            update={
                "update": c.update,
                "global_step": c.global_step,
                **result.stats.as_dict(),
                **result.behaviour,
                **run.figures(),
                "rollout_seconds": result.rollout_seconds,
                "update_seconds": result.update_seconds,
            },
            sps=run.steps_per_update / max(result.rollout_seconds + result.update_seconds, 1e-9),
            time=c.elapsed,
        )

    def line(self, text: str) -> None:
        """A console line from rank 0 (no-op elsewhere)."""
        if self.log is not None:
            self.log.line(text)

    def mean_recent_return(self) -> float | None:
        return self.log.mean_recent_return() if self.log is not None else None

    def on_training_end(self, run: RunState) -> None:
        if self.log is not None:
            self.log.close()


class Checkpointer(Callback):
    """Validation and checkpoints: every ``eval_every`` updates (and at the end) rank 0 scores the run (`score`) and
    keeps the best as best.pt; every ``checkpoint_every`` updates, at the end, on a stop and at each ``save_every``
    episodes it writes latest.pt (and episode_<n>.pt). Nothing is written after an update with NaN/inf, so the last good
    checkpoint stays.

    :param logger: the run's `Logger`, whose recent training returns score a run without a validation split.
    """

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def on_update_end(self, run: RunState, result: UpdateResult) -> None:
        """Every rank takes part in gathering worker states. The decision uses only values identical on all ranks
        (global counters, the all-reduced stop flag, rank 0's broadcast score), so the gather below is issued by
        every rank or by none."""
        cfg, c, comm = run.cfg, run.counters, run.comm
        if c.bad_updates > 0:
            return  # keep the last good checkpoint
        episodes_before = c.episodes - result.episodes.shape[0]
        finished = c.episodes >= cfg.ppo.num_episodes
        crossed_period = (
            cfg.run.save_every > 0 and c.episodes // cfg.run.save_every > episodes_before // cfg.run.save_every
        )
        evaluate = c.update % cfg.run.eval_every == 0 or finished
        due = c.update % cfg.run.checkpoint_every == 0 or finished or run.stopping or crossed_period
        if not (due or evaluate):
            return
        score = self.score(run) if evaluate and comm.master else None
        is_best = comm.broadcast_object(score is not None and score > c.best_score)
        if not (due or is_best):
            return
        worker_states = comm.gather_objects(run.worker_state())
        if not comm.master:
            return
        if is_best:
            c.best_score = score
        payload = run.checkpoint_payload(worker_states)
        save_checkpoint(run.run_dir / LATEST, payload)
        if is_best:
            save_checkpoint(run.run_dir / BEST, payload)
        if crossed_period:
            save_checkpoint(run.run_dir / episode_checkpoint_name(c.episodes), payload)

    def score(self, run: RunState) -> float | None:
        """Validation Sharpe of the deterministic policy when a validation split exists, else the mean return of
        the last 100 training episodes (None before any episode finished)."""
        if run.market.splits.validation is not None:
            return run.validation_run().sharpe
        return self.logger.mean_recent_return()


def with_defaults(extra: list[Callback] | tuple[Callback, ...] = ()) -> list[Callback]:
    """A loop's callbacks: the product's, then ``extra`` (no ``callbacks=`` replaces them). The product's run in this
    order after each update: the log, then the checkpoint (whose `Checkpointer.score` may read the log)."""
    logger = Logger()
    return [logger, Checkpointer(logger), *extra]
