"""A study's report from its folder: baselines on the traded days, statistics over the finished cells, and the files
study.md, study.json (everything, machine readable), cells.csv (one row per cell) and study.png (docs/study.md, Output).

Failed or unfinished cells are counted and listed; they are never averaged in. Building the report adds the study and
its finished cells to the trials ledger (idempotently), whose count of trials on these days deflates the Sharpe ratios.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clstm_ppo.agent.evaluate import PolicyRun
from clstm_ppo.config import TrainConfig
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation import statistics as S
from clstm_ppo.evaluation.backtest import read_index
from clstm_ppo.evaluation.baselines import BUY_AND_HOLD, rule_baselines
from clstm_ppo.evaluation.holdout import describe, holdout_summary, iso_days
from clstm_ppo.evaluation.ledger import Ledger, TrialCount, count_trials, same_data_trials, same_data_tried
from clstm_ppo.evaluation.oracle import (
    REFERENCE,
    ReferencePolicy,
    SeedShare,
    choose_member,
    member_env,
    planted,
    seed_share_words,
    share_over_seeds,
)
from clstm_ppo.evaluation.report import write_json
from clstm_ppo.study import analysis as A
from clstm_ppo.study.cell import read_status, record_metrics, run_ensemble, walk_windows
from clstm_ppo.study.grid import Cell
from clstm_ppo.study.markets import load_markets, market_key, paper_stop_days, traded_window
from clstm_ppo.study.spec import StudySpec
from clstm_ppo.study.trials import StudyData, record_cells, record_study
from envs.data import MarketData
from envs.execution import Terms
from envs.features import PreparedMarket
from envs.oracle import Member, member_actions, require_planted_rule, signal_predictor

UNTRAINED = "untrained"


def _fmt(value: float, kind: str) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return {
        "pct": f"{100 * value:.1f}%",
        "ratio": f"{value:.2f}",
        "dollars": f"${value:,.0f}",
        "times": f"{value:.1f}x",
        "prob": f"{value:.2f}",
    }[kind]


def _ci(stat: dict[str, float], kind: str) -> str:
    if math.isnan(stat["lo"]):
        return _fmt(stat["mean"], kind)
    return f"{_fmt(stat['mean'], kind)} [{_fmt(stat['lo'], kind)}, {_fmt(stat['hi'], kind)}]"


def build_report(
    study_dir: Path, *, ledger: Ledger, confidence: float = 0.95, n_boot: int = S.BOOTSTRAP_DRAWS
) -> dict[str, Any]:
    """Compute the statistics and write study.md, study.json, cells.csv and study.png; return study.json.

    The study and its finished cells go into ``ledger`` first (module docstring); the number of configurations among
    its trials on these days is the m of each difference's Bonferroni interval.

    :param n_boot: the draws of every bootstrap of the report: the Sharpe intervals, the paired Sharpe differences
        and the intervals over seeds (default `S.BOOTSTRAP_DRAWS`, 10,000; tests pass fewer, and study.md states
        the count and each difference bound's Monte Carlo standard error either way).
    """
    spec = StudySpec.load(study_dir)
    base = spec.base_config
    rf = base.env.risk_free  # every ratio is on returns in excess of it
    markets = load_markets(study_dir / "prepared", market_key(base))
    data = markets[0].data
    days, turbulent = traded_window(markets)  # the policies' own stop days (none with the stop off)
    dates = np.asarray(data.dates)[days.start : days.stop]
    baselines = _baselines(spec, data, days, dates, paper_stop_days(markets))
    bench = baselines[BUY_AND_HOLD]["values"]
    reference = _add_reference(baselines, base, markets)
    cells, rows, by_group = _read_cells(study_dir, spec, bench, turbulent)
    study = record_study(ledger, study_dir, spec)
    record_cells(ledger, study_dir, spec, study, spec.cells())
    counted = _trials_on_these_days(ledger, study, data)
    _deflate(cells, rows, counted, M.excess_returns(bench, rf))
    tried = max(1, counted.num_configurations)  # the Bonferroni family: configurations on these days
    baseline_intervals = _baseline_intervals(baselines, rf, confidence=confidence, n_boot=n_boot)
    groups = _groups(study_dir, base, by_group, baselines, confidence=confidence, n_boot=n_boot, tried=tried)
    between = _between_groups(by_group, confidence=confidence, n_boot=n_boot)
    family = _judge(groups, between, baseline_intervals, confidence)
    report = {
        "spec": spec.identity(),
        "confidence": confidence,
        "bootstrap": n_boot,
        "traded": _traded(dates, turbulent),
        "data": {"fingerprint": study.fingerprint, "tickers": list(data.tickers)},
        "cells": {"total": len(rows), **_cell_counts(rows)},
        "trials": {**counted._asdict(), "ledger": str(ledger.path), "first": study.first, "last": study.last},
        "holdout": holdout_summary(ledger, data, str(iso_days(data)[markets[0].splits.train.start]), study.last),
        "multiple_comparisons": _multiple_comparisons(family, confidence, tried),
        "baselines": {name: b["metrics"] for name, b in baselines.items()},
        "reference": reference,
        "baseline_sharpe_intervals": baseline_intervals,
        "groups": groups,
        "between": between,
        "overfitting": A.overfitting(np.stack([e["returns"] for e in cells], axis=1)) if len(cells) >= 4 else None,
        "best_cell": _best_cell(cells),
    }
    write_json(study_dir / "study.json", report)
    pd.DataFrame(rows).to_csv(study_dir / "cells.csv", index=False)
    (study_dir / "study.md").write_text(_markdown(report, spec, rows), encoding="utf-8")
    _plot(study_dir / "study.png", dates, by_group, baselines)
    return report


def _baselines(
    spec: StudySpec, data: MarketData, days: range, dates: np.ndarray, turbulent: np.ndarray
) -> dict[str, dict[str, Any]]:
    """The baselines on the traded days (each rule, and the spec's index if any): equity curve and metrics;
    ``turbulent``: the days the paper's stop holds buy-and-hold with the stop in cash (`paper_stop_days`)."""
    env = spec.base_config.env
    rf = env.risk_free
    close = np.asarray(data.close)[days.start : days.stop]
    terms = Terms.of(data, env.execution, env.risk_free).days(days.start, days.stop)  # the policies'
    rules = rule_baselines(close, terms, dates, turbulent, env.initial_amount, env.buy_cost_pct, env.sell_cost_pct)
    bench = rules[BUY_AND_HOLD].values
    baselines = {}
    for name, run in rules.items():  # its curve's metrics, with trades and costs, and its exposure profile
        metrics = A.curve_metrics(
            run.values,
            run.holdings_value,
            bench,
            trades=run.num_trades,
            costs=run.costs,
            traded_value=run.traded_value,
            risk_free=rf,
        )
        metrics.update(A.exposure_profile(run.values, run.holdings_value, bench, turbulent))
        baselines[name] = {"values": run.values, "metrics": metrics}
    if spec.index:
        level = read_index(spec.index, dates)
        values = level / level[0] * env.initial_amount
        baselines["index"] = {"values": values, "metrics": A.curve_metrics(values, values, bench, risk_free=rf)}
    for b in baselines.values():
        b["metrics"].update(A.active_profile(b["values"], bench))
    return baselines


def _reference(base: TrainConfig, markets: list[PreparedMarket]) -> tuple[Member, PolicyRun]:
    """The reference trader of the planted signal (`clstm_ppo.evaluation.oracle`) on the study's traded days: its
    member chosen once, on the first window's training days (the days before any traded day), then traded through
    each window's days and env, the portfolio carried over, as a cell's trades are."""
    signal = require_planted_rule(base.data.source)
    first = markets[0]
    member = choose_member(first, base.env, signal_predictor(first.data, signal, first.splits.train)).member

    def acting(_: int, market: PreparedMarket) -> ReferencePolicy:
        predictor = signal_predictor(market.data, signal, first.splits.train)
        return ReferencePolicy(member_actions(predictor, [member.scale])[:, 0], market.splits.test.start)

    return member, walk_windows(markets, member_env(base.env, member.band), acting)


def _add_reference(
    baselines: dict[str, dict[str, Any]], base: TrainConfig, markets: list[PreparedMarket]
) -> dict[str, Any] | None:
    """On a planted market traded by weights, the yardstick its signal sets: add the reference trader (`_reference`)
    to ``baselines`` and return study.json's ``reference`` (its member, in words, and the training days it was
    chosen on). None on any other market."""
    if not (planted(base.data.source) and base.env.action_mode == "weights"):
        return None
    member, run = _reference(base, markets)
    baselines[REFERENCE] = {
        "values": run.values,
        "metrics": record_metrics(run, base, baselines[BUY_AND_HOLD]["values"]),
    }
    days, train = iso_days(markets[0].data), markets[0].splits.train
    return {
        "member": member._asdict(),
        "described": member.describe(),
        "chosen_on": {"first": str(days[train.start]), "last": str(days[train.stop - 1])},
    }


def _read_cells(
    study_dir: Path, spec: StudySpec, bench: np.ndarray, turbulent: np.ndarray
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Every cell's cells.csv row, and the finished cells' records (all of them, and by configuration)."""
    rf = spec.base_config.env.risk_free
    table = {t[0] for t in A.TABLE}
    cells, rows, by_group = [], [], {}
    for cell in spec.cells():
        folder = study_dir / "cells" / cell.name
        status = read_status(folder)
        row = {
            "cell": cell.name,
            "group": cell.group,
            "policy": cell.policy,
            "seed": cell.seed,
            **{f"vary_{k}": v for k, v in cell.variant},
            "status": status["status"],
            "error": status.get("error", ""),
            "seconds": status.get("seconds"),
            "train_seconds": status.get("train_seconds"),
        }
        if status["status"] == "done" and (folder / "result.json").is_file():
            entry, result = _finished_cell(folder, cell, bench, turbulent, rf)
            cells.append(entry)
            by_group.setdefault(cell.group, []).append(entry)
            row.update({k: v for k, v in result["policy"].items() if k in table})
            row.update(result.get("training", {}))  # final KL, clip fraction, training episodes' costs
        rows.append(row)
    return cells, rows, by_group


def _finished_cell(
    folder: Path, cell: Cell, bench: np.ndarray, turbulent: np.ndarray, rf: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished cell's record for the statistics (metrics, curves, excess returns) and its result.json."""
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    with np.load(folder / "result.npz", allow_pickle=False) as z:
        values, untrained = z["values"], z["untrained_values"]
        for record, prefix in ((result["policy"], ""), (result["untrained"], "untrained_")):
            record.update(A.exposure_profile(z[f"{prefix}values"], z[f"{prefix}holdings_value"], bench, turbulent))
            record.update(A.active_profile(z[f"{prefix}values"], bench))
    return {
        "cell": cell,
        "policy": result["policy"],
        "untrained": result["untrained"],
        "values": values,
        "untrained_values": untrained,
        "returns": M.excess_returns(values, rf),
        "untrained_returns": M.excess_returns(untrained, rf),
    }, result


def _trials_on_these_days(ledger: Ledger, study: StudyData, data: MarketData) -> TrialCount:
    """The ledger's count of trials on this study's days of this data (this study's included), with those recorded
    as tried outside it (``study tried``)."""
    where = dict(fingerprint=study.fingerprint, tickers=list(data.tickers), witness=study.witness)
    days = dict(first=study.first, last=study.last)
    return count_trials(same_data_trials(ledger, **where, **days), same_data_tried(ledger, **where, **days))


def _deflate(
    cells: list[dict[str, Any]], rows: list[dict[str, Any]], counted: TrialCount, bench_returns: np.ndarray
) -> None:
    """Add the deflated Sharpe ratios (by the ledger's count of trials) to each finished cell's metrics and row."""
    A.add_deflated_sharpe(cells, counted, bench_returns)
    for entry in cells:
        row = next(r for r in rows if r["cell"] == entry["cell"].name)
        row.update({k: entry["policy"][k] for k in A.DEFLATED})


def _baseline_intervals(
    baselines: dict[str, dict[str, Any]], rf: float, *, confidence: float, n_boot: int
) -> dict[str, dict[str, float]]:
    """Each baseline's Sharpe interval (days resampled: a baseline has no seeds)."""
    return {
        name: S.sharpe_interval(M.excess_returns(b["values"], rf), confidence=confidence, n_boot=n_boot, seed=k)
        for k, (name, b) in enumerate(baselines.items())
    }


def _groups(
    study_dir: Path,
    base: TrainConfig,
    by_group: dict[str, list[dict[str, Any]]],
    baselines: dict[str, dict[str, Any]],
    *,
    confidence: float,
    n_boot: int,
    tried: int,
) -> dict[str, Any]:
    """Per configuration: its statistics over seeds (`_group_statistics`, against every baseline but the reference
    trader, a yardstick rather than a comparison), the ensemble of its seeds where it has two or more, and on a
    planted market its share of the reference trader's edge over buy-and-hold (every seed trades the same days:
    buy-and-hold and the reference are one each)."""
    rf, bench = base.env.risk_free, baselines[BUY_AND_HOLD]["values"]
    compared = {name: b for name, b in baselines.items() if name != REFERENCE}
    groups: dict[str, Any] = {}
    for i, (group, entries) in enumerate(by_group.items()):
        groups[group] = g = _group_statistics(group, entries, compared, rf, confidence, n_boot, tried, i)
        if len(entries) >= 2:
            g["ensemble"] = _ensemble(study_dir, base, entries, bench, rf, confidence, n_boot, i)
        if REFERENCE in baselines:
            sharpe = [e["policy"]["sharpe"] for e in entries]
            held, ref = (baselines[k]["metrics"]["sharpe"] for k in (BUY_AND_HOLD, REFERENCE))
            g["reference_share"] = share_over_seeds(sharpe, [held] * len(sharpe), [ref] * len(sharpe))._asdict()
    return groups


def _judge(
    groups: dict[str, Any],
    between: list[dict[str, Any]],
    baseline_intervals: dict[str, dict[str, float]],
    confidence: float,
) -> list[dict[str, Any]]:
    """Holm's correction over the study's comparisons (each configuration against each baseline and its untrained
    network, and every pair of configurations), then each configuration's verdict; return the family."""
    family = [d for g in groups.values() for d in g["vs"].values()] + between
    A.holm_family(family, confidence)
    for group, g in groups.items():
        g["verdict"] = A.verdict(
            group,
            g["summary"],
            g["sharpe_interval"],
            g["vs"][BUY_AND_HOLD],
            baseline_intervals[BUY_AND_HOLD],
            confidence,
        )
    return family


def _traded(dates: np.ndarray, turbulent: np.ndarray) -> dict[str, Any]:
    """study.json's ``traded``: first and last traded day, how many days, how many with the turbulence stop on."""
    return {
        "first": str(dates[0])[:10],
        "last": str(dates[-1])[:10],
        "num_days": int(len(dates)),
        "turbulent_days": int(turbulent.sum()),
    }


def _cell_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many cells are in each status."""
    return {s: sum(r["status"] == s for r in rows) for s in ("done", "failed", "interrupted", "running", "new")}


def _multiple_comparisons(family: list[dict[str, Any]], confidence: float, tried: int) -> dict[str, Any]:
    """study.json's ``multiple_comparisons``: Holm's family and level, and the Bonferroni m (``tried``, the
    configurations on these days) with its confidence level."""
    return {
        "method": "holm",
        "family_size": len(family),
        "alpha": 1.0 - confidence,
        "bonferroni_m": tried,
        "bonferroni_confidence": S.bonferroni_confidence(confidence, tried),
    }


def _group_statistics(
    group: str,
    entries: list[dict[str, Any]],
    baselines: dict[str, dict[str, Any]],
    rf: float,
    confidence: float,
    n_boot: int,
    tried: int,
    seed: int,
) -> dict[str, Any]:
    """One configuration's seeds, metric summaries (trained and untrained), Sharpe intervals and differences (each
    against a baseline and against its untrained network, with the Bonferroni interval for ``tried`` configurations)."""
    keys = [t[0] for t in A.TABLE]
    policy_returns = np.stack([e["returns"] for e in entries])
    untrained_returns = np.stack([e["untrained_returns"] for e in entries])
    boot: dict[str, Any] = {"confidence": confidence, "n_boot": n_boot, "seed": seed}  # every bootstrap here
    untrained = A.seed_summary([e["untrained"] for e in entries], [k for k in keys if k not in A.DEFLATED], **boot)
    against = {
        name: S.paired_sharpe_difference(policy_returns, M.excess_returns(b["values"], rf), family=tried, **boot)
        for name, b in baselines.items()
    }
    against[f"{UNTRAINED} {group}"] = S.paired_sharpe_difference(
        policy_returns, untrained_returns, family=tried, **boot
    )
    return {
        "seeds": [e["cell"].seed for e in entries],
        "summary": A.seed_summary([e["policy"] for e in entries], keys, **boot),
        "untrained": untrained,
        "sharpe_interval": S.sharpe_interval(policy_returns, **boot),
        "untrained_sharpe_interval": S.sharpe_interval(untrained_returns, **boot),
        "vs": against,
    }


def _best_cell(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """study.json's ``best_cell``: the finished cell with the highest Sharpe and its deflated Sharpe ratios."""
    if not cells:
        return None
    best = max(cells, key=lambda e: e["policy"]["sharpe"])
    return {"cell": best["cell"].name, "sharpe": best["policy"]["sharpe"], **{k: best["policy"][k] for k in A.DEFLATED}}


def _between_groups(
    by_group: dict[str, list[dict[str, Any]]], *, confidence: float, n_boot: int
) -> list[dict[str, Any]]:
    """Every pair of configurations on the seeds both finished: the paired block-bootstrap interval of the
    Sharpe difference (first minus second; seed s of one paired with seed s of the other, days resampled)."""
    out = []
    for a, b in itertools.combinations(by_group, 2):
        seeds_a = {e["cell"].seed: e for e in by_group[a]}
        seeds_b = {e["cell"].seed: e for e in by_group[b]}
        common = sorted(seeds_a.keys() & seeds_b.keys())
        if not common:
            continue
        d = S.paired_sharpe_difference(
            np.stack([seeds_a[s]["returns"] for s in common]),
            np.stack([seeds_b[s]["returns"] for s in common]),
            confidence=confidence,
            n_boot=n_boot,
            seed=len(out),
        )
        out.append({"first": a, "second": b, "seeds": common, **d})
    return out


def between_verdict(pair: dict[str, Any], confidence: float) -> str:
    """One line, e.g. "clstm vs mlp: Sharpe difference +0.41 [+0.12, +0.70]; clstm beats mlp; 10/12 seeds"."""
    a, b, lo, hi = pair["first"], pair["second"], pair["lo"], pair["hi"]
    if lo > 0:
        word = f"{a} beats {b} (the {confidence:.0%} interval lies above 0)"
    elif hi < 0:
        word = f"{b} beats {a} (the {confidence:.0%} interval lies below 0)"
    else:
        word = "no difference can be claimed (the interval includes 0)"
    return (
        f"{a} vs {b}: Sharpe difference {pair['difference']:+.2f} [{lo:+.2f}, {hi:+.2f}]; {word}; "
        f"{A.significance(pair)}; {a} ahead in {pair['seeds_beating']}/{pair['num_seeds']} paired seeds"
    )


def _configurations(trials: dict[str, Any]) -> str:
    count = trials["num_configurations"]
    return f"{count} configuration{'' if count == 1 else 's'}"


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """The plain-words lines: the trials count and the seals, one per configuration against buy-and-hold, then one
    per pair of configurations."""
    tr = report["trials"]
    return [
        f"these days have been traded by {_configurations(tr)} ({tr['num_trials']} trials) so far (ledger {tr['ledger']})",
        *[describe(entry) for entry in report.get("holdout", [])],
        *[g["verdict"] for g in report["groups"].values()],
        *reference_lines(report),
        *[between_verdict(pair, report["confidence"]) for pair in report.get("between", [])],
    ]


def reference_lines(report: dict[str, Any]) -> list[str]:
    """On a planted market: the reference trader's member and Sharpe on the study's days, its excess over
    buy-and-hold, and per configuration its share of that excess with a 95% t interval over the seeds and the paired
    test of share >= the target (`clstm_ppo.evaluation.oracle.seed_share_words`; the share n/a where the reference's
    excess is under 0.5)."""
    reference = report["baselines"].get(REFERENCE)
    if reference is None:
        return []
    held = report["baselines"][BUY_AND_HOLD]["sharpe"]
    chosen = report["reference"]
    lines = [
        f"on this planted market, the {REFERENCE} ({chosen['described']}, chosen on "
        f"{chosen['chosen_on']['first']} .. {chosen['chosen_on']['last']}) earns Sharpe {reference['sharpe']:.2f} after "
        f"costs on the same days, {reference['sharpe'] - held:+.2f} over buy-and-hold"
    ]
    for name, g in report["groups"].items():
        lines.append(f"{name}: {seed_share_words(SeedShare(**g['reference_share']))}")
    return lines


ENSEMBLE_KEYS = ("sharpe", "max_drawdown", "annual_turnover", "cumulative_return")


def _ensemble(
    study_dir: Path,
    base: Any,
    entries: list[dict[str, Any]],
    bench: np.ndarray,
    rf: float,
    confidence: float,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """The ensemble of one configuration's seeds (`clstm_ppo.study.cell.run_ensemble`): its metrics, its Sharpe
    interval (days resampled: it is one series) and the mean of its members' metrics beside them."""
    cells = [e["cell"] for e in entries]
    run = run_ensemble(study_dir, cells)
    return {
        "members": [c.name for c in cells],
        "metrics": record_metrics(run, cells[0].config(base), bench),
        "sharpe_interval": S.sharpe_interval(
            M.excess_returns(run.values, rf), confidence=confidence, n_boot=n_boot, seed=seed
        ),
        "members_mean": {k: float(np.mean([e["policy"][k] for e in entries])) for k in ENSEMBLE_KEYS},
    }


TABLE6 = tuple(t for t in A.TABLE if t[1] in ("CR", "MER", "MPB", "APPT", "SR", "exposure"))
"""The paper's Table 6 columns and the exposure (`A.TABLE` entries, in its order)."""


def _markdown(report: dict[str, Any], spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    lines = [
        *_md_head(report, spec),
        *_md_resampling(report),
        *_md_verdicts(report),
        *_md_sharpe_table(report),
        *_md_table6(report),
        *_md_other_metrics(report),
        *_md_baseline_differences(report),
        *_md_ensembles(report),
        *_md_pairs(report),
        *_md_overfitting(report),
        *_md_not_in_statistics(rows),
        "",
        "Files: `study.json` (everything), `cells.csv` (one row per cell), `study.png`, `cells/<cell>/report/`.",
        "",
    ]
    return "\n".join(lines)


def _md_head(report: dict[str, Any], spec: StudySpec) -> list[str]:
    c, t, tr = report["cells"], report["traded"], report["trials"]
    base = spec.base
    return [
        "# Study",
        "",
        f"Data `{base['data']}` (fingerprint `{report['data']['fingerprint']}`); traded {t['first']} .. {t['last']} "
        f"({t['num_days']} days, {t['turbulent_days']} with the turbulence stop on), retrained {spec.retrain} "
        f"({spec.retrain_from} start), {spec.validation_days} validation days per window; {base['num_episodes']} "
        f"episodes for the first window"
        + (f", {spec.retrain_episodes} for later ones" if spec.retrain_episodes else "")
        + ".",
        f"Cells: {c['total']} ({c['done']} done, {c['failed']} failed, "
        f"{c['total'] - c['done'] - c['failed']} not finished); intervals are {report['confidence']:.0%}, each "
        f"bootstrap of {report['bootstrap']:,} draws.",
        "",
        f"These days have been traded by {_configurations(tr)} ({tr['num_trials']} trials: "
        f"a configuration and a seed) so far, this study's included (trials ledger `{tr['ledger']}`).",
        *[f"Sealed hold-out: {describe(entry)}." for entry in report["holdout"]],
    ]


def _md_resampling(report: dict[str, Any]) -> list[str]:
    mc = report["multiple_comparisons"]
    c = f"{report['confidence']:.0%}"
    groups = list(report["groups"].values())
    block = groups[0]["sharpe_interval"]["mean_block"] if groups else None
    days = (
        f"the traded days by the stationary block bootstrap (blocks of {block:.0f} days on average, so runs of calm "
        f"and turbulent days stay together)"
        if block
        else "the traded days by the stationary block bootstrap"
    )
    return [
        "",
        "## What the intervals resample",
        "",
        f"- **Sharpe, days and seeds**: a {c} interval that resamples {days} and the seeds (with replacement): "
        "what a freshly trained seed could show on another stretch of market like this one. This is the headline "
        "interval.",
        f"- **Sharpe, seeds only**: a {c} percentile bootstrap over the seeds with the days held fixed: how much "
        "training runs differ on these very days. It leaves the market's noise out, so it is much narrower.",
        "- **Baselines** (buy-and-hold, the turbulence stop, 1/N, an index) have no seeds: their intervals resample "
        "the days only.",
        "- **Differences** (against a baseline, or between configurations paired by seed): the same resampled days "
        "for both sides (so the market's common moves cancel) and the seeds resampled; the p-value is the "
        "bootstrap's two-sided tail beyond 0.",
        f"- **Every other metric**: mean over seeds with a {c} percentile bootstrap over seeds (days fixed).",
        f"- **Verdicts** name the comparisons that survive Holm's family-wise correction over all {mc['family_size']} "
        f"comparisons of this study (each configuration against each baseline and its untrained network, and "
        f"every pair of configurations), at {mc['alpha']:.0%}; the unadjusted interval stays beside it.",
        f"- **Bonferroni**: beside each difference against a baseline or an untrained network, the same draws' "
        f"interval at {_level(mc['bonferroni_confidence'])} (1 - {mc['alpha']:.0%}/m), for the m = "
        f"{_configurations({'num_configurations': mc['bonferroni_m']})} the trials ledger has seen on these days: "
        "what the interval is worth once the configurations tried on these days are counted.",
        f"- **Monte Carlo error**: each bootstrap has {report['bootstrap']:,} draws, and another set of draws would "
        "move a bound by about its Monte Carlo standard error (order-statistic estimate: half the distance between "
        "the draws ranked B q - sqrt(B q (1 - q)) and B q + sqrt(B q (1 - q))). The differences' table gives each "
        "bound's (±); the other tables, their largest.",
    ]


def _md_verdicts(report: dict[str, Any]) -> list[str]:
    lines = [g["verdict"] for g in report["groups"].values()] + reference_lines(report)
    return ["", "## Verdicts", "", *[f"- {line}" for line in lines]]


def _md_sharpe_table(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Sharpe ratios",
        "",
        "| | Sharpe | days and seeds resampled | seeds only (days fixed) |",
        "|---|---:|---:|---:|",
    ]
    for group, g in report["groups"].items():
        for label, iv, seeds in (
            (f"{group} ({len(g['seeds'])} seeds)", g["sharpe_interval"], g["summary"]["sharpe"]),
            (f"{UNTRAINED} {group}", g["untrained_sharpe_interval"], g["untrained"]["sharpe"]),
        ):
            only = "n/a" if math.isnan(seeds["lo"]) else f"[{seeds['lo']:.2f}, {seeds['hi']:.2f}]"
            lines.append(f"| {label} | {iv['sharpe']:.2f} | [{iv['lo']:.2f}, {iv['hi']:.2f}] | {only} |")
    for name, iv in report["baseline_sharpe_intervals"].items():
        lines.append(f"| {name} | {iv['sharpe']:.2f} | [{iv['lo']:.2f}, {iv['hi']:.2f}] (days only) | n/a |")
    block = [iv for g in report["groups"].values() for iv in (g["sharpe_interval"], g["untrained_sharpe_interval"])]
    return [*lines, "", _largest_mcse(report, block + list(report["baseline_sharpe_intervals"].values()))]


def _md_table6(report: dict[str, Any]) -> list[str]:
    rows = []
    for group, g in report["groups"].items():
        rows.append((f"{group} ({len(g['seeds'])} seeds)", [_ci(g["summary"][k], kind) for k, _, kind in TABLE6]))
        rows.append((f"{UNTRAINED} {group}", [_ci(g["untrained"][k], kind) for k, _, kind in TABLE6]))
    head = "## The paper's Table 6 metrics (mean over seeds [interval over seeds, days fixed]; SR: see above)"
    return ["", head, "", *_md_grid(report, TABLE6, rows)]


def _md_other_metrics(report: dict[str, Any]) -> list[str]:
    rest = tuple(t for t in A.TABLE if t not in TABLE6)
    rows = [
        (group, [_fmt(g["summary"][k]["mean"], kind) for k, _, kind in rest]) for group, g in report["groups"].items()
    ]
    return [
        "",
        "## Every other metric (mean over seeds)",
        "",
        'PSR and DSR "vs 0" test a Sharpe ratio above 0; "vs B&H" test the active daily returns over '
        'equal-weight buy-and-hold on the same days (a long-only book in a rising market passes "vs 0" by its '
        f"exposure alone). The DSRs deflate by the {report['trials']['num_trials']} trials on these days in the ledger.",
        "",
        *_md_grid(report, rest, rows),
    ]


def _md_grid(report: dict[str, Any], columns: tuple[tuple[str, str, str], ...], rows: list[Any]) -> list[str]:
    """A markdown table of ``columns`` (`A.TABLE` entries) across: its header, ``rows`` (label, cells), then each
    baseline's row."""
    baselines = [
        (name, [_fmt(m.get(k, math.nan), kind) for k, _, kind in columns]) for name, m in report["baselines"].items()
    ]
    return [
        "| | " + " | ".join(col for _, col, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
        *(f"| {label} | " + " | ".join(cells) + " |" for label, cells in [*rows, *baselines]),
    ]


def _level(confidence: float) -> str:
    """A confidence level in percent with no trailing zeros: 0.95 -> "95%", 1 - 0.05 / 6 -> "99.17%"."""
    return f"{100 * confidence:.2f}".rstrip("0").rstrip(".") + "%"


def _bounds(d: dict[str, Any], suffix: str = "") -> str:
    """A difference's interval, each bound with ± its Monte Carlo standard error: "[-0.80 ±0.012, +0.31 ±0.009]"."""
    lo, hi = f"lo{suffix}", f"hi{suffix}"
    return f"[{d[lo]:+.2f} ±{d[lo + '_mcse']:.3f}, {d[hi]:+.2f} ±{d[hi + '_mcse']:.3f}]"


def _largest_mcse(report: dict[str, Any], intervals: list[dict[str, Any]]) -> str:
    """One line under a table: the bootstrap count and the largest Monte Carlo standard error of its bounds."""
    worst = max(max(iv["lo_mcse"], iv["hi_mcse"]) for iv in intervals)
    return (
        f"{report['bootstrap']:,} bootstrap draws; the Monte Carlo standard error of these bounds is at most "
        f"{worst:.3f} (each bound's is in `study.json`, `lo_mcse` and `hi_mcse`)."
    )


def _md_baseline_differences(report: dict[str, Any]) -> list[str]:
    mc, c = report["multiple_comparisons"], report["confidence"]
    m, wide = mc["bonferroni_m"], _level(mc["bonferroni_confidence"])
    lines = [
        "",
        "## Sharpe difference against each baseline (paired block bootstrap, days and seeds resampled)",
        "",
        f"{report['bootstrap']:,} bootstrap draws; each bound is followed by ± its Monte Carlo standard error (how "
        f"far another {report['bootstrap']:,} draws would typically move it). The Bonferroni column is the same "
        f"draws' interval at {wide} = 1 - {1 - c:.0%}/{m}, for the {_configurations({'num_configurations': m})} "
        f"the trials ledger has seen on these days; Holm's p is the correction the verdicts use.",
        "",
        f"| configuration | baseline | difference [{_level(c)} interval] | Bonferroni for m = {m} configuration"
        f"{'' if m == 1 else 's'} on these days ({wide}) | p | Holm p | survives Holm | seeds beating |",
        "|---|---|---:|---:|---:|---:|:---:|---:|",
    ]
    for group, g in report["groups"].items():
        for name, d in g["vs"].items():
            lines.append(
                f"| {group} | {name} | {d['difference']:+.2f} {_bounds(d)} | {_bounds(d, '_bonferroni')} | "
                f"{d['p_value']:.3f} | {d['p_holm']:.3f} | {'yes' if d['survives_holm'] else 'no'} | "
                f"{d['seeds_beating']}/{d['num_seeds']} |"
            )
    return lines


def _md_ensembles(report: dict[str, Any]) -> list[str]:
    ensembles = {group: g["ensemble"] for group, g in report["groups"].items() if "ensemble" in g}
    if not ensembles:
        return []
    lines = [
        "",
        "## Ensembles of the seeds (the seeds' selected checkpoints acting on the mean of their target weights)",
        "",
        "| configuration | Sharpe [days resampled] | members' mean Sharpe | max drawdown (members) | "
        "turnover/yr (members) | CR (members) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for group, e in ensembles.items():
        m, mm, iv = e["metrics"], e["members_mean"], e["sharpe_interval"]
        lines.append(
            f"| {group} ({len(e['members'])} seeds) | {iv['sharpe']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}] | "
            f"{mm['sharpe']:.2f} | {_fmt(m['max_drawdown'], 'pct')} ({_fmt(mm['max_drawdown'], 'pct')}) | "
            f"{_fmt(m['annual_turnover'], 'times')} ({_fmt(mm['annual_turnover'], 'times')}) | "
            f"{_fmt(m['cumulative_return'], 'pct')} ({_fmt(mm['cumulative_return'], 'pct')}) |"
        )
    return [*lines, "", _largest_mcse(report, [e["sharpe_interval"] for e in ensembles.values()])]


def _md_pairs(report: dict[str, Any]) -> list[str]:
    if not report["between"]:
        return []
    return [
        "",
        "## Configurations against each other (paired by seed, block bootstrap of daily returns)",
        "",
        *[f"- {between_verdict(pair, report['confidence'])}" for pair in report["between"]],
        "",
        _largest_mcse(report, report["between"]),
    ]


def _md_overfitting(report: dict[str, Any]) -> list[str]:
    pbo, best, tr = report["overfitting"], report["best_cell"], report["trials"]
    lines = ["", "## Overfitting", ""]
    if best is not None:
        lines.append(
            f"- The best cell of this study, `{best['cell']}`, has Sharpe {best['sharpe']:.2f}. Its deflated Sharpe "
            f"ratio, the probability that its true Sharpe is above what the best of the {tr['num_trials']} trials "
            f"on these days would show without skill (variance of their daily Sharpe ratios "
            f"{tr['sharpe_variance_daily']:.2e}), is {best['dsr']:.2f} vs 0 and {best['dsr_active']:.2f} on its "
            f"returns over buy-and-hold."
        )
    lines.append(
        f"- Probability of backtest overfitting (CSCV, {pbo['num_splits']} blocks, {pbo['num_configurations']} "
        f"cells): {pbo['pbo']:.2f}."
        if pbo
        else "- Probability of backtest overfitting: not computed "
        "(needs 4 or more finished cells and enough traded days)."
    )
    return lines


def _md_not_in_statistics(rows: list[dict[str, Any]]) -> list[str]:
    failed = [r for r in rows if r["status"] != "done"]
    if not failed:
        return []
    return [
        "",
        "## Cells not in the statistics",
        "",
        *[f"- `{r['cell']}`: {r['status']}" + (f": {r['error']}" if r.get("error") else "") for r in failed],
    ]


def _plot(
    path: Path, dates: np.ndarray, by_group: dict[str, list[dict[str, Any]]], baselines: dict[str, dict[str, Any]]
) -> None:
    from matplotlib.figure import Figure

    x = pd.to_datetime(dates).to_numpy()
    fig = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    ax, dd = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.3))
    for group, entries in by_group.items():
        v = np.stack([e["values"] for e in entries])
        median = np.median(v, axis=0)
        (line,) = ax.plot(x, median, lw=2.0, label=f"{group} (median of {len(entries)} seeds, 25-75% band)")
        ax.fill_between(
            x, np.percentile(v, 25, axis=0), np.percentile(v, 75, axis=0), color=line.get_color(), alpha=0.2
        )
        dd.plot(x, -100 * M.drawdown_series(median), lw=1.4, color=line.get_color())
    for name, b in baselines.items():
        (line,) = ax.plot(x, b["values"], lw=1.2, ls="--", label=name)
        dd.plot(x, -100 * M.drawdown_series(b["values"]), lw=1.0, ls="--", color=line.get_color())
    ax.set_title("Out-of-sample walk-forward equity")
    ax.set_ylabel("portfolio value ($)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    dd.set_ylabel("drawdown (%)")
    dd.grid(alpha=0.3)
    fig.savefig(path)
