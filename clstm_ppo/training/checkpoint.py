"""Checkpoints: atomic writes, safe loads, and finding the one to resume from.

Layout of a run folder (written by rank 0 only)::

    checkpoints/<run>/latest.pt        after every update that finished an episode
    checkpoints/<run>/best.pt          best validation score so far (training score without a validation split)
    checkpoints/<run>/episode_<n>.pt   every --save_every episodes
    checkpoints/<run>/config.json      the resolved config (no secrets: the config holds none)
    checkpoints/<run>/metrics.jsonl    one JSON object per finished episode / update

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)`` -- no pickled code runs on load. It is written to a temporary file in
the same folder, flushed and fsynced, then ``os.replace``d over the old one: a crash mid-write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envs.atomic import atomic_write
from envs.errors import UserError

FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format since torch 1.6
REQUIRED_KEYS = ("format_version", "config", "model_config", "market_spec", "model_state", "counters")


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
            raise UserError(f"{path} is not a clstm-ppo checkpoint: it holds Python objects other than tensors "
                            f"and plain data, which are not loaded for safety (weights_only)") from None
        raise UserError(f"{path} is not a readable clstm-ppo checkpoint (truncated or corrupt, "
                        f"{path.stat().st_size:,} bytes): {reason[:160]}") from None
    if not isinstance(raw, dict) or not all(k in raw for k in REQUIRED_KEYS):
        raise UserError(f"{path} is not a clstm-ppo checkpoint (missing {', '.join(k for k in REQUIRED_KEYS if not isinstance(raw, dict) or k not in raw)})")
    if raw["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {raw['format_version']}, this version reads {FORMAT_VERSION}")
    return Checkpoint(
        path=path, config=raw["config"], model_config=raw["model_config"], market_spec=raw["market_spec"],
        model_state=raw["model_state"], optimizer_state=raw.get("optimizer_state"),
        scaler_state=raw.get("scaler_state"), counters=raw["counters"], worker_states=raw.get("worker_states"),
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
