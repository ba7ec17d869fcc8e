"""Experiment tracking, as CleanRL's ``--track``: ``--track wandb`` sends a run to Weights & Biases (docs/training.md
"Experiment tracking").

Rank 0 alone opens one W&B run named after the run folder, logs the resolved settings once as its config, then every
scalar TensorBoard gets, at the same step: ``episode/<key>`` against ``episode`` and ``train/<key>`` against
``global_step``. The run's W&B id is kept in the run folder, so ``--resume`` continues the same W&B run. What is sent
holds no secret: Alpaca keys never enter the settings, and a data URL is sent without user:password or query string.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from clstm_ppo.config import TrainConfig, tracking_target
from envs.alpaca import redact_url
from envs.errors import UserError, first_line

RUN_ID_FILE = "wandb_run_id.txt"  # in the run folder: a resumed run logs to the same W&B run
STEP_METRICS = {"episode": "episode/*", "global_step": "train/*"}  # x-axis -> the scalars drawn against it


def check_tracking(track: str) -> None:
    """Refuse a tracker whose package is missing, in one line (before workers start). ``track`` is a validated
    ``--track`` (`clstm_ppo.config.parse_track` refused any other): every tracker but ``none`` is W&B."""
    if track != "none":
        try:
            import wandb  # noqa: F401  (0.7 s, paid only by runs that track)
        except ImportError:
            raise UserError(
                "--track wandb needs the wandb package: pip install 'clstm-ppo[wandb]' (or pip install wandb)"
            ) from None


class WandbTracker:
    """One W&B run: the settings once at the start, then scalars against their step counter."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        import wandb

        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
        if not run_id:
            run_id = secrets.token_hex(4)  # W&B's own id length; random, so two machines' "exp1" never merge
            id_file.write_text(run_id + "\n", encoding="utf-8")
        _, project, entity = tracking_target(cfg.run.track)
        config = cfg.to_dict()
        if config.get("data_url"):
            config["data_url"] = redact_url(config["data_url"])
        try:
            self.run = wandb.init(
                project=project,
                entity=entity or None,
                name=run_dir.name,
                id=run_id,
                resume="allow",
                config=config,
                dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
            )
        except Exception as err:  # wandb raises its own types for logins, projects and the network
            raise UserError(
                f"--track wandb: {first_line(err, 300)} (`wandb login`, or WANDB_MODE=offline to log locally)"
            ) from None
        for step, pattern in STEP_METRICS.items():
            self.run.define_metric(step)
            self.run.define_metric(pattern, step_metric=step)

    def log(self, scalars: dict[str, float], step_name: str, step: int) -> None:
        """``scalars`` (full names, e.g. ``train/policy_loss``) at ``step`` of the ``step_name`` counter."""
        self.run.log({**scalars, step_name: step})

    def close(self, failed: bool = False) -> None:
        """Finish the run (marked failed after an error; a stop by signal is a clean end, resumable)."""
        self.run.finish(exit_code=1 if failed else 0)


def open_tracker(cfg: TrainConfig, run_dir: Path) -> WandbTracker | None:
    """The tracker ``--track`` asks for (None for ``none``); call on rank 0 only, after the run folder exists."""
    check_tracking(cfg.run.track)
    return WandbTracker(cfg, run_dir) if cfg.run.track != "none" else None
