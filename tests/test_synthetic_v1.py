"""Synthetic market, generator version 1 (`envs.synthetic_v1`, kept for old checkpoints): byte-identical to the
markets it drew before versions existed, determinism, bar sanity, correlation structure, regimes, and a learnable
planted signal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs.data import MarketData, split_days
from envs.errors import UserError
from envs.sources import load_market_data
from envs.synthetic_v1 import _regime_path, generate_market
from tests.conftest import CHECKSUM_RTOL, array_checksums

FIELDS = ("open", "high", "low", "close", "volume")

CHECKSUMS = json.loads((Path(__file__).parent / "fixtures" / "synthetic_checksums.json").read_text())["generator1"]
"""`array_checksums` of markets generator 1 draws, computed from `envs/synthetic_v1.py` (unchanged
since it was moved there verbatim from `envs/synthetic.py` at 8bcb3cf, before generator versions existed, and pinned
by a sha256 of the same markets until that hash met a CPU whose numpy rounds exp's last bit differently): the markets
old checkpoints were trained on."""


@pytest.mark.parametrize("pinned", CHECKSUMS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p["kwargs"].items()))
def test_version_1_draws_the_markets_it_drew_before_versions_existed(pinned):
    kwargs = pinned["kwargs"]
    m = generate_market(**kwargs)
    assert [str(m.dates[0])[:10], str(m.dates[-1])[:10]] == pinned["dates"]
    assert set(pinned["checksums"]) == set(FIELDS)
    for name, expected in pinned["checksums"].items():
        np.testing.assert_allclose(array_checksums(getattr(m, name)), expected, rtol=CHECKSUM_RTOL, err_msg=name)


def test_version_1_is_reached_by_its_source_string():
    # the source string reaches it with generator=1, and an old signal= option with it
    old = load_market_data("synthetic:tickers=5,days=300,signal=0.9,signal_kind=lead_lag,generator=1", seed=3)
    assert old.equals(generate_market(num_tickers=5, num_days=300, seed=3, signal_strength=0.9, signal="lead_lag"))


@pytest.fixture(scope="module")
def default_market() -> MarketData:
    return generate_market(seed=7, signal_strength=0.5)


def test_defaults_shape_names_and_business_days(default_market):
    m = default_market
    assert (m.num_days, m.num_tickers) == (2520, 30)
    assert m.tickers[0] == "SYN00" and m.tickers[-1] == "SYN29"
    expected = pd.bdate_range("2014-01-02", periods=2520).to_numpy(dtype="datetime64[ns]")
    np.testing.assert_array_equal(m.dates, expected)
    assert not m.close_only
    assert generate_market(num_tickers=120, num_days=3).tickers[:2] == ("SYN000", "SYN001")


@pytest.mark.parametrize("signal", ["momentum", "lead_lag"])
def test_same_seed_same_bytes_different_seed_different(signal):
    a = generate_market(num_tickers=8, num_days=300, seed=11, signal_strength=0.3, signal=signal)
    b = generate_market(num_tickers=8, num_days=300, seed=11, signal_strength=0.3, signal=signal)
    c = generate_market(num_tickers=8, num_days=300, seed=12, signal_strength=0.3, signal=signal)
    for f in FIELDS:
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
        assert getattr(a, f).tobytes() != getattr(c, f).tobytes()
    assert a.dates.tobytes() == b.dates.tobytes()


def test_ohlc_sanity_on_every_row(default_market):
    m = default_market
    for f in FIELDS:
        assert np.isfinite(getattr(m, f)).all()
    assert (m.low > 0).all()
    assert (m.high >= np.maximum(m.open, m.close)).all()
    assert (m.low <= np.minimum(m.open, m.close)).all()
    assert (m.volume > 0).all() and (m.volume == np.round(m.volume)).all()
    # the open gaps from the previous close, but only a little: well inside the day's range of moves
    gap = np.abs(np.log(m.open[1:] / m.close[:-1]))
    day = np.abs(np.log(m.close[1:] / m.close[:-1]))
    assert 0 < np.median(gap) < np.median(day)
    # loads through the same validation as real data
    assert MarketData.from_frame(m.to_frame()).equals(m)


def test_returns_are_plausible_and_correlated_within_sectors():
    m = generate_market(num_tickers=20, num_days=2520, seed=3)
    r = np.diff(np.log(m.close), axis=0)
    vol = r.std(axis=0) * np.sqrt(252)
    assert ((vol > 0.15) & (vol < 0.70)).all()
    corr = np.corrcoef(r.T)
    sector = np.arange(20) % 5
    same = corr[(sector[:, None] == sector[None, :]) & ~np.eye(20, dtype=bool)]
    other = corr[sector[:, None] != sector[None, :]]
    assert 0.1 < other.mean() < same.mean() < 0.8


def test_volume_is_heavier_on_big_moves(default_market):
    m = default_market
    r = np.abs(np.diff(np.log(m.close), axis=0))
    v = np.log(m.volume[1:])
    big = r > np.quantile(r, 0.9, axis=0)
    small = r < np.quantile(r, 0.5, axis=0)
    assert (v[big].mean() - v[small].mean()) > 0.1


def test_regimes_switch_and_high_vol_is_more_volatile():
    path = _regime_path(np.random.default_rng(5), 2520)  # the generator's first draw from its seed's PCG64
    assert set(np.unique(path)) == {0, 1, 2}
    assert 5 < np.count_nonzero(np.diff(path)) < 200
    m = generate_market(num_tickers=10, num_days=2520, seed=5)
    r = np.diff(np.log(m.close), axis=0).mean(axis=1)  # market-wide daily return, day t+1
    regime = path[1:]
    assert r[regime == 2].std() > 1.5 * r[regime == 0].std()


def test_signal_strength_zero_is_identical_for_both_kinds():
    a = generate_market(num_tickers=5, num_days=100, seed=1, signal="momentum")
    b = generate_market(num_tickers=5, num_days=100, seed=1, signal="lead_lag")
    assert a.equals(b)


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"signal_strength": 1.0}, "signal strength must be in [0, 1)"),
        ({"signal_strength": -0.1}, "signal strength must be in [0, 1)"),
        ({"signal": "mean_reversion"}, "unknown synthetic signal 'mean_reversion'"),
        ({"num_tickers": 0}, "num_tickers must be a whole number >= 1"),
        ({"num_days": 1}, "num_days must be a whole number >= 2"),
        ({"num_days": 2.5}, "num_days must be a whole number"),
        ({"start": "yesterday-ish"}, "start date 'yesterday-ish' is not a date"),
    ],
)
def test_bad_arguments(kwargs, expected):
    with pytest.raises(UserError, match=None) as info:
        generate_market(**{"num_days": 10, **kwargs})
    assert expected in str(info.value)


# ---------------------------------------------------------------------- the planted signal is learnable
def _sharpe(pnl: np.ndarray) -> float:
    return float(np.sqrt(252) * pnl.mean() / pnl.std())


def momentum_rule_test_pnl(m: MarketData, lookback: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Causal rules on the test split: weights at day t use closes up to t only, earn day t -> t+1.

    Returns (long-short daily pnl: long past winners, short past losers, gross 1), and (long-only excess:
    equal weight in the better half by past return, minus equal-weight buy-and-hold).
    """
    splits = split_days(m, window=30)
    logc = np.log(m.close)
    ls, lo = [], []
    for t in range(splits.test.start, splits.test.stop - 1):
        past = logc[t] - logc[t - lookback]  # only closes up to day t
        nxt = np.exp(logc[t + 1] - logc[t]) - 1
        w = past - past.mean()
        ls.append(w @ nxt / np.abs(w).sum())
        lo.append(nxt[past > np.median(past)].mean() - nxt.mean())
    return np.array(ls), np.array(lo)


@pytest.mark.parametrize("seed", [0, 1])
def test_momentum_signal_gives_a_causal_rule_a_clear_edge_on_test_days(seed):
    signal_ls, signal_lo = momentum_rule_test_pnl(generate_market(seed=seed, signal_strength=0.5))
    null_ls, null_lo = momentum_rule_test_pnl(generate_market(seed=seed, signal_strength=0.0))
    assert len(signal_ls) > 300
    assert _sharpe(signal_ls) > 2.0, _sharpe(signal_ls)
    assert _sharpe(signal_ls) > _sharpe(null_ls) + 1.5
    # long-only (what a no-shorting policy can do) beats equal-weight buy-and-hold by > 8% a year
    assert signal_lo.mean() * 252 > 0.08, signal_lo.mean() * 252
    assert signal_lo.mean() > null_lo.mean()


def test_lead_lag_signal_gives_a_causal_rule_a_clear_edge_on_test_days():
    def pnl(m: MarketData) -> np.ndarray:
        r = np.diff(np.log(m.close), axis=0)  # r[t] = return of day t+1
        rel = r - r.mean(axis=1, keepdims=True)
        start = split_days(m, window=30).test.start
        # yesterday's move of ticker i (known at today's close) -> position in ticker i+1 for tomorrow
        w = np.sign(rel[start - 1 : -1, :-1])
        return (w * rel[start:, 1:]).mean(axis=1)

    with_signal = pnl(generate_market(seed=2, signal_strength=0.5, signal="lead_lag"))
    without = pnl(generate_market(seed=2, signal_strength=0.0, signal="lead_lag"))
    assert _sharpe(with_signal) > 3.0
    assert _sharpe(with_signal) > _sharpe(without) + 2.0


def test_stronger_signal_means_stronger_return_autocorrelation():
    def autocorr(s: float) -> float:
        r = np.diff(np.log(generate_market(num_tickers=30, num_days=2520, seed=4, signal_strength=s).close), axis=0)
        r = r - r.mean(axis=1, keepdims=True)  # remove the market factor
        past = np.stack([r[t - 5 : t].sum(axis=0) for t in range(5, len(r))])
        return float(np.corrcoef(past.ravel(), r[5:].ravel())[0, 1])

    a0, a3, a8 = autocorr(0.0), autocorr(0.3), autocorr(0.8)
    assert abs(a0) < 0.03 and a0 < a3 < a8


def test_lag_k_lead_lag_hides_the_signal_from_today_and_shows_it_k_days_back():
    """The memory market: the leader's move that predicts tomorrow is k - 1 days old, not in today's state."""
    lagged = generate_market(num_tickers=5, num_days=2520, seed=1, signal_strength=0.9, signal="lead_lag", lag=10)
    r = np.diff(np.log(lagged.close), axis=0)

    def lead(k: int) -> float:  # mean correlation of ticker i's return with ticker i+1's k days later
        return float(np.mean([np.corrcoef(r[:-k, i], r[k:, i + 1])[0, 1] for i in range(4)]))

    assert lead(10) > 0.25 and abs(lead(1)) < 0.05 and abs(lead(9)) < 0.05
    one_day = generate_market(num_tickers=5, num_days=300, seed=1, signal_strength=0.9, signal="lead_lag")
    assert np.array_equal(
        one_day.close,
        generate_market(num_tickers=5, num_days=300, seed=1, signal_strength=0.9, signal="lead_lag", lag=1).close,
    )  # lag 1 is the old market
    with pytest.raises(UserError, match="lag"):
        generate_market(num_days=10, signal="lead_lag", lag=10)
