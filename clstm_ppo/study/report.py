"""A study's report from its folder: baselines on the traded days, statistics over the finished cells, and the files.

    study.md     the paper's Table 6 metrics per configuration with confidence intervals, every other metric, the
                 Sharpe differences against each baseline, a verdict per configuration in plain words, overfitting
    study.json   everything above, machine readable (with the spec, the schedule and each cell's metrics)
    cells.csv    one row per cell: status, error, seconds, metrics
    study.png    out-of-sample equity: per configuration the median over seeds with a 25-75% band, the baselines,
                 and a drawdown panel

Failed or unfinished cells are counted and listed; they are never averaged in.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clstm_ppo.evaluation.backtest import read_index
from clstm_ppo.evaluation.baselines import BUY_AND_HOLD, rule_baselines
from clstm_ppo.evaluation.report import jsonable
from clstm_ppo.study import analysis as A
from clstm_ppo.study.cell import read_status
from clstm_ppo.study.markets import load_markets, market_key
from clstm_ppo.study.spec import StudySpec
from envs.execution import Terms

UNTRAINED = "untrained"


def _traded(markets: list[Any]) -> tuple[range, np.ndarray]:
    """Traded day indices s_0 .. e and, for each, whether its window's turbulence stop fires that day."""
    days = range(markets[0].splits.test.start, markets[-1].splits.test.stop)
    turbulent = np.zeros(len(days), dtype=bool)
    for m in markets:  # each window decides on its days but the last, which the next window decides on
        for t in range(m.splits.test.start, m.splits.test.stop - 1):
            turbulent[t - days.start] = m.turbulence[t] >= m.turbulence_threshold
    return days, turbulent


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


def build_report(study_dir: Path, *, confidence: float = 0.95, n_boot: int = 5000) -> dict[str, Any]:
    """Compute the statistics and write study.md, study.json, cells.csv and study.png; return study.json."""
    spec = StudySpec.load(study_dir)
    base = spec.base_config
    markets = load_markets(study_dir / "prepared", market_key(base))
    data = markets[0].data
    days, turbulent = _traded(markets)
    dates = np.asarray(data.dates)[days.start : days.stop]
    close = np.asarray(data.close)[days.start : days.stop]
    terms = Terms.of(data, base.env.execution, base.env.risk_free).days(days.start, days.stop)  # the policies'
    rules = rule_baselines(
        close, terms, dates, turbulent, base.env.initial_amount, base.env.buy_cost_pct, base.env.sell_cost_pct
    )
    bench = rules[BUY_AND_HOLD].values
    baselines = {
        name: {
            "values": run.values,
            "metrics": A.curve_metrics(
                run.values,
                run.holdings_value,
                bench,
                trades=run.num_trades,
                costs=run.costs,
                traded_value=run.traded_value,
            ),
        }
        for name, run in rules.items()
    }
    for name, run in rules.items():
        baselines[name]["metrics"].update(A.exposure_profile(run.values, run.holdings_value, bench, turbulent))
    if spec.index:
        level = read_index(spec.index, dates)
        values = level / level[0] * base.env.initial_amount
        baselines["index"] = {"values": values, "metrics": A.curve_metrics(values, values, bench)}

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
            result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
            with np.load(folder / "result.npz", allow_pickle=False) as z:
                values, untrained = z["values"], z["untrained_values"]
                for record, prefix in ((result["policy"], ""), (result["untrained"], "untrained_")):
                    record.update(
                        A.exposure_profile(z[f"{prefix}values"], z[f"{prefix}holdings_value"], bench, turbulent)
                    )
            entry = {
                "cell": cell,
                "policy": result["policy"],
                "untrained": result["untrained"],
                "values": values,
                "untrained_values": untrained,
                "returns": A.returns_of(values),
                "untrained_returns": A.returns_of(untrained),
            }
            cells.append(entry)
            by_group.setdefault(cell.group, []).append(entry)
            row.update({k: v for k, v in result["policy"].items() if k in dict((t[0], 1) for t in A.TABLE)})
        rows.append(row)

    trials = A.add_deflated_sharpe(cells) if cells else {"num_trials": 0}
    for entry in cells:
        next(r for r in rows if r["cell"] == entry["cell"].name)["dsr"] = entry["policy"]["dsr"]
    keys = [t[0] for t in A.TABLE]
    groups: dict[str, Any] = {}
    for i, (group, entries) in enumerate(by_group.items()):
        policy_returns = np.stack([e["returns"] for e in entries])
        summary = A.seed_summary([e["policy"] for e in entries], keys, confidence=confidence, n_boot=n_boot, seed=i)
        untrained = A.seed_summary(
            [e["untrained"] for e in entries],
            [k for k in keys if k != "dsr"],
            confidence=confidence,
            n_boot=n_boot,
            seed=i,
        )
        against = {
            name: A.compare(
                policy_returns, A.returns_of(b["values"]), confidence=confidence, n_boot=max(500, n_boot // 5), seed=i
            )
            for name, b in baselines.items()
        }
        against[f"{UNTRAINED} {group}"] = A.compare(
            policy_returns,
            np.stack([e["untrained_returns"] for e in entries]),
            confidence=confidence,
            n_boot=max(500, n_boot // 5),
            seed=i,
        )
        groups[group] = {
            "seeds": [e["cell"].seed for e in entries],
            "summary": summary,
            "untrained": untrained,
            "vs": against,
            "verdict": A.verdict(
                group, summary, against[BUY_AND_HOLD], baselines[BUY_AND_HOLD]["metrics"]["sharpe"], confidence
            ),
        }
    between = _between_groups(by_group, confidence=confidence, n_boot=max(500, n_boot // 5))
    pbo = A.overfitting(np.stack([e["returns"] for e in cells], axis=1)) if len(cells) >= 4 else None
    best = max(cells, key=lambda e: e["policy"]["sharpe"]) if cells else None
    counts = {s: sum(r["status"] == s for r in rows) for s in ("done", "failed", "interrupted", "running", "new")}
    report = {
        "spec": spec.identity(),
        "confidence": confidence,
        "bootstrap": n_boot,
        "traded": {
            "first": str(dates[0])[:10],
            "last": str(dates[-1])[:10],
            "num_days": int(len(dates)),
            "turbulent_days": int(turbulent.sum()),
        },
        "cells": {"total": len(rows), **counts},
        "trials": trials,
        "baselines": {name: b["metrics"] for name, b in baselines.items()},
        "groups": groups,
        "between": between,
        "overfitting": pbo,
        "best_cell": None
        if best is None
        else {"cell": best["cell"].name, "sharpe": best["policy"]["sharpe"], "dsr": best["policy"]["dsr"]},
    }
    (study_dir / "study.json").write_text(json.dumps(jsonable(report), indent=2) + "\n", encoding="utf-8")
    pd.DataFrame(rows).to_csv(study_dir / "cells.csv", index=False)
    (study_dir / "study.md").write_text(_markdown(report, spec, rows), encoding="utf-8")
    _plot(study_dir / "study.png", dates, by_group, baselines)
    return report


def _between_groups(
    by_group: dict[str, list[dict[str, Any]]], *, confidence: float, n_boot: int
) -> list[dict[str, Any]]:
    """Every pair of configurations on the seeds both finished: the paired block-bootstrap interval of the
    Sharpe difference (first minus second; seed s of one paired with seed s of the other, days resampled)."""
    out = []
    names = list(by_group)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seeds_a = {e["cell"].seed: e for e in by_group[a]}
            seeds_b = {e["cell"].seed: e for e in by_group[b]}
            common = sorted(seeds_a.keys() & seeds_b.keys())
            if not common:
                continue
            d = A.compare(
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
        f"{a} ahead in {pair['seeds_beating']}/{pair['num_seeds']} paired seeds"
    )


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """The plain-words lines: one per configuration against buy-and-hold, then one per pair of configurations."""
    return [g["verdict"] for g in report["groups"].values()] + [
        between_verdict(pair, report["confidence"]) for pair in report.get("between", [])
    ]


def _markdown(report: dict[str, Any], spec: StudySpec, rows: list[dict[str, Any]]) -> str:
    c, t = report["cells"], report["traded"]
    base = spec.base
    lines = [
        "# Study",
        "",
        f"Data `{base['data']}`; traded {t['first']} .. {t['last']} ({t['num_days']} days, {t['turbulent_days']} "
        f"with the turbulence stop on), retrained {spec.retrain} ({spec.retrain_from} start), "
        f"{spec.validation_days} validation days per window; {base['num_episodes']} episodes for the first window"
        + (f", {spec.retrain_episodes} for later ones" if spec.retrain_episodes else "")
        + ".",
        f"Cells: {c['total']} ({c['done']} done, {c['failed']} failed, "
        f"{c['total'] - c['done'] - c['failed']} not finished); intervals are {report['confidence']:.0%} "
        f"(percentile bootstrap over seeds; paired stationary block bootstrap of daily returns for differences).",
        "",
        "## Verdicts",
        "",
        *[f"- {g['verdict']}" for g in report["groups"].values()],
        "",
        "## The paper's Table 6 metrics (mean over seeds [interval])",
        "",
        "| | CR | MER | MPB | APPT | SR | exposure |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    six = [
        ("cumulative_return", "pct"),
        ("max_earning_rate", "pct"),
        ("max_drawdown", "pct"),
        ("appt", "dollars"),
        ("sharpe", "ratio"),
        ("exposure", "pct"),
    ]
    for group, g in report["groups"].items():
        lines.append(
            f"| {group} ({len(g['seeds'])} seeds) | " + " | ".join(_ci(g["summary"][k], kind) for k, kind in six) + " |"
        )
        lines.append(f"| {UNTRAINED} {group} | " + " | ".join(_ci(g["untrained"][k], kind) for k, kind in six) + " |")
    for name, m in report["baselines"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k, math.nan), kind) for k, kind in six) + " |")
    rest = [t for t in A.TABLE if t[0] not in dict(six)]
    lines += [
        "",
        "## Every other metric (mean over seeds)",
        "",
        "| | " + " | ".join(col for _, col, _ in rest) + " |",
        "|---|" + "---:|" * len(rest),
    ]
    for group, g in report["groups"].items():
        lines.append(f"| {group} | " + " | ".join(_fmt(g["summary"][k]["mean"], kind) for k, _, kind in rest) + " |")
    for name, m in report["baselines"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k, math.nan), kind) for k, _, kind in rest) + " |")
    lines += [
        "",
        "## Sharpe difference against each baseline (paired block bootstrap, days and seeds resampled)",
        "",
        "| configuration | baseline | difference [interval] | seeds beating |",
        "|---|---|---:|---:|",
    ]
    for group, g in report["groups"].items():
        for name, d in g["vs"].items():
            lines.append(
                f"| {group} | {name} | {d['difference']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] | "
                f"{d['seeds_beating']}/{d['num_seeds']} |"
            )
    if report["between"]:
        lines += [
            "",
            "## Configurations against each other (paired by seed, block bootstrap of daily returns)",
            "",
            *[f"- {between_verdict(pair, report['confidence'])}" for pair in report["between"]],
        ]
    tr, pbo, best = report["trials"], report["overfitting"], report["best_cell"]
    lines += ["", "## Overfitting", ""]
    if best is not None:
        lines.append(
            f"- The best of {tr['num_trials']} cells, `{best['cell']}`, has Sharpe {best['sharpe']:.2f}; its "
            f"deflated Sharpe ratio (the probability that its true Sharpe is above what the best of "
            f"{tr['num_trials']} unskilled trials would show) is {best['dsr']:.2f}."
        )
    lines.append(
        f"- Probability of backtest overfitting (CSCV, {pbo['num_splits']} blocks, {pbo['num_configurations']} "
        f"cells): {pbo['pbo']:.2f}."
        if pbo
        else "- Probability of backtest overfitting: not computed "
        "(needs 4 or more finished cells and enough traded days)."
    )
    failed = [r for r in rows if r["status"] != "done"]
    if failed:
        lines += ["", "## Cells not in the statistics", ""]
        lines += [f"- `{r['cell']}`: {r['status']}" + (f": {r['error']}" if r.get("error") else "") for r in failed]
    lines += [
        "",
        "Files: `study.json` (everything), `cells.csv` (one row per cell), `study.png`, `cells/<cell>/report/`.",
        "",
    ]
    return "\n".join(lines)


def _plot(
    path: Path, dates: np.ndarray, by_group: dict[str, list[dict[str, Any]]], baselines: dict[str, dict[str, Any]]
) -> None:
    from matplotlib.figure import Figure

    from clstm_ppo.evaluation.metrics import drawdown_series

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
        dd.plot(x, -100 * drawdown_series(median), lw=1.4, color=line.get_color())
    for name, b in baselines.items():
        (line,) = ax.plot(x, b["values"], lw=1.2, ls="--", label=name)
        dd.plot(x, -100 * drawdown_series(b["values"]), lw=1.0, ls="--", color=line.get_color())
    ax.set_title("Out-of-sample walk-forward equity")
    ax.set_ylabel("portfolio value ($)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    dd.set_ylabel("drawdown (%)")
    dd.grid(alpha=0.3)
    fig.savefig(path)
