"""Synthetic market, generator version 3 (`envs.synthetic`): determinism, bars, the overnight gap, a planted signal
of the requested IC whose predictor a trader computes from the prices, and the source options. Its stylized facts
are `tests/test_synthetic_facts.py`'s."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from envs.data import MarketData
from envs.errors import UserError
from envs.predictor import SignalRule, fill_returns, information_coefficient, predictor_from_prices
from envs.sources import load_market_data, training_draws
from envs.synthetic import generate_market, market_and_parts
from tests.conftest import SYNTHETIC_BAD_ARGUMENTS

FIELDS = ("open", "high", "low", "close", "volume")


def test_same_arguments_same_bytes_other_seed_other_bytes():
    kwargs = dict(num_tickers=8, num_days=300, seed=11, signal_ic=0.1, signal_kind="momentum")
    a, b = generate_market(**kwargs), generate_market(**kwargs)
    c = generate_market(**{**kwargs, "seed": 12})
    for f in FIELDS:
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes() != getattr(c, f).tobytes()
    assert a.dates.tobytes() == b.dates.tobytes()


def test_planting_a_signal_leaves_the_markets_noise_as_it_was():
    """One draw order whatever the signal: the market with a signal is the market without it plus the planted move,
    which day t carries from the predictor of day t - 1."""
    _, plain = market_and_parts(num_tickers=6, num_days=400, seed=3)
    for kind in ("lead_lag", "momentum"):
        _, signal = market_and_parts(num_tickers=6, num_days=400, seed=3, signal_ic=0.2, signal_kind=kind)
        np.testing.assert_allclose(signal.returns - signal.planted, plain.returns, atol=1e-15)
        np.testing.assert_allclose(signal.gap - 0.3 * signal.planted, plain.gap, atol=1e-15)
        np.testing.assert_allclose(signal.planted[1:], signal.signal_scale * signal.predictor[:-1], atol=1e-15)
        assert signal.planted[1:].std() > 0 and not signal.planted[0].any()
    _, pairs = market_and_parts(num_tickers=5, num_days=400, seed=3, signal_ic=0.2)
    assert not pairs.planted[:, 0::2].any() and (pairs.planted[2:, 1::2] != 0).all()  # leaders carry no planted move


def test_bars_are_valid_and_the_open_carries_the_overnight_part_of_the_move():
    m, parts = market_and_parts(num_tickers=10, num_days=2520, seed=5, signal_ic=0.1)
    for f in FIELDS:
        assert np.isfinite(getattr(m, f)).all()
    assert (m.low > 0).all() and (m.high >= np.maximum(m.open, m.close)).all()
    assert (m.low <= np.minimum(m.open, m.close)).all()
    assert (m.volume > 0).all() and (m.volume == np.round(m.volume)).all()
    assert MarketData.from_frame(m.to_frame()).equals(m)  # loads through the validation real data goes through
    gap = np.log(m.open[1:] / m.close[:-1])
    intraday = np.log(m.close[1:] / m.open[1:])
    np.testing.assert_allclose(gap + intraday, np.diff(np.log(m.close), axis=0), atol=1e-12)
    np.testing.assert_allclose(gap, parts.gap[1:], atol=1e-12)
    assert m.tickers == tuple(f"SYN{i:02d}" for i in range(10))
    np.testing.assert_array_equal(m.dates, pd.bdate_range("2014-01-02", periods=2520).to_numpy("datetime64[ns]"))


def _ics(ic: float, kind: str, seeds: range = range(16), days: int = 2520) -> np.ndarray:
    """The measured IC of 20-ticker draws (10 years unless ``days`` says otherwise) from the prices: the predictor a
    trader computes, with the open-to-open return a next-open fill earns."""
    out = []
    for seed in seeds:
        m = generate_market(num_tickers=20, num_days=days, seed=seed, signal_ic=ic, signal_kind=kind)
        out.append(
            information_coefficient(predictor_from_prices(m.close, SignalRule(kind)), fill_returns(m.open, m.close))
        )
    return np.array(out)


@pytest.mark.parametrize(("ic", "kind"), [(0.04, "lead_lag"), (0.3, "lead_lag"), (0.3, "momentum")])
def test_the_predictor_from_the_prices_has_the_requested_ic_at_next_open_fills(ic, kind):
    """Issue 58's target: on 20-ticker, 10-year draws, seeds 0-15, the mean measured IC is within 10% of the requested
    one, and each draw is within 3 standard deviations of that mean (no draw runs away)."""
    ics = _ics(ic, kind)
    assert abs(ics.mean() / ic - 1) < 0.10, ics
    assert (np.abs(ics - ics.mean()) < 3 * ics.std(ddof=1)).all(), ics


def test_a_weak_momentum_signal_has_its_ic_over_long_markets_and_a_small_sample_bias_over_ten_years():
    """A momentum predictor is built from the ticker's own returns, and a correlation over D days subtracts their
    sample mean, which holds the very returns the predictor was built from: over ten years that biases the measured
    IC down by about 0.004 (at the 20-day half-life), a tenth of 0.04 (measured: 0.0356 over seeds 0-15) and a
    hundredth of 0.3. Over 100-year markets the bias is a tenth as large and the IC is the requested one."""
    ten_years = _ics(0.04, "momentum")
    assert 0.85 < ten_years.mean() / 0.04 < 1.0, ten_years
    century = _ics(0.04, "momentum", seeds=range(4), days=25200)
    assert abs(century.mean() / 0.04 - 1) < 0.10, century


def test_the_ic_is_of_the_return_the_fills_earn():
    """At next-open fills the IC is of open-to-open returns; on close-only data (next-close fills) of close-to-close
    ones, which also hold the overnight share of the next planted move."""
    m, parts = market_and_parts(num_tickers=10, num_days=2520, seed=1, signal_ic=0.3, signal_overnight=0.0)
    open_to_open = information_coefficient(parts.predictor, fill_returns(m.open, m.close))
    close_to_close = information_coefficient(parts.predictor, fill_returns(None, m.close))
    ahead = np.log(m.open[2:] / m.open[1:-1])
    by_hand = np.mean([np.corrcoef(parts.predictor[:-2, i], ahead[:, i])[0, 1] for i in range(1, 10, 2)])
    assert open_to_open == pytest.approx(by_hand, rel=1e-12)
    assert abs(open_to_open - 0.3) < 0.06 and close_to_close < open_to_open  # the close-to-close misses a day's move


def test_train_draws_names_the_training_pool_and_leaves_the_market_as_it_is():
    plain = load_market_data("synthetic:tickers=3,days=300,signal_ic=0.2", seed=5)
    pooled = load_market_data("synthetic:tickers=3,days=300,signal_ic=0.2,train_draws=8", seed=5)
    assert pooled.equals(plain)
    assert training_draws("tickers=3,train_draws=8") == 8 and training_draws("tickers=3") == 1
    for bad in ("train_draws=0", "train_draws=two", "train_draws=100000"):
        with pytest.raises(UserError, match="train_draws"):
            load_market_data(f"synthetic:{bad}")
    with pytest.raises(UserError, match="needs generator 3"):
        load_market_data("synthetic:generator=2,train_draws=4")


@pytest.mark.parametrize(("kwargs", "expected"), SYNTHETIC_BAD_ARGUMENTS)
def test_bad_arguments(kwargs, expected):
    with pytest.raises(UserError) as info:
        generate_market(**{"num_days": 10, **kwargs})
    assert expected in str(info.value)
