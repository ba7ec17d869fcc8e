"""Run `clstm-ppo trade` for real against the two local test servers and print what a terminal shows.

    PYTHONPATH=. python -m tests.trade_demo /tmp/trade-demo

The output quoted in docs/trading.md comes from this script: a tiny checkpoint is trained on 3 tickers of
served daily bars (2022-2023; the bars go on to March 2024, NYSE holidays of 2024 left out), then, with the
trading server's clock after the close of Friday 2024-02-16 and a paper account holding $100,000, 20 MSFT
and 10 TSLA: a dry run, the same with --submit (the orders wait for the next open), --submit again, a run
on Monday 2024-02-19 (Presidents' Day, no session), the next session's run on Tuesday (which records the
fills) and `clstm-ppo trade report`. Every command is a real process with fake keys in its environment;
the servers run in this process.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars
from tests.alpaca_trading_server import NY, NYSE_HOLIDAYS, AlpacaTradingServer, Holding, TradingState
from tests.conftest import TINY_RUN

ROOT = Path(__file__).resolve().parents[1]
KEY, SECRET = "PKDEMOKEY0000000000", "demo-secret-0000000000000000"
TICKERS = ["AAPL", "MSFT", "NVDA"]
TRAIN = [
    *["--data", "alpaca", "--tickers", ",".join(TICKERS), "--start", "2022-01-03", "--end", "2023-12-29"],
    *TINY_RUN,
    *["--hmax", "5000", "--num_episodes", "8", "--run_name", "demo"],
]


def closes(bars: dict, day: str) -> dict[str, float]:
    return {t: next(b["c"] for b in bars[t] if b["t"].startswith(day)) for t in TICKERS}


def show(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run ``clstm-ppo ARGS`` and print it as a terminal would."""
    print(f"$ clstm-ppo {shlex.join(args)}")
    done = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    print((done.stdout + done.stderr).rstrip())
    print(f"[exit status {done.returncode}]\n")


def main(folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    served = daily_bars(TICKERS, "2022-01-03", "2024-03-28")
    bars = {t: [b for b in rows if b["t"][:10] not in NYSE_HOLIDAYS or b["t"] < "2024"] for t, rows in served.items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALPACA_", "APCA_"))}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", ALPACA_API_KEY=KEY, ALPACA_SECRET_KEY=SECRET)
    day, nxt = "2024-02-16", "2024-02-20"
    state = TradingState(
        key=KEY,
        secret=SECRET,
        prices={**closes(bars, day), "TSLA": 252.5},
        cash=100_000.0,
        positions={"MSFT": Holding.at(20, 68.0), "TSLA": Holding.at(10, 240.0)},
        now=datetime(2024, 2, 16, 16, 30, tzinfo=NY),
    )
    with (
        AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=bars)) as data,
        AlpacaTradingServer(state) as trading,
    ):
        env.update(ALPACA_DATA_URL=data.url, ALPACA_TRADING_URL=trading.url)
        train = subprocess.run(
            [sys.executable, str(ROOT / "train_distributed_clstm_ppo.py"), *TRAIN],
            cwd=out,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if train.returncode:
            raise SystemExit(train.stderr)
        ck = "checkpoints/demo/latest.pt"
        show(["trade", "--checkpoint", ck], out, env)
        show(["trade", "--checkpoint", ck, "--submit"], out, env)
        show(["trade", "--checkpoint", ck, "--submit"], out, env)  # the same day again: nothing twice
        with state.lock:
            state.now = datetime(2024, 2, 19, 16, 30, tzinfo=NY)  # Presidents' Day
        show(["trade", "--checkpoint", ck, "--submit"], out, env)
        with state.lock:  # the next session: the queued orders fill at its open; the command runs after its close
            state.fill_when_closed = True
            state.fill_prices = {t: round(p * 1.004, 2) for t, p in closes(bars, day).items()}  # gap at the open
            state.prices.update(closes(bars, nxt))
            state.now = datetime(2024, 2, 20, 16, 30, tzinfo=NY)
        show(["trade", "--checkpoint", ck], out, env)
        show(["trade", "report", "--checkpoint", ck], out, env)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "trade-demo")
