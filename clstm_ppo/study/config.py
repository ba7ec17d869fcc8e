"""A study's own settings, typed: its grid, its walk-forward, how it runs and how it reports.

Each `StudyConfig` field is declared with `envs.config.setting` (its default and help text), as training's sections
are, and is a flag of ``clstm-ppo study`` (`add_study_flags`). The training flags beside them set the cells' common
settings; the study's spec (`clstm_ppo.study.spec.StudySpec`) is made from both and keeps what decides the cells'
numbers, and the rest of these settings beside it (``run_settings``). `ReportSettings`, the part a report uses
(confidence level, bootstrap draws, trials ledger), are the flags of ``study merge`` and ``study report``.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from clstm_ppo.config import POLICIES, scalar_type
from clstm_ppo.evaluation.statistics import BOOTSTRAP_DRAWS
from clstm_ppo.study.grid import parse_seeds, parse_shard, parse_variants
from clstm_ppo.study.schedule import RETRAIN
from envs.config import setting
from envs.errors import UserError

LEDGER_HELP = (
    "the trials ledger (JSON lines) that counts every configuration traded on the data's days and holds the seals "
    "(default: $CLSTM_PPO_LEDGER, else ~/.clstm_ppo/ledger.jsonl)"
)
BOOTSTRAP_HELP = (
    f"bootstrap draws of every interval and Sharpe difference of the report (default {BOOTSTRAP_DRAWS:,}; study.md "
    "states the count and each difference bound's Monte Carlo standard error)"
)
CONFIDENCE_HELP = "confidence level of every interval"
RUN_ONLY = ("out", "workers", "cells_per_gpu", "threads", "batch_cells", "cpu", "shard", "ray", "ledger", "unseal")
"""Settings that say where and how a study runs, never what a cell computes (kept beside the spec's identity)."""


@dataclass(frozen=True)
class ReportSettings:
    """How a study's report resamples and where it counts the trials: the flags of ``study merge`` and ``study
    report`` (a field's flag is its name), and the part of a `StudyConfig` its own report uses
    (`StudyConfig.report_settings`)."""

    confidence: float = setting(0.95, CONFIDENCE_HELP)
    bootstrap: int = setting(BOOTSTRAP_DRAWS, BOOTSTRAP_HELP)
    ledger: str = setting("", LEDGER_HELP)  # "": the default ledger (`clstm_ppo.evaluation.ledger.ledger_path`)

    def validate(self) -> ReportSettings:
        """UserError unless the confidence level is in (0, 1) and every bootstrap has at least 100 draws."""
        if not 0 < self.confidence < 1 or self.bootstrap < 100:
            raise UserError("--confidence must be in (0, 1) and --bootstrap at least 100")
        return self

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ReportSettings:
        """From the parsed flags of ``study merge`` or ``study report`` (`add_report_flags`), validated."""
        return cls(**{f.name: args[f.name] for f in fields(cls)}).validate()


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `ReportSettings` field, with its help and default."""
    for f in fields(ReportSettings):
        text = f.metadata["help"].replace("%", "%%")
        parser.add_argument(f"--{f.name}", type=scalar_type(f.type), default=f.default, help=text)


@dataclass(frozen=True)
class StudyConfig:
    """``clstm-ppo study``'s own settings (see the module docstring); a field's flag is its name."""

    out: str = setting("", "the study's folder (re-running the same command continues it); required")
    policies: str = setting("clstm,lstm,mlp", f"comma-separated policy variants to compare ({', '.join(POLICIES)})")
    seeds: str = setting(
        "1-4",
        "seeds per configuration: numbers and ranges, e.g. 1-8 or 1,3,5-7; more seeds on a study's folder grow it",
    )
    vary: tuple[str, ...] = setting(
        (), "a training setting to vary, SETTING=V1,V2 (repeatable: the grid is every combination), e.g. window=5,30"
    )
    trade_start: str = setting("", "first trading day of the out-of-sample walk-forward (YYYY-MM-DD); required")
    trade_end: str = setting("", "last trading day (default: the data's last day)")
    retrain: str = setting(
        "quarterly",
        "retrain every month, quarter or year on the window extended by the traded period; none: one training window "
        "up to --trade_start and one traded period (a single split)",
        choices=RETRAIN,
    )
    retrain_from: str = setting(
        "warm",
        "warm: each window's training starts from the previous window's selected weights; scratch: from the seed's "
        "random initial weights",
        choices=("warm", "scratch"),
    )
    validation_days: int = setting(
        63,
        "trading days at the end of each training window that select the checkpoint (best validation Sharpe); 0: no "
        "selection, the last weights trade (as in the paper; FinRL uses 3 months)",
    )
    retrain_episodes: int = setting(0, "training episodes for each window after the first (0: --num_episodes)")
    index: str = setting("", "CSV (date,value) of an index to compare with on the traded days")
    workers: int = setting(0, "cells run at once (0: visible GPUs x --cells_per_gpu, or CPU cores / --threads)")
    cells_per_gpu: int = setting(1, "cells sharing one GPU at a time (small models fit many)")
    threads: int = setting(0, "torch threads per CPU process (0: cores / workers)")
    batch_cells: int = setting(
        0,
        "train up to this many cells as one batch in one process: cells that differ only in their seed or in settings "
        "that change no shape (docs/study.md); 0: automatic, sized by each cell's work (small cells batch, large ones "
        "on the CPU train alone, no worker left waiting; at most 64 cells each); 1: every cell in its own process",
    )
    cpu: bool = setting(False, "run every cell on the CPU even when GPUs are visible")
    shard: str = setting(
        "",
        "run only the I-th of N deterministic slices of the grid (I/N, 1-based), e.g. one task of a SLURM job array; "
        "join the folders with `clstm-ppo study merge`",
    )
    ray: str = setting(
        "",
        "run the study's jobs on the Ray cluster at this address (HOST:PORT of its head, or auto: the one this machine "
        'is part of) instead of this machine\'s cores; needs pip install -e ".[ray]" here and on every node',
    )
    max_cells: int = setting(1000, "refuse a grid larger than this (a typo guard)")
    confidence: float = setting(0.95, CONFIDENCE_HELP)
    bootstrap: int = setting(BOOTSTRAP_DRAWS, BOOTSTRAP_HELP)
    ledger: str = setting("", LEDGER_HELP)
    unseal: bool = setting(
        False,
        "trade days sealed with `clstm-ppo study seal` anyway; the ledger records it and every report on those days "
        "says how many times they were unsealed",
    )

    # ------------------------------------------------------------------ parsed views
    @property
    def policy_list(self) -> list[str]:
        return [p.strip() for p in self.policies.split(",") if p.strip()]

    @property
    def seed_list(self) -> list[int]:
        return parse_seeds(self.seeds)

    @property
    def variants(self) -> list[tuple[tuple[str, Any], ...]]:
        return parse_variants(list(self.vary))

    @property
    def shard_of(self) -> tuple[int, int] | None:
        return parse_shard(self.shard) if self.shard else None

    @property
    def report_settings(self) -> ReportSettings:
        """The settings of the study's report: its confidence level, bootstrap draws and trials ledger."""
        return ReportSettings(confidence=self.confidence, bootstrap=self.bootstrap, ledger=self.ledger)

    def validate(self) -> StudyConfig:
        """Every rule between these settings, once; UserError naming the first broken one."""
        if not self.out:
            raise UserError("--out is required: the study's folder")
        if not self.trade_start:
            raise UserError("--trade_start is required: the first traded day (YYYY-MM-DD)")
        unknown = [p for p in self.policy_list if p not in POLICIES]
        if unknown or not self.policy_list:
            raise UserError(f"--policies {','.join(self.policy_list) or '(none)'}: choose among {', '.join(POLICIES)}")
        self.seed_list, self.variants, self.shard_of  # noqa: B018 (each parses, or says what is wrong)
        if self.validation_days < 0 or self.retrain_episodes < 0 or self.max_cells < 1:
            raise UserError("--validation_days and --retrain_episodes must be >= 0, --max_cells >= 1")
        self.report_settings.validate()
        if self.cells_per_gpu < 1 or self.threads < 0 or self.workers < 0 or self.batch_cells < 0:
            raise UserError("--workers, --threads and --batch_cells must be >= 0 and --cells_per_gpu >= 1")
        if self.ray and self.shard:
            raise UserError(
                "--ray runs the whole grid on the cluster; --shard splits it for schedulers without one: drop one"
            )
        if self.index and not Path(self.index).is_file():
            raise UserError(f"--index: file not found: {self.index}")
        return self

    def run_settings(self) -> dict[str, Any]:
        """The settings that say where and how the study ran (`RUN_ONLY`), as stored beside its spec."""
        return {k: v for k, v in asdict(self).items() if k in RUN_ONLY}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> StudyConfig:
        """From parsed flags (consumed from ``args``: the training flags stay), validated."""
        names = {f.name for f in fields(cls)}
        given = {k: args.pop(k) for k in list(args) if k in names}
        if "vary" in given:
            given["vary"] = tuple(given["vary"])
        return replace(cls(), **given).validate()


def add_study_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `StudyConfig` field, with its help and default, in a "study" group (the parser must use
    ``argument_default=argparse.SUPPRESS``: only the flags given override the defaults)."""
    group = parser.add_argument_group("study")
    for f in fields(StudyConfig):
        kind = scalar_type(f.type)
        text = f.metadata["help"].replace("%", "%%")
        text = text if "default" in text or f.default in ("", (), False) else f"{text} (default: {f.default})"
        if kind is bool:
            group.add_argument(f"--{f.name}", action="store_true", help=text)
        elif f.default == ():
            group.add_argument(f"--{f.name}", action="append", metavar="SETTING=V1,V2", help=text)
        else:
            group.add_argument(f"--{f.name}", type=kind, choices=f.metadata.get("choices"), help=text)
