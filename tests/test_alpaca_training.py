"""Training on Alpaca bars end to end: the real alpaca-py client against the local Alpaca test server.

Also the secrets check: fake keys are planted, and no file the run writes (cache, checkpoints, config,
metrics) nor anything it prints contains them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from clstm_ppo.training.checkpoint import load_checkpoint
from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars
from tests.test_trainer import SCRIPT, TINY, clean_env

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
        cmd = [sys.executable, SCRIPT, *tiny, "--data", "alpaca", "--tickers", ",".join(TICKERS),
               "--start", "2022-01-03", "--end", "2023-12-29", "--data_url", server.url,
               "--data_cache_dir", str(tmp_path / "cache"), "--checkpoint_dir", str(tmp_path / "ck"),
               "--run_name", "alp", "--num_episodes", "8"]
        result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        requests_first = len(server.bar_requests())
        assert requests_first > 0
        assert result.returncode == 0, result.stderr
        again = subprocess.run(cmd[:-4] + ["--run_name", "alp2", "--num_episodes", "4"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=240)
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
