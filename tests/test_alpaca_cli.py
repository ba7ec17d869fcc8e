"""`clstm-ppo data download` as a real subprocess against the local Alpaca test server.

Runs `python -m clstm_ppo.cli data download` with a
scrubbed environment and cwd in tmp_path, so no real keys and no `.env` from the checkout are seen.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

try:  # tests/ is a package in this repo; plain rootdir-relative import if it ever is not
    from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars
except ImportError:
    from alpaca_server import AlpacaTestServer, ServerState, daily_bars

REPO = Path(__file__).resolve().parents[1]
KEY = "PKCLI9X8W7V6KEYIDLEAKCHECK"
SECRET = "cliSECRETshouldNEVERappear-0a1b2c3d4e5f"
TICKERS = ["AAPL", "MSFT"]


@pytest.fixture
def server():
    bars = daily_bars(TICKERS, "2023-12-01", "2024-03-29")
    state = ServerState(key=KEY, secret=SECRET, bars=bars, page_size=10)
    with AlpacaTestServer(state) as srv:
        yield srv


def run_cli(
    cwd: Path, args: list[str], module: tuple[str, ...] = ("clstm_ppo.cli", "data", "download"), **env_vars: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALPACA_", "APCA_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["ALPACA_RETRY_WAIT_SECONDS"] = "0.01"
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-m", *module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def download_args(url: str, *extra: str) -> list[str]:
    return [
        "--tickers",
        ",".join(TICKERS),
        "--start",
        "2024-01-02",
        "--end",
        "2024-01-31",
        "--data_url",
        url,
        "--cache_dir",
        "cache",
        *extra,
    ]


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert proc.stdout == ""


def test_download_end_to_end_never_writes_or_prints_keys(tmp_path: Path, server: AlpacaTestServer) -> None:
    (tmp_path / ".env").write_text(f"ALPACA_API_KEY={KEY}\nALPACA_SECRET_KEY={SECRET}\n")
    proc = run_cli(tmp_path, download_args(server.url, "--out", "out/bars.csv", "--debug"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "44 bars for 2 tickers, 22 dates 2024-01-02..2024-01-31 (1Day, all, iex), cache cache; wrote out/bars.csv"
    ]
    frame = pd.read_csv(tmp_path / "out" / "bars.csv", parse_dates=["date"])
    assert list(frame.columns) == ["date", "tic", "open", "high", "low", "close", "volume"]
    assert len(frame) == 44 and set(frame["tic"]) == set(TICKERS)
    assert len(server.bar_requests()) == 5  # 44 bars, pages of 10

    proc2 = run_cli(tmp_path, download_args(server.url, "--out", "out/bars.parquet"))
    assert proc2.returncode == 0 and len(server.bar_requests()) == 5  # served from the cache

    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".env"]
    assert {p.suffix for p in written} == {".csv", ".parquet"} and len(written) == 3
    for path in written:
        blob = path.read_bytes()
        assert KEY.encode() not in blob and SECRET.encode() not in blob, path
        assert KEY not in str(path) and SECRET not in str(path)
    for text in (proc.stdout, proc.stderr, proc2.stdout, proc2.stderr):
        assert KEY not in text and SECRET not in text


def test_missing_keys(tmp_path: Path, server: AlpacaTestServer) -> None:
    proc = run_cli(tmp_path, download_args(server.url))
    assert_one_error_line(proc, "ALPACA_API_KEY", "ALPACA_SECRET_KEY", ".env.example")
    assert server.bar_requests() == []


def test_bad_keys(tmp_path: Path, server: AlpacaTestServer) -> None:
    proc = run_cli(tmp_path, download_args(server.url), APCA_API_KEY_ID="PKWRONGKEY", APCA_API_SECRET_KEY="wrongsecret")
    assert_one_error_line(proc, "rejected the API keys", "HTTP 403")
    assert "PKWRONGKEY" not in proc.stderr and "wrongsecret" not in proc.stderr


def test_rate_limit_exhausted(tmp_path: Path, server: AlpacaTestServer) -> None:
    server.state.fail_429 = 1000
    proc = run_cli(
        tmp_path, download_args(server.url), ALPACA_API_KEY=KEY, ALPACA_SECRET_KEY=SECRET, ALPACA_MAX_RETRIES="2"
    )
    assert_one_error_line(proc, "HTTP 429", "after 2 retries")
    assert len(server.bar_requests()) == 3


def test_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_cli(tmp_path, download_args(f"http://127.0.0.1:{port}"), ALPACA_API_KEY=KEY, ALPACA_SECRET_KEY=SECRET)
    assert_one_error_line(proc, "cannot connect", f"127.0.0.1:{port}")


def test_unknown_ticker_through_clstm_ppo_data_download(tmp_path: Path, server: AlpacaTestServer) -> None:
    args = ["--tickers", "AAPL,NOPE", "--start", "2024-01-02", "--end", "2024-01-31"]
    proc = run_cli(
        tmp_path,
        args,
        module=("clstm_ppo.cli", "data", "download"),
        ALPACA_API_KEY=KEY,
        ALPACA_SECRET_KEY=SECRET,
        ALPACA_DATA_URL=server.url,
    )
    assert_one_error_line(proc, "no bars for NOPE")
