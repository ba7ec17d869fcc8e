"""Which checkpoint to deploy: each cell's validation-selected ``best.pt`` against its last weights ``latest.pt``.

A study trades one checkpoint per cell and window (``--deploy``). This script trades both, on the study's own days
and market (its ``prepared/`` arrays, the cell's env settings, the portfolio carried from window to window as the
study carries it), and pairs them cell by cell::

    python benchmarks/deploy_rule.py studies/a [studies/b ...] [--n_boot 5000]

Prints, per study and pooled over all of them (when they traded the same days), each rule's mean Sharpe with its
interval over days and cells (`statistics.sharpe_interval`), mean turnover (x a year) and exposure, and the paired
difference last - best (`statistics.paired_sharpe_difference`: the same stationary block bootstrap over days, cells
resampled too) with the cells ahead; then each configuration's ensemble of its seeds under each rule (its interval
resamples the days). A cell is one trained seed of one configuration; cells of different
configurations on the same days pool as further rows. Checks that the rule the study deployed reproduces its
``result.npz`` bit for bit (the two trades are the study's, not an approximation of it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.agent.evaluate import PolicyRun  # noqa: E402
from clstm_ppo.config import TrainConfig  # noqa: E402
from clstm_ppo.evaluation import statistics as S  # noqa: E402
from clstm_ppo.evaluation.report import BacktestResult  # noqa: E402
from clstm_ppo.study import analysis as A  # noqa: E402
from clstm_ppo.study.cell import record_metrics, run_ensemble, trade_deployed, traded_terms  # noqa: E402
from clstm_ppo.study.grid import Cell  # noqa: E402
from clstm_ppo.study.markets import load_markets, market_key  # noqa: E402
from clstm_ppo.study.spec import StudySpec  # noqa: E402
from clstm_ppo.training.run_folder import DEPLOY_RULES  # noqa: E402


def trade(study: Path, cell: Cell, rule: str) -> tuple[PolicyRun, dict[str, float], float]:
    """The cell's walk-forward trade with the checkpoints ``rule`` picks (`clstm_ppo.study.cell.trade_deployed`): its
    record, its metrics (as the study's cells table has them) and the study's --risk_free."""
    spec = StudySpec.load(study)
    cfg = cell.config(spec.base_config).with_settings(deploy=rule)
    markets = load_markets(study / "prepared", market_key(cfg))
    run = trade_deployed(study, [cell], cfg, markets, "cpu")
    return run, metrics_of(run, cfg, markets), cfg.env.risk_free


def metrics_of(run: PolicyRun, cfg: TrainConfig, markets: list) -> dict[str, float]:
    """A stitched walk-forward record's metrics, as the study's cells table has them (buy-and-hold on its days)."""
    result = BacktestResult.from_run(
        run,
        initial_amount=cfg.env.initial_amount,
        buy_cost_pct=cfg.env.buy_cost_pct,
        sell_cost_pct=cfg.env.sell_cost_pct,
        terms=traded_terms(markets, cfg),
    )
    return record_metrics(run, cfg, np.asarray(result.baseline_values))


def ensemble_lines(study: Path, cells: list[Cell], n_boot: int) -> str:
    """Markdown table rows: the seeds' ensemble of one configuration under each rule (`run_ensemble`), its Sharpe
    with the interval over days (one record: nothing else to resample), turnover and exposure."""
    spec = StudySpec.load(study)
    cfg = cells[0].config(spec.base_config)
    markets = load_markets(study / "prepared", market_key(cfg))
    lines = []
    for rule in DEPLOY_RULES:
        run = run_ensemble(study, cells, deploy=rule)
        metrics = metrics_of(run, cfg, markets)
        iv = S.sharpe_interval(A.returns_of(run.values, cfg.env.risk_free)[None, :], n_boot=n_boot)
        lines.append(
            f"| {study.name} | {rule}, ensemble of {len(cells)} ({cells[0].group}) | 1 | {iv['sharpe']:.2f} "
            f"[{iv['lo']:.2f}, {iv['hi']:.2f}] (days) | {metrics['annual_turnover']:.0f}x | {metrics['exposure']:.0%} |"
        )
    return "\n".join(lines)


def study_rows(study: Path) -> tuple[list[dict], list[str]]:
    """Per finished cell: both rules' daily excess returns and metrics (and the cell, under "cell_spec"). Also the
    traded dates (ISO days)."""
    spec = StudySpec.load(study)
    rows, dates = [], None
    for folder in sorted((study / "cells").iterdir()):
        result = folder / "result.json"
        if not result.is_file():
            continue
        cell = Cell.from_dict(json.loads(result.read_text(encoding="utf-8"))["cell"])
        row = {"cell": cell.name, "cell_spec": cell}
        for rule in DEPLOY_RULES:
            run, metrics, risk_free = trade(study, cell, rule)
            row[rule] = {"returns": A.returns_of(run.values, risk_free), **metrics}
            if rule == cell.config(spec.base_config).run.deploy:
                with np.load(folder / "result.npz", allow_pickle=False) as z:
                    if not np.array_equal(z["values"], run.values):
                        raise SystemExit(f"{folder}: --deploy {rule} does not reproduce the study's trade")
            dates = [str(d)[:10] for d in run.dates]
        rows.append(row)
    if not rows:
        raise SystemExit(f"{study}: no finished cell")
    return rows, dates


def summary(name: str, rows: list[dict], n_boot: int) -> str:
    """Markdown table rows: each rule, then last - best paired."""
    lines = []
    for rule in DEPLOY_RULES:
        r = np.stack([row[rule]["returns"] for row in rows])
        iv = S.sharpe_interval(r, n_boot=n_boot)
        turnover = np.mean([row[rule]["annual_turnover"] for row in rows])
        exposure = np.mean([row[rule]["exposure"] for row in rows])
        lines.append(
            f"| {name} | {rule} | {len(rows)} | {iv['sharpe']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}] | "
            f"{turnover:.0f}x | {exposure:.0%} |"
        )
    d = A.compare(
        np.stack([row["last"]["returns"] for row in rows]),
        np.stack([row["best"]["returns"] for row in rows]),
        confidence=0.95,
        n_boot=n_boot,
    )
    lines.append(
        f"| {name} | last - best | {len(rows)} | {d['difference']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] "
        f"({d['seeds_beating']}/{d['num_seeds']} ahead, p {d['p_value']:.3f}) | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", type=Path, nargs="+")
    p.add_argument("--n_boot", type=int, default=5000)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the studies' arithmetic (--threads 1), and no oversubscription beside a running study
    print("| study | deploy | cells | Sharpe [95%, days and cells] | turnover/yr | exposure |")
    print("|---|---|---:|---|---:|---:|")
    pooled, days = [], []
    for study in args.studies:
        rows, dates = study_rows(study)
        print(summary(study.name, rows, args.n_boot), flush=True)
        groups: dict[str, list[Cell]] = {}
        for row in rows:
            groups.setdefault(row["cell_spec"].group, []).append(row["cell_spec"])
        for cells in groups.values():
            if len(cells) > 1:
                print(ensemble_lines(study, cells, args.n_boot), flush=True)
        pooled += rows
        days.append(dates)
    if len(args.studies) > 1 and all(d == days[0] for d in days):
        print(summary("pooled", pooled, args.n_boot))
    elif len(args.studies) > 1:
        print("(not pooled: the studies traded different days)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
