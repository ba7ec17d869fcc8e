"""benchmarks/forecast_bound.py's forecasts of a lead-lag market's planted move (docs/learning.md section 22): the
oracle is the planted term itself in z units, and the best estimate from returns beats the leader's own return."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.forecast_bound import forecast_z, information_coefficient, shock_estimates
from envs.data import split_days
from envs.features import PreparedMarket
from envs.synthetic_v1 import generate_market, synthetic_returns

KWARGS = dict(num_tickers=5, num_days=1500, seed=41, signal_strength=0.9, signal="lead_lag")


@pytest.fixture(scope="module")
def market() -> PreparedMarket:
    data = generate_market(**KWARGS)
    return PreparedMarket.prepare(data, split_days(data, window=5), window=5, indicator_names=(), price_mode="return")


def test_the_oracle_is_the_planted_move_of_tomorrow_over_todays_regime_vol(market: PreparedMarket) -> None:
    parts = synthetic_returns(**KWARGS)
    z = forecast_z(parts, market, 1, "oracle")
    daily_vol = parts.vol_multiplier[:-1, None] * np.sqrt(parts.calm_var[None, 1:])  # [D - 1, N - 1]
    np.testing.assert_allclose(z[:-1, 1:], parts.planted[1:, 1:] / daily_vol, rtol=1e-9)
    assert np.isneginf(z[:, 0]).all()  # ticker 0 follows nobody


def test_the_best_estimate_reads_more_of_the_shock_than_the_leaders_return(market: PreparedMarket) -> None:
    parts = synthetic_returns(**KWARGS)
    estimate = shock_estimates(parts, lag=1)
    leaders = range(parts.returns.shape[1] - 1)
    best = np.mean([np.corrcoef(estimate[:, i], parts.shocks[:, i])[0, 1] for i in leaders])
    raw = np.mean([np.corrcoef(parts.returns[:, i], parts.shocks[:, i])[0, 1] for i in leaders])
    assert 0.6 < raw < best < 1.0  # the factors and the regime are taken out: most, not all, of the noise
    days = range(market.splits.test.start, market.splits.test.stop)
    ic = {
        kind: information_coefficient(forecast_z(parts, market, 1, kind), parts.returns, days)
        for kind in ("leader", "best", "oracle")
    }
    assert ic["leader"] < ic["best"] < ic["oracle"], ic


def test_with_a_longer_lag_each_forecast_reads_the_shock_of_lag_days_before_tomorrow() -> None:
    kwargs = {**KWARGS, "lag": 3}
    data = generate_market(**kwargs)
    market = PreparedMarket.prepare(data, split_days(data, window=5), window=5, indicator_names=(), price_mode="return")
    parts = synthetic_returns(**kwargs)
    z = forecast_z(parts, market, 3, "oracle")
    daily_vol = parts.vol_multiplier[2:-1, None] * np.sqrt(parts.calm_var[None, 1:])
    np.testing.assert_allclose(z[2:-1, 1:], parts.planted[3:, 1:] / daily_vol, rtol=1e-9)
