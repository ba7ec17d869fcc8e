"""envs.alpaca against a local HTTP server speaking Alpaca's protocol, through the real alpaca-py client."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs.alpaca import cache_path, fetch_bars, parse_timeframe, redact_url, resolve_data_url
from envs.errors import UserError

try:  # tests/ is a package in this repo; plain rootdir-relative import if it ever is not
    from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars, intraday_bars
    from tests.conftest import use_alpaca_keys
except ImportError:
    from alpaca_server import AlpacaTestServer, ServerState, daily_bars, intraday_bars
    from conftest import use_alpaca_keys

KEY = "PKTEST7Q2ZKEYIDVALUE"
SECRET = "s3cr3tVALUEdo-not-leak-9f8e7d6c5b4a"
TICKERS = ["AAPL", "MSFT", "NVDA"]
START, END = "2024-01-02", "2024-02-09"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean slate: no Alpaca variables, cwd in tmp_path (no .env above it), fast retries, good keys."""
    use_alpaca_keys(monkeypatch, KEY, SECRET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def server():
    bars = daily_bars(TICKERS, "2023-12-01", "2024-03-29")
    state = ServerState(key=KEY, secret=SECRET, bars=bars, page_size=7)
    with AlpacaTestServer(state) as srv:
        yield srv


def expected_frame(bars: dict, tickers: list[str], start: str, end: str) -> pd.DataFrame:
    """Independent oracle: the served bars in range, dated by their New York calendar day."""
    rows = []
    for tic in tickers:
        for bar in bars[tic]:
            day = pd.Timestamp(bar["t"]).tz_convert("America/New_York").tz_localize(None).normalize()
            if pd.Timestamp(start) <= day <= pd.Timestamp(end):
                rows.append((day, tic, bar["o"], bar["h"], bar["l"], bar["c"], float(bar["v"])))
    frame = pd.DataFrame(rows, columns=["date", "tic", "open", "high", "low", "close", "volume"])
    return frame.sort_values(["date", "tic"]).reset_index(drop=True)


def fetch(server: AlpacaTestServer, tmp_path: Path, **kw) -> pd.DataFrame:
    kw.setdefault("cache_dir", tmp_path / "cache")
    kw.setdefault("data_url", server.url)
    return fetch_bars(kw.pop("tickers", TICKERS), kw.pop("start", START), kw.pop("end", END), **kw)


def assert_frames_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == ["date", "tic", "open", "high", "low", "close", "volume"]
    assert len(got) == len(want)
    np.testing.assert_array_equal(got["date"].to_numpy(), want["date"].to_numpy(dtype="datetime64[ns]"))
    assert got["tic"].tolist() == want["tic"].tolist()
    for col in ("open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(got[col].to_numpy(), want[col].to_numpy(dtype=float))


# ------------------------------------------------------------------------------------ download and pages


def test_multi_page_multi_symbol_download_is_complete(env: Path, server: AlpacaTestServer) -> None:
    got = fetch(server, env)
    want = expected_frame(server.state.bars, TICKERS, START, END)
    assert_frames_equal(got, want)
    assert got["date"].dtype == np.dtype("datetime64[ns]")
    assert got["date"].dt.tz is None and (got["date"] == got["date"].dt.normalize()).all()
    # Last day included; 29 weekdays x 3 tickers = 87 bars over pages of 7.
    assert got["date"].max() == pd.Timestamp(END) and got["date"].min() == pd.Timestamp(START)
    requests = server.bar_requests()
    assert len(requests) == -(-len(want) // 7) == 13
    first, rest = requests[0], requests[1:]
    assert first["params"]["symbols"] == "AAPL,MSFT,NVDA"
    assert first["params"]["timeframe"] == "1Day"
    assert first["params"]["adjustment"] == "all" and first["params"]["feed"] == "iex"
    assert "page_token" not in first["params"] and all(r["params"].get("page_token") for r in rest)
    assert all((r["key"], r["secret"]) == (KEY, SECRET) for r in requests)


def test_feed_adjustment_timeframe_are_sent(env: Path, server: AlpacaTestServer) -> None:
    server.state.bars = intraday_bars(["AAPL"], "2024-01-03", minutes=15)
    got = fetch(
        server,
        env,
        tickers=["aapl"],
        start="2024-01-03",
        end="2024-01-03",
        timeframe="15Min",
        adjustment="split",
        feed="sip",
    )
    params = server.bar_requests()[0]["params"]
    assert (params["timeframe"], params["adjustment"], params["feed"]) == ("15Min", "split", "sip")
    # Intraday bars keep their New York start time.
    assert got["date"].iloc[0] == pd.Timestamp("2024-01-03 09:30")
    assert got["date"].iloc[-1] == pd.Timestamp("2024-01-03 15:45")
    assert len(got) == 26 and set(got["tic"]) == {"AAPL"}


def test_summer_and_winter_midnights_map_to_calendar_days(env: Path, server: AlpacaTestServer) -> None:
    server.state.bars = daily_bars(["AAPL"], "2024-03-08", "2024-03-12")  # DST starts 2024-03-10
    got = fetch(server, env, tickers=["AAPL"], start="2024-03-08", end="2024-03-12")
    assert [d.strftime("%Y-%m-%d") for d in got["date"]] == ["2024-03-08", "2024-03-11", "2024-03-12"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Day", "1Day"),
        ("1D", "1Day"),
        ("day", "1Day"),
        ("1Hour", "1Hour"),
        ("4h", "4Hour"),
        ("15Min", "15Min"),
        ("5minutes", "5Min"),
        ("1Week", "1Week"),
        ("3Month", "3Month"),
    ],
)
def test_parse_timeframe(text: str, value: str) -> None:
    assert parse_timeframe(text).value == value


@pytest.mark.parametrize("text", ["", "Day1", "90Min", "2Day", "1Fortnight", "5Month"])
def test_parse_timeframe_rejects(text: str) -> None:
    with pytest.raises(UserError, match="timeframe"):
        parse_timeframe(text)


def test_bad_arguments_are_user_errors_before_any_request(env: Path, server: AlpacaTestServer) -> None:
    for kw, pattern in [
        ({"adjustment": "splits"}, "adjustment"),
        ({"feed": "otc"}, "feed"),
        ({"start": "2024-02-10"}, "after end"),
        ({"start": "yesterday-ish"}, "start date"),
        ({"tickers": []}, "no tickers"),
        ({"tickers": ["AA PL"]}, "not a ticker"),
    ]:
        with pytest.raises(UserError, match=pattern):
            fetch(server, env, **kw)
    assert server.bar_requests() == []


def test_data_url_resolution(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_data_url(None) == "https://data.alpaca.markets"
    monkeypatch.setenv("ALPACA_DATA_URL", "http://proxy.local:8080/v2/")
    assert resolve_data_url(None) == "http://proxy.local:8080"
    assert resolve_data_url("http://127.0.0.1:9") == "http://127.0.0.1:9"
    with pytest.raises(UserError, match="not an http"):
        resolve_data_url("ftp://x")
    assert redact_url("https://user:pw@proxy.local:8443/x?token=abc") == "https://proxy.local:8443/x"


# ------------------------------------------------------------------------------------ cache


def test_second_call_reads_cache_without_requests_or_keys(
    env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fetch(server, env)
    n = len(server.bar_requests())
    monkeypatch.delenv("ALPACA_API_KEY")
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    again = fetch(server, env, tickers=list(reversed(TICKERS)))  # order does not change the key
    assert len(server.bar_requests()) == n
    pd.testing.assert_frame_equal(first, again)


def test_refresh_downloads_again(env: Path, server: AlpacaTestServer) -> None:
    fetch(server, env)
    n = len(server.bar_requests())
    server.state.bars["AAPL"][25]["c"] = 999.0  # 2024-01-08 in the served range; shows the new data is used
    got = fetch(server, env, refresh=True)
    assert len(server.bar_requests()) == 2 * n
    assert 999.0 in got.loc[got["tic"] == "AAPL", "close"].tolist()
    assert 999.0 in fetch(server, env)["close"].tolist()  # the cache was replaced


def test_cache_files_hold_no_keys_and_no_temp_leftovers(env: Path, server: AlpacaTestServer) -> None:
    fetch(server, env)
    files = [p for p in (env / "cache").rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].suffix == ".parquet" and not files[0].name.startswith(".")
    for path in files:
        blob = path.read_bytes()
        assert KEY.encode() not in blob and SECRET.encode() not in blob
        assert KEY not in path.name and SECRET not in path.name


def test_cache_key_covers_request_not_keys_or_url(env: Path) -> None:
    base = dict(
        cache_dir="c", tickers=["AAPL", "MSFT"], start=START, end=END, timeframe="1Day", adjustment="all", feed="iex"
    )
    path = cache_path(**base)
    assert cache_path(**{**base, "tickers": ["MSFT", "AAPL"]}) == path
    for change in (
        {"tickers": ["AAPL"]},
        {"start": "2024-01-03"},
        {"end": "2024-02-08"},
        {"timeframe": "1Hour"},
        {"adjustment": "raw"},
        {"feed": "sip"},
    ):
        assert cache_path(**{**base, **change}) != path, change


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_tickers"])
def test_damaged_cache_file_is_downloaded_again(
    env: Path, server: AlpacaTestServer, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = fetch(server, env)
    n = len(server.bar_requests())
    (path,) = (env / "cache").glob("*.parquet")
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "garbage":
        path.write_bytes(b"PAR1 not really parquet")
    else:
        good[good["tic"] != "NVDA"].to_parquet(path, index=False)
    got = fetch(server, env)
    assert len(server.bar_requests()) == 2 * n
    assert "ignoring unreadable cache file" in capsys.readouterr().err
    pd.testing.assert_frame_equal(got, good)
    pd.testing.assert_frame_equal(pd.read_parquet(path).reset_index(drop=True), good, check_dtype=False)


# ------------------------------------------------------------------------------------ keys


def test_missing_keys_name_the_variables(env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    with pytest.raises(UserError) as info:
        fetch(server, env)
    msg = str(info.value)
    assert "ALPACA_SECRET_KEY" in msg and "APCA_API_SECRET_KEY" in msg and ".env.example" in msg
    assert "ALPACA_API_KEY" not in msg.replace("ALPACA_API_KEY_", "")  # the key that is set is not named
    assert KEY not in msg and server.bar_requests() == []


def test_keys_from_dotenv_file(env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALPACA_API_KEY")
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    (env / ".env").write_text(f"# test\nALPACA_API_KEY={KEY}\nALPACA_SECRET_KEY='{SECRET}'\n")
    assert len(fetch(server, env)) > 0
    assert "ALPACA_API_KEY" not in os.environ  # read, not exported to child processes
    sub = env / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)  # only the working directory's .env counts
    with pytest.raises(UserError, match="keys not found"):
        fetch(server, env, refresh=True)


def test_environment_wins_over_dotenv(env: Path, server: AlpacaTestServer) -> None:
    (env / ".env").write_text("ALPACA_API_KEY=wrong\nALPACA_SECRET_KEY=wrong\n")
    assert len(fetch(server, env)) > 0


def test_apca_variables_are_accepted(env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALPACA_API_KEY")
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    monkeypatch.setenv("APCA_API_KEY_ID", KEY)
    monkeypatch.setenv("APCA_API_SECRET_KEY", SECRET)
    assert len(fetch(server, env)) > 0


def test_data_url_from_environment(env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALPACA_DATA_URL", server.url)
    fetch_bars(["AAPL"], START, END, cache_dir=env / "cache")
    assert len(server.bar_requests()) > 0


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("key", "secret", "status"),
    [("wrong", "wrong", "403"), (KEY, "bad" + SECRET, "403")],
    ids=["both-wrong", "secret-wrong"],
)
def test_bad_keys(
    env: Path, server: AlpacaTestServer, monkeypatch: pytest.MonkeyPatch, key: str, secret: str, status: str
) -> None:
    monkeypatch.setenv("ALPACA_API_KEY", key)
    monkeypatch.setenv("ALPACA_SECRET_KEY", secret)
    with pytest.raises(UserError, match=f"rejected the API keys \\(HTTP {status}") as info:
        fetch(server, env)
    assert key not in str(info.value) and secret not in str(info.value)
    assert not (env / "cache").exists() or not list((env / "cache").iterdir())


def test_unknown_ticker_is_named_and_not_cached(env: Path, server: AlpacaTestServer) -> None:
    with pytest.raises(UserError, match=r"no bars for QQQQX, ZZZZ between") as info:
        fetch(server, env, tickers=["AAPL", "ZZZZ", "QQQQX"])
    assert "AAPL" not in str(info.value)
    assert not list((env / "cache").glob("*.parquet")) if (env / "cache").exists() else True


def test_empty_range(env: Path, server: AlpacaTestServer) -> None:
    with pytest.raises(UserError, match="no bars at all"):
        fetch(server, env, start="2024-01-06", end="2024-01-07")  # a weekend


def test_rate_limit_retried_then_served(env: Path, server: AlpacaTestServer) -> None:
    server.state.fail_429 = 2
    got = fetch(server, env, max_retries=3)
    assert len(got) == 87
    assert len(server.bar_requests()) == 13 + 2


def test_rate_limit_waits_grow_exponentially(env: Path, server: AlpacaTestServer) -> None:
    server.state.fail_429 = 3
    fetch(server, env, max_retries=3, retry_wait_seconds=0.05)
    times = [r["time"] for r in server.bar_requests()[:4]]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.10 and gaps[2] >= 0.20, gaps


def test_rate_limit_exhausted(env: Path, server: AlpacaTestServer) -> None:
    server.state.fail_429 = 100
    with pytest.raises(UserError, match=r"rate limit \(HTTP 429\) still hit after 2 retries"):
        fetch(server, env, max_retries=2)
    assert len(server.bar_requests()) == 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused(env: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match="cannot connect to the Alpaca data API at http://127.0.0.1:"):
        fetch_bars(TICKERS, START, END, cache_dir=env / "cache", data_url=url)


@pytest.mark.parametrize("mode", ["not_json", "no_bars_key", "bars_list", "bad_bar"])
def test_malformed_response(env: Path, server: AlpacaTestServer, mode: str) -> None:
    server.state.mode = mode
    with pytest.raises(UserError, match="malformed response from the Alpaca data API"):
        fetch(server, env)
    assert not (env / "cache").exists() or not list((env / "cache").glob("*.parquet"))


def test_silent_server_times_out_with_one_clear_error(env: Path, server: AlpacaTestServer) -> None:
    """alpaca-py sets no request timeout; ours turns a server that never answers into one error line."""
    server.state.mode, server.state.hang_seconds = "hang", 4.0
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"did not answer within 0.5 s \(ALPACA_TIMEOUT_SECONDS\)"):
        fetch(server, env, timeout_seconds=0.5, max_retries=0)
    assert time.monotonic() - t0 < 3.0  # gave up on its own, long before the server would have answered
    with pytest.raises(UserError, match="ALPACA_TIMEOUT_SECONDS must be > 0"):
        fetch(server, env, timeout_seconds=0)


def test_wrong_path_is_a_clear_http_error(env: Path, server: AlpacaTestServer) -> None:
    with pytest.raises(UserError, match="HTTP 404 .*endpoint not found"):
        fetch(server, env, data_url=server.url + "/somewhere")


# ------------------------------------------------------------------------------------ contracts


def test_env_example_lists_every_variable_read() -> None:
    import envs.alpaca as alpaca

    text = (Path(__file__).resolve().parents[1] / ".env.example").read_text()
    names = (
        *alpaca.KEY_VARS,
        *alpaca.SECRET_VARS,
        alpaca.URL_VAR,
        alpaca.RETRIES_VAR,
        alpaca.RETRY_WAIT_VAR,
        alpaca.TIMEOUT_VAR,
        "MASTER_ADDR",
        "MASTER_PORT",
    )
    for name in names:
        assert name in text, name


def test_env_example_copied_as_is_means_no_keys(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALPACA_API_KEY")
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    (env / ".env").write_text((Path(__file__).resolve().parents[1] / ".env.example").read_text())
    with pytest.raises(UserError, match="Alpaca API keys not found"):
        fetch_bars(["AAPL"], START, END, cache_dir=env / "cache")


def test_alpaca_source_builds_market_data(env: Path, server: AlpacaTestServer) -> None:
    from envs.sources import load_market_data

    data = load_market_data(
        "alpaca", tickers=TICKERS, start=START, end=END, cache_dir=env / "cache", data_url=server.url
    )
    want = expected_frame(server.state.bars, TICKERS, START, END)
    assert data.tickers == tuple(TICKERS) and data.num_days == 29
    assert data.close[:, 1].tolist() == want.loc[want["tic"] == "MSFT", "close"].tolist()


def test_subscription_403_is_not_blamed_on_keys(env: Path, server: AlpacaTestServer) -> None:
    server.state.mode = "sip_recent"
    with pytest.raises(UserError, match="HTTP 403.*subscription does not permit.*--feed iex") as info:
        fetch(server, env, feed="sip")
    assert "API keys" not in str(info.value)


def test_range_not_over_is_not_cached(env: Path, server: AlpacaTestServer, capsys: pytest.CaptureFixture[str]) -> None:
    got = fetch(server, env, start="2024-03-25", end="2999-12-31")
    assert got["date"].max() == pd.Timestamp("2024-03-29")
    assert "not cached" in capsys.readouterr().err
    n = len(server.bar_requests())
    fetch(server, env, start="2024-03-25", end="2999-12-31")
    assert len(server.bar_requests()) == 2 * n
    assert not list((env / "cache").glob("*.parquet")) if (env / "cache").exists() else True
