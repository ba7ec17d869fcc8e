"""One worker's training loop: rollout -> GAE -> PPO update (through DDP) -> metrics -> checkpoint.

Read top to bottom it is the algorithm: build env, model, optimizer and storage; then per update
anneal, collect ``n_steps`` days from ``num_envs`` envs, bootstrap, compute advantages, run the
update, gather finished episodes' metrics to rank 0, and let rank 0 log and save. Every worker
runs the same number of collectives in the same order; the stop decision is taken from the
all-gathered episode count, so ranks that finished different numbers of episodes stop together.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.agent.model import ActorCritic, ModelConfig, unwrap
from clstm_ppo.config import TrainConfig
from clstm_ppo.market import env_config
from clstm_ppo.training.checkpoint import (
    FORMAT_VERSION,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    strip_prefixes,
)
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.ppo import ppo_update
from clstm_ppo.training.rollout import RolloutBuffer, compute_gae
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.vector_env import VectorStockTradingEnv

FAULT_INJECT_ENV = "CLSTM_PPO_FAULT_INJECT"
EPISODE_FIELDS = ("reward", "final_value", "return", "trades", "sharpe", "max_drawdown", "length", "costs")


def autocast_factory(mixed_precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """A zero-argument function returning the autocast context for the run (nullcontext for 'none')."""
    if mixed_precision == "none":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    if mixed_precision == "fp16" and device.type != "cuda":
        raise UserError("--mixed_precision fp16 needs a CUDA GPU; use bf16 or none on CPU")
    return lambda: torch.autocast(device.type, dtype=dtype)


def model_config(cfg: TrainConfig, market: PreparedMarket) -> ModelConfig:
    """What the ActorCritic of ``cfg`` is, sized for ``market`` (F features, N tickers)."""
    return ModelConfig(
        policy=cfg.policy, num_features=market.num_features, num_tickers=market.data.num_tickers, window=cfg.window,
        stage1_hidden=cfg.stage1_hidden, feature_dim=cfg.feature_dim, stage2_hidden=cfg.stage2_hidden,
        init_log_std=cfg.init_log_std,
    )


def build_model(cfg: TrainConfig, market: PreparedMarket) -> ActorCritic:
    """The ActorCritic for ``cfg`` sized for ``market``."""
    return ActorCritic(model_config(cfg, market))


def build_optimizer(cfg: TrainConfig, model: ActorCritic, world_size: int) -> torch.optim.Adam:
    """Adam with two parameter groups: stage 1 at learning_rate_clstm, the rest at learning_rate_actor_critic.

    ``fused=True`` (CPU and CUDA): the per-parameter Python loop of the default implementation cost
    ~6% of a paper-preset update on a CPU (benchmarks/README.md).
    """
    scale = world_size if cfg.scale_lr else 1
    return torch.optim.Adam([
        {"params": model.stage1_parameters(), "lr": cfg.learning_rate_clstm * scale, "name": "clstm"},
        {"params": model.stage2_parameters(), "lr": cfg.learning_rate_actor_critic * scale, "name": "actor_critic"},
    ], eps=cfg.adam_eps, fused=True)  # one fused kernel per step: clip + Adam 16.6 -> 2.6 ms on a CPU core


def parse_fault_spec(text: str) -> dict[str, Any] | None:
    """Testing hook: ``CLSTM_PPO_FAULT_INJECT="rank=1,update=2[,kind=raise|kill|nan][,count=K]"``.

    At update ``update`` (1-based, counted like the checkpoint's counters) rank ``rank`` raises a
    RuntimeError (``raise``, the default), kills itself with SIGKILL (``kill``), or turns its rollout
    rewards into NaN for ``count`` updates (``nan``; default: every update from then on), which makes
    the loss and the all-reduced gradients NaN on every rank. Only the fault tests set it.
    """
    if not text.strip():
        return None
    spec: dict[str, Any] = {"rank": 0, "update": 1, "kind": "raise", "count": 1 << 30}
    try:
        for part in text.split(","):
            key, value = (x.strip() for x in part.split("=", 1))
            if key not in spec:
                raise ValueError(key)
            spec[key] = value if key == "kind" else int(value)
    except ValueError:
        raise UserError(f"{FAULT_INJECT_ENV}={text!r}: expected rank=R,update=U[,kind=raise|kill|nan][,count=K]") from None
    if spec["kind"] not in ("raise", "kill", "nan"):
        raise UserError(f"{FAULT_INJECT_ENV}: kind must be raise, kill or nan, got {spec['kind']!r}")
    return spec


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived: save and leave."""


class Trainer:
    """Training state of one worker (rank). Rank 0 alone prints and writes files."""

    def __init__(self, cfg: TrainConfig, market: PreparedMarket, comm: Comm, run_dir: Path) -> None:
        self.cfg, self.market, self.comm, self.run_dir = cfg, market, comm, run_dir
        device = comm.device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
            torch.backends.cudnn.allow_tf32 = cfg.tf32
        env_device = device if cfg.env_device == "auto" else torch.device(cfg.env_device)
        self.device = device
        self.env = VectorStockTradingEnv(market, split="train", num_envs=cfg.num_envs, config=env_config(cfg),
                                         device=env_device, seed=cfg.seed + comm.rank * cfg.num_envs)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        self.model = build_model(cfg, market).to(device)
        self.model.window_kernel = cfg.window_kernel
        self.optimizer = build_optimizer(cfg, self.model, comm.world_size)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.scaler = torch.amp.GradScaler("cuda") if cfg.mixed_precision == "fp16" else None
        self.autocast = autocast_factory(cfg.mixed_precision, device)
        self.action_gen = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + 104729 * comm.rank + 1)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed * 6151 + 7877 * comm.rank + 2)
        self.buf = RolloutBuffer.allocate(cfg.n_steps, cfg.num_envs, (cfg.window, market.num_features),
                                          market.data.num_tickers, device)
        self.counters: dict[str, Any] = dict(update=0, global_step=0, episodes=0, best_score=-math.inf,
                                             bad_updates=0, skipped_steps=0, elapsed=0.0)
        obs, _ = self.env.reset(seed=cfg.seed + comm.rank * cfg.num_envs)
        self.next_obs = obs.to(device)
        self.next_start = torch.ones(cfg.num_envs, dtype=torch.bool, device=device)
        self.state = self.model.initial_state(cfg.num_envs, device)
        if cfg.resume:
            self._resume(resolve_resume(cfg.resume, run_dir))
        trained = torch.compile(self.model) if cfg.compile else self.model
        if comm.distributed:
            trained = DDP(trained, device_ids=[device.index] if device.type == "cuda" else None)
        self.trained = trained  # the loss forward goes through this (DDP when distributed)
        self.recent_returns: list[float] = []
        self.metrics_file = None
        self.tb = None
        self.stop_signal: int | None = None
        self.fault = parse_fault_spec(os.environ.get(FAULT_INJECT_ENV, ""))

    # ------------------------------------------------------------------ rollout
    def collect_rollout(self) -> torch.Tensor:
        """Fill ``self.buf`` with n_steps days of every env.

        :return: finished episodes' rows ``[k, 9]`` float64: the EPISODE_FIELDS, then this worker's rank.
        """
        cfg, buf, policy = self.cfg, self.buf, self.model
        buf.initial_state = tuple(s.clone() for s in self.state)
        ep_masks, ep_fields = [], []  # finished episodes stay on the device until the rollout ends
        reset_before = True  # some env's window is not its previous one moved on a day (host-known)
        with torch.no_grad(), self.autocast():
            for step in range(cfg.n_steps):
                buf.obs.record(step, self.next_obs, anchor=reset_before)
                buf.starts[step] = self.next_start
                action, log_prob, value, self.state = policy.act(self.next_obs, self.state, self.next_start,
                                                                 generator=self.action_gen)
                obs, reward, terminated, truncated, info = self.env.step(action.to(self.env.device))
                obs, reward = obs.to(self.device), reward.to(self.device)
                terminated, truncated = terminated.to(self.device), truncated.to(self.device)
                # The env decides episode ends on the host and sets "_episode" only on steps where some
                # env finished, so other steps need no device sync here.
                reset_before = "_episode" in info
                if reset_before:
                    # Time-limit cut: bootstrap from the final observation's value, evaluated for the
                    # truncated envs only (a second forward over all B envs would double this step).
                    cut = torch.nonzero(truncated).flatten()
                    if cut.numel():
                        final_obs = info["final_obs"].to(self.device).index_select(0, cut)
                        cut_state = tuple(s.index_select(1, cut) for s in self.state)
                        no_start = torch.zeros(cut.numel(), dtype=torch.bool, device=self.device)
                        final_value = policy.value(final_obs, cut_state, no_start)
                        reward = reward.index_add(0, cut, cfg.gamma * final_value.float())
                    ep = info["episode"]
                    ep_masks.append(info["_episode"].to(self.device))
                    ep_fields.append(torch.stack([ep[k].to(self.device, torch.float64) for k in EPISODE_FIELDS], dim=1))
                buf.actions[step] = action
                buf.log_probs[step] = log_prob
                buf.values[step] = value
                buf.rewards[step] = reward
                done = terminated | truncated
                buf.dones[step] = done
                self.next_obs, self.next_start = obs, done
        if not ep_masks:
            return torch.zeros((0, len(EPISODE_FIELDS) + 1), dtype=torch.float64)
        local = torch.cat(ep_fields)[torch.cat(ep_masks)].cpu()  # step-major, env order within a step
        return torch.cat([local, torch.full((local.shape[0], 1), float(self.comm.rank), dtype=torch.float64)], dim=1)

    # ------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        """Run updates until ``num_episodes`` episodes have finished over all workers; return the counters."""
        cfg, comm = self.cfg, self.comm
        steps_per_update = cfg.rollout_steps * comm.world_size
        est_updates = max(1, math.ceil(cfg.num_episodes * (self.env_episode_days() / steps_per_update)))
        if comm.master:
            self._open_outputs()
            self._log(f"[Rank 0] {self.layout_line}")
        self._install_signal_handlers()
        start = time.perf_counter() - self.counters["elapsed"]
        progress = self._progress_bar()
        try:
            while self.counters["episodes"] < cfg.num_episodes:
                if cfg.anneal_lr:
                    frac = max(0.0, 1.0 - self.counters["update"] / est_updates)
                    for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                        group["lr"] = base * frac
                t0 = time.perf_counter()
                rows = self.collect_rollout()
                if self.fault is not None:
                    self._inject_fault()
                with torch.no_grad(), self.autocast():
                    last_value = self.model.value(self.next_obs, self.state, self.next_start).float()
                advantages, returns = compute_gae(self.buf.rewards, self.buf.values, self.buf.dones, last_value,
                                                  cfg.gamma, cfg.gae_lambda)
                t1 = time.perf_counter()
                stats = ppo_update(self.trained, self.optimizer, self.buf, advantages, returns, cfg, comm,
                                   generator=self.shuffle_gen, autocast=self.autocast, scaler=self.scaler)
                t2 = time.perf_counter()
                all_rows = comm.all_gather_rows(rows)  # every rank sees every finished episode
                stop_flag = comm.all_reduce_sum(torch.tensor([float(self.stop_signal is not None)]))
                self.counters["update"] += 1
                self.counters["global_step"] += steps_per_update
                self.counters["episodes"] += all_rows.shape[0]
                self.counters["skipped_steps"] += stats.skipped_steps
                bad = stats.skipped_steps > 0 or not math.isfinite(stats.policy_loss)
                self.counters["bad_updates"] = self.counters["bad_updates"] + 1 if bad else 0
                self.counters["elapsed"] = time.perf_counter() - start
                sps = steps_per_update / max(t2 - t0, 1e-9)
                if comm.master:
                    self._record(all_rows, stats.as_dict(), sps, t1 - t0, t2 - t1, progress)
                self._maybe_checkpoint(all_rows, stopping=stop_flag.item() > 0)
                if self.counters["bad_updates"] >= cfg.max_bad_updates:
                    latest = self.run_dir / "latest.pt"
                    kept = (f"the last good checkpoint is kept: {latest}" if latest.is_file()
                            else "no checkpoint had been written yet")
                    raise UserError(f"stopped: {self.counters['bad_updates']} updates in a row had NaN/inf loss or "
                                    f"gradients (their optimizer steps were skipped); {kept}; try a lower "
                                    f"learning rate or --max_grad_norm")
                if stop_flag.item() > 0:
                    raise StopRequested()
            self.verify_replicas()
        except StopRequested:
            if comm.master:
                self._log("[Rank 0] stop requested: checkpoint saved, exiting")
        finally:
            if progress is not None:
                progress.close()
            self._close_outputs()
        return dict(self.counters)

    def verify_replicas(self) -> None:
        """Check that every rank holds the same weights (what DDP promises); raise if not."""
        if not self.comm.distributed:
            return
        with torch.no_grad():
            flat = torch.cat([p.detach().double().flatten() for p in self.model.parameters()])
            probe = torch.stack([flat.sum(), flat.square().sum(), (flat * torch.arange(flat.numel(), device=flat.device)).sum()])
        probes = self.comm.all_gather_rows(probe.cpu().unsqueeze(0))  # [world, 3]
        n = self.comm.world_size
        if not bool((probes == probes[0]).all()):
            raise RuntimeError("replicas diverged: ranks hold different weights after training")
        if self.comm.master:
            self._log(f"[Rank 0] replicas in sync: {n} ranks hold identical weights")

    def env_episode_days(self) -> float:
        days = self.cfg.episode_days or self.market.splits.train.num_days
        return float(min(days, self.market.splits.train.num_days))

    @property
    def layout_line(self) -> str:
        devices = str(self.device) if self.comm.world_size == 1 else f"{self.device.type} x {self.comm.world_size}"
        return (f"world size {self.comm.world_size} | backend {self.comm.backend} | devices {devices} | "
                f"{self.cfg.num_envs} envs per worker | policy {self.cfg.policy} | "
                f"{self.market.data.num_tickers} tickers, F={self.market.num_features}, T={self.cfg.window}")

    # ------------------------------------------------------------------ rank-0 output
    def _open_outputs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
        self.metrics_file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        if self.cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))

    def _close_outputs(self) -> None:
        if self.metrics_file is not None:
            self.metrics_file.close()
            self.metrics_file = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def _log(self, line: str) -> None:
        if self.comm.master:
            print(line, flush=True)

    def _progress_bar(self) -> Any:
        if not (self.comm.master and self.cfg.progress and sys.stdout.isatty()):
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.num_episodes, initial=min(self.counters["episodes"], self.cfg.num_episodes),
                    unit="ep", dynamic_ncols=True)

    def _record(self, rows: torch.Tensor, stats: dict[str, float], sps: float, rollout_s: float, update_s: float,
                progress: Any) -> None:
        c = self.counters
        first_episode = c["episodes"] - rows.shape[0]
        now = c["elapsed"]
        lines = []
        for i, row in enumerate(rows.tolist()):
            episode = first_episode + i + 1
            record = {"kind": "episode", "episode": episode, "global_step": c["global_step"], "rank": int(row[-1]),
                      **dict(zip(EPISODE_FIELDS, row[:-1], strict=True)), "time": now}
            record["length"] = int(record["length"])
            lines.append(json.dumps(record))
            self.recent_returns = (self.recent_returns + [record["return"]])[-100:]
            if self.tb is not None:
                for key in ("reward", "final_value", "return", "sharpe", "max_drawdown", "trades"):
                    self.tb.add_scalar(f"episode/{key}", record[key], episode)
            log_every = max(1, self.cfg.log_every)
            if (episode % log_every == 0 and episode <= self.cfg.num_episodes) or episode == self.cfg.num_episodes:
                message = (f"[Rank 0] Episode {episode}/{self.cfg.num_episodes} | reward {record['reward']:.2f} | "
                           f"trades {record['trades']:.0f} | value ${record['final_value']:,.2f} | "
                           f"return {record['return']:+.2%} | sharpe {record['sharpe']:.2f} | {sps:,.0f} steps/s")
                if progress is not None:
                    progress.write(message)
                else:
                    self._log(message)
        update = {"kind": "update", "update": c["update"], "global_step": c["global_step"], **stats,
                  "lr_clstm": self.optimizer.param_groups[0]["lr"],
                  "lr_actor_critic": self.optimizer.param_groups[1]["lr"], "steps_per_second": sps,
                  "rollout_seconds": rollout_s, "update_seconds": update_s, "time": now}
        lines.append(json.dumps(update))
        if self.tb is not None:
            for key, value in update.items():
                if key != "kind" and isinstance(value, float | int):
                    self.tb.add_scalar(f"train/{key}", value, c["global_step"])
        if self.metrics_file is not None:
            self.metrics_file.write("\n".join(lines) + "\n")
            self.metrics_file.flush()
        if progress is not None:
            progress.n = min(c["episodes"], self.cfg.num_episodes)
            progress.set_postfix_str(f"{sps:,.0f} steps/s")
            progress.refresh()

    # ------------------------------------------------------------------ checkpoints
    def _worker_state(self) -> dict[str, Any]:
        """Everything that makes this rank's next update bitwise reproducible."""
        state: dict[str, Any] = {
            "torch_rng": torch.get_rng_state(), "action_gen": self.action_gen.get_state(),
            "shuffle_gen": self.shuffle_gen.get_state(), "next_obs": self.next_obs.cpu(),
            "next_start": self.next_start.cpu(), "recurrent": [s.cpu() for s in self.state],
        }
        if hasattr(self.env, "state_dict"):
            state["env"] = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in self.env.state_dict().items()}
        return state

    def _maybe_checkpoint(self, rows: torch.Tensor, *, stopping: bool) -> None:
        """Save latest (and best/periodic) on rank 0; every rank takes part in gathering worker states.

        The decision uses only values identical on all ranks (global counters, the all-reduced stop flag),
        so the gather below is issued by every rank or by none.
        """
        cfg, c = self.cfg, self.counters
        if c["bad_updates"] > 0:
            return  # keep the last good checkpoint
        finished = c["episodes"] >= cfg.num_episodes
        crossed_period = cfg.save_every > 0 and (c["episodes"] // cfg.save_every) > ((c["episodes"] - rows.shape[0]) // cfg.save_every)
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
        payload = self.checkpoint_payload(worker_states)
        save_checkpoint(self.run_dir / "latest.pt", payload)
        if is_best:
            save_checkpoint(self.run_dir / "best.pt", payload)
        if crossed_period:
            save_checkpoint(self.run_dir / f"episode_{c['episodes']}.pt", payload)

    def _score(self) -> float | None:
        """Validation Sharpe of the deterministic policy when a validation split exists, else the mean
        return of the last 100 training episodes (None before any episode finished)."""
        if self.market.splits.validation is not None:
            run = evaluate_policy(self.model, self.market, "validation", env_config(self.cfg, full_episodes=True),
                                  device=self.device)
            return run.sharpe
        if not self.recent_returns:
            return None
        return float(sum(self.recent_returns) / len(self.recent_returns))

    def checkpoint_payload(self, worker_states: list[dict[str, Any]] | None) -> dict[str, Any]:
        model = unwrap(self.model)
        return {
            "format_version": FORMAT_VERSION,
            "config": {**self.cfg.to_dict(), "resume": ""},
            "model_config": dict(model.cfg.__dict__),
            "market_spec": self.market.to_spec(),
            "model_state": strip_prefixes({k: v.detach().cpu() for k, v in model.state_dict().items()}),
            "optimizer_state": self.optimizer.state_dict(),
            "scaler_state": self.scaler.state_dict() if self.scaler is not None else None,
            "counters": {k: (float(v) if isinstance(v, float) else v) for k, v in self.counters.items()},
            "worker_states": worker_states,
            "world_size": self.comm.world_size,
        }

    def _resume(self, path: Path) -> None:
        """Continue from ``path``; `train_cli.check_resume` already checked, before any worker started,
        that its tickers and model match this run."""
        ckpt = load_checkpoint(path, map_location="cpu")
        model = self.model
        model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        if self.scaler is not None and ckpt.scaler_state:
            self.scaler.load_state_dict(ckpt.scaler_state)
        self.counters.update(ckpt.counters)
        states = ckpt.worker_states or []
        if len(states) == self.comm.world_size:
            ws = states[self.comm.rank]
            torch.set_rng_state(ws["torch_rng"])
            self.action_gen.set_state(ws["action_gen"])
            self.shuffle_gen.set_state(ws["shuffle_gen"])
            self.next_obs = ws["next_obs"].to(self.device)
            self.next_start = ws["next_start"].to(self.device)
            self.state = tuple(s.to(self.device) for s in ws["recurrent"])
            if "env" in ws and hasattr(self.env, "load_state_dict"):
                self.env.load_state_dict(ws["env"])
        elif self.comm.master:
            self._log(f"[Rank 0] resuming {path} with world size {self.comm.world_size} (saved with "
                      f"{len(states)}): weights, optimizer and counters restored; environments start fresh")

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

    def _inject_fault(self) -> None:
        """The `parse_fault_spec` testing hook, run after the rollout of each update."""
        spec, update = self.fault, self.counters["update"] + 1
        if spec is None or spec["rank"] != self.comm.rank or not spec["update"] <= update < spec["update"] + spec["count"]:
            return
        if spec["kind"] == "raise":
            raise RuntimeError(f"injected fault ({FAULT_INJECT_ENV}) on rank {self.comm.rank} at update {update}")
        if spec["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        self.buf.rewards.fill_(float("nan"))
