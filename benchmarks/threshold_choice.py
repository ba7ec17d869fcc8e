"""One threshold for several markets, chosen by a rule fixed before the runs (docs/learning.md section 20).

    python benchmarks/threshold_choice.py MEMORY.csv:49 LEADLAG.csv:88

Each argument is a `deploy_slower.py --shift_sd ... --csv` file and the most turnover a year allowed on that draw
(a third of the comparison's). For each K (the ``shift`` column, in spreads) the seeds' mean Sharpe and mean
turnover per file are printed to stderr; stdout gets the K with the highest mean over the files of their mean
Sharpes among the K whose mean turnover is within the allowance on every file, or nothing where none is.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd


def choose(tables: list[tuple[pd.DataFrame, float]]) -> float | None:
    """The chosen K of ``tables`` (each a deploy_slower csv and its turnover allowance), or None."""
    best: tuple[float, float] | None = None
    for k in sorted(set.intersection(*(set(t.loc[t["unit"] == "K", "shift"]) for t, _ in tables))):
        sharpes, within = [], True
        for table, allowed in tables:
            rows = table[(table["unit"] == "K") & (table["shift"] == k)]
            sharpe, turnover = rows["sharpe"].mean(), rows["annual_turnover"].mean()
            sharpes.append(sharpe)
            within &= turnover <= allowed
            print(f"  K {k:g}: Sharpe {sharpe:.2f}, turnover {turnover:.0f}x (allowed {allowed:g}x)", file=sys.stderr)
        mean = sum(sharpes) / len(sharpes)
        print(f"K {k:g}: mean Sharpe {mean:.2f}, {'within' if within else 'over'} the allowance", file=sys.stderr)
        if within and (best is None or mean > best[1]):
            best = (k, mean)
    return None if best is None else best[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+", help="CSV:ALLOWED_TURNOVER")
    args = p.parse_args()
    tables = []
    for item in args.tables:
        path, _, allowed = item.rpartition(":")
        tables.append((pd.read_csv(path), float(allowed)))
    k = choose(tables)
    if k is not None:
        print(f"{k:g}")


if __name__ == "__main__":
    main()
