"""Generator 3's tails against robust statistics (issue 58): its default market on seeds 0-9 has the stylized facts of
real daily stocks and their robust kurtoses (the median over tickers of the excess kurtosis, 6.1 on the development
data, and the same after winsorising 0.1% per side, 3.1); the robust statistics on hand-made arrays; and
``data generate --like`` (`envs.market_fit`) reproduces a file's robust kurtoses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from scipy.stats import mstats

from envs.data import MarketData
from envs.facts import Facts, excess_kurtosis, market_facts, winsorize
from envs.market_fit import fit_market
from envs.sources import load_market_data
from envs.synthetic import generate_market
from tests.conftest import REAL_STOCK_RANGES, assert_facts_of_real_stocks

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "data" / "stocks_daily_6_ohlcv.csv"

RANGES = REAL_STOCK_RANGES
"""Issue 48's ranges (`tests.conftest.REAL_STOCK_RANGES`), on every seed."""
ROBUST_TARGETS = {"median_kurtosis": 6.1, "winsorized_kurtosis": 3.1}
"""Issue 58: the development data's robust kurtoses; generator 3's means over seeds 0-9 within 25% of them."""
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def facts_by_seed() -> dict[int, Facts]:
    """The facts of generator 3's default market (30 tickers, 2,520 days) on seeds 0-9 (about 1.5 s in all)."""
    return {seed: market_facts(generate_market(seed=seed)) for seed in range(10)}


@pytest.mark.parametrize("seed", range(10))
def test_default_market_has_the_facts_of_real_daily_stocks(facts_by_seed, seed):
    assert_facts_of_real_stocks(facts_by_seed[seed], RANGES, seed)


@pytest.mark.parametrize("name", ROBUST_TARGETS)
def test_default_markets_robust_kurtoses_are_real_stocks(facts_by_seed, name):
    values = np.array([getattr(f, name) for f in facts_by_seed.values()])
    target = ROBUST_TARGETS[name]
    assert abs(values.mean() / target - 1) < TOLERANCE, (name, values)


def test_winsorising_replaces_floor_of_a_thousandth_of_the_days_per_side():
    rng = np.random.default_rng(0)
    for t, k in [(999, 0), (1000, 1), (2519, 2), (4537, 4)]:
        r = np.stack([rng.permutation(t).astype(np.float64), -rng.permutation(t).astype(np.float64)], axis=1)
        w = winsorize(r)
        ordered = np.sort(r, axis=0)
        for j in range(2):
            low, high = r[:, j] < ordered[k, j], r[:, j] > ordered[t - 1 - k, j]
            assert low.sum() == high.sum() == k
            assert (w[low, j] == ordered[k, j]).all() and (w[high, j] == ordered[t - 1 - k, j]).all()
            np.testing.assert_array_equal(w[~(low | high), j], r[~(low | high), j])
    # ties: the k-th smallest and the (k+1)-th are equal, so nothing moves
    flat = np.r_[np.zeros(3), np.arange(2000.0)][:, None]
    assert winsorize(flat)[:3].tolist() == [[0.0]] * 3


def test_robust_kurtoses_agree_with_scipy_and_are_zero_for_a_normal_law():
    rng = np.random.default_rng(1)
    heavy = rng.standard_t(3, (3000, 5))
    for j in range(5):
        expected = np.asarray(mstats.winsorize(heavy[:, j], limits=0.001))
        np.testing.assert_array_equal(winsorize(heavy)[:, j], expected)
        assert excess_kurtosis(winsorize(heavy))[j] == pytest.approx(stats.kurtosis(expected, bias=False))
    # winsorising 0.1% per side of a normal sample takes its excess kurtosis to about -0.08 (0 before)
    normal = rng.standard_normal((20000, 5))
    assert abs(np.median(excess_kurtosis(winsorize(normal)))) < 0.2
    assert abs(np.median(excess_kurtosis(normal))) < 0.2
    # through market_facts: medians over the tickers
    close = 100 * np.exp(np.cumsum(np.vstack([np.zeros((1, 5)), 0.01 * heavy]), axis=0))
    dates = np.datetime64("2000-01-03", "ns") + np.arange(len(close)) * np.timedelta64(1, "D")
    data = MarketData(dates, tuple("ABCDE"), close, close, close, close, np.zeros_like(close), close_only=True)
    facts = market_facts(data)
    r = np.diff(np.log(close), axis=0)
    assert facts.median_kurtosis == pytest.approx(np.median(stats.kurtosis(r, bias=False)))
    winsorized = [stats.kurtosis(np.asarray(mstats.winsorize(r[:, j], limits=0.001)), bias=False) for j in range(5)]
    assert facts.winsorized_kurtosis == pytest.approx(np.median(winsorized))
    assert facts.winsorized_kurtosis < facts.median_kurtosis


@pytest.fixture(scope="module")
def like_example() -> tuple[Facts, list[Facts]]:
    """The example file's facts and those of its fitted generator (the file's 6 tickers x 2,699 days) on seeds 0-9:
    one fit, about 10 s."""
    data = load_market_data(str(FIXTURE))
    model, facts = fit_market(data)
    fake = [
        market_facts(generate_market(num_tickers=data.num_tickers, num_days=data.num_days, seed=s, model=model))
        for s in range(10)
    ]
    return facts, fake


@pytest.mark.parametrize("name", ROBUST_TARGETS)
def test_like_reproduces_a_files_robust_kurtoses(like_example, name):
    """Issue 58: the median over seeds 0-9 of the fitted generator's robust kurtosis within 25% of the file's own."""
    facts, fake = like_example
    median = np.median([getattr(f, name) for f in fake])
    assert abs(median / getattr(facts, name) - 1) < TOLERANCE, (name, getattr(facts, name), median)


def test_like_keeps_the_clustering_the_leverage_and_the_selloffs(like_example):
    """The ACF(1) of |r| and the leverage are fitted too; correlations still rise in sell-offs on average (less than
    in the file: its heavy body with little clustering gets a short persistence, docs/data.md)."""
    facts, fake = like_example
    assert abs(np.median([f.abs_acf1 for f in fake]) - facts.abs_acf1) < 0.04
    assert np.median([f.leverage for f in fake]) < 0
    assert np.mean([f.selloff_corr - f.pair_corr for f in fake]) > 0
