"""The trainer end to end with real processes: spawn (2 gloo ranks), torchrun, two-node torchrun, resume."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import clstm_ppo
from clstm_ppo.training.checkpoint import load_checkpoint
from clstm_ppo.training.distributed import find_free_port
from tests.conftest import SCRIPT, TINY, clean_env, files_under, read_metrics, train


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``trained_once(*flags)``: the run folder of the tiny run (`train`) with ``flags``, trained the first time a
    test of this module asks for these flags and shared, read only, after: the resume test's uninterrupted run is
    also the first of the same-seed test's two runs (each training process costs seconds of imports)."""
    folders: dict[tuple[str, ...], Path] = {}

    def run_folder(*flags: str) -> Path:
        if flags not in folders:
            root = tmp_path_factory.mktemp("trained_once")
            result = train(root, *flags, "--run_name", "once")
            assert result.returncode == 0, result.stderr
            folders[flags] = root / "ck" / "once"
        return folders[flags]

    return run_folder


@pytest.mark.slow
def test_two_cpu_workers_train_together_and_only_rank0_writes(tmp_path):
    # with the running observation and reward statistics, which every rank must merge alike, and weight decay
    (tmp_path / "decay.json").write_text('{"weight_decay": 0.01}')
    result = train(
        tmp_path,
        "--num_workers",
        "2",
        "--num_episodes",
        "16",
        "--run_name",
        "two",
        "--norm_obs",
        "--norm_reward",
        "--config",
        str(tmp_path / "decay.json"),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "world size 2" in out and "backend gloo" in out
    assert "replicas in sync: 2 ranks hold identical weights" in out
    assert "[Rank 1]" not in out + result.stderr  # other ranks print nothing but errors
    assert "Episode 16/16" in out and "steps/s" in out
    run_dir = tmp_path / "ck" / "two"
    episodes, updates = read_metrics(run_dir)
    assert len(episodes) == 16 and len(updates) == 2  # 2 ranks x 4 envs x 2 updates
    assert {e["rank"] for e in episodes} == {0, 1}  # metrics of both ranks reached rank 0
    assert all(0 <= e["exposure"] <= 1 for e in episodes)
    for key in ("exposure", "clipped_fraction", "refused_buy_fraction", "advantage_std", "return_std", "policy_std"):
        assert all(u[key] >= 0 for u in updates), key
    assert all(len(u["action_mean"]) == 4 and len(u["action_std"]) == 4 for u in updates)
    assert [e["episode"] for e in episodes] == list(range(1, 17))
    assert all(e["length"] == 16 and e["final_value"] > 0 for e in episodes)
    # only rank 0's files, and nothing outside the run folder (cwd is tmp_path)
    assert files_under(tmp_path) == {
        "decay.json",
        *(f"ck/two/{name}" for name in ("latest.pt", "best.pt", "config.json", "metrics.jsonl")),
    }
    ckpt = load_checkpoint(run_dir / "latest.pt")
    assert ckpt.counters["episodes"] == 16 and ckpt.counters["update"] == 2
    assert len(ckpt.worker_states) == 2
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt.model_state)
    assert ckpt.version == clstm_ppo.__version__ and ckpt.cfg.ppo.weight_decay == 0.01
    rows = 2 * 4 * 16 * 2  # ranks x envs x steps x updates: every rank's states reached the statistics
    reward_counts = [w["reward_norm"]["moments"][0] for w in ckpt.worker_states]
    assert ckpt.model_state["obs_count"].item() == rows and reward_counts == [rows, rows]  # the same on each rank
    assert ckpt.model_state["obs_var"].min() > 0 and 0 < updates[-1]["reward_scale"] != 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--norm_obs", "--norm_reward", "--episode_length", "12"),
    ],  # episodes end inside rollouts
    ids=["defaults", "normalisers"],
)
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, extra, trained_once):
    straight = trained_once("--num_episodes", "16", *extra)
    first = train(tmp_path, "--num_episodes", "8", "--run_name", "split", *extra, here=True)
    assert first.returncode == 0, first.stderr
    second = train(tmp_path, "--num_episodes", "16", "--run_name", "split", "--resume", "latest", *extra, here=True)
    assert second.returncode == 0, second.stderr
    a = load_checkpoint(straight / "latest.pt")
    b = load_checkpoint(tmp_path / "ck" / "split" / "latest.pt")
    assert a.counters["update"] == b.counters["update"] >= 3
    for wa, wb in zip(a.worker_states, b.worker_states, strict=True):  # the running return statistics too
        assert wa["reward_norm"]["moments"] == wb["reward_norm"]["moments"]
        assert torch.equal(wa["reward_norm"]["discounted"], wb["reward_norm"]["discounted"])
    for key, value in a.model_state.items():
        assert torch.equal(value, b.model_state[key]), key
    episodes_a, _ = read_metrics(straight)
    episodes_b, _ = read_metrics(tmp_path / "ck" / "split")
    assert [e["final_value"] for e in episodes_a] == [e["final_value"] for e in episodes_b]


@pytest.mark.slow
def test_torchrun_launch_runs_the_same_worker(tmp_path):
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(find_free_port()),
    ]
    result = train(tmp_path, "--num_episodes", "8", "--run_name", "tr", launcher=launcher)
    assert result.returncode == 0, result.stderr
    assert "world size 2" in result.stdout and "(torchrun)" not in result.stderr
    episodes, _ = read_metrics(tmp_path / "ck" / "tr")
    assert {e["rank"] for e in episodes} == {0, 1}


@pytest.mark.slow
def test_two_node_torchrun_on_one_machine(tmp_path):
    port = find_free_port()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(node),
            "--nproc_per_node",
            "1",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_id",
            "clstm-test",
            SCRIPT,
            *TINY,
            "--checkpoint_dir",
            str(tmp_path / "ck"),
            "--num_episodes",
            "8",
            "--run_name",
            "multinode",
        ]
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    combined = outputs[0][0] + outputs[1][0]
    assert "world size 2" in combined and "replicas in sync" in combined
    episodes, _ = read_metrics(tmp_path / "ck" / "multinode")
    assert {e["rank"] for e in episodes} == {0, 1}


@pytest.mark.slow
def test_ranks_finishing_different_episode_counts_stop_together(tmp_path):
    # Whole-split episodes from random start days: each rank finishes episodes at its own pace.
    result = train(
        tmp_path,
        "--num_workers",
        "2",
        "--num_episodes",
        "3",
        "--episode_length",
        "full",
        "--run_name",
        "uneven",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    episodes, _ = read_metrics(tmp_path / "ck" / "uneven")
    assert len(episodes) >= 3


def test_dry_run_prints_config_and_layout(tmp_path):
    result = train(tmp_path, "--num_workers", "2", "--dry_run", "--num_episodes", "5")
    assert result.returncode == 0, result.stderr
    assert '"num_episodes": 5' in result.stdout and "world size 2" in result.stdout
    # what the run will see: the data and each split's first and last day and length
    assert "data: synthetic:tickers=4,days=400 | 4 tickers (SYN00, SYN01, SYN02, SYN03)" in result.stdout
    assert "(400 trading days; the first 4 are the window's lookback)" in result.stdout
    assert "  train      2014-01-08 .. " in result.stdout and "  test       " in result.stdout
    assert not (tmp_path / "ck").exists()


def test_help_explains_every_flag_without_escaping_artifacts():
    result = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "70% of days" in result.stdout and "%%" not in result.stdout


@pytest.mark.slow
def test_same_seed_and_config_give_identical_parameters_however_often_validation_runs(tmp_path, trained_once):
    """Two runs of the same seed train to the same bits, one a process and the other in this interpreter, the second
    scoring the validation split after every update (the first once, at the end): validation reads the weights and
    draws nothing, so a test may leave it out (tests/test_learning.py does: ``--eval_every``)."""
    a = load_checkpoint(trained_once("--num_episodes", "16") / "latest.pt")  # a process; b: this interpreter
    again = train(tmp_path, "--num_episodes", "16", "--run_name", "b", "--eval_every", "1", here=True)
    assert again.returncode == 0, again.stderr
    b = load_checkpoint(tmp_path / "ck" / "b" / "latest.pt")
    assert a.counters["update"] == 4
    assert all(torch.equal(v, b.model_state[k]) for k, v in a.model_state.items())
    other = train(tmp_path, "--num_episodes", "16", "--run_name", "c", "--seed", "7", here=True)
    assert other.returncode == 0, other.stderr
    c = load_checkpoint(tmp_path / "ck" / "c" / "latest.pt")
    assert any(not torch.equal(v, c.model_state[k]) for k, v in a.model_state.items())


@pytest.mark.slow
def test_tensorboard_writes_event_files(tmp_path):
    result = train(tmp_path, "--num_episodes", "4", "--run_name", "tb", "--tensorboard", "--policy", "mlp", here=True)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "ck" / "tb" / "tensorboard").glob("events.out.tfevents.*"))
