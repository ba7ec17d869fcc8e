"""What a study costs beyond its training: cells per hour, and the study's own share of the cells' time.

    python benchmarks/study_overhead.py studies/leadlag [studies/memory ...]

Reads each finished study folder (``cells/<cell>/status.json``: started, finished, seconds, train_seconds) and
prints one table row per study: cells done, wall time from the first cell's start to the last cell's end,
cells per hour, the cells' summed seconds, of which training (the trainer's own loop, validation included),
and the rest (process start, loading the prepared market, the out-of-sample backtest and the untrained
baseline) as a share. The report's own time is printed by the study itself ("statistics and report in ...").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def study_row(folder: Path) -> dict[str, float]:
    """Cost figures of one study folder from its cells' status files."""
    done = []
    for status_file in sorted((folder / "cells").glob("*/status.json")):
        status = json.loads(status_file.read_text(encoding="utf-8"))
        if status.get("status") == "done" and status.get("train_seconds") is not None:
            done.append(status)
    if not done:
        raise SystemExit(f"error: {folder} has no finished cells")
    wall = max(s["finished"] for s in done) - min(s["started"] for s in done)
    cell_s = sum(s["seconds"] for s in done)
    train_s = sum(s["train_seconds"] for s in done)
    return {
        "cells": len(done),
        "wall_s": wall,
        "cells_per_hour": len(done) / wall * 3600,
        "cell_s": cell_s,
        "train_s": train_s,
        "overhead": (cell_s - train_s) / cell_s,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[1])
        return 2
    print("| study | cells done | wall s | cells/hour | cell s (sum) | training s | study's own share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in argv:
        r = study_row(Path(name))
        print(
            f"| {name} | {r['cells']} | {r['wall_s']:.0f} | {r['cells_per_hour']:.0f} | {r['cell_s']:.0f} | "
            f"{r['train_s']:.0f} | {r['overhead']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
