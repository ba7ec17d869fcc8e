"""MarketData: loading, aliases, validation messages, gap policies, round trips, views, splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.data import _ROUND_TRIP, DayRange, MarketData, Splits, require_days, split_days, standardize_frame
from envs.errors import UserError
from envs.synthetic import generate_market

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "data" / "stocks_daily_6_ohlcv.csv"
# the reference read must parse floats exactly like the loader does (pandas 2 defaults to a faster parser)


def make_frame(tickers=("AAA", "BBB", "CCC"), days=12, seed=0) -> pd.DataFrame:
    """A valid long frame with random-walk prices, rows in (date, tic) order."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2021-03-01", periods=days)
    rows = []
    for j, tic in enumerate(tickers):
        close = (20 + 10 * j) * np.exp(np.cumsum(rng.normal(0, 0.02, days)))
        open_ = close * np.exp(rng.normal(0, 0.005, days))
        high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.01, days))
        low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.01, days))
        vol = rng.integers(1000, 100000, days).astype(float)
        for i in range(days):
            rows.append((dates[i], tic, open_[i], high[i], low[i], close[i], vol[i]))
    df = pd.DataFrame(rows, columns=["date", "tic", "open", "high", "low", "close", "volume"])
    return df.sort_values(["date", "tic"]).reset_index(drop=True)


def error_of(fn, *args, **kw) -> str:
    with pytest.raises(UserError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------- loading
def test_fixture_loads_six_tickers_aligned():
    data = MarketData.from_path(FIXTURE)
    assert data.tickers == ("AAPL", "AMZN", "GOOG", "META", "NFLX", "NVDA")
    assert data.num_days == 2699 and data.num_tickers == 6
    assert data.dates.dtype == np.dtype("datetime64[ns]")
    assert data.date_str(0) == "2013-01-02" and data.date_str(-1) == "2023-09-21"
    assert not data.close_only
    raw = pd.read_csv(FIXTURE, **_ROUND_TRIP)
    aapl = raw[raw.symbol == "AAPL"].sort_values("date")
    # the adjusted column is ignored by default: close is used as given
    np.testing.assert_array_equal(data.close[:, 0], aapl["close"].to_numpy())
    assert (data.high >= data.low).all()


def test_fixture_use_adjusted_rescales_ohlc_by_adjusted_over_close():
    data = MarketData.from_path(FIXTURE, use_adjusted=True)
    raw = pd.read_csv(FIXTURE, **_ROUND_TRIP)
    aapl = raw[raw.symbol == "AAPL"].sort_values("date")
    np.testing.assert_allclose(data.close[:, 0], aapl["adjusted"].to_numpy(), rtol=1e-12)
    factor = aapl["adjusted"].to_numpy() / aapl["close"].to_numpy()
    np.testing.assert_allclose(data.open[:, 0], aapl["open"].to_numpy() * factor, rtol=1e-12)
    np.testing.assert_array_equal(data.volume[:, 0], aapl["volume"].to_numpy())


def test_an_adjusted_close_column_is_read_as_the_dividends_it_implies():
    """By hand: closes 100, 99, 101 with adjusted closes 98, 98, 100 -> on day 1 the holder of day 0's close gets
    100 x 98/98 - 99 = $1.00; day 2 pays nothing (101/99 = 100/98 up to rounding). The fixture's AAPL pays the
    quarterly dividends its adjusted column implies; written out and read back, the dividends survive."""
    frame = pd.DataFrame(
        {
            "date": ["2021-01-04", "2021-01-05", "2021-01-06"] * 2,
            "tic": ["A"] * 3 + ["B"] * 3,
            "close": [100.0, 99.0, 101.0, 50.0, 51.0, 52.0],
            "adjusted": [98.0, 98.0, 98.0 * 101.0 / 99.0, 50.0, 51.0, 52.0],
        }
    )
    data = MarketData.from_frame(frame)
    np.testing.assert_allclose(data.dividends, [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], atol=1e-12)
    assert MarketData.from_frame(data.to_frame()).dividends == pytest.approx(data.dividends, abs=1e-9)
    assert not MarketData.from_frame(frame, use_adjusted=True).dividends.any()  # rescaled instead: none paid
    aapl = MarketData.from_path(FIXTURE).dividends[:, 0]
    assert 40 <= (aapl > 0).sum() <= 44 and 0 < aapl.max() < 1.0  # about quarterly, split-adjusted cents
    split = frame.assign(close=[100.0, 49.5, 50.5, 50.0, 51.0, 52.0])  # a 2:1 split the close does not show
    with pytest.raises(UserError, match="implies a .* payout on A 2021-01-05: the close column looks split-unadjusted"):
        MarketData.from_frame(split, max_price_ratio=0)


def test_aliases_case_insensitive_and_unsorted_input_is_sorted():
    df = make_frame()
    shuffled = df.sample(frac=1.0, random_state=1).rename(
        columns={"tic": " Symbol ", "date": "TimeStamp", "close": "Close", "volume": "VOL"}
    )
    data = MarketData.from_frame(shuffled)
    assert data.equals(MarketData.from_frame(df))
    df2 = df.rename(columns={"tic": "ticker", "date": "datetime"})
    assert MarketData.from_frame(df2).equals(MarketData.from_frame(df))


def test_date_and_tic_index_is_accepted():
    df = make_frame()
    assert MarketData.from_frame(df.set_index(["date", "tic"])).equals(MarketData.from_frame(df))


def test_timezone_aware_dates_keep_their_local_day():
    df = make_frame(days=5)
    # Alpaca stamps daily bars at midnight New York time, i.e. 04:00/05:00 UTC
    df["date"] = (df["date"] + pd.Timedelta(hours=5)).dt.tz_localize("UTC")
    data = MarketData.from_frame(df)
    assert data.date_str(0) == "2021-03-01"


def test_ambiguous_alias_columns_are_refused_unless_one_is_canonical():
    df = make_frame(days=4)
    both = df.assign(timestamp=df["date"])
    assert MarketData.from_frame(both).num_days == 4  # exact "date" wins
    two_aliases = df.rename(columns={"date": "timestamp"}).assign(datetime=df["date"])
    assert "ambiguous columns for 'date'" in error_of(MarketData.from_frame, two_aliases)


def test_close_only_input_fills_from_close():
    df = make_frame()[["date", "tic", "close"]]
    data = MarketData.from_frame(df)
    assert data.close_only
    np.testing.assert_array_equal(data.open, data.close)
    np.testing.assert_array_equal(data.high, data.close)
    np.testing.assert_array_equal(data.low, data.close)
    assert (data.volume == 0).all()
    # round trip keeps close_only
    assert MarketData.from_frame(data.to_frame()).equals(data)


def test_ohlc_without_volume_gets_zero_volume():
    data = MarketData.from_frame(make_frame().drop(columns="volume"))
    assert not data.close_only and (data.volume == 0).all()


def test_ticker_symbols_like_na_and_true_survive_csv(tmp_path):
    df = make_frame(tickers=("NA", "TRUE", "NULL"))
    path = tmp_path / "odd.csv"
    df.to_csv(path, index=False)
    assert MarketData.from_path(path).tickers == ("NA", "NULL", "TRUE")


def test_integer_yyyymmdd_dates_parse_as_dates(tmp_path):
    df = make_frame(days=3)
    df["date"] = df["date"].dt.strftime("%Y%m%d").astype(int)
    path = tmp_path / "int_dates.csv"
    df.to_csv(path, index=False)
    assert MarketData.from_path(path).date_str(0) == "2021-03-01"


# ---------------------------------------------------------------------- round trips
def test_frame_round_trip_is_lossless():
    data = MarketData.from_frame(make_frame())
    frame = data.to_frame()
    assert list(frame.columns) == ["date", "tic", "open", "high", "low", "close", "volume"]
    assert len(frame) == data.num_days * data.num_tickers
    assert frame[["date", "tic"]].equals(frame.sort_values(["date", "tic"])[["date", "tic"]])
    assert MarketData.from_frame(frame).equals(data)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_file_round_trip_is_bit_exact(tmp_path, suffix):
    rng = np.random.default_rng(3)
    df = make_frame(days=30)
    # awkward floats: many significant digits, tiny and huge values
    df["close"] = df["close"] * (1 + rng.uniform(-1e-9, 1e-9, len(df)))
    df["volume"] = rng.uniform(0, 1e12, len(df))
    data = MarketData.from_frame(df)
    path = data.to_path(tmp_path / "sub" / f"bars{suffix}")
    assert MarketData.from_path(path).equals(data)


# ---------------------------------------------------------------------- validation
def _with(df: pd.DataFrame, row: int, **values) -> pd.DataFrame:
    df = df.copy()
    for col, value in values.items():
        if df[col].dtype.kind == "f" and isinstance(value, str):
            df[col] = df[col].astype(object)
        df.loc[row, col] = value
    return df


BAD_FRAMES = {
    "missing close": (lambda df: df.drop(columns="close"), "missing columns close"),
    "missing date and tic": (lambda df: df.drop(columns=["date", "tic"]), "missing columns date, tic"),
    "partial ohlc": (lambda df: df.drop(columns=["high", "low"]), "missing columns high, low"),
    "unparseable date": (
        lambda df: _with(df.assign(date=df["date"].dt.strftime("%Y-%m-%d")), 4, date="not-a-date"),
        "unparseable dates in column 'date': BBB 'not-a-date'",
    ),
    "duplicate rows": (lambda df: pd.concat([df, df.iloc[[5]]]), "duplicate (date, tic) rows: CCC 2021-03-02"),
    "nan close": (lambda df: _with(df, 7, close=np.nan), "missing (NaN) close prices at BBB 2021-03-03"),
    "inf open": (lambda df: _with(df, 7, open=np.inf), "infinite open prices at BBB 2021-03-03"),
    "zero low": (lambda df: _with(df, 8, low=0.0), "non-positive low prices at CCC 2021-03-03"),
    "negative close": (lambda df: _with(df, 0, close=-1.0), "non-positive close prices at AAA 2021-03-01"),
    "high below low": (lambda df: _with(df, 2, high=1.0, low=2.0), "high below low at CCC 2021-03-01"),
    "negative volume": (lambda df: _with(df, 1, volume=-5.0), "negative volume at BBB 2021-03-01"),
    "non-numeric price": (lambda df: _with(df, 3, close="12,5"), "non-numeric values in column 'close': '12,5' (AAA"),
    "empty": (lambda df: df.iloc[:0], "no rows of market data"),
    "missing ticker": (lambda df: _with(df, 3, tic=None), "missing ticker symbols"),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frames_raise_one_clear_line(case):
    mutate, expected = BAD_FRAMES[case]
    msg = error_of(MarketData.from_frame, mutate(make_frame()))
    assert expected in msg, msg


def test_many_offenders_are_listed_first_few_with_a_count():
    df = make_frame(days=12)
    df.loc[df.index[:20], "close"] = -1.0
    msg = error_of(MarketData.from_frame, df)
    assert msg.count("AAA") + msg.count("BBB") + msg.count("CCC") == 5
    assert "(20 rows in all)" in msg


def test_intraday_duplicates_hint_at_one_bar_per_day():
    df = make_frame(days=3)
    later = df.assign(date=df["date"] + pd.Timedelta(hours=13))
    assert "one bar per ticker per day" in error_of(MarketData.from_frame, pd.concat([df, later]))
    assert "one bar per ticker per day" not in error_of(MarketData.from_frame, pd.concat([df, df.iloc[:1]]))


def test_unknown_gap_policy_is_refused():
    assert "unknown gap_policy 'drop'" in error_of(MarketData.from_frame, make_frame(), gap_policy="drop")


# ---------------------------------------------------------------------- gaps
def gappy_frame() -> pd.DataFrame:
    """AAA misses 2021-03-03 and 03-04 (a 2-day hole); CCC misses 2021-03-10; 12 business days."""
    df = make_frame(days=12)
    drop = ((df.tic == "AAA") & df.date.isin(pd.to_datetime(["2021-03-03", "2021-03-04"]))) | (
        (df.tic == "CCC") & (df.date == pd.Timestamp("2021-03-10"))
    )
    return df[~drop].reset_index(drop=True)


def test_gaps_fail_by_default_listing_each_ticker():
    msg = error_of(MarketData.from_frame, gappy_frame())
    assert msg.startswith("tickers do not cover the same dates")
    assert "AAA misses 2 of 12 dates (2021-03-03, 2021-03-04)" in msg
    assert "CCC misses 1 of 12 dates (2021-03-10)" in msg
    assert "BBB" not in msg


def test_gap_policy_intersect_keeps_common_dates():
    data = MarketData.from_frame(gappy_frame(), gap_policy="intersect")
    assert data.num_days == 9
    kept = {data.date_str(i) for i in range(data.num_days)}
    assert not kept & {"2021-03-03", "2021-03-04", "2021-03-10"}
    full = MarketData.from_frame(make_frame(days=12))
    keep_idx = [i for i in range(12) if full.date_str(i) in kept]
    np.testing.assert_array_equal(data.close, full.close[keep_idx])


def test_gap_policy_ffill_fills_flat_bars_from_previous_close():
    full = MarketData.from_frame(make_frame(days=12))
    data = MarketData.from_frame(gappy_frame(), gap_policy="ffill", max_ffill_days=2)
    assert data.num_days == 12
    # AAA days 2, 3 (03-03, 03-04) filled from day 1's close; volume 0
    for day in (2, 3):
        for arr in (data.open, data.high, data.low, data.close):
            assert arr[day, 0] == full.close[1, 0]
        assert data.volume[day, 0] == 0
    np.testing.assert_array_equal(data.close[:, 1], full.close[:, 1])
    np.testing.assert_array_equal(data.close[4:, 0], full.close[4:, 0])


def test_gap_policy_ffill_refuses_long_gaps_and_leading_gaps():
    msg = error_of(MarketData.from_frame, gappy_frame(), gap_policy="ffill", max_ffill_days=1)
    assert "cannot forward-fill: AAA misses 2 days in a row from 2021-03-03 (max_ffill_days=1)" in msg
    df = make_frame(days=6)
    late = df[~((df.tic == "BBB") & (df.date == df.date.min()))]
    assert "BBB has no bar before 2021-03-02" in error_of(MarketData.from_frame, late, gap_policy="ffill")


def test_intersect_with_no_common_date_is_refused():
    df = make_frame(tickers=("AAA", "BBB"), days=4)
    df = df[((df.tic == "AAA") & (df.date < "2021-03-03")) | ((df.tic == "BBB") & (df.date >= "2021-03-03"))]
    assert "share no common date" in error_of(MarketData.from_frame, df, gap_policy="intersect")


# ---------------------------------------------------------------------- views
def test_slice_and_select():
    data = MarketData.from_frame(make_frame(days=12))
    part = data.slice_days(2, 5)
    assert part.num_days == 3 and part.date_str(0) == data.date_str(2)
    np.testing.assert_array_equal(part.close, data.close[2:5])
    sel = data.select_tickers(["CCC", "AAA"])
    assert sel.tickers == ("CCC", "AAA")
    np.testing.assert_array_equal(sel.close, data.close[:, [2, 0]])
    assert "unknown tickers ZZZ, YYY" in error_of(data.select_tickers, ["AAA", "ZZZ", "YYY"])
    assert "more than once: AAA" in error_of(data.select_tickers, ["AAA", "AAA"])
    assert "outside" in error_of(data.slice_days, 5, 99)
    dated = data.select_dates("2021-03-03", "2021-03-05")
    assert [dated.date_str(i) for i in range(dated.num_days)] == ["2021-03-03", "2021-03-04", "2021-03-05"]
    assert "no trading days between" in error_of(data.select_dates, "2030-01-01", None)


def test_standardize_frame_is_idempotent():
    once = standardize_frame(make_frame())
    twice = standardize_frame(once)
    pd.testing.assert_frame_equal(once, twice)


# ---------------------------------------------------------------------- splits
def bdays_data(days: int) -> MarketData:
    return MarketData.from_frame(make_frame(tickers=("AAA", "BBB"), days=days))


def _check_partition(splits: Splits, data: MarketData, window: int) -> None:
    parts = [r for r in splits.as_dict().values() if r is not None]
    assert parts[0].start == window - 1
    for a, b in zip(parts, parts[1:], strict=False):
        assert a.stop == b.start  # adjacent, never overlapping
    for r in parts:
        assert 0 <= r.start < r.stop <= data.num_days and r.num_days >= 2


@pytest.mark.parametrize("days,window", [(60, 1), (60, 10), (200, 30), (41, 30)])
def test_fraction_splits_partition_the_usable_days(days, window):
    data = bdays_data(days)
    splits = split_days(data, window=window)
    _check_partition(splits, data, window)
    assert splits.test is not None and splits.test.stop == data.num_days
    usable = days - window + 1
    assert abs(splits.train.num_days - 0.7 * usable) <= 1


def test_fraction_splits_with_zero_validation_and_leftover():
    data = bdays_data(100)
    splits = split_days(data, window=5, fractions=(0.5, 0.0, 0.25))
    assert splits.validation is None
    _check_partition(splits, data, 5)
    assert splits.test.stop < data.num_days  # the last quarter is unused


def test_date_splits_include_their_end_date():
    data = bdays_data(60)
    idx = {data.date_str(i): i for i in range(data.num_days)}
    splits = split_days(data, window=5, train_end="2021-04-01", validation_end="2021-04-15", test_end="2021-05-04")
    assert splits.train == DayRange(4, idx["2021-04-01"] + 1)
    assert splits.validation == DayRange(idx["2021-04-01"] + 1, idx["2021-04-15"] + 1)
    assert splits.test == DayRange(idx["2021-04-15"] + 1, idx["2021-05-04"] + 1)
    # a split never contains a day after its end date
    assert data.date_str(splits.train.stop - 1) == "2021-04-01"
    assert data.date_str(splits.test.stop - 1) == "2021-05-04"


def test_date_splits_weekend_end_and_test_to_the_end():
    data = bdays_data(60)
    splits = split_days(data, window=5, train_end="2021-04-03")  # a Saturday
    assert data.date_str(splits.train.stop - 1) == "2021-04-02"
    assert splits.validation is None and splits.test == DayRange(splits.train.stop, data.num_days)
    last = split_days(data, window=5, train_end=data.date_str(-3), validation_end=data.date_str(-1))
    assert last.test is None


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"train_end": "2020-01-01"}, "train_end 2020-01-01 is outside the usable dates"),
        ({"train_end": "2031-01-01"}, "outside the usable dates"),
        (
            {"train_end": "2021-04-15", "validation_end": "2021-04-01"},
            "validation_end 2021-04-01 must be after train_end",
        ),
        ({"train_end": "2021-04-16", "validation_end": "2021-04-18"}, "must be after train_end"),  # same last day
        ({"validation_end": "2021-04-15"}, "train_end is required"),
        ({"train_end": "2021-03-05"}, "the train split has 1 trading day(s)"),
        ({"train_end": "2021-04-15", "fractions": (0.5, 0.2, 0.3)}, "not both"),
        ({"fractions": (0.8, 0.3, 0.2)}, "add up to 1.3"),
        ({"fractions": (0.0, 0.5, 0.5)}, "train > 0"),
        ({"fractions": (0.98, 0.01, 0.01)}, "the validation split has"),
        ({"train_end": "not a date"}, "is not a date"),
    ],
)
def test_split_errors(kwargs, expected):
    data = bdays_data(60)
    assert expected in error_of(split_days, data, window=5, **kwargs)


def test_too_few_days_for_the_window():
    data = bdays_data(30)
    assert "too few trading days: the data has 30, a window of 30 needs at least 31" in error_of(
        split_days, data, window=30
    )
    assert "window must be a whole number" in error_of(require_days, data, 0)
    require_days(data, 29)


def test_fixture_splits_by_date():
    data = MarketData.from_path(FIXTURE)
    splits = split_days(data, window=30, train_end="2019-12-31", validation_end="2020-12-31")
    assert data.date_str(splits.train.start) == "2013-02-13"
    assert data.date_str(splits.validation.start) == "2020-01-02"
    assert data.date_str(splits.test.start) == "2021-01-04"
    assert splits.test.stop == data.num_days


@settings(max_examples=200, deadline=None)
@given(
    days=st.integers(2, 120),
    window=st.integers(1, 40),
    fr=st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
)
def test_fraction_splits_property(days, window, fr):
    """Any fractions/days/window: either a clean UserError or ordered, adjacent, in-range splits >= 2 days."""
    data = _PROPERTY_DATA.slice_days(0, days)
    try:
        splits = split_days(data, window=window, fractions=fr)
    except UserError:
        return
    assert sum(fr) <= 1 + 1e-9 and days >= window + 1
    _check_partition(splits, data, window)
    last = [r for r in splits.as_dict().values() if r is not None][-1]
    assert last.stop <= days


_PROPERTY_DATA = MarketData.from_frame(make_frame(tickers=("AAA",), days=120))


def test_an_implausible_jump_is_refused_naming_ticker_and_date_unless_allowed() -> None:
    frame = generate_market(num_tickers=2, num_days=60, seed=1).to_frame()
    row = (frame["tic"] == "SYN00").to_numpy().nonzero()[0][30]
    frame.loc[row, ["open", "high", "close"]] = 1e300
    day = str(frame.loc[row, "date"].date())
    with pytest.raises(UserError, match=rf"implausible price jump: SYN00 closed at 1e\+300 on {day} after"):
        MarketData.from_frame(frame)
    assert MarketData.from_frame(frame, max_price_ratio=0).close.max() == 1e300  # allowed on request
    halved = generate_market(num_tickers=2, num_days=60, seed=1).to_frame()
    halved.loc[row:, ["open", "high", "low", "close"]] /= 2  # a 2:1 split left unadjusted is plausible
    MarketData.from_frame(halved)
