"""A study's entries in the trials ledger (`clstm_ppo.evaluation.ledger`): the study itself (its data, traded
window and configurations) once, and each finished cell as a trial, as soon as the runner sees it finish.

Keys (what makes two records the same, so that re-reporting or re-running never counts a trial twice):

- a configuration: every training setting of the cell but its seed (and the settings that name files or only
  change the console), with the walk-forward schedule;
- a trial: its configuration, its seed, the data's fingerprint and the traded window;
- a study: its spec (without the data's path) and the data's fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clstm_ppo.config import OUTPUT_SETTINGS, SETTINGS
from clstm_ppo.evaluation import statistics as S
from clstm_ppo.evaluation.baselines import buy_and_hold
from clstm_ppo.evaluation.holdout import iso_days
from clstm_ppo.evaluation.ledger import Ledger, record
from clstm_ppo.evaluation.metrics import daily_returns, sharpe_from_returns
from clstm_ppo.migrate import LEGACY
from clstm_ppo.study.cell import read_status
from clstm_ppo.study.grid import Cell
from clstm_ppo.study.markets import load_markets, market_key, traded_window
from clstm_ppo.study.spec import SCHEDULE, StudySpec
from envs.data import MarketData
from envs.execution import Terms
from envs.fingerprint import data_fingerprint, market_witness

# Settings that do not change a cell's numbers, or name the data (which the fingerprint identifies instead).
NOT_SETTINGS = ("seed", "data", "log_every", *OUTPUT_SETTINGS)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_key(spec: StudySpec, cell: Cell) -> str:
    """The key of ``cell``'s configuration: its settings without the seed, and the study's schedule.

    A setting at the value a file without it is read as (`clstm_ppo.migrate.LEGACY`, else its default) is left
    out, so a release that adds a setting does not make every configuration in a ledger count again."""
    settings = cell.config(spec.base_config).to_dict()
    settings = {k: v for k, v in settings.items() if k not in NOT_SETTINGS and v != LEGACY.get(k, SETTINGS[k].default)}
    return _digest({"settings": settings, "schedule": {k: getattr(spec, k) for k in SCHEDULE}})


@dataclass(frozen=True)
class StudyData:
    """What the ledger needs to know about a study's market, read once from its ``prepared/`` folder."""

    key: str  # the study's ledger key
    data: MarketData  # every loaded day (training and traded)
    fingerprint: str  # `data_fingerprint` of it
    witness: dict[str, Any]  # `market_witness` of it
    dates: np.ndarray  # [D] "YYYY-MM-DD", the traded days
    benchmark: np.ndarray  # [D] dollars, equal-weight buy-and-hold on the traded days with the base costs

    @property
    def first(self) -> str:
        return str(self.dates[0])

    @property
    def last(self) -> str:
        return str(self.dates[-1])


def study_key(spec: StudySpec, fingerprint: str) -> str:
    """The key of a study: its spec without the data's path (and settings that do not change numbers), and the
    fingerprint of its data."""
    identity = spec.identity()
    identity.pop("data", None)
    identity["base"] = {k: v for k, v in identity["base"].items() if k not in NOT_SETTINGS}
    return _digest({"spec": identity, "fingerprint": fingerprint})


def study_data(study_dir: Path, spec: StudySpec) -> StudyData:
    """`StudyData` of the study in ``study_dir`` (its markets must be prepared)."""
    base = spec.base_config
    markets = load_markets(study_dir / "prepared", market_key(base))
    data = markets[0].data
    days, _ = traded_window(markets)
    terms = Terms.of(data, base.env.execution, base.env.risk_free).days(days.start, days.stop)  # the policies'
    bench = buy_and_hold(
        data.close[days.start : days.stop], terms, base.env.initial_amount, base.env.buy_cost_pct
    ).values
    fingerprint = data_fingerprint(data)
    return StudyData(
        key=study_key(spec, fingerprint),
        data=data,
        fingerprint=fingerprint,
        witness=market_witness(data),
        dates=iso_days(data)[days.start : days.stop],
        benchmark=bench,
    )


def study_record(study_dir: Path, spec: StudySpec, sd: StudyData) -> dict[str, Any]:
    """The ledger's study record: the data, the traded window and every configuration of the grid."""
    groups = {c.group: c for c in spec.cells()}
    return record(
        "study",
        sd.key,
        folder=str(study_dir.resolve()),
        source=spec.base.get("data", ""),
        fingerprint=sd.fingerprint,
        tickers=sorted(sd.data.tickers),
        witness=sd.witness,
        first=sd.first,
        last=sd.last,
        num_days=int(len(sd.dates)),
        schedule={k: getattr(spec, k) for k in SCHEDULE},
        configurations=[
            {"config": config_key(spec, c), "group": g, "policy": c.policy, "variant": dict(c.variant)}
            for g, c in groups.items()
        ],
    )


def trial_record(spec: StudySpec, cell: Cell, sd: StudyData, values: np.ndarray) -> dict[str, Any]:
    """The ledger's trial record of one finished cell from its stitched values ``[D]`` dollars on the traded days."""
    if len(values) != len(sd.benchmark):
        raise ValueError(f"cell {cell.name} has {len(values)} values for {len(sd.benchmark)} traded days")
    r, b = daily_returns(values), daily_returns(sd.benchmark)
    sharpe, active = sharpe_from_returns(r, spec.base_config.env.risk_free), S.information_ratio(r, b)
    config = config_key(spec, cell)
    return record(
        "trial",
        _digest({"config": config, "seed": cell.seed, "fingerprint": sd.fingerprint, "days": [sd.first, sd.last]}),
        config=config,
        study=sd.key,
        cell=cell.name,
        group=cell.group,
        seed=cell.seed,
        fingerprint=sd.fingerprint,
        first=sd.first,
        last=sd.last,
        num_days=int(r.size),
        sharpe=sharpe,
        sharpe_daily=S.to_daily_sharpe(sharpe),
        active_sharpe=active,
        active_sharpe_daily=S.to_daily_sharpe(active),
    )


def record_study(ledger: Ledger, study_dir: Path, spec: StudySpec) -> StudyData:
    """Append the study's record (once) and return its `StudyData` for `record_cells`."""
    sd = study_data(study_dir, spec)
    ledger.append([study_record(study_dir, spec, sd)])
    return sd


def record_cells(ledger: Ledger, study_dir: Path, spec: StudySpec, sd: StudyData, cells: list[Cell]) -> int:
    """Append a trial for each of ``cells`` that is done (once each); return how many were new."""
    new = []
    for cell in cells:
        folder = study_dir / "cells" / cell.name
        if read_status(folder)["status"] != "done" or not (folder / "result.npz").is_file():
            continue
        with np.load(folder / "result.npz", allow_pickle=False) as z:
            new.append(trial_record(spec, cell, sd, z["values"]))
    return ledger.append(new)
