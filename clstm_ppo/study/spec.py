"""What a study is: the data and base settings, the grid and the walk-forward schedule, kept in ``spec.json``.

Everything that decides a cell's numbers is in the spec; how the work is spread (workers, shards) is not. A study
folder belongs to one spec: re-running with another grid or schedule on the same folder is refused, so finished
cells are never mixed with cells of another study. The one change a run may make is more seeds (every seed it had,
and others): each cell's numbers depend on its own seed only (up to a batch's float rounding), so the study grows
and its finished cells are kept.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clstm_ppo import migrate
from clstm_ppo.config import TrainConfig
from clstm_ppo.study.config import StudyConfig
from clstm_ppo.study.grid import Cell, build_grid
from envs.errors import UserError

SPEC_FILE = "spec.json"
SPEC_FORMAT = 1
SCHEDULE = ("trade_start", "trade_end", "retrain", "retrain_from", "validation_days", "retrain_episodes")


@dataclass
class StudySpec:
    """A study's identity (see the module docstring). ``variants`` holds each variant as [[setting, value], ...]."""

    base: dict[str, Any]  # TrainConfig.to_dict(): every cell's settings before its policy, seed and variant
    policies: list[str]
    seeds: list[int]
    variants: list[list[list[Any]]]
    trade_start: str
    trade_end: str  # "" = the data's last day
    retrain: str  # none | monthly | quarterly | yearly
    retrain_from: str  # warm | scratch
    validation_days: int
    retrain_episodes: int  # episodes per window after the first (0: the same as num_episodes)
    index: str = ""  # CSV of an index to compare with
    data: dict[str, Any] = field(default_factory=dict)  # what was loaded: tickers, first/last day (informational)
    format: int = SPEC_FORMAT
    run_settings: dict[str, Any] = field(default_factory=dict)  # how it last ran (`StudyConfig.run_settings`)

    @classmethod
    def of(cls, settings: StudyConfig, base: dict[str, Any]) -> StudySpec:
        """The spec of a study with ``settings`` (validated) over cells whose common settings are ``base``
        (`TrainConfig.to_dict`)."""
        return cls(
            base=base,
            policies=settings.policy_list,
            seeds=settings.seed_list,
            variants=[[list(kv) for kv in v] for v in settings.variants],
            **{k: getattr(settings, k) for k in (*SCHEDULE, "index")},
            run_settings=settings.run_settings(),
        )

    @property
    def base_config(self) -> TrainConfig:
        return TrainConfig.from_dict(self.base, source="the study's base settings")

    def cells(self) -> list[Cell]:
        """Every cell of the grid, in the stable order shards rely on."""
        return build_grid(self.policies, self.seeds, [tuple((k, v) for k, v in variant) for variant in self.variants])

    def identity(self) -> dict[str, Any]:
        """The fields that must agree for two runs to be the same study (the data description is checked too; how it
        ran, ``run_settings``, is not)."""
        return {k: v for k, v in asdict(self).items() if k != "run_settings"}

    def save(self, folder: Path) -> None:
        (folder / SPEC_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> StudySpec:
        path = folder / SPEC_FILE
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{folder} is not a study folder (no {SPEC_FILE})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{path} is not readable JSON: {err}") from None
        if not isinstance(values, dict):
            raise UserError(f"{path} is not a study spec (it must hold a JSON object)")
        if values.get("format") != SPEC_FORMAT:
            raise UserError(f"{path} has study format {values.get('format')!r}, this version reads {SPEC_FORMAT}")
        spec = cls(**migrate.study_spec(values))  # an earlier release's spec in this release's shape
        spec.base = spec.base_config.to_dict()  # each setting as this version writes it (e.g. "252" -> 252)
        return spec

    def check_same(self, other: StudySpec, where: Path, *, more_seeds: bool = False) -> bool:
        """UserError naming what differs when ``other`` (found in ``where``) is another study.

        :param more_seeds: accept ``other`` when it differs only by adding seeds to this one's (a study grown).
        :return: whether ``other`` adds seeds.
        """
        mine, theirs = self.identity(), other.identity()
        diff = sorted(k for k in mine if mine[k] != theirs.get(k))
        if more_seeds and diff == ["seeds"] and set(self.seeds) < set(other.seeds):  # a study grown
            return True
        if "base" in diff:
            base_diff = sorted(k for k in mine["base"] if mine["base"][k] != theirs["base"].get(k))
            diff = [d for d in diff if d != "base"] + [f"--{k}" for k in base_diff]
        if diff:
            raise UserError(
                f"{where} holds another study (it differs in {', '.join(diff)}); use a new --out, or "
                f"the same settings to continue it{' (seeds may only be added)' if more_seeds and 'seeds' in diff else ''}"
            )
        return False
