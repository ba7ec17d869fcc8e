"""What hangs on the training loop besides the algorithm: Stable-Baselines3's ``BaseCallback`` shape.

`clstm_ppo.training.trainer.Trainer.train` calls every callback's hooks at fixed points of each iteration, in list
order, on every rank (so a hook may issue collectives: every rank issues the same ones in the same order):

- ``on_training_start(trainer)``: before the first update;
- ``on_rollout_end(trainer)``: after the rollout is collected (``trainer.buf``) and before the advantages;
- ``on_update_end(trainer, result)``: after the PPO epochs and the episode gather (`UpdateResult`, the same on every
  rank; ``trainer.stopping`` says whether every rank agreed to stop after this update);
- ``on_training_end(trainer)``: in the loop's ``finally``, also after an error.

The product's callbacks, in `default_callbacks` order: `NormalisationSync` (the normalisers' statistics merged over
the ranks), `Logger` (rank 0: metrics.jsonl, TensorBoard, the tracker, the console) and `Checkpointer` (validation,
best.pt, latest.pt, periodic checkpoints). Tests add their own through the same interface (a fault injector in
``tests/faults.py``); nothing in the loop reads a test switch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clstm_ppo.agent.moments import moment_sums
from clstm_ppo.training.checkpoint import checkpoint_payload, save_checkpoint
from clstm_ppo.training.run_folder import BEST, LATEST, episode_checkpoint_name, write_config
from clstm_ppo.training.run_log import RunLog
from clstm_ppo.training.tracking import open_tracker

if TYPE_CHECKING:
    from clstm_ppo.training.trainer import Trainer, UpdateResult


class Callback:
    """A hook on the training loop (see the module docstring); every method is a no-op until overridden."""

    def on_training_start(self, trainer: Trainer) -> None:
        """Before the first update."""

    def on_rollout_end(self, trainer: Trainer) -> None:
        """After the rollout (``trainer.buf``), before the advantages are computed from it."""

    def on_update_end(self, trainer: Trainer, result: UpdateResult) -> None:
        """After the PPO epochs and the episode gather (``trainer.counters`` already advanced)."""

    def on_training_end(self, trainer: Trainer) -> None:
        """When the loop ends, normally or by an exception."""


class NormalisationSync(Callback):
    """After each update, merge the normalisers' statistics over all ranks: the observation normaliser's running
    moments (``--norm_obs``, this rollout's states added up over the workers) and the reward normaliser's
    (``--norm_reward``), so every rank acts on the same statistics in the next rollout."""

    def on_update_end(self, trainer: Trainer, result: UpdateResult) -> None:
        if trainer.cfg.model.norm_obs:
            sums = moment_sums(trainer.buf.obs.newest.flatten(0, 1))
            trainer.model.update_obs_stats(trainer.comm.all_reduce_sum(sums))
        trainer.rollout.reward_norm.sync(trainer.comm)


class Logger(Callback):
    """Rank 0's record of the run (`RunLog`): the run folder's config.json, then each update's episodes and
    statistics to metrics.jsonl, TensorBoard, the ``--track`` tracker and the console."""

    def __init__(self) -> None:
        self.log: RunLog | None = None

    def on_training_start(self, trainer: Trainer) -> None:
        if not trainer.comm.master:
            return
        cfg = trainer.cfg
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        write_config(trainer.run_dir, cfg)
        self.log = RunLog(
            trainer.run_dir,
            num_episodes=cfg.ppo.num_episodes,
            log_every=cfg.run.log_every,
            episodes_done=trainer.counters.episodes,
            tensorboard=cfg.run.tensorboard,
            progress=cfg.run.progress,
            tracker=open_tracker(cfg, trainer.run_dir),
        )
        self.log.line(f"[Rank 0] {trainer.layout_line}")

    def on_update_end(self, trainer: Trainer, result: UpdateResult) -> None:
        if self.log is None:
            return
        c, episodes = trainer.counters, result.episodes
        seconds = result.rollout_seconds + result.update_seconds
        groups = trainer.optimizer.param_groups
        self.log.record_update(
            episodes,
            first_episode=c.episodes - episodes.shape[0],
            global_step=c.global_step,
            update={
                "update": c.update,
                "global_step": c.global_step,
                **result.stats.as_dict(),
                **result.behaviour,
                "policy_std": trainer.model.log_std.detach().exp().mean().item(),
                **({"reward_scale": trainer.rollout.reward_norm.scale} if trainer.cfg.ppo.norm_reward else {}),
                "lr_clstm": groups[0]["lr"],
                "lr_actor_critic": groups[1]["lr"],
                "rollout_seconds": result.rollout_seconds,
                "update_seconds": result.update_seconds,
            },
            sps=trainer.steps_per_update / max(seconds, 1e-9),
            time=c.elapsed,
        )

    def line(self, text: str) -> None:
        """A console line from rank 0 (no-op elsewhere)."""
        if self.log is not None:
            self.log.line(text)

    def mean_recent_return(self) -> float | None:
        return self.log.mean_recent_return() if self.log is not None else None

    def on_training_end(self, trainer: Trainer) -> None:
        if self.log is not None:
            self.log.close()


class Checkpointer(Callback):
    """Validation and checkpoints: every ``eval_every`` updates (and at the end) rank 0 scores the deterministic
    policy on the validation split (without one: the mean return of the last 100 training episodes) and keeps the
    best as best.pt; every ``checkpoint_every`` updates, at the end, on a stop and at each ``save_every`` episodes it
    writes latest.pt (and episode_<n>.pt). Nothing is written after an update with NaN/inf, so the last good
    checkpoint stays.

    :param logger: the run's `Logger`, whose recent training returns score a run without a validation split.
    """

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def on_update_end(self, trainer: Trainer, result: UpdateResult) -> None:
        """Every rank takes part in gathering worker states. The decision uses only values identical on all ranks
        (global counters, the all-reduced stop flag, rank 0's broadcast score), so the gather below is issued by
        every rank or by none."""
        cfg, c, comm = trainer.cfg, trainer.counters, trainer.comm
        if c.bad_updates > 0:
            return  # keep the last good checkpoint
        episodes_before = c.episodes - result.episodes.shape[0]
        finished = c.episodes >= cfg.ppo.num_episodes
        crossed_period = (
            cfg.run.save_every > 0 and c.episodes // cfg.run.save_every > episodes_before // cfg.run.save_every
        )
        evaluate = c.update % cfg.run.eval_every == 0 or finished
        due = c.update % cfg.run.checkpoint_every == 0 or finished or trainer.stopping or crossed_period
        if not (due or evaluate):
            return
        score = self.score(trainer) if evaluate and comm.master else None
        is_best = comm.broadcast_object(score is not None and score > c.best_score)
        if not (due or is_best):
            return
        worker_states = comm.gather_objects(trainer.worker_state())
        if not comm.master:
            return
        if is_best:
            c.best_score = score
        payload = checkpoint_payload(
            cfg=cfg,
            model=trainer.model,
            market=trainer.market,
            optimizer=trainer.optimizer,
            scaler=trainer.scaler,
            counters=c.as_dict(),
            worker_states=worker_states,
            world_size=comm.world_size,
        )
        save_checkpoint(trainer.run_dir / LATEST, payload)
        if is_best:
            save_checkpoint(trainer.run_dir / BEST, payload)
        if crossed_period:
            save_checkpoint(trainer.run_dir / episode_checkpoint_name(c.episodes), payload)

    def score(self, trainer: Trainer) -> float | None:
        """Validation Sharpe of the deterministic policy when a validation split exists, else the mean return of
        the last 100 training episodes (None before any episode finished)."""
        if trainer.market.splits.validation is not None:
            return trainer.validation_run().sharpe
        return self.logger.mean_recent_return()


def default_callbacks() -> list[Callback]:
    """The product's callbacks, in the order they run after each update: the normalisers' sync before anything reads
    them, then the log, then the checkpoint (which stores the synced statistics)."""
    logger = Logger()
    return [NormalisationSync(), logger, Checkpointer(logger)]


def find(callbacks: list[Callback], kind: type) -> Any:
    """The first callback of type ``kind`` in ``callbacks`` (None if there is none)."""
    return next((cb for cb in callbacks if isinstance(cb, kind)), None)
