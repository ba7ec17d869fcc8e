"""How many seeds the learning test needs: its chance of failing when the learner works, from measured seeds.

    PYTHONPATH=. python benchmarks/learning_test_size.py docs/studies/demo/robust-after-*.json --seeds 6-12

Reads `benchmarks/demo_seeds.py` JSON files (one per kernel setting or seed set; each row a seed's held-out trained,
buy-and-hold, untrained and oracle Sharpe ratios) and pools their rows. A seed *fails* when its trained network
trails buy-and-hold on its held-out days. With k failures among n rows, the failure rate's one-sided 95%
Clopper-Pearson upper bound p_u is what the test is sized by, not the point estimate k / n.

The test (`tests/test_learning.py`) fails when any of its asserts does over its seeds: an oracle less than
`MIN_ORACLE_EXCESS` above buy-and-hold, a one-sided 95% t lower bound of trained - buy-and-hold or of trained -
untrained at or below 0, or a share of the oracle's excess under the test's 25%. Its chance of failing with m seeds
is simulated (100,000 draws, fixed seed): each of the m seeds fails with probability p_u, a failing seed is one of
the measured failing rows and a passing seed one of the passing rows (both drawn with replacement), so a bad seed is
as bad as the bad seeds seen. Where no row failed, the failing rows are the measured rows whose trained - buy-and-hold
is in the lowest tenth (a stand-in, said in the output). The table prints the chance for each m, beside the same
with the point estimate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clstm_ppo.evaluation.oracle import MIN_ORACLE_EXCESS  # noqa: E402
from clstm_ppo.study.grid import parse_seeds  # noqa: E402

SHARE = 0.25
"""`tests/test_learning.py`'s share floor."""
COLUMNS = ("trained", "buy_and_hold", "untrained", "oracle")


def upper_bound(failures: int, rows: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper confidence bound of a rate with ``failures`` of ``rows``."""
    return 1.0 if failures >= rows else float(stats.beta.ppf(confidence, failures + 1, rows - failures))


def test_fails(sample: np.ndarray) -> np.ndarray:
    """``[S]`` whether the learning test fails on each of S draws of seeds ``sample [S, m, 4]`` (`COLUMNS`)."""
    trained, bh, untrained, oracle = (sample[..., i] for i in range(4))
    m = sample.shape[1]
    t = stats.t.ppf(0.95, m - 1)

    def lower(x: np.ndarray) -> np.ndarray:
        return x.mean(axis=1) - t * x.std(axis=1, ddof=1) / np.sqrt(m)

    room = oracle.mean(axis=1) - bh.mean(axis=1)
    share = np.where(room >= MIN_ORACLE_EXCESS, (trained.mean(axis=1) - bh.mean(axis=1)) / room, -np.inf)
    no_room = (oracle - bh < MIN_ORACLE_EXCESS).any(axis=1)
    return no_room | (lower(trained - bh) <= 0) | (lower(trained - untrained) <= 0) | (share < SHARE)


def chance_of_failing(rows: np.ndarray, failing: np.ndarray, rate: float, m: int, draws: int = 100_000) -> float:
    """The simulated chance that the test fails with ``m`` seeds when each fails with probability ``rate``."""
    rng = np.random.default_rng(69)
    passing = rows[~failing] if (~failing).any() else rows
    bad = rows[failing]
    fails = rng.random((draws, m)) < rate
    sample = passing[rng.integers(0, len(passing), (draws, m))]
    sample[fails] = bad[rng.integers(0, len(bad), int(fails.sum()))]
    return float(test_fails(sample).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="benchmarks/demo_seeds.py --out files to pool")
    parser.add_argument("--seeds", default="6-12", help="test sizes to print (the study's syntax)")
    args = parser.parse_args()
    rows, names = [], []
    for name in args.files:
        record = json.loads(Path(name).read_text())
        table = np.array([[r[c] for c in COLUMNS] for r in record["seeds"]])
        behind = table[:, 0] < table[:, 1]
        print(f"{name}: {int(behind.sum())}/{len(table)} seeds behind buy-and-hold ({record.get('commit', '?')})")
        rows.append(table)
        names.append(name)
    table = np.concatenate(rows)
    failing = table[:, 0] < table[:, 1]
    k, n = int(failing.sum()), len(table)
    rate, bound = k / n, upper_bound(k, n)
    print(f"pooled: {k}/{n} seeds behind buy-and-hold: rate {rate:.1%}, one-sided 95% upper bound {bound:.1%}")
    if k == 0:
        gap = table[:, 0] - table[:, 1]
        failing = gap <= np.quantile(gap, 0.1)
        print(f"(no seed failed: a failing seed is drawn from the {int(failing.sum())} rows of the lowest tenth)")
    print("\n| seeds | chance the test fails, rate at its upper bound | at the point estimate |")
    print("|---:|---:|---:|")
    for m in parse_seeds(args.seeds):
        print(
            f"| {m} | {chance_of_failing(table, failing, bound, m):.2%} | "
            f"{chance_of_failing(table, failing, rate, m):.2%} |"
        )


if __name__ == "__main__":
    main()
