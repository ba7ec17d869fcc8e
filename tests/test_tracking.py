"""`--track wandb`: real training runs logged by the real wandb client in its offline mode (no network), then
read back from the run log wandb wrote; compared with TensorBoard's event files of the same run."""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from clstm_ppo import cli
from clstm_ppo.training.tracking import RUN_ID_FILE
from tests.conftest import QUICK, QUICK_DATA, read_metrics, train

KEY = "PKTRACKINGKEY0MUSTNOTLEAK"
SECRET = "trackingSecret-must-not-leak-3c2b1a"
LEVELDB_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of 7-byte-headed chunks


def wandb_records(path: Path) -> list[Any]:
    """Every record of a ``run-<id>.wandb`` file, parsed with wandb's own protobuf schema.

    wandb has no public reader for this file (``wandb sync`` uploads it): the framing is LevelDB's log format
    after a 7-byte ``:W&B`` header: each chunk is crc32c (4 bytes), length (2, little-endian), type (1: full,
    2: first, 3: middle, 4: last); a block's tail shorter than a chunk header is padding.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if LEVELDB_BLOCK - pos % LEVELDB_BLOCK < 7:
            pos += LEVELDB_BLOCK - pos % LEVELDB_BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def of_type(records: list[Any], kind: str) -> list[Any]:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def item_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_scalars(records: list[Any]) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, each tag at the step of the counter logged with it (``episode`` or ``global_step``)."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for history in of_type(records, "history"):
        row = {item_key(i): json.loads(i.value_json) for i in history.item}
        step_name = "episode" if "episode" in row else "global_step"
        for tag, value in row.items():
            if "/" in tag:
                out[tag][int(row[step_name])] = value
    return dict(out)


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


@pytest.fixture
def offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """W&B offline and silent, every file it keeps under tmp_path; fake Alpaca keys in the environment."""
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("ALPACA_API_KEY", KEY)
    monkeypatch.setenv("ALPACA_SECRET_KEY", SECRET)
    return tmp_path


@pytest.mark.slow
def test_track_wandb_logs_what_tensorboard_gets_from_rank_0_and_resumes_the_same_run(offline_wandb: Path) -> None:
    tmp_path = offline_wandb
    flags = ["--run_name", "wb", "--track", "wandb", "--tensorboard", "--policy", "mlp", "--num_workers", "2"]
    first = train(tmp_path, *flags, "--num_episodes", "8")
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "ck" / "wb"
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1  # rank 0 alone: one W&B run for the two workers
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    records = wandb_records(runs[0] / f"run-{run_id}.wandb")

    run = of_type(records, "run")[0]
    assert (run.run_id, run.display_name, run.project) == (run_id, "wb", "clstm-ppo")
    config = {i.key: json.loads(i.value_json) for i in run.config.update if i.key != "_wandb"}
    assert config == json.loads((run_dir / "config.json").read_text())  # the resolved settings, once
    assert config["track"] == "wandb" and config["num_workers"] == 2

    logged = wandb_scalars(records)
    board = tensorboard_scalars(run_dir / "tensorboard")
    assert set(logged) == set(board) and {"episode/return", "train/policy_loss", "train/approx_kl"} <= set(board)
    for tag, points in board.items():  # same steps; TensorBoard keeps float32
        assert logged[tag].keys() == points.keys(), tag
        assert [logged[tag][s] for s in sorted(points)] == pytest.approx([points[s] for s in sorted(points)], rel=1e-6)
    episodes, updates = read_metrics(run_dir)
    assert sorted(logged["episode/return"]) == [e["episode"] for e in episodes]
    assert sorted(logged["train/policy_loss"]) == [u["global_step"] for u in updates]

    again = train(tmp_path, *flags, "--num_episodes", "16", "--resume", "latest")
    assert again.returncode == 0, again.stderr
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)  # the same W&B run, continued
    resumed = wandb_scalars(wandb_records(runs[1] / f"run-{run_id}.wandb"))
    assert min(resumed["episode/return"]) == len(episodes) + 1
    assert min(resumed["train/policy_loss"]) > max(logged["train/policy_loss"])

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written)
    for path in written:
        blob = path.read_bytes()
        assert KEY.encode() not in blob and SECRET.encode() not in blob, path


def test_track_wandb_without_wandb_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that is not installed
    code = cli.main(["train", *QUICK_DATA, *QUICK, "--track", "wandb"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --track wandb needs the wandb package: pip install 'clstm-ppo[wandb]'")
    assert not (tmp_path / "checkpoints").exists()  # refused before the run folder or the data
