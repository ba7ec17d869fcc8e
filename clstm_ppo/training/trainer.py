"""One worker's training loop: rollout -> GAE -> PPO update (through DDP) -> metrics -> checkpoint.

Read top to bottom, `Trainer.train` is the algorithm: per update anneal the learning rates, collect
``n_steps`` days from ``num_envs`` envs, bootstrap and compute advantages, run the update, gather the
finished episodes to every rank, and let rank 0 log and save. Every worker issues the same collectives
in the same order: the stop decision comes from the all-gathered episode count and the all-reduced stop
flag, so ranks that finished different numbers of episodes stop together. The stages live elsewhere:
`clstm_ppo.training.rollout` (acting, storage, GAE), `clstm_ppo.training.ppo` (the update and the
optimizer), `clstm_ppo.training.checkpoint` (the run folder), `clstm_ppo.training.run_log` (rank 0's logs).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.agent.model import build_model
from clstm_ppo.agent.moments import merge_moments, moment_sums
from clstm_ppo.config import TrainConfig
from clstm_ppo.market import env_config
from clstm_ppo.training.checkpoint import (
    BEST,
    LATEST,
    checkpoint_payload,
    episode_checkpoint_name,
    load_checkpoint,
    load_weights,
    resolve_resume,
    save_checkpoint,
    write_config,
)
from clstm_ppo.training.distributed import Comm, WorldLayout
from clstm_ppo.training.faults import FaultSpec
from clstm_ppo.training.launch import StoppedBySignal
from clstm_ppo.training.ppo import autocast_factory, build_optimizer, ppo_update
from clstm_ppo.training.rollout import RolloutBuffer, RolloutCollector, RolloutStats, compute_gae
from clstm_ppo.training.run_log import RunLog
from clstm_ppo.training.tracking import open_tracker
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.vector_env import VectorStockTradingEnv


class Trainer:
    """Training state of one worker (rank). Rank 0 alone prints and writes files."""

    def __init__(self, cfg: TrainConfig, market: PreparedMarket, comm: Comm, run_dir: Path) -> None:
        self.cfg, self.market, self.comm, self.run_dir = cfg, market, comm, run_dir
        device = self.device = comm.device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
            torch.backends.cudnn.allow_tf32 = cfg.tf32
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(cfg, market).to(device)
        self.optimizer = build_optimizer(cfg, self.model, comm.world_size)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.scaler = torch.amp.GradScaler("cuda") if cfg.mixed_precision == "fp16" else None
        self.autocast = autocast_factory(cfg.mixed_precision, device)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed * 6151 + 7877 * comm.rank + 2)
        env_seed = cfg.seed + comm.rank * cfg.num_envs
        env = VectorStockTradingEnv(
            market,
            split="train",
            num_envs=cfg.num_envs,
            config=env_config(cfg),
            device=device if cfg.env_device == "auto" else torch.device(cfg.env_device),
            seed=env_seed,
        )
        self.rollout = RolloutCollector(
            env,
            self.model,
            gamma=cfg.gamma,
            device=device,
            autocast=self.autocast,
            seed=env_seed,
            generator=torch.Generator(device=device).manual_seed(cfg.seed * 7919 + 104729 * comm.rank + 1),
            permute_tickers=cfg.permute_tickers,
            norm_reward=cfg.norm_reward,
        )
        self.buf = RolloutBuffer.allocate(
            cfg.n_steps, cfg.num_envs, (market.window, market.num_features), market.num_tickers, device
        )
        # reward_moments: running (count, mean, var) of all workers' discounted returns (--norm_reward)
        self.counters: dict[str, Any] = dict(
            update=0,
            global_step=0,
            episodes=0,
            best_score=-math.inf,
            bad_updates=0,
            skipped_steps=0,
            elapsed=0.0,
            reward_moments=[0.0, 0.0, 1.0],
        )
        if cfg.resume:
            self._resume(resolve_resume(cfg.resume, run_dir))
        elif cfg.init_weights:
            self.model.load_state_dict(load_weights(cfg.init_weights, cfg, market))
        self.rollout.reward_scale = self.reward_scale()
        trained = torch.compile(self.model) if cfg.compile else self.model
        if comm.distributed:
            trained = DDP(trained, device_ids=[device.index] if device.type == "cuda" else None)
        self.trained = trained  # the loss forward goes through this (DDP when distributed)
        self.log: RunLog | None = None
        self.stop_signal: int | None = None
        self.fault = FaultSpec.from_environment()

    # ------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        """Run updates until ``num_episodes`` episodes have finished over all workers; return the counters.

        :raises StoppedBySignal: after SIGINT/SIGTERM, once every rank finished the update and rank 0 saved.
        """
        cfg, comm, c = self.cfg, self.comm, self.counters
        steps_per_update = cfg.rollout_steps * comm.world_size
        est_updates = max(1, math.ceil(cfg.num_episodes * self.episode_days() / steps_per_update))
        if comm.master:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_config(self.run_dir, cfg)
            self.log = RunLog(
                self.run_dir,
                num_episodes=cfg.num_episodes,
                log_every=cfg.log_every,
                episodes_done=c["episodes"],
                tensorboard=cfg.tensorboard,
                progress=cfg.progress,
                tracker=open_tracker(cfg, self.run_dir),
            )
            self.log.line(f"[Rank 0] {self.layout_line}")
        self._install_signal_handlers()
        start = time.perf_counter() - c["elapsed"]
        try:
            while c["episodes"] < cfg.num_episodes:
                if cfg.anneal_lr:
                    frac = max(0.0, 1.0 - c["update"] / est_updates)
                    for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                        group["lr"] = base * frac
                t0 = time.perf_counter()
                rows = self.rollout.collect(self.buf)
                if self.fault is not None:
                    self.fault.apply(comm.rank, c["update"] + 1, self.buf.rewards)
                advantages, returns = compute_gae(
                    self.buf.rewards,
                    self.buf.values,
                    self.buf.dones,
                    self.rollout.bootstrap_value(),
                    cfg.gamma,
                    cfg.gae_lambda,
                )
                t1 = time.perf_counter()
                stats = ppo_update(
                    self.trained,
                    self.optimizer,
                    self.buf,
                    advantages,
                    returns,
                    cfg,
                    comm,
                    generator=self.shuffle_gen,
                    autocast=self.autocast,
                    scaler=self.scaler,
                )
                t2 = time.perf_counter()
                self._update_normalizers()
                behaviour = RolloutStats(comm.all_reduce_sum(self.rollout.stats.sums)).as_dict()
                ranks = torch.full((rows.shape[0], 1), float(comm.rank), dtype=torch.float64)
                all_rows = comm.all_gather_rows(torch.cat([rows, ranks], dim=1))  # every rank sees every episode
                stopping = comm.all_reduce_sum(torch.tensor([float(self.stop_signal is not None)])).item() > 0
                c["update"] += 1
                c["global_step"] += steps_per_update
                c["episodes"] += all_rows.shape[0]
                c["skipped_steps"] += stats.skipped_steps
                bad = stats.skipped_steps > 0 or not math.isfinite(stats.policy_loss)
                c["bad_updates"] = c["bad_updates"] + 1 if bad else 0
                c["elapsed"] = time.perf_counter() - start
                if self.log is not None:
                    self.log.record_update(
                        all_rows,
                        first_episode=c["episodes"] - all_rows.shape[0],
                        global_step=c["global_step"],
                        update={
                            "update": c["update"],
                            "global_step": c["global_step"],
                            **stats.as_dict(),
                            **behaviour,
                            "policy_std": self.model.log_std.detach().exp().mean().item(),
                            **({"reward_scale": self.rollout.reward_scale} if cfg.norm_reward else {}),
                            "lr_clstm": self.optimizer.param_groups[0]["lr"],
                            "lr_actor_critic": self.optimizer.param_groups[1]["lr"],
                            "rollout_seconds": t1 - t0,
                            "update_seconds": t2 - t1,
                        },
                        sps=steps_per_update / max(t2 - t0, 1e-9),
                        time=c["elapsed"],
                    )
                self._maybe_checkpoint(episodes_before=c["episodes"] - all_rows.shape[0], stopping=stopping)
                if c["bad_updates"] >= cfg.max_bad_updates:
                    latest = self.run_dir / LATEST
                    kept = (
                        f"the last good checkpoint is kept: {latest}"
                        if latest.is_file()
                        else "no checkpoint had been written yet"
                    )
                    raise UserError(
                        f"stopped: {c['bad_updates']} updates in a row had NaN/inf loss or "
                        f"gradients (their optimizer steps were skipped); {kept}; try a lower "
                        f"learning rate or --max_grad_norm"
                    )
                if stopping:
                    if self.log is not None:
                        self.log.line("[Rank 0] stop requested: checkpoint saved, exiting")
                    raise StoppedBySignal(self.stop_signal or signal.SIGTERM)
            self.verify_replicas()
        finally:
            if self.log is not None:
                self.log.close()
        return dict(c)

    def _update_normalizers(self) -> None:
        """After an update: merge this rollout's states (``--norm_obs``) and discounted returns (``--norm_reward``),
        added up over all workers, into the running statistics the next rollout uses (every rank the same)."""
        if self.cfg.norm_obs:
            rows = self.buf.obs.newest.flatten(0, 1)  # [S x B, F] each step's current state
            self.model.update_obs_stats(self.comm.all_reduce_sum(moment_sums(rows)))
        if self.cfg.norm_reward:
            count, mean, var = (torch.tensor(v, dtype=torch.float64) for v in self.counters["reward_moments"])
            sums = self.comm.all_reduce_sum(self.rollout.return_sums.cpu())
            self.counters["reward_moments"] = [float(v) for v in merge_moments(count, mean, var, sums)]
            self.rollout.reward_scale = self.reward_scale()

    def reward_scale(self) -> float:
        """What rewards are multiplied by: 1 / the running std of the discounted return (1 without --norm_reward
        or before any return was seen)."""
        count, _mean, var = self.counters["reward_moments"]
        return 1.0 / math.sqrt(var + 1e-8) if self.cfg.norm_reward and count > 0 else 1.0

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
        if self.log is not None:
            self.log.line(f"[Rank 0] replicas in sync: {self.comm.world_size} ranks hold identical weights")

    def episode_days(self) -> float:
        """Trading days of one training episode (the training split's length when episodes are 'full')."""
        train_days = self.market.splits.train.num_days
        return float(min(self.cfg.episode_days or train_days, train_days))

    @property
    def layout_line(self) -> str:
        devices = str(self.device) if self.comm.world_size == 1 else f"{self.device.type} x {self.comm.world_size}"
        return (
            f"world size {self.comm.world_size} | backend {self.comm.backend} | devices {devices} | "
            f"{self.cfg.num_envs} envs per worker | policy {self.cfg.policy} | "
            f"{self.market.num_tickers} tickers, F={self.market.num_features}, T={self.market.window}"
        )

    # ------------------------------------------------------------------ checkpoints
    def _worker_state(self) -> dict[str, Any]:
        """Everything that makes this rank's next update bitwise reproducible."""
        return {
            "torch_rng": torch.get_rng_state(),
            "shuffle_gen": self.shuffle_gen.get_state(),
            **self.rollout.state_dict(),
        }

    def _maybe_checkpoint(self, *, episodes_before: int, stopping: bool) -> None:
        """Save latest (and best/periodic) on rank 0; every rank takes part in gathering worker states.

        The decision uses only values identical on all ranks (global counters, the all-reduced stop flag),
        so the gather below is issued by every rank or by none.
        """
        cfg, c = self.cfg, self.counters
        if c["bad_updates"] > 0:
            return  # keep the last good checkpoint
        finished = c["episodes"] >= cfg.num_episodes
        crossed_period = cfg.save_every > 0 and c["episodes"] // cfg.save_every > episodes_before // cfg.save_every
        evaluate = c["update"] % cfg.eval_every == 0 or finished
        due = c["update"] % cfg.checkpoint_every == 0 or finished or stopping or crossed_period
        if not (due or evaluate):
            return
        score = self._score() if evaluate and self.comm.master else None
        is_best = self.comm.broadcast_object(score is not None and score > c["best_score"])
        if not (due or is_best):
            return
        worker_states = self.comm.gather_objects(self._worker_state())
        if not self.comm.master:
            return
        if is_best:
            c["best_score"] = score
        payload = checkpoint_payload(
            cfg=cfg,
            model=self.model,
            market=self.market,
            optimizer=self.optimizer,
            scaler=self.scaler,
            counters=c,
            worker_states=worker_states,
            world_size=self.comm.world_size,
        )
        save_checkpoint(self.run_dir / LATEST, payload)
        if is_best:
            save_checkpoint(self.run_dir / BEST, payload)
        if crossed_period:
            save_checkpoint(self.run_dir / episode_checkpoint_name(c["episodes"]), payload)

    def _score(self) -> float | None:
        """Validation Sharpe of the deterministic policy when a validation split exists, else the mean
        return of the last 100 training episodes (None before any episode finished)."""
        if self.market.splits.validation is not None:
            run = evaluate_policy(
                self.model, self.market, "validation", env_config(self.cfg, full_episodes=True), device=self.device
            )
            return run.sharpe
        return self.log.mean_recent_return() if self.log is not None else None

    def _resume(self, path: Path) -> None:
        """Continue from ``path``; `checkpoint.check_resume` already checked, before any worker started,
        that its tickers and model match this run."""
        ckpt = load_checkpoint(path, map_location="cpu")
        self.model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        if self.scaler is not None and ckpt.scaler_state:
            self.scaler.load_state_dict(ckpt.scaler_state)
        self.counters.update(ckpt.counters)
        states = ckpt.worker_states or []
        if len(states) == self.comm.world_size:
            state = states[self.comm.rank]
            torch.set_rng_state(state["torch_rng"])
            self.shuffle_gen.set_state(state["shuffle_gen"])
            self.rollout.load_state_dict(state)
        elif self.comm.master:
            print(
                f"[Rank 0] resuming {path} with world size {self.comm.world_size} (saved with {len(states)}): "
                f"weights, optimizer and counters restored; environments start fresh",
                flush=True,
            )

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> None:
        """First SIGINT/SIGTERM: finish the update, save, stop (all ranks agree through the stop flag).
        A second one quits at once (KeyboardInterrupt; an interrupted checkpoint write leaves the old file).
        A signal already ignored stays ignored: spawned workers leave Ctrl-C to their parent, which forwards it."""

        def request_stop(signum: int, _frame: Any) -> None:
            if self.stop_signal is not None:
                raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
            self.stop_signal = signum

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (e.g. in tests)
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    signal.signal(sig, request_stop)


def train_worker(comm: Comm, payload: tuple[TrainConfig, PreparedMarket, Path, WorldLayout]) -> None:
    """One rank's whole job (what `clstm_ppo.training.launch.launch` runs on every worker)."""
    cfg, market, run_dir, layout = payload
    if comm.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if layout.torchrun else layout.world_size
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // max(1, local_world)))
    run_dir = comm.broadcast_object(run_dir)  # under torchrun every process named its own; rank 0's wins
    trainer = Trainer(cfg, market, comm, run_dir)
    start = time.perf_counter()
    try:
        counters = trainer.train()
    except StoppedBySignal:
        if comm.master:
            c = trainer.counters
            print(
                f"[Rank 0] stopped after {c['episodes']} episodes (update {c['update']}); "
                f"continue with: --run_name {run_dir.name} --resume latest",
                flush=True,
            )
        raise
    if comm.master:
        print(
            f"[Rank 0] done: {counters['episodes']} episodes, {counters['global_step']:,} env steps in "
            f"{time.perf_counter() - start:,.1f} s | checkpoints: {run_dir}",
            flush=True,
        )
