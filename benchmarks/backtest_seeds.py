"""Several seeds' backtests of one configuration on the same days, summarised as a study would summarise them.

For backtests made outside a study (``clstm-ppo backtest --out DIR`` of each seed's checkpoint, e.g. a ``shared``
policy traded with ``--new_universe`` on tickers it never saw)::

    python benchmarks/backtest_seeds.py BACKTEST_DIR [BACKTEST_DIR ...] [--n_boot 5000]
    python benchmarks/backtest_seeds.py A_s1 A_s2 ... --against B_s1 B_s2 ...   # and A minus B, paired by seed

Reads each folder's ``equity.csv`` (the policy's and equal-weight buy-and-hold's values, same costs and fills) and
``report.json``, and prints: the mean Sharpe with its interval over days and seeds (`statistics.sharpe_interval`),
buy-and-hold's with its interval over days, the paired difference (`statistics.paired_sharpe_difference`), how
many seeds beat buy-and-hold, and the mean turnover, costs and exposure. With ``--against``, another configuration's
backtests of the same seeds (in the same order) on the same days: the same line for it, and the paired difference of
the first configuration minus it, days and seeds resampled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.evaluation import metrics as M  # noqa: E402
from clstm_ppo.evaluation import statistics as S  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--n_boot", type=int, default=5000)
    p.add_argument(
        "--against", type=Path, nargs="+", default=[], help="another configuration's backtests, seed by seed"
    )
    args = p.parse_args(argv)
    if args.against and len(args.against) != len(args.folders):
        print("backtest_seeds.py: --against needs one backtest per seed of the first configuration", file=sys.stderr)
        return 2
    curves = [pd.read_csv(f / "equity.csv") for f in [*args.folders, *args.against]]
    if any(not c["date"].equals(curves[0]["date"]) for c in curves):
        print("backtest_seeds.py: the backtests did not trade the same days", file=sys.stderr)
        return 2
    first = summarise(args.folders, curves[: len(args.folders)], args.n_boot)
    if not args.against:
        return 0
    other = summarise(args.against, curves[len(args.folders) :], args.n_boot)
    diff = S.paired_sharpe_difference(first, other, n_boot=args.n_boot)
    print(
        f"first minus --against, paired by seed: {diff['difference']:+.2f} [{diff['lo']:+.2f}, {diff['hi']:+.2f}] "
        f"(days and seeds resampled), p {diff['p_value']:.3f}, first ahead in {diff['seeds_beating']}/{diff['num_seeds']}"
    )
    return 0


def summarise(folders: list[Path], curves: list[pd.DataFrame], n_boot: int) -> np.ndarray:
    """Print one configuration's line (module docstring); return its daily returns ``[S, D]``."""
    policy = np.stack([M.daily_returns(c["value"].to_numpy()) for c in curves])
    baseline = M.daily_returns(curves[0]["baseline_value"].to_numpy())
    own = S.sharpe_interval(policy, n_boot=n_boot)
    bench = S.sharpe_interval(baseline, n_boot=n_boot)
    diff = S.paired_sharpe_difference(policy, baseline, n_boot=n_boot)
    reports = [json.loads((f / "report.json").read_text(encoding="utf-8"))["metrics"]["policy"] for f in folders]
    exposure = np.mean([S.mean_exposure(c["value"], c["holdings_value"]) for c in curves])
    print(
        f"{len(curves)} seeds, {len(curves[0])} days {curves[0]['date'].iloc[0]} .. {curves[0]['date'].iloc[-1]}: "
        f"Sharpe {own['sharpe']:.2f} [{own['lo']:.2f}, {own['hi']:.2f}] (days and seeds resampled) | buy-and-hold "
        f"{bench['sharpe']:.2f} [{bench['lo']:.2f}, {bench['hi']:.2f}] (days) | difference {diff['difference']:+.2f} "
        f"[{diff['lo']:+.2f}, {diff['hi']:+.2f}], p {diff['p_value']:.3f}, {diff['seeds_beating']}/{diff['num_seeds']} "
        f"seeds beat it | turnover {np.mean([r['annual_turnover'] for r in reports]):.1f}x/yr, costs "
        f"${np.mean([r['total_costs'] for r in reports]):,.0f}, exposure {exposure:.0%}"
    )
    return policy


if __name__ == "__main__":
    sys.exit(main())
