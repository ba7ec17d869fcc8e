"""How a study's job (a batch of cells, or one cell) is started as a process: its command line, its log and its
environment; the same on this machine (`clstm_ppo.study.runner`) and on a Ray node (`clstm_ppo.study.ray_jobs`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Protocol

DEVICE_ENV = "CLSTM_PPO_STUDY_DEVICE"  # set for each cell process: cpu or cuda


def job_command(study_dir: Path, names: list[str], threads: int) -> tuple[list[str], Path]:
    """The cell process of the cells ``names`` of ``study_dir`` (``clstm-ppo study _cell``) on ``threads`` torch
    threads, and its log: the first cell's log.txt, to which its output is appended (the others' log.txt say where
    it is). Makes the cells' folders."""
    for name in names:
        (study_dir / "cells" / name).mkdir(parents=True, exist_ok=True)
    log = study_dir / "cells" / names[0] / "log.txt"
    for name in names[1:]:
        with open(study_dir / "cells" / name / "log.txt", "a", encoding="utf-8") as note:
            note.write(f"trained in one batch with {', '.join(names)}: its output is in {log}\n")
    argv = [sys.executable, "-m", "clstm_ppo.cli", "study", "_cell", str(study_dir), ",".join(names)]
    return [*argv, "--threads", str(threads)], log


def job_env(device: str) -> dict[str, str]:
    """The cell process's environment: this one's, unbuffered output, and its device (``cpu`` or ``cuda``)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", DEVICE_ENV: device}


class Running(Protocol):
    """A running job as the study's pool sees it: a `subprocess.Popen` here, or a `clstm_ppo.study.ray_jobs.RayJob`."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, signum: int, /) -> None: ...

    def kill(self) -> None: ...
