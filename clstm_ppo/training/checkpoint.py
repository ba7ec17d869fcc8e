"""The run folder and its checkpoints: names, finding the run, atomic writes, safe loads, resume checks,
and rebuilding a checkpoint's policy and market. Every reader (backtest, study, trade) and the trainer
go through here.

Layout of a run folder (written by rank 0 only)::

    checkpoints/<run>/latest.pt        every --checkpoint_every updates, at the end and on a stop
    checkpoints/<run>/best.pt          best validation score so far (training score without a validation split)
    checkpoints/<run>/episode_<n>.pt   every --save_every episodes
    checkpoints/<run>/config.json      the resolved config (no secrets: the config holds none)
    checkpoints/<run>/metrics.jsonl    one JSON object per finished episode / update (`clstm_ppo.training.run_log`)

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)`` -- no pickled code runs on load. It is written to a temporary file in
the same folder, flushed and fsynced, then ``os.replace``d over the old one: a crash mid-write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from clstm_ppo.agent.model import ActorCritic, ModelConfig, model_config
from clstm_ppo.config import TrainConfig
from clstm_ppo.market import rebuild_market
from envs.atomic import atomic_write
from envs.data import MarketData
from envs.errors import UserError
from envs.features import PreparedMarket

FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format since torch 1.6
REQUIRED_KEYS = ("format_version", "config", "model_config", "market_spec", "model_state", "counters")
LATEST, BEST, CONFIG_FILE = "latest.pt", "best.pt", "config.json"


def episode_checkpoint_name(episodes: int) -> str:
    """File name of the periodic checkpoint kept after ``episodes`` finished episodes (--save_every)."""
    return f"episode_{episodes}.pt"


@dataclass
class Checkpoint:
    """A loaded checkpoint; see the module docstring for where each part comes from."""

    path: Path
    config: dict[str, Any]  # TrainConfig.to_dict()
    model_config: dict[str, Any]  # ModelConfig fields
    market_spec: dict[str, Any]  # PreparedMarket.to_spec(): tickers, normalisation, threshold, splits
    model_state: dict[str, torch.Tensor]  # raw ActorCritic state_dict (no module./_orig_mod. prefixes)
    optimizer_state: dict[str, Any] | None
    scaler_state: dict[str, Any] | None
    counters: dict[str, Any]  # global_step, update, episodes, best_score, ...
    worker_states: list[dict[str, Any]] | None  # per rank: RNG, env and recurrent state (exact resume)

    @cached_property
    def cfg(self) -> TrainConfig:
        """The run's settings; UserError when they do not parse (another version's or a damaged file)."""
        if not isinstance(self.config, dict):
            raise UserError(f"{self.path} is not a clstm-ppo checkpoint (its config is not a mapping)")
        return TrainConfig.from_checkpoint(self.config, source=f"checkpoint {self.path}")

    @property
    def tickers(self) -> list[str]:
        return [str(t) for t in self.market_spec["tickers"]]

    @property
    def window(self) -> int:
        """T, the observation window the policy was trained with (trading days)."""
        return int(self.market_spec["window"])

    @property
    def policy(self) -> str | None:
        return self.model_config.get("policy")


def strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove DDP's ``module.`` and torch.compile's ``_orig_mod.`` key prefixes."""
    out = {}
    for key, value in state.items():
        while key.startswith(("module.", "_orig_mod.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically to ``path`` (temp file in the same folder, fsync, os.replace)."""
    path = Path(path)
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except OSError as err:
        raise UserError(f"cannot write checkpoint {path}: {err.strerror or err}") from None
    return path


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete temporary files that `save_checkpoint` left when its process was killed mid-write.

    Call only when no other process writes checkpoints to ``folder`` (before training starts).
    """
    folder = Path(folder)
    stale = [p for p in folder.glob(".*.pt.*.tmp") if p.is_file()] if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load and check a checkpoint; every problem is a `UserError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as err:
        raise UserError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    if head != ZIP_MAGIC:  # torch.save writes a zip archive; anything else is some other file
        raise UserError(f"{path} is not a readable clstm-ppo checkpoint (not a file written by torch.save)")
    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch.load fails in many ways on a damaged archive (RuntimeError, OSError, ...)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, pickle.UnpicklingError) and "weights_only" in str(err):
            raise UserError(
                f"{path} is not a clstm-ppo checkpoint: it holds Python objects other than tensors "
                f"and plain data, which are not loaded for safety (weights_only)"
            ) from None
        raise UserError(
            f"{path} is not a readable clstm-ppo checkpoint (truncated or corrupt, "
            f"{path.stat().st_size:,} bytes): {reason[:160]}"
        ) from None
    if not isinstance(raw, dict) or not all(k in raw for k in REQUIRED_KEYS):
        raise UserError(
            f"{path} is not a clstm-ppo checkpoint (missing {', '.join(k for k in REQUIRED_KEYS if not isinstance(raw, dict) or k not in raw)})"
        )
    if raw["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {raw['format_version']}, this version reads {FORMAT_VERSION}")
    return Checkpoint(
        path=path,
        config=raw["config"],
        model_config=raw["model_config"],
        market_spec=raw["market_spec"],
        model_state=raw["model_state"],
        optimizer_state=raw.get("optimizer_state"),
        scaler_state=raw.get("scaler_state"),
        counters=raw["counters"],
        worker_states=raw.get("worker_states"),
    )


def resolve_resume(resume: str, run_dir: Path) -> Path:
    """Map ``--resume latest|best|PATH`` to a checkpoint file (UserError when there is none)."""
    if resume in ("latest", "best"):
        path = run_dir / f"{resume}.pt"
        if not path.is_file():
            raise UserError(f"--resume {resume}: no {path} (give --run_name of the run to resume, or a PATH)")
        return path
    path = Path(resume)
    if not path.is_file():
        raise UserError(f"--resume: checkpoint not found: {path}")
    return path


def open_checkpoint(path: str | Path) -> Checkpoint:
    """`load_checkpoint` on the CPU, then check that its config parses and its market spec names tickers and
    a window: what every reader (backtest, study, trade) needs before it trusts the file. UserError otherwise."""
    ckpt = load_checkpoint(path, map_location="cpu")
    spec = ckpt.market_spec
    if not isinstance(spec, dict):
        raise UserError(f"{ckpt.path} is not a clstm-ppo checkpoint (its market spec is not a mapping)")
    _ = ckpt.cfg  # parses, or names the problem
    if not isinstance(spec.get("tickers"), list) or not isinstance(spec.get("window"), int):
        raise UserError(f"{ckpt.path}: its market spec has no ticker list or window (not a clstm-ppo checkpoint?)")
    return ckpt


# ------------------------------------------------------------------------------------------- run folder


def _newest_run(checkpoint_dir: Path, name: str) -> Path | None:
    runs = sorted((p.parent for p in checkpoint_dir.glob(f"*/{name}")), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def resolve_run_dir(cfg: TrainConfig) -> Path:
    """The run folder: --run_name, or for --resume latest/best the newest run holding one, else a new name."""
    root = Path(cfg.checkpoint_dir)
    if cfg.run_name:
        return root / cfg.run_name
    if cfg.resume in ("latest", "best"):
        newest = _newest_run(root, f"{cfg.resume}.pt")
        if newest is None:
            raise UserError(f"--resume {cfg.resume}: no run in {root} has {cfg.resume}.pt")
        return newest
    return root / f"{cfg.policy}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_writable(folder: Path) -> None:
    """Fail before training when checkpoints could not be written (read-only folder, a file in the way)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the run folder {folder}: {err.strerror or err}") from None


def write_config(run_dir: Path, cfg: TrainConfig) -> Path:
    """The resolved settings as ``run_dir/config.json`` (they hold no secret: keys never enter a config)."""
    path = run_dir / CONFIG_FILE
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def _names(tickers: list[str], most: int = 6) -> str:
    return ", ".join(tickers[:most]) + (f", ... ({len(tickers)} in all)" if len(tickers) > most else "")


RESUME_MUST_MATCH = (
    "action_mode",
    "rebalance_band",
    "reward",
    "reward_scaling",
    "hmax",
    "initial_amount",
    "buy_cost_pct",
    "sell_cost_pct",
    "use_turbulence",
    "price_features",
    "portfolio_features",
)
"""Env settings that give an action or a reward its meaning: a resumed run must keep the checkpoint's."""


def _shown(value: object) -> object:
    """A setting as the user types it (an unbounded log-std is stored as None: shown as inf)."""
    return "inf" if value is None or value == float("inf") else value


def check_resume(cfg: TrainConfig, market: PreparedMarket, run_dir: Path) -> Path:
    """Fail in the parent, before any worker starts, when ``--resume`` cannot continue this run.

    :return: the checkpoint file (the trainer loads it again on every rank).
    """
    path = resolve_resume(cfg.resume, run_dir)
    ckpt = load_checkpoint(path)
    theirs, ours = [str(t) for t in ckpt.market_spec.get("tickers", [])], [str(t) for t in market.data.tickers]
    if theirs != ours:
        raise UserError(
            f"--resume {path}: it was trained on {len(theirs)} tickers ({_names(theirs)}) but this run's "
            f"data has {len(ours)} ({_names(ours)}); use the same --data/--tickers, or start a new run"
        )
    ours_model = model_config(cfg, market).__dict__
    stored = ModelConfig.from_dict(ckpt.model_config).__dict__
    flags = {f.name for f in fields(TrainConfig)}
    then = ckpt.cfg
    shown_as = {
        "next_day_head": "aux_coef",
        "obs_norm": "norm_obs",
    }  # model fields a flag decides: name the flag and its values
    diff = [
        f"--{shown_as[k]} {_shown(getattr(then, shown_as[k]))} (now {_shown(getattr(cfg, shown_as[k]))})"
        if k in shown_as
        else f"{'--' if k in flags else ''}{k} {_shown(stored.get(k))} (now {_shown(v)})"
        for k, v in ours_model.items()
        if stored.get(k) != v
    ]
    diff += [
        f"--{k} {_shown(getattr(then, k))} (now {_shown(getattr(cfg, k))})"
        for k in RESUME_MUST_MATCH
        if getattr(then, k) != getattr(cfg, k)
    ]
    if diff:
        raise UserError(
            f"--resume {path}: it was trained with {', '.join(diff)}; give the same settings, or start a new run"
        )
    return path


def load_weights(path: str | Path, cfg: TrainConfig, market: PreparedMarket) -> dict[str, torch.Tensor]:
    """The model weights of checkpoint ``path`` for a new run of ``cfg`` on ``market`` (--init_weights): UserError
    unless it holds the same model (variant, sizes, window, features) for the same tickers."""
    ckpt = load_checkpoint(path)
    if [str(t) for t in ckpt.market_spec.get("tickers", [])] != [str(t) for t in market.data.tickers]:
        raise UserError(f"--init_weights {path}: it trades other tickers than this run's data")
    ours, theirs = model_config(cfg, market).__dict__, ModelConfig.from_dict(ckpt.model_config).__dict__
    diff = [f"{k} {theirs.get(k)} (now {v})" for k, v in ours.items() if theirs.get(k) != v]
    if diff:
        raise UserError(f"--init_weights {path}: it holds another model: {', '.join(diff)}")
    return ckpt.model_state


# ------------------------------------------------------------------------------------------- contents


def checkpoint_payload(
    *,
    cfg: TrainConfig,
    model: ActorCritic,
    market: PreparedMarket,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    counters: dict[str, Any],
    worker_states: list[dict[str, Any]] | None,
    world_size: int,
) -> dict[str, Any]:
    """Everything a checkpoint holds (see `Checkpoint`); ``model`` is the raw ActorCritic (no wrappers)."""
    return {
        "format_version": FORMAT_VERSION,
        "config": {**cfg.to_dict(), "resume": ""},
        "model_config": dict(model.cfg.__dict__),
        "market_spec": market.to_spec(),
        "model_state": strip_prefixes({k: v.detach().cpu() for k, v in model.state_dict().items()}),
        "optimizer_state": optimizer.state_dict(),
        "scaler_state": scaler.state_dict() if scaler is not None else None,
        "counters": {k: (float(v) if isinstance(v, float) else v) for k, v in counters.items()},
        "worker_states": worker_states,
        "world_size": world_size,
    }


def restore_market(ckpt: Checkpoint, data: MarketData) -> PreparedMarket:
    """``ckpt``'s market over ``data``: its stored normalisation and turbulence threshold, never refitted."""
    try:
        return rebuild_market(data, ckpt.market_spec)
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"{ckpt.path}: its market spec is incomplete or invalid ({type(err).__name__}: {err})"
        ) from None


def restore_policy(ckpt: Checkpoint, market: PreparedMarket, device: torch.device | str = "cpu") -> ActorCritic:
    """The checkpoint's ActorCritic, weights loaded, in eval mode on ``device``; UserError on any mismatch."""
    path = ckpt.path
    try:
        model_cfg = ModelConfig.from_dict(ckpt.model_config)
    except TypeError as err:
        raise UserError(f"{path}: its model config does not fit this version ({err})") from None
    want = {"num_features": market.num_features, "num_tickers": market.num_tickers, "window": market.window}
    wrong = {k: (getattr(model_cfg, k), v) for k, v in want.items() if getattr(model_cfg, k) != v}
    if wrong:
        what = ", ".join(f"{k} {a} (market gives {b})" for k, (a, b) in wrong.items())
        raise UserError(f"{path}: the stored model does not fit its market spec: {what}")
    try:
        model = ActorCritic(model_cfg)
        model.load_state_dict(ckpt.model_state, strict=True)
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])[:300]
        raise UserError(
            f"{path}: stored weights do not match its model config ({model_cfg.policy}): {detail}"
        ) from None
    return model.to(device).eval()
