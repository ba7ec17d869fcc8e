"""Indicators, turbulence, normalisation and the market spec (envs/features.py)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from envs.data import DayRange, MarketData, Splits, split_days
from envs.errors import UserError
from envs.features import (
    INDICATORS,
    Normalization,
    PreparedMarket,
    compute_indicators,
    turbulence_index,
)
from envs.synthetic import generate_market

ta = pytest.importorskip("ta")  # test-only dependency (in the [dev] extra)


def _random_ohlc(num_days: int = 400, num_tickers: int = 3, seed: int = 0) -> MarketData:
    rng = np.random.default_rng(seed)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, (num_days, num_tickers)), axis=0))
    high = close * (1 + rng.uniform(0, 0.03, close.shape))
    low = close * (1 - rng.uniform(0, 0.03, close.shape))
    dates = pd.bdate_range("2015-01-02", periods=num_days).to_numpy().astype("datetime64[ns]")
    tickers = tuple(f"T{i}" for i in range(num_tickers))
    return MarketData(
        dates=dates,
        tickers=tickers,
        open=close.copy(),
        high=high,
        low=low,
        close=close,
        volume=np.full(close.shape, 1e6),
    )


@pytest.fixture(scope="module")
def ohlc() -> MarketData:
    return _random_ohlc()


@pytest.fixture(scope="module")
def indicators(ohlc: MarketData) -> np.ndarray:
    return compute_indicators(ohlc)


def _ticker(data: MarketData, i: int) -> tuple[pd.Series, pd.Series, pd.Series]:
    return pd.Series(data.high[:, i]), pd.Series(data.low[:, i]), pd.Series(data.close[:, i])


@pytest.mark.parametrize("i", [0, 1, 2])
def test_macd_rsi_cci_match_ta_where_ta_is_defined(ohlc: MarketData, indicators: np.ndarray, i: int) -> None:
    high, low, close = _ticker(ohlc, i)
    k = {name: INDICATORS.index(name) for name in INDICATORS}
    expected = {
        "macd": ta.trend.MACD(close, window_slow=26, window_fast=12).macd().to_numpy(),
        "rsi": ta.momentum.RSIIndicator(close, window=30).rsi().to_numpy(),
        "cci": ta.trend.CCIIndicator(high, low, close, window=30, constant=0.015).cci().to_numpy(),
    }
    for name, want in expected.items():
        defined = ~np.isnan(want)
        assert defined.sum() > 300  # ta leaves only its warm-up undefined
        np.testing.assert_allclose(indicators[defined, i, k[name]], want[defined], rtol=0, atol=1e-6, err_msg=name)


def _dx_oracle(high: np.ndarray, low: np.ndarray, close: np.ndarray, window: int = 30) -> np.ndarray:
    """DX of one ticker, written as a plain loop from the textbook definitions (Wilder smoothing seeded on day 0)."""
    a = 1.0 / window
    out = np.zeros(len(close))
    sp = sm = st = 0.0
    for t in range(len(close)):
        if t == 0:
            pdm = mdm = 0.0
            tr = high[0] - low[0]
        else:
            up, down = high[t] - high[t - 1], low[t - 1] - low[t]
            pdm = up if (up > down and up > 0) else 0.0
            mdm = down if (down > up and down > 0) else 0.0
            tr = max(high[t] - low[t], abs(high[t] - close[t - 1]), abs(low[t] - close[t - 1]))
        if t == 0:
            sp, sm, st = pdm, mdm, tr
        else:
            sp, sm, st = a * pdm + (1 - a) * sp, a * mdm + (1 - a) * sm, a * tr + (1 - a) * st
        pdi, mdi = 100 * sp / st, 100 * sm / st
        out[t] = 100 * abs(pdi - mdi) / (pdi + mdi) if pdi + mdi > 0 else 0.0
    return out


@pytest.mark.parametrize("i", [0, 2])
def test_adx_is_dx30_against_a_loop_oracle_and_converges_to_ta(
    ohlc: MarketData, indicators: np.ndarray, i: int
) -> None:
    high, low, close = _ticker(ohlc, i)
    got = indicators[:, i, INDICATORS.index("adx")]
    np.testing.assert_allclose(got, _dx_oracle(high.to_numpy(), low.to_numpy(), close.to_numpy()), atol=1e-9)
    # ta seeds Wilder's average with a 30-day sum instead of day 0; the seeds' influence decays as
    # (29/30)^t, so late days must agree with the DX built from ta's +DI / -DI.
    adx = ta.trend.ADXIndicator(high, low, close, window=30)
    pos, neg = adx.adx_pos().to_numpy(), adx.adx_neg().to_numpy()
    with np.errstate(invalid="ignore"):  # ta's own warm-up zeros
        dx_ta = 100 * np.abs(pos - neg) / (pos + neg)
    late = slice(350, 399)  # ta leaves its own last value at 0, hence 399
    np.testing.assert_allclose(got[late], dx_ta[late], atol=1e-3)


def test_hand_worked_flat_and_linear_series() -> None:
    days = 60
    dates = pd.bdate_range("2020-01-01", periods=days).to_numpy().astype("datetime64[ns]")
    flat = np.full((days, 1), 10.0)
    rising = (10.0 + np.arange(days, dtype=float))[:, None]
    close = np.hstack([flat, rising])
    data = MarketData(
        dates=dates,
        tickers=("FLAT", "UP"),
        open=close,
        high=close,
        low=close,
        close=close,
        volume=np.ones_like(close),
        close_only=True,
    )
    with pytest.warns(UserWarning, match="closes only"):
        ind = compute_indicators(data)
    macd, rsi, cci, adx = (ind[:, :, k] for k in range(4))
    # Flat: no movement anywhere -> MACD 0, RSI neutral 50, CCI 0, DX 0.
    assert np.all(macd[:, 0] == 0) and np.all(rsi[:, 0] == 50) and np.all(cci[:, 0] == 0) and np.all(adx[:, 0] == 0)
    # Rising by $1 a day: only up-moves -> RSI 100 and DX 100 from day 1; day 0 has no move.
    assert rsi[0, 1] == 50
    np.testing.assert_allclose(rsi[1:, 1], 100, rtol=1e-12)
    np.testing.assert_allclose(adx[1:, 1], 100, rtol=1e-12)
    # MACD of a line x_t = 10 + t: EMA_span lags by (1 - a)/a * (1 - (1-a)^t) = (span-1)/2 * (1-(1-a)^t).
    t = np.arange(days)
    lag = lambda span: (span - 1) / 2 * (1 - (1 - 2 / (span + 1)) ** t)  # noqa: E731
    np.testing.assert_allclose(macd[:, 1], lag(26) - lag(12), atol=1e-9)
    # CCI of a line over 30 days: TP - mean = 14.5, mean abs deviation = 7.5 -> 14.5 / (0.015 * 7.5).
    np.testing.assert_allclose(cci[29:, 1], 14.5 / (0.015 * 7.5), rtol=1e-12)
    # Day 3 uses days 0..3: TP - mean = 1.5, MAD = 1.0.
    assert cci[3, 1] == pytest.approx(1.5 / 0.015)


def test_close_only_warns_once_per_call() -> None:
    data = generate_market(num_tickers=2, num_days=80, seed=1)
    flat = MarketData(
        dates=data.dates,
        tickers=data.tickers,
        open=data.close,
        high=data.close,
        low=data.close,
        close=data.close,
        volume=data.volume,
        close_only=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compute_indicators(flat)
    assert len([w for w in caught if "closes only" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_indicators(data)  # full bars: no warning


def test_unknown_indicator_is_a_user_error(ohlc: MarketData) -> None:
    with pytest.raises(UserError, match="unknown indicator"):
        compute_indicators(ohlc, ("macd", "bollinger"))


def test_no_look_ahead_in_indicators_and_turbulence() -> None:
    data = _random_ohlc(num_days=140, num_tickers=4, seed=3)
    base_ind = compute_indicators(data)
    base_turb = turbulence_index(data.close, lookback=40)
    rng = np.random.default_rng(7)
    for t in (0, 29, 41, 42, 90, 138):
        bump = np.ones_like(data.close)
        bump[t + 1 :] = rng.uniform(0.5, 1.5, bump[t + 1 :].shape)  # every price after day t changes
        changed = MarketData(
            dates=data.dates,
            tickers=data.tickers,
            open=data.open * bump,
            high=data.high * bump,
            low=data.low * bump,
            close=data.close * bump,
            volume=data.volume,
        )
        ind = compute_indicators(changed)
        turb = turbulence_index(changed.close, lookback=40)
        np.testing.assert_array_equal(ind[: t + 1], base_ind[: t + 1], err_msg=f"indicators look ahead at {t}")
        np.testing.assert_array_equal(turb[: t + 1], base_turb[: t + 1], err_msg=f"turbulence looks ahead at {t}")
        assert not np.array_equal(ind[t + 1 :], base_ind[t + 1 :])  # the perturbation did reach later days


def _turbulence_oracle(close: np.ndarray, lookback: int) -> np.ndarray:
    """One day at a time, as FinRL does it (without its zeroing of the first two positive values)."""
    returns = pd.DataFrame(close).pct_change().to_numpy()
    out = np.zeros(len(close))
    for t in range(lookback + 1, len(close)):
        hist = returns[t - lookback : t]
        cov = np.cov(hist, rowvar=False)
        dev = returns[t] - hist.mean(axis=0)
        out[t] = dev @ np.linalg.pinv(cov) @ dev
    return out


def test_turbulence_matches_a_per_day_loop_including_a_singular_covariance() -> None:
    data = _random_ohlc(num_days=300, num_tickers=5, seed=4)
    close = data.close.copy()
    close[:, 4] = close[:, 3] * 2.0  # identical returns: singular covariance, pinv needed
    got = turbulence_index(close, lookback=50, chunk=37)  # chunk boundaries inside the range
    want = _turbulence_oracle(close, 50)
    assert np.all(got[:51] == 0) and np.all(got[51:] > 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_turbulence_short_data_is_all_zero() -> None:
    assert np.all(turbulence_index(np.ones((10, 3)), lookback=252) == 0)


def _market(seed: int = 0, num_days: int = 700, num_tickers: int = 4) -> tuple[MarketData, Splits]:
    data = generate_market(num_tickers=num_tickers, num_days=num_days, seed=seed)
    return data, split_days(data, window=10)


def test_normalisation_and_threshold_use_training_days_only() -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, splits, window=10, price_mode="level")
    train = splits.train
    # Change every price after the training split: statistics and threshold must not move.
    bump = np.ones_like(data.close)
    bump[train.stop :] = 3.0
    later = MarketData(
        dates=data.dates,
        tickers=data.tickers,
        open=data.open * bump,
        high=data.high * bump,
        low=data.low * bump,
        close=data.close * bump,
        volume=data.volume,
    )
    other = PreparedMarket.prepare(later, splits, window=10, price_mode="level")
    for name in ("close_mean", "close_std", "indicator_mean", "indicator_std"):
        np.testing.assert_array_equal(getattr(market.normalization, name), getattr(other.normalization, name))
    assert market.turbulence_threshold == other.turbulence_threshold
    # ...and they are exactly the training days' statistics.
    close = data.close[train.start : train.stop]
    np.testing.assert_allclose(market.normalization.close_mean, close.mean(axis=0))
    np.testing.assert_allclose(market.normalization.close_std, close.std(axis=0))
    ind = market.indicators[train.start : train.stop]
    np.testing.assert_allclose(market.normalization.indicator_mean, ind.mean(axis=0).T)
    defined = market.turbulence[max(train.start, 253) : train.stop]
    assert market.turbulence_threshold == pytest.approx(np.quantile(defined, 0.9))
    assert np.mean(defined >= market.turbulence_threshold) == pytest.approx(0.1, abs=0.01)


def test_market_rows_layout() -> None:
    data, splits = _market(num_tickers=3)
    m = PreparedMarket.prepare(data, splits, window=10, price_mode="level")
    rows = m.normalization.market_rows(data.close, m.indicators)
    n, day = 3, 500
    assert rows.shape == (data.num_days, n + 4 * n)
    norm = m.normalization
    assert rows[day, 1] == pytest.approx((data.close[day, 1] - norm.close_mean[1]) / norm.close_std[1])
    k, i = INDICATORS.index("cci"), 2  # indicator k of ticker i sits at N + k*N + i
    want = (m.indicators[day, i, k] - norm.indicator_mean[k, i]) / norm.indicator_std[k, i]
    assert rows[day, n + k * n + i] == pytest.approx(want)
    assert m.num_features == 1 + 3 + 3 + 12


@pytest.mark.parametrize("price_mode", ["return", "level"])
def test_spec_round_trip_through_json(price_mode: str) -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, splits, window=10, price_mode=price_mode)
    spec = json.loads(json.dumps(market.to_spec()))
    assert spec["splits"]["train"]["start"] == str(data.dates[splits.train.start])[:10]
    back = PreparedMarket.from_spec(data, spec)
    assert back.splits == market.splits
    assert back.window == 10 and back.indicator_names == market.indicator_names
    assert back.turbulence_threshold == market.turbulence_threshold
    for name in ("close_mean", "close_std", "indicator_mean", "indicator_std"):
        np.testing.assert_array_equal(getattr(back.normalization, name), getattr(market.normalization, name))
    np.testing.assert_array_equal(back.indicators, market.indicators)
    np.testing.assert_array_equal(back.turbulence, market.turbulence)
    assert Normalization.from_dict(market.normalization.to_dict()).to_dict() == market.normalization.to_dict()
    assert back.normalization.price_mode == price_mode
    rows = back.normalization.market_rows(data.close, back.indicators)
    np.testing.assert_array_equal(rows, market.normalization.market_rows(data.close, market.indicators))
    assert np.all(np.isfinite(rows))


def test_spec_without_turbulence_is_json_and_inf() -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, splits, window=10, use_turbulence=False)
    spec = json.loads(json.dumps(market.to_spec(), allow_nan=False))
    assert spec["turbulence_threshold"] is None
    assert PreparedMarket.from_spec(data, spec).turbulence_threshold == float("inf")


def test_spec_on_new_data_reuses_statistics_and_checks_tickers() -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, splits, window=10)
    spec = market.to_spec()
    # Backtest on the test period only (plus lookback): stored statistics, splits mapped by date.
    tail = data.slice_days(splits.test.start - 300, data.num_days)
    back = PreparedMarket.from_spec(tail, spec)
    assert back.splits.test == DayRange(300, tail.num_days)
    np.testing.assert_array_equal(back.normalization.close_mean, market.normalization.close_mean)
    # Causal features: once warm (EMA seeds forgotten), values on shared days agree.
    np.testing.assert_allclose(back.indicators[-50:], market.indicators[-50:], rtol=1e-3, atol=1e-3)
    # Same tickers in another order: reordered to the spec's order.
    reordered = data.select_tickers(list(reversed(data.tickers)))
    assert PreparedMarket.from_spec(reordered, spec).data.tickers == data.tickers
    with pytest.raises(UserError, match=r"missing \['T003'\]|missing"):
        PreparedMarket.from_spec(data.select_tickers(data.tickers[:3]), spec)


def test_split_range_errors() -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, Splits(splits.train, None, splits.test), window=10)
    with pytest.raises(UserError, match="validation"):
        market.split_range("validation")
    with pytest.raises(UserError, match="unknown split"):
        market.split_range("holdout")


def test_resplit_equals_preparing_again_with_the_new_splits() -> None:
    data, splits = _market()
    market = PreparedMarket.prepare(data, splits, window=10)
    later = split_days(data, window=10, train_end=str(data.dates[splits.train.stop + 40])[:10])
    again, resplit = PreparedMarket.prepare(data, later, window=10), market.resplit(later)
    assert resplit.splits == later and resplit.turbulence_threshold == again.turbulence_threshold
    assert resplit.turbulence_threshold != market.turbulence_threshold  # it was refitted, not kept
    for name in ("close_mean", "close_std", "indicator_mean", "indicator_std"):
        np.testing.assert_array_equal(getattr(resplit.normalization, name), getattr(again.normalization, name))
    assert resplit.indicators is market.indicators  # computed once


@pytest.mark.parametrize("indicators, names", [("none", ()), ("rsi", ("rsi",)), ("adx, macd", ("adx", "macd"))])
def test_indicators_setting_picks_the_states_indicators_and_the_spec_keeps_them(indicators, names) -> None:
    """--indicators: the chosen ones, in the order given (macd divided by the close in return mode), and a market
    rebuilt from the stored spec (what backtest and trade do) has the same state rows."""
    from clstm_ppo.config import DataConfig
    from clstm_ppo.market import build_market, rebuild_market

    data, _ = _market(num_tickers=3)
    cfg = DataConfig(indicators=indicators, window=10)
    cfg.validate()
    market = build_market(cfg, seed=0, data=data)
    assert market.indicator_names == names and market.num_features == 1 + 2 * 3 + 3 * len(names)
    full = build_market(DataConfig(window=10), seed=0, data=data)
    rows = market.normalization.market_rows(data.close, market.indicators)
    full_rows = full.normalization.market_rows(data.close, full.indicators)
    np.testing.assert_allclose(rows[:, :3], full_rows[:, :3])  # the price columns do not depend on the choice
    for j, name in enumerate(names):
        k = INDICATORS.index(name)
        np.testing.assert_allclose(rows[:, 3 + 3 * j : 6 + 3 * j], full_rows[:, 3 + 3 * k : 6 + 3 * k])
    back = rebuild_market(data, json.loads(json.dumps(market.to_spec())))
    np.testing.assert_array_equal(back.normalization.market_rows(data.close, back.indicators), rows)


@pytest.mark.parametrize("indicators", ["rsi,foo", "rsi,rsi", "", " , "])
def test_unknown_repeated_or_missing_indicators_are_refused(indicators) -> None:
    from clstm_ppo.config import DataConfig

    with pytest.raises(UserError, match="--indicators"):
        DataConfig(indicators=indicators).validate()


def test_the_turbulence_stop_is_on_exactly_on_days_at_or_above_the_threshold() -> None:
    """The paper's rule: the stop holds the book in cash on a day whose turbulence reaches the threshold, and is
    off on the first calm day after; with the stop off (threshold inf) never."""
    data = generate_market(num_tickers=3, num_days=700, seed=4)
    market = PreparedMarket.prepare(data, split_days(data, window=5), window=5)
    stopped = market.stopped_days()
    hot = np.asarray(market.turbulence) >= market.turbulence_threshold
    assert np.isfinite(market.turbulence_threshold) and 0 < stopped.sum() < len(stopped)
    np.testing.assert_array_equal(stopped, hot)
    off = PreparedMarket.prepare(data, split_days(data, window=5), window=5, use_turbulence=False)
    assert not off.stopped_days().any()
