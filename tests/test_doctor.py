"""`clstm-ppo doctor` as a real subprocess: names keys, never prints them; flags unwritable folders."""

from __future__ import annotations

import os
import subprocess
import sys


def run_doctor(tmp_path, *args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALPACA_", "APCA_"))}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "doctor", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_doctor_reports_keys_by_name_only(tmp_path):
    secret = "PKTESTSECRET123456"
    result = run_doctor(
        tmp_path,
        "--checkpoint_dir",
        str(tmp_path / "ck"),
        env_extra={"ALPACA_API_KEY": secret, "ALPACA_SECRET_KEY": secret + "X"},
    )
    assert result.returncode == 0, result.stderr
    assert "ALPACA_API_KEY and ALPACA_SECRET_KEY set" in result.stdout
    assert secret not in result.stdout + result.stderr
    assert "gloo backend" in result.stdout and "torch" in result.stdout


def test_doctor_accepts_the_mixed_key_names_that_downloads_accept(tmp_path):
    """load_credentials takes a key from either family and a secret from either; doctor must agree."""
    result = run_doctor(
        tmp_path,
        "--checkpoint_dir",
        str(tmp_path / "ck"),
        env_extra={"APCA_API_KEY_ID": "PKMIXED1", "ALPACA_SECRET_KEY": "mixedsecret"},
    )
    assert result.returncode == 0, result.stderr
    assert "APCA_API_KEY_ID and ALPACA_SECRET_KEY set" in result.stdout
    half = run_doctor(tmp_path, "--checkpoint_dir", str(tmp_path / "ck"), env_extra={"APCA_API_KEY_ID": "PKONLY"})
    assert "not set: needed only for --data alpaca" in half.stdout


def test_doctor_fails_on_unwritable_checkpoint_folder(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run_doctor(tmp_path, "--checkpoint_dir", str(blocker / "ck"))
    assert result.returncode == 1
    assert "FAIL" in result.stdout and "checkpoint folder" in result.stdout
