"""How many seeds the learning test needs: its chance of failing when the learner works, from measured seeds.

    PYTHONPATH=. python benchmarks/learning_test_size.py after-default.json after-sse41.json \
        --failures before-default.json before-sse41.json --seeds 4-10

Reads `benchmarks/demo_seeds.py` JSON files (one per kernel setting; each row a seed's held-out trained,
buy-and-hold, untrained and reference-trader Sharpe ratios, the last under the key ``oracle``; files written before
issue 70 hold the old fixed tilt there). A seed *fails* when its trained network trails buy-and-hold on its held-out
days under any of the files' settings (the same seed under another kernel is a related run, so the count is over
distinct seeds, the conservative one). With k failing seeds of n, the failure rate's one-sided 95%
Clopper-Pearson upper bound p_u is what the test is sized by, not the point estimate k / n.

The test (`tests/test_learning.py`) fails when any of its asserts does over its seeds: a reference less than
`MIN_ORACLE_EXCESS` above buy-and-hold, a one-sided 95% t lower bound of trained - buy-and-hold or of trained -
untrained at or below 0, or a share of the reference's excess under the test's 25%. Its chance of failing with m seeds
is simulated (100,000 draws, fixed seed): each of the m seeds fails with probability p_u, a passing seed is one of
the measured rows that passed, and a failing seed one of the failing rows (both drawn with replacement): those of
``--failures`` where given (e.g. the runs before a fix: a bad seed as bad as the bad seeds seen), else the files'
own, else the rows whose trained - buy-and-hold is in the lowest tenth (a stand-in, said in the output). The table
prints the chance for each m, beside the same at the point estimate.
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
    trained, bh, untrained, reference = (sample[..., i] for i in range(4))
    m = sample.shape[1]
    t = stats.t.ppf(0.95, m - 1)

    def lower(x: np.ndarray) -> np.ndarray:
        return x.mean(axis=1) - t * x.std(axis=1, ddof=1) / np.sqrt(m)

    room = reference.mean(axis=1) - bh.mean(axis=1)
    share = np.where(room >= MIN_ORACLE_EXCESS, (trained.mean(axis=1) - bh.mean(axis=1)) / room, -np.inf)
    no_room = (reference - bh < MIN_ORACLE_EXCESS).any(axis=1)
    return no_room | (lower(trained - bh) <= 0) | (lower(trained - untrained) <= 0) | (share < SHARE)


def chance_of_failing(passing: np.ndarray, failing: np.ndarray, rate: float, m: int, draws: int = 100_000) -> float:
    """The simulated chance that the test fails with ``m`` seeds when each fails with probability ``rate``: a seed is
    a row of ``passing`` or, with probability ``rate``, of ``failing`` (``[R, 4]`` each, `COLUMNS`)."""
    rng = np.random.default_rng(69)
    fails = rng.random((draws, m)) < rate
    sample = passing[rng.integers(0, len(passing), (draws, m))]
    sample[fails] = failing[rng.integers(0, len(failing), int(fails.sum()))]
    return float(test_fails(sample).mean())


def read_rows(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The rows (`COLUMNS`) of every seed in the files, and each row's seed."""
    tables, seeds = [], []
    for name in names:
        record = json.loads(Path(name).read_text())
        table = np.array([[r[c] for c in COLUMNS] for r in record["seeds"]])
        behind = table[:, 0] < table[:, 1]
        print(f"{name}: {int(behind.sum())}/{len(table)} seeds behind buy-and-hold ({record.get('commit', '?')})")
        tables.append(table)
        seeds += [r["seed"] for r in record["seeds"]]
    return np.concatenate(tables), np.array(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="benchmarks/demo_seeds.py --out files: the runs that size the test")
    parser.add_argument("--failures", nargs="*", default=[], help="files whose failing rows model a failing seed")
    parser.add_argument("--seeds", default="6-12", help="test sizes to print (the study's syntax)")
    args = parser.parse_args()
    table, seeds = read_rows(args.files)
    behind = table[:, 0] < table[:, 1]
    distinct = sorted(set(seeds.tolist()))
    k = len({s for s, b in zip(seeds.tolist(), behind, strict=True) if b})
    rate, bound = k / len(distinct), upper_bound(k, len(distinct))
    print(
        f"{k}/{len(distinct)} distinct seeds behind buy-and-hold under some setting: rate {rate:.1%}, one-sided 95% "
        f"upper bound {bound:.1%}"
    )
    passing = table[~behind]
    if args.failures:
        model, _ = read_rows(args.failures)
        failing = model[model[:, 0] < model[:, 1]]
        print(f"a failing seed: one of the {len(failing)} failing rows of --failures")
    elif behind.any():
        failing = table[behind]
    else:
        gap = table[:, 0] - table[:, 1]
        failing = table[gap <= np.quantile(gap, 0.1)]
        print(f"(no seed failed: a failing seed is one of the {len(failing)} rows of the lowest tenth)")
    print("\n| seeds | chance the test fails, rate at its upper bound | at the point estimate |")
    print("|---:|---:|---:|")
    for m in parse_seeds(args.seeds):
        print(
            f"| {m} | {chance_of_failing(passing, failing, bound, m):.2%} | "
            f"{chance_of_failing(passing, failing, rate, m):.2%} |"
        )


if __name__ == "__main__":
    main()
