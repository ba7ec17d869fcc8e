"""A study's choice, made by a rule fixed before the run (docs/learning.md sections 9-10), not by hand.

    python benchmarks/choice_rule.py STUDY/cells.csv --by vary_ema_decay --rule highest-sharpe
    python benchmarks/choice_rule.py STUDY/cells.csv --by vary_trade_rate --rule lowest-turnover --min_sharpe 1.40

Groups the study's finished cells by the column ``--by`` (a ``--vary`` setting), prints each group's mean Sharpe and
mean turnover over its seeds to stderr, and the chosen value to stdout (nothing where no group passes):

- ``highest-sharpe``: the value with the highest mean Sharpe;
- ``lowest-turnover``: among the values whose mean Sharpe is at least ``--min_sharpe``, the lowest mean turnover.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path


def choose(cells: Path, by: str, rule: str, min_sharpe: float) -> str:
    """The chosen value of column ``by`` in ``cells`` (a study's cells.csv) under ``rule``; "" when none passes."""
    groups: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(cells.open(encoding="utf-8")):
        if row["status"] == "done":
            groups.setdefault(row[by], []).append(row)
    sharpe, turnover = {}, {}
    for value, rows in sorted(groups.items()):
        sharpe[value] = statistics.mean(float(r["sharpe"]) for r in rows)
        turnover[value] = statistics.mean(float(r["annual_turnover"]) for r in rows)
        print(
            f"  {by} {value}: Sharpe {sharpe[value]:.2f}, turnover {turnover[value]:.0f}x over {len(rows)} seeds",
            file=sys.stderr,
        )
    if rule == "highest-sharpe":
        return max(sharpe, key=sharpe.get) if sharpe else ""
    passed = [v for v in sharpe if sharpe[v] >= min_sharpe]
    return min(passed, key=turnover.get) if passed else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path, help="a study's cells.csv")
    parser.add_argument("--by", required=True, help="the column that names the choice, e.g. vary_ema_decay")
    parser.add_argument("--rule", choices=("highest-sharpe", "lowest-turnover"), required=True)
    parser.add_argument("--min_sharpe", type=float, default=float("-inf"), help="lowest-turnover: the bar to pass")
    args = parser.parse_args()
    print(choose(args.cells, args.by, args.rule, args.min_sharpe))


if __name__ == "__main__":
    main()
