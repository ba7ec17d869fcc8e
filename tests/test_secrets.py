"""Secrets never leave the environment: with fake Alpaca keys in the environment and in ./.env, a
2-worker training and a backtest write no key to any file or to their output, write nothing outside
the folders they were given, and their checkpoints load with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import QUICK

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "train_distributed_clstm_ppo.py")
TINY = [
    *["--data", "synthetic:tickers=3,days=300", *QUICK],
    *["--num_episodes", "8", "--num_workers", "2", "--save_every", "4"],
    *["--config", str(ROOT / "tests" / "fixtures" / "checkpoint_every_update.json")],
]
ENV_KEYS = {"ALPACA_API_KEY": "PKENVFAKEKEY0123456789", "ALPACA_SECRET_KEY": "envFakeSecret0123456789abcdefghijklmnop"}
DOTENV_KEYS = {"APCA_API_KEY_ID": "PKDOTENVFAKEKEY98765", "APCA_API_SECRET_KEY": "dotenvFakeSecretZYXWVU9876543210"}


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_keys_reach_no_file_and_no_output_and_nothing_is_written_elsewhere(tmp_path):
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in DOTENV_KEYS.items()), encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALPACA_", "APCA_", "CLSTM_PPO_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(ENV_KEYS, PYTHONUNBUFFERED="1")
    before = _files(tmp_path)
    train = subprocess.run(
        [sys.executable, SCRIPT, *TINY, "--checkpoint_dir", "ck", "--run_name", "r"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert train.returncode == 0, train.stderr
    backtest = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "backtest", "--checkpoint", "ck/r/latest.pt", "--out", "reports"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert backtest.returncode == 0, backtest.stderr

    written = _files(tmp_path) - before
    # only inside the two folders given on the command line
    assert written and all(p.relative_to(tmp_path).parts[0] in ("ck", "reports") for p in written), sorted(written)
    names = {p.name for p in written}
    assert {"latest.pt", "best.pt", "config.json", "metrics.jsonl", "episode_4.pt", "report.json"} <= names, names
    secrets = [*ENV_KEYS.values(), *DOTENV_KEYS.values()]
    for path in written:
        blob = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in blob, f"{secret} found in {path}"
    for stream in (train.stdout, train.stderr, backtest.stdout, backtest.stderr):
        assert not any(secret in stream for secret in secrets)
    for path in written:
        if path.suffix == ".pt":  # plain tensors and data only: loads without unpickling code
            assert isinstance(torch.load(path, weights_only=True), dict)
