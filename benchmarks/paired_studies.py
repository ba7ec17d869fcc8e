"""One configuration against another when they ran as two studies on the same days and seeds.

A study pairs its own configurations seed by seed (`clstm_ppo.study.report`), but settings the study owns, such as
``--num_episodes``, can only differ between studies. This script pairs the cells of two finished studies the same
way: seed s of one with seed s of the other, the same stationary block bootstrap over days and seeds
(`clstm_ppo.study.analysis.compare`), on daily returns in excess of each study's ``--risk_free``::

    python benchmarks/paired_studies.py studies/longer studies/reference [--n_boot 5000]
    python benchmarks/paired_studies.py studies/candidate "studies/earlier@clstm forecast_skip=False"  # one group

Prints the Sharpe difference (first minus second) with its interval, the p-value, and the seeds ahead. Both studies
must have traded the same days (same data, same trade dates, one walk-forward window set). ``STUDY@GROUP`` takes one
configuration (a ``group`` of its cells.csv) of a study that ran several.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.deploy_rule import trade  # noqa: E402
from clstm_ppo.study import analysis as A  # noqa: E402
from clstm_ppo.study.grid import Cell  # noqa: E402


def seed_returns(study: Path, deploy: str = "study", group: str = "") -> tuple[dict[int, np.ndarray], dict]:
    """``{seed: [D-1] daily excess returns}`` of a one-configuration study's finished cells (or of its configuration
    ``group``), and what it traded (study.json's traded days and data fingerprint). ``deploy``: "study" reads what
    the study traded; "best" or "last" trades that checkpoint of every window again (`deploy_rule.trade`)."""
    rows = [r for r in csv.DictReader((study / "cells.csv").open(encoding="utf-8")) if r["status"] == "done"]
    if group:
        if group not in {r["group"] for r in rows}:
            raise SystemExit(f"{study}: no finished cells of configuration {group!r}")
        rows = [r for r in rows if r["group"] == group]
    if len({r["group"] for r in rows}) != 1:
        raise SystemExit(f"{study}: expected one configuration, found {sorted({r['group'] for r in rows})}")
    spec = json.loads((study / "spec.json").read_text(encoding="utf-8"))
    risk_free = float(spec.get("base", {}).get("risk_free", 0.0) or 0.0)
    report = json.loads((study / "study.json").read_text(encoding="utf-8"))
    out = {}
    for r in rows:
        if deploy == "study":
            with np.load(study / "cells" / r["cell"] / "result.npz", allow_pickle=False) as z:
                out[int(r["seed"])] = A.returns_of(z["values"], risk_free)
        else:
            c = json.loads((study / "cells" / r["cell"] / "result.json").read_text(encoding="utf-8"))["cell"]
            run, _, _ = trade(study, Cell.from_dict(c), deploy)
            out[int(r["seed"])] = A.returns_of(run.values, risk_free)
    return out, {"traded": report["traded"], "data": report["data"]["fingerprint"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("first", help="a finished study folder, or STUDY@GROUP for one of its configurations")
    p.add_argument("second", help="the same for the configuration it is compared with")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--n_boot", type=int, default=5000)
    p.add_argument(
        "--deploy",
        default="study",
        choices=("study", "best", "last"),
        help="what each study traded, or every window's best.pt / latest.pt traded again (deploy_rule.py)",
    )
    args = p.parse_args(argv)
    first, second = (Path(s.partition("@")[0]) for s in (args.first, args.second))
    (a, days_a) = seed_returns(first, args.deploy, args.first.partition("@")[2])
    (b, days_b) = seed_returns(second, args.deploy, args.second.partition("@")[2])
    if days_a != days_b:
        print(f"paired_studies.py: the two studies did not trade the same days: {days_a} vs {days_b}", file=sys.stderr)
        return 2
    seeds = sorted(a.keys() & b.keys())
    d = A.compare(
        np.stack([a[s] for s in seeds]), np.stack([b[s] for s in seeds]), confidence=args.confidence, n_boot=args.n_boot
    )
    print(
        f"{Path(args.first).name} - {Path(args.second).name} ({args.deploy}): Sharpe difference {d['difference']:+.2f} "
        f"[{d['lo']:+.2f}, {d['hi']:+.2f}] (days and seeds resampled, {days_a['traded']['num_days']} days, {len(seeds)} seeds), "
        f"p {d['p_value']:.3f}, {d['seeds_beating']}/{d['num_seeds']} seeds ahead; "
        f"Sharpe {np.mean(d['policy_sharpe']):.2f} vs {np.mean(d['baseline_sharpe']):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
