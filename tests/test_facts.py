"""The stylized facts (`envs.facts`): issue 48's figures for the example file, measured independently when the issue
was written, the robust kurtoses (issue 58) against scipy's, and hand-worked cases of the pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.stats import mstats

from envs.facts import SELLOFF_LOOKBACK, abs_acf1, leverage, market_facts, next_day_corr, selloff_days
from envs.sources import load_market_data

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "data" / "stocks_daily_6_ohlcv.csv"


def test_the_example_file_has_issue_48s_facts():
    """Issue 48's table (two decimals): kurtosis 14.4, ACF(1) of |r| 0.17, pair corr 0.49, next-day cross corr
    0.034 / 0.102, overnight share 0.43 (the issue's figure is the ratio of summed variances; the mean of the tickers'
    ratios is 0.436)."""
    facts = market_facts(load_market_data(str(FIXTURE)))
    assert facts.kurtosis == pytest.approx(14.4, abs=0.05)
    assert facts.abs_acf1 == pytest.approx(0.17, abs=0.005)
    assert facts.pair_corr == pytest.approx(0.49, abs=0.005)
    assert facts.next_day_corr_median == pytest.approx(0.034, abs=0.0005)
    assert facts.next_day_corr_max == pytest.approx(0.102, abs=0.0005)
    assert facts.overnight_share == pytest.approx(0.436, abs=0.0005)
    assert facts.selloff_corr > facts.pair_corr and facts.leverage < 0


def test_the_robust_kurtoses_are_scipys_medians_over_tickers():
    """Issue 58: the median over tickers of the excess kurtosis, before and after `scipy.stats.mstats.winsorize` at
    0.1% per side, computed here from the raw CSV."""
    raw = pd.read_csv(FIXTURE).sort_values(["symbol", "date"])
    r = np.diff(np.log(raw.pivot(index="date", columns="symbol", values="close").to_numpy()), axis=0)
    winsorized = [stats.kurtosis(np.asarray(mstats.winsorize(c, limits=0.001)), bias=False) for c in r.T]
    facts = market_facts(load_market_data(str(FIXTURE)))
    assert facts.median_kurtosis == pytest.approx(np.median(stats.kurtosis(r, bias=False)), rel=1e-9)
    assert facts.winsorized_kurtosis == pytest.approx(np.median(winsorized), rel=1e-9)
    assert 0 < facts.winsorized_kurtosis < facts.median_kurtosis < facts.kurtosis  # the file's outliers


def test_the_pieces_on_hand_worked_returns():
    r = np.array([[1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]])
    # |r| alternates 1, 0, 1, 0: three lag products of -1/4 over four squares of 1/4
    np.testing.assert_allclose(abs_acf1(r + np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])), [-0.75, -0.75])
    # ticker 1 tomorrow is ticker 0 today: the pair (0 -> 1) correlates fully, (1 -> 0) the other way round
    x = np.random.default_rng(0).standard_normal(500)
    pair = np.stack([x[1:], x[:-1]], axis=1)
    assert next_day_corr(pair)[0] == pytest.approx(1.0) and next_day_corr(pair)[1] < 0.15
    # leverage: a fall today, a large move tomorrow
    y = np.tile([-1.0, 2.0, 1.0, 0.5], 50)[:, None]
    assert leverage(y)[0] < -0.5
    # sell-off days: the lowest fifth of the trailing 20-day market return (16 of the 80 days with a lookback, plus
    # a tie: the sums fall by 0.02 a day to -0.2 at day 80 and rise again after it), none in the first 20 days
    market = np.r_[np.ones(60), -np.ones(20), np.ones(20)] * 0.01
    days = np.flatnonzero(selloff_days(np.stack([market, market], axis=1)))
    np.testing.assert_array_equal(days, np.arange(72, 89))
    assert days.min() >= SELLOFF_LOOKBACK
