"""The run folder (written by rank 0 only): its file names (docs/training.md lists what each holds), finding the
run to write or resume, checking it can be written, and ``config.json``. Checkpoint files themselves are
`clstm_ppo.training.checkpoint`'s.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

from clstm_ppo.config import RunConfig, TrainConfig
from envs.errors import UserError

LATEST, BEST, CONFIG_FILE = "latest.pt", "best.pt", "config.json"
METRICS_FILE = "metrics.jsonl"  # `clstm_ppo.training.run_log` writes it, `clstm_ppo.training.curves` reads it
DEPLOY_RULES = ("best", "last")  # --deploy: which checkpoint a finished run trades
TEMP_PATTERN = ".*.pt.*.tmp"  # what `envs.atomic.atomic_write` leaves when its process is killed mid-write


def deployed_checkpoint(run_dir: Path, has_validation: bool, deploy: str) -> Path:
    """The checkpoint a finished run in ``run_dir`` trades under ``--deploy``: ``best.pt`` (the highest validation
    score) for ``best`` when the run had a validation split and wrote one, else ``latest.pt`` (the last weights)."""
    if deploy not in DEPLOY_RULES:
        raise ValueError(f"deploy must be one of {DEPLOY_RULES}, got {deploy!r}")
    best = run_dir / BEST
    return best if deploy == "best" and has_validation and best.is_file() else run_dir / LATEST


def episode_checkpoint_name(episodes: int) -> str:
    """File name of the periodic checkpoint kept after ``episodes`` finished episodes (--save_every)."""
    return f"episode_{episodes}.pt"


def _timestamp() -> str:
    """Local time to the second, as generated run names carry it."""
    return time.strftime("%Y%m%d-%H%M%S")


def resolve_run_dir(run: RunConfig, policy: str) -> Path:
    """The run folder: --run_name, or for --resume latest/best the newest run holding one, else a new name
    ``<policy>-<timestamp>``."""
    root = Path(run.checkpoint_dir)
    if run.run_name:
        return root / run.run_name
    if run.resume in ("latest", "best"):
        runs = sorted((p.parent for p in root.glob(f"*/{run.resume}.pt")), key=lambda p: p.stat().st_mtime)
        if not runs:
            raise UserError(f"--resume {run.resume}: no run in {root} has {run.resume}.pt")
        return runs[-1]
    return root / f"{policy}-{_timestamp()}"


def claim_run_dir(run_dir: Path) -> Path:
    """Create a generated run folder (``<policy>-<timestamp>``) and return it: the first of NAME, NAME-2, NAME-3, ...
    that did not exist, so runs started in the same second from one shell loop never share a folder (mkdir is
    atomic). A folder that cannot be created is returned as it is, for `check_writable` to name the problem."""
    for k in itertools.count(1):
        candidate = run_dir if k == 1 else run_dir.with_name(f"{run_dir.name}-{k}")
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError:
            return run_dir
        return candidate
    raise AssertionError("unreachable")


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


def check_writable(folder: Path) -> None:
    """Fail before training when checkpoints could not be written (read-only folder, a file in the way)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the run folder {folder}: {err.strerror or err}") from None


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete temporary files that a checkpoint write left when its process was killed mid-write.

    Call only when no other process writes checkpoints to ``folder`` (before training starts).
    """
    folder = Path(folder)
    stale = [p for p in folder.glob(TEMP_PATTERN) if p.is_file()] if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_config(run_dir: Path, cfg: TrainConfig) -> Path:
    """The resolved settings as ``run_dir/config.json`` (they hold no secret: keys never enter a config)."""
    path = run_dir / CONFIG_FILE
    path.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path
