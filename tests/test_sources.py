"""load_market_data: synthetic options, CSV/Parquet files, filters, and the errors users will hit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs.data import _ROUND_TRIP, MarketData
from envs.errors import UserError
from envs.sources import default_signal_kind, describe_source, load_market_data, parse_synthetic_options, pin_synthetic
from envs.synthetic import generate_market
from envs.synthetic_v1 import generate_market as generate_market_v1

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "data" / "stocks_daily_6_ohlcv.csv"
# the reference read must parse floats exactly like the loader does (pandas 2 defaults to a faster parser)


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(UserError) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_synthetic_default_uses_seed_argument():
    data = load_market_data("synthetic", seed=4)
    assert data.equals(generate_market(seed=4))


def test_synthetic_options_are_passed_to_the_generator():
    source = "synthetic:tickers=10,days=1000,signal_ic=0.04,signal_kind=momentum,signal_halflife=5,seed=3"
    data = load_market_data(source, seed=99)
    expected = generate_market(
        num_tickers=10, num_days=1000, signal_ic=0.04, signal_kind="momentum", signal_halflife=5.0, seed=3
    )
    assert data.equals(expected)
    assert parse_synthetic_options(" start=2020-01-01 , signal_kind=lead_lag, signal_overnight=0.2 ") == {
        "start": "2020-01-01",
        "signal_kind": "lead_lag",
        "signal_overnight": 0.2,
    }
    # generator 1 takes its own options, the old signal strength among them
    old = load_market_data("synthetic:generator=1,tickers=10,days=1000,signal=0.5,signal_kind=momentum,seed=3")
    assert old.equals(generate_market_v1(num_tickers=10, num_days=1000, signal_strength=0.5, signal="momentum", seed=3))
    assert parse_synthetic_options("signal_kind=lead_lag,generator=1") == {"signal": "lead_lag"}


def test_a_source_is_described_with_the_signal_kind_its_generator_plants():
    """Generators 2 and 3 plant lead_lag where the source names no kind, generator 1 momentum; the words say so."""
    assert describe_source("synthetic:signal_ic=0.04") == "synthetic market, planted lead_lag signal of IC 0.04"
    assert describe_source("synthetic:generator=2,signal_ic=0.2").startswith("toy synthetic market, planted lead_lag")
    assert describe_source("synthetic:signal_ic=0.04,signal_kind=momentum") == (
        "synthetic market, planted momentum signal of IC 0.04"
    )
    for old in ("synthetic:generator=1,signal=0.5", "synthetic:signal=0.5"):  # generator 1's, named or not
        assert describe_source(old) == "synthetic market, planted momentum signal of strength 0.5"
    assert describe_source("synthetic:tickers=3") == "synthetic market, no planted signal"
    # the default is the generator's own: naming it draws the same market
    for version, ic in ((1, "signal=0.5"), (2, "signal_ic=0.2"), (3, "signal_ic=0.2")):
        source = f"synthetic:generator={version},tickers=3,days=60,{ic}"
        named = f"{source},signal_kind={default_signal_kind(version)}"
        assert load_market_data(source, seed=1).equals(load_market_data(named, seed=1))
    assert default_signal_kind(1) != default_signal_kind(3)


def test_pin_synthetic_fixes_what_a_source_string_meant_and_keeps_what_it_names():
    assert pin_synthetic("synthetic", generator=1) == "synthetic:generator=1"
    assert pin_synthetic("synthetic:tickers=3,days=200", generator=1) == "synthetic:tickers=3,days=200,generator=1"
    assert pin_synthetic("synthetic:tickers=3,generator=2", generator=1) == "synthetic:tickers=3,generator=2"
    assert pin_synthetic("synthetic:seed=4", seed=9, generator=2) == "synthetic:seed=4,generator=2"
    assert pin_synthetic("csv:prices.csv", generator=1) == "csv:prices.csv"


@pytest.mark.parametrize(
    "source,expected",
    [
        ("synthetic:ticker=3", "unknown synthetic option 'ticker' for generator 3; accepted: tickers, days, start"),
        ("synthetic:tickers=three", "synthetic option tickers='three' is not a valid int"),
        ("synthetic:tickers", "must look like key=value"),
        ("synthetic:signal=0.5", "synthetic option signal= is generator 1's strength; give signal_ic=IC"),
        ("synthetic:signal_ic=0.5", "signal_ic must be in [0, 0.5)"),
        ("synthetic:signal_ic=-0.1", "signal_ic must be in [0, 0.5)"),
        ("synthetic:signal_ic=nan", "signal_ic must be in [0, 0.5)"),
        ("synthetic:signal_kind=noise", "unknown synthetic signal 'noise'"),
        ("synthetic:signal_ic=0.04,generator=1", "unknown synthetic option 'signal_ic' for generator 1"),
        ("synthetic:generator=4", "synthetic generator='4' is unknown; versions: 1, 2, 3"),
        ("synthetic:generator=1,signal=1.5", "signal strength must be in [0, 1)"),
    ],
)
def test_bad_synthetic_options(source, expected):
    assert expected in error_of(load_market_data, source)


def test_synthetic_filters():
    data = load_market_data(
        "synthetic:tickers=5,days=50", tickers=["SYN03", "SYN01"], start="2014-01-06", end="2014-01-10"
    )
    assert data.tickers == ("SYN03", "SYN01")
    assert [data.date_str(i) for i in range(data.num_days)] == [f"2014-01-{d:02d}" for d in range(6, 11)]
    assert "unknown tickers SYN09" in error_of(load_market_data, "synthetic:tickers=5,days=50", tickers=["SYN09"])


def test_csv_scheme_bare_path_and_parquet_agree(tmp_path):
    frame = pd.read_csv(FIXTURE, **_ROUND_TRIP)
    pq = tmp_path / "stocks.parquet"
    frame.to_parquet(pq, index=False)
    by_scheme = load_market_data(f"csv:{FIXTURE}")
    assert by_scheme.num_tickers == 6
    assert load_market_data(str(FIXTURE)).equals(by_scheme)
    assert load_market_data(f"parquet:{pq}").equals(by_scheme)
    assert load_market_data(str(pq)).equals(by_scheme)


def test_file_ticker_and_date_filters():
    data = load_market_data(f"csv:{FIXTURE}", tickers=["NVDA", "AAPL"], start="2020-01-01", end="2020-12-31")
    assert data.tickers == ("NVDA", "AAPL")
    assert data.date_str(0) == "2020-01-02" and data.date_str(-1) == "2020-12-31"
    assert data.num_days == 253
    full = MarketData.from_path(FIXTURE)
    i0 = int(np.searchsorted(full.dates, np.datetime64("2020-01-02")))
    np.testing.assert_array_equal(data.close[:, 1], full.close[i0 : i0 + 253, 0])


def test_filters_apply_before_gap_check(tmp_path):
    frame = pd.read_csv(FIXTURE, **_ROUND_TRIP)
    # META starts late: without a filter the file has gaps
    frame = frame[~((frame.symbol == "META") & (frame.date < "2015-01-01"))]
    path = tmp_path / "late_meta.csv"
    frame.to_csv(path, index=False)
    assert "tickers do not cover the same dates: META misses" in error_of(load_market_data, f"csv:{path}")
    assert load_market_data(f"csv:{path}", tickers=["AAPL", "GOOG"]).num_days == 2699
    assert load_market_data(f"csv:{path}", start="2015-01-01").num_tickers == 6
    assert load_market_data(f"csv:{path}", gap_policy="intersect").date_str(0) == "2015-01-02"


@pytest.mark.parametrize(
    "source,kwargs,expected",
    [
        (
            "yahoo:AAPL",
            {},
            "unknown data source 'yahoo:AAPL'; use one of synthetic, synthetic:k=v,..., csv:PATH, parquet:PATH, alpaca",
        ),
        ("", {}, "empty data source"),
        ("csv:/no/such/file.csv", {}, "data file not found: /no/such/file.csv"),
        ("parquet:/no/such/file.parquet", {}, "data file not found: /no/such/file.parquet"),
        ("csv:", {}, "csv: needs a path"),
        (f"csv:{FIXTURE}", {"tickers": ["AAPL", "TSLA", "IBM"]}, "unknown tickers TSLA, IBM in"),
        (f"csv:{FIXTURE}", {"start": "2030-01-01"}, "no rows of"),
        (f"csv:{FIXTURE}", {"start": "2021-01-01", "end": "2020-01-01"}, "start 2021-01-01 is after end 2020-01-01"),
        (f"csv:{FIXTURE}", {"end": "last tuesday"}, "end date 'last tuesday' is not a date"),
        (f"csv:{FIXTURE}", {"feed": "sip"}, "only apply to the alpaca source"),
        ("alpaca", {}, "the alpaca source needs tickers"),
        ("alpaca", {"tickers": ["AAPL"]}, "needs a start and an end date"),
        ("alpaca:fee=sip", {"tickers": ["AAPL"]}, "unknown alpaca option 'fee'; accepted: feed, adjustment, timeframe"),
        ("alpaca:feed=xyz", {"tickers": ["AAPL"], "start": "2024-01-02", "end": "2024-01-31"}, "feed must be one of"),
    ],
)
def test_source_errors(source, kwargs, expected):
    assert expected in error_of(load_market_data, source, **kwargs)


def test_parquet_scheme_on_a_csv_file_is_a_user_error(tmp_path):
    assert "cannot read Parquet file" in error_of(load_market_data, f"parquet:{FIXTURE}")
    folder = tmp_path / "dir.csv"
    folder.mkdir()
    assert "is a folder" in error_of(load_market_data, f"csv:{folder}")
