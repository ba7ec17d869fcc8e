"""The study's grid: policies x seeds x config variants, each combination one cell, and shards of it.

A cell is named by its settings (``clstm-s3`` or ``clstm-window=5-s3``), so the same grid always gives the same
cell folders and a re-run, a shard or a merge finds its cells by name.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from clstm_ppo.config import SETTINGS, TrainConfig, format_seeds, parse_seeds  # noqa: F401 (the grid's seed syntax)
from envs.errors import UserError

T = TypeVar("T")

# Settings that change the prepared market (so cells differing in them need their own market per window).
MARKET_KEYS = ("window", "price_features", "use_turbulence", "indicators")
# Settings a variant may not change: the data's (but the market keys), which the study loads once, and how one
# training run is laid out, which the study owns (one market per retraining window, one process per cell).
NOT_VARIABLE = frozenset(
    {s.flag for s in SETTINGS.values() if s.section == "data" and s.flag not in MARKET_KEYS}
    | {"run_name", "checkpoint_dir", "resume", "init_weights", "dry_run", "policy", "seed", "num_episodes"}
    | {"num_gpus", "num_workers", "backend", "master_port"}
)


@dataclass(frozen=True)
class Cell:
    """One walk-forward run: a policy variant, a seed and the setting overrides of a variant."""

    policy: str
    seed: int
    variant: tuple[tuple[str, Any], ...] = ()  # (setting, value) pairs, in --vary order

    @property
    def name(self) -> str:
        """Folder-safe id, e.g. ``clstm-window=5-s3``."""
        parts = [self.policy, *[f"{k}={v}" for k, v in self.variant], f"s{self.seed}"]
        return "-".join(parts).replace("/", "_").replace(" ", "")

    @property
    def group(self) -> str:
        """The configuration this cell is a seed of, e.g. ``clstm`` or ``clstm window=5``."""
        return " ".join([self.policy, *[f"{k}={v}" for k, v in self.variant]])

    def config(self, base: TrainConfig) -> TrainConfig:
        """``base`` with this cell's policy, seed and variant settings."""
        values = {**base.to_dict(), "policy": self.policy, "seed": self.seed, **dict(self.variant)}
        return TrainConfig.from_dict(values, source=f"cell {self.name}").validate()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, **asdict(self), "variant": dict(self.variant)}


def parse_variants(specs: list[str]) -> list[tuple[tuple[str, Any], ...]]:
    """``["window=5,30", "ent_coef=0,0.01"]`` -> the cartesian product of the settings, as variant tuples
    (``[()]`` when there is none). Values are parsed with the setting's type; unknown or data settings refused."""
    axes: list[list[tuple[str, Any]]] = []
    seen = set()
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not values.strip():
            raise UserError(f"--vary {spec!r}: expected SETTING=V1,V2,... (e.g. window=5,30)")
        if key not in SETTINGS:
            raise UserError(f"--vary {spec!r}: {key!r} is not a training setting (see train --help)")
        if key in NOT_VARIABLE:
            raise UserError(
                f"--vary {key}: the study sets {key} itself (use --policies/--seeds, or one study per data set)"
            )
        if key in seen:
            raise UserError(f"--vary {key} is given twice; list all its values once")
        seen.add(key)
        axis = []
        for raw in filter(None, (v.strip() for v in values.split(","))):
            parse = SETTINGS[key].parse
            try:
                value = (raw.lower() in ("1", "true", "yes")) if parse is bool else parse(raw)
            except ValueError:
                raise UserError(f"--vary {key}={raw!r} is not a valid {parse.__name__}") from None
            axis.append((key, value))
        axes.append(axis)
    return [tuple(combo) for combo in itertools.product(*axes)] if axes else [()]


def build_grid(policies: list[str], seeds: list[int], variants: list[tuple[tuple[str, Any], ...]]) -> list[Cell]:
    """Every cell, ordered policy, then variant, then seed (a stable order: shards and merges rely on it)."""
    return [Cell(p, s, v) for p in policies for v in variants for s in seeds]


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4): run the second of four deterministic slices; UserError for ``5/4``, ``0/3``, ``x``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if n < 1 or not 1 <= i <= n:
        raise UserError(f"--shard {text}: needs 1 <= I <= N (there are {n} shard(s), numbered from 1)")
    return i, n


def shard(jobs: list[T], index: int, count: int) -> list[T]:
    """The jobs (cells, or batches of cells: `clstm_ppo.study.batch.batches`) of shard ``index`` of ``count``
    (1-based): every count-th from the index-th, so each shard gets a mix of policies and seeds."""
    return jobs[index - 1 :: count]
