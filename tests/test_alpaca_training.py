"""Training on Alpaca bars end to end: the real alpaca-py client against the local Alpaca test server.

Also the secrets check: fake keys are planted, and no file the run writes (cache, checkpoints, config,
metrics) nor anything it prints contains them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from clstm_ppo.training.checkpoint import load_checkpoint
from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars
from tests.conftest import SCRIPT, TINY, clean_env, settings_file

KEY = "PKTRAINKEYMUSTNOTLEAK0001"
SECRET = "trainSECRETmustNOTleak-9f8e7d6c"
TICKERS = ["AAPL", "MSFT", "NVDA"]


@pytest.mark.slow
def test_train_on_alpaca_bars_and_never_store_keys(tmp_path):
    state = ServerState(key=KEY, secret=SECRET, bars=daily_bars(TICKERS, "2022-01-03", "2023-12-29"), page_size=200)
    with AlpacaTestServer(state) as server:
        tiny = [a for a in TINY if not a.startswith("synthetic")]
        tiny.remove("--data")
        env = clean_env() | {"ALPACA_API_KEY": KEY, "ALPACA_SECRET_KEY": SECRET}
        cmd = [
            sys.executable,
            SCRIPT,
            *tiny,
            "--data",
            "alpaca",
            "--tickers",
            ",".join(TICKERS),
            "--start",
            "2022-01-03",
            "--end",
            "2023-12-29",
            *settings_file(tmp_path, data_url=server.url, data_cache_dir=str(tmp_path / "cache")),
            "--checkpoint_dir",
            str(tmp_path / "ck"),
            "--run_name",
            "alp",
            "--num_episodes",
            "8",
        ]
        result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        requests_first = len(server.bar_requests())
        assert requests_first > 0
        assert result.returncode == 0, result.stderr
        again = subprocess.run(
            cmd[:-4] + ["--run_name", "alp2", "--num_episodes", "4"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert again.returncode == 0, again.stderr
        assert len(server.bar_requests()) == requests_first  # the second run read the cache
    ckpt = load_checkpoint(tmp_path / "ck" / "alp" / "latest.pt")
    assert ckpt.market_spec["tickers"] == TICKERS
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and any(p.name == "latest.pt" for p in written)
    for path in written:
        blob = path.read_bytes()
        assert KEY.encode() not in blob and SECRET.encode() not in blob, path
    for text in (result.stdout, result.stderr, again.stdout, again.stderr):
        assert KEY not in text and SECRET not in text


@pytest.mark.slow
def test_backtest_of_an_alpaca_run_fetches_the_bars_it_was_trained_on(tmp_path):
    """The backtest rebuilds the market with the run's own Alpaca settings (adjustment, feed, timeframe,
    endpoint, cache folder), not the defaults: a run on raw SIP bars is backtested on raw SIP bars."""
    state = ServerState(key=KEY, secret=SECRET, bars=daily_bars(TICKERS, "2022-01-03", "2023-12-29"))
    with AlpacaTestServer(state) as server:
        tiny = [a for a in TINY if not a.startswith("synthetic")]
        tiny.remove("--data")
        env = clean_env() | {"ALPACA_API_KEY": KEY, "ALPACA_SECRET_KEY": SECRET}
        cache = tmp_path / "run-cache"
        train = subprocess.run(
            [
                sys.executable,
                SCRIPT,
                *tiny,
                "--data",
                "alpaca:adjustment=raw,feed=sip",
                "--tickers",
                ",".join(TICKERS),
                "--start",
                "2022-01-03",
                "--end",
                "2023-12-29",
                *settings_file(tmp_path, data_url=server.url, data_cache_dir=str(cache)),
                "--checkpoint_dir",
                str(tmp_path / "ck"),
                "--run_name",
                "raw",
                "--num_episodes",
                "4",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert train.returncode == 0, train.stderr
        trained_with = [r["params"] for r in server.bar_requests()]
        assert {(p["adjustment"], p["feed"], p["timeframe"]) for p in trained_with} == {("raw", "sip", "1Day")}
        shutil.rmtree(cache)  # the backtest must fetch again, and show what it asks for
        state.requests.clear()
        bt = subprocess.run(
            [
                sys.executable,
                "-m",
                "clstm_ppo.cli",
                "backtest",
                "--checkpoint",
                str(tmp_path / "ck" / "raw" / "latest.pt"),
                "--out",
                str(tmp_path / "bt"),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert bt.returncode == 0, bt.stderr
        asked = [r["params"] for r in server.bar_requests()]
    assert asked and {(p["adjustment"], p["feed"], p["timeframe"]) for p in asked} == {("raw", "sip", "1Day")}
    assert any(cache.rglob("*.parquet"))  # into the run's own cache folder
