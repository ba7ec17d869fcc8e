"""A study's choice, made by a rule fixed before the run (docs/learning.md sections 9-10, 17), not by hand.

    python benchmarks/choice_rule.py STUDY/cells.csv --by vary_ema_decay --rule highest-sharpe
    python benchmarks/choice_rule.py STUDY/cells.csv --by vary_trade_rate --rule lowest-turnover --min_sharpe 1.40
    python benchmarks/choice_rule.py A/cells.csv B/cells.csv --by vary_forecast_days vary_trade_rate \
        --rule lowest-turnover --min_sharpe 1.40 --flags

Groups the finished cells of one or more studies by the columns ``--by`` (``--vary`` settings; a column a study
lacks reads ``-``, its default), prints each group's mean Sharpe and mean turnover over its seeds to stderr, and the
chosen group to stdout (nothing where no group passes): the one column's value, or with ``--flags`` the group as
training flags (``--forecast_days 5 --trade_rate 0.25``; a ``-`` column is left out).

- ``highest-sharpe``: the group with the highest mean Sharpe;
- ``lowest-turnover``: among the groups whose mean Sharpe is at least ``--min_sharpe``, the lowest mean turnover.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path


def choose(cells: list[Path], by: list[str], rule: str, min_sharpe: float) -> tuple[str, ...] | None:
    """The chosen group (its values of the columns ``by``) of ``cells`` (studies' cells.csv) under ``rule``; None
    when none passes."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for path in cells:
        for row in csv.DictReader(path.open(encoding="utf-8")):
            if row["status"] == "done":
                groups.setdefault(tuple(row.get(column) or "-" for column in by), []).append(row)
    sharpe, turnover = {}, {}
    for key, rows in sorted(groups.items()):
        sharpe[key] = statistics.mean(float(r["sharpe"]) for r in rows)
        turnover[key] = statistics.mean(float(r["annual_turnover"]) for r in rows)
        name = ", ".join(f"{column} {value}" for column, value in zip(by, key, strict=True))
        print(
            f"  {name}: Sharpe {sharpe[key]:.2f}, turnover {turnover[key]:.0f}x over {len(rows)} seeds", file=sys.stderr
        )
    if rule == "highest-sharpe":
        return max(sharpe, key=sharpe.get) if sharpe else None
    passed = [key for key in sharpe if sharpe[key] >= min_sharpe]
    return min(passed, key=turnover.get) if passed else None


def as_flags(by: list[str], key: tuple[str, ...]) -> str:
    """``vary_trade_rate 0.25`` -> ``--trade_rate 0.25``; columns at their default (``-``) are left out."""
    return " ".join(
        f"--{column.removeprefix('vary_')} {value}" for column, value in zip(by, key, strict=True) if value != "-"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path, nargs="+", help="studies' cells.csv")
    parser.add_argument("--by", nargs="+", required=True, help="the columns that name the choice, e.g. vary_ema_decay")
    parser.add_argument("--rule", choices=("highest-sharpe", "lowest-turnover"), required=True)
    parser.add_argument("--min_sharpe", type=float, default=float("-inf"), help="lowest-turnover: the bar to pass")
    parser.add_argument("--flags", action="store_true", help="print the choice as training flags")
    args = parser.parse_args()
    key = choose(args.cells, args.by, args.rule, args.min_sharpe)
    if key is None:
        print("")
    elif args.flags:
        print(as_flags(args.by, key))
    else:
        print(" ".join(key))


if __name__ == "__main__":
    main()
