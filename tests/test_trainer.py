"""The trainer end to end with real processes: spawn (2 gloo ranks), torchrun, two-node torchrun, resume."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from clstm_ppo.evaluation.backtest import backtest
from clstm_ppo.market import build_market
from clstm_ppo.training.checkpoint import load_checkpoint, restore_policy
from clstm_ppo.training.distributed import find_free_port
from tests.conftest import SCRIPT, TINY, clean_env, files_under, read_metrics, train


@pytest.mark.slow
def test_two_cpu_workers_train_together_and_only_rank0_writes(tmp_path):
    # with the auxiliary next-day head, the linear forecaster and the gain that feeds its forecast to the actor, whose
    # gradients must be all-reduced like the rest, and the running observation and reward statistics, which every
    # rank must merge alike
    result = train(
        tmp_path,
        "--num_workers",
        "2",
        "--num_episodes",
        "16",
        "--run_name",
        "two",
        "--aux_coef",
        "0.5",
        "--forecast_skip",
        "--forecaster",
        "linear",
        "--forecast_days",
        "2",
        "--norm_obs",
        "--norm_reward",
        "--permute_tickers",
        "--weight_decay",
        "0.01",
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
    assert all(u["aux_loss"] > 0 for u in updates)
    assert [e["episode"] for e in episodes] == list(range(1, 17))
    assert all(e["length"] == 16 and e["final_value"] > 0 for e in episodes)
    # only rank 0's files, and nothing outside the run folder (cwd is tmp_path)
    assert files_under(tmp_path) == {
        f"ck/two/{name}" for name in ("latest.pt", "best.pt", "config.json", "metrics.jsonl")
    }
    ckpt = load_checkpoint(run_dir / "latest.pt")
    assert ckpt.counters["episodes"] == 16 and ckpt.counters["update"] == 2
    assert len(ckpt.worker_states) == 2
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt.model_state)
    assert ckpt.model_state["forecast_gain"].item() != 0.0  # PPO moved the gain off its start
    assert ckpt.model_state["linear_forecast.weight"].any()  # the linear forecaster's own next-day term fitted it
    assert ckpt.model_config["next_day_head"] is True and "next_day.weight" in ckpt.model_state
    rows = 2 * 4 * 16 * 2  # ranks x envs x steps x updates: every rank's states reached the statistics
    reward_counts = [w["reward_norm"]["moments"][0] for w in ckpt.worker_states]
    assert ckpt.model_state["obs_count"].item() == rows and reward_counts == [rows, rows]  # the same on each rank
    assert ckpt.model_state["obs_var"].min() > 0 and 0 < updates[-1]["reward_scale"] != 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        (),
        (
            "--norm_obs",
            "--norm_reward",
            "--permute_tickers",
            "--weight_decay",
            "0.01",
            "--episode_length",
            "12",
            "--noise_hold",
            "3",
        ),
        ("--ema_decay", "0.6"),
    ],  # episodes end inside rollouts
    ids=["defaults", "normalisers-and-augmentation", "weight-average"],
)
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, extra):
    straight = train(tmp_path, "--num_episodes", "16", "--run_name", "straight", *extra)
    assert straight.returncode == 0, straight.stderr
    first = train(tmp_path, "--num_episodes", "8", "--run_name", "split", *extra)
    assert first.returncode == 0, first.stderr
    second = train(tmp_path, "--num_episodes", "16", "--run_name", "split", "--resume", "latest", *extra)
    assert second.returncode == 0, second.stderr
    a = load_checkpoint(tmp_path / "ck" / "straight" / "latest.pt")
    b = load_checkpoint(tmp_path / "ck" / "split" / "latest.pt")
    assert a.counters["update"] == b.counters["update"] >= 3
    for wa, wb in zip(a.worker_states, b.worker_states, strict=True):  # the running return statistics too
        assert wa["reward_norm"]["moments"] == wb["reward_norm"]["moments"]
        assert torch.equal(wa["reward_norm"]["discounted"], wb["reward_norm"]["discounted"])
    for key, value in a.model_state.items():
        assert torch.equal(value, b.model_state[key]), key
    assert (a.average_state is None) == (b.average_state is None) == ("--ema_decay" not in extra)
    for key, value in (a.average_state or {}).items():
        assert torch.equal(value, b.average_state[key]), key
    episodes_a, _ = read_metrics(tmp_path / "ck" / "straight")
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
def test_same_seed_and_config_give_identical_parameters(tmp_path):
    runs = [train(tmp_path, "--num_episodes", "8", "--run_name", name) for name in ("a", "b")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    a, b = (load_checkpoint(tmp_path / "ck" / name / "latest.pt") for name in ("a", "b"))
    assert a.counters["update"] == 2
    assert all(torch.equal(v, b.model_state[k]) for k, v in a.model_state.items())
    other = train(tmp_path, "--num_episodes", "8", "--run_name", "c", "--seed", "7")
    assert other.returncode == 0, other.stderr
    c = load_checkpoint(tmp_path / "ck" / "c" / "latest.pt")
    assert any(not torch.equal(v, c.model_state[k]) for k, v in a.model_state.items())


def test_forecast_threshold_changes_the_deployed_actions_and_not_the_training(tmp_path):
    """``--forecast_threshold`` reaches the checkpoint and every deterministic action; the trained weights are
    bit-identical to the same run without it (validation acts with it every update and draws no noise)."""
    only = ["--forecast_skip", "--forecaster", "linear", "--forecast_only", "--num_episodes", "8", "--eval_every", "1"]
    runs = [train(tmp_path, *only, "--run_name", f"d{d}", "--forecast_threshold", d) for d in ("0", "1.5")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    plain, shifted = (load_checkpoint(tmp_path / "ck" / name / "latest.pt") for name in ("d0", "d1.5"))
    assert shifted.counters["update"] == 2 and shifted.cfg.model.forecast_threshold == 1.5
    assert all(torch.equal(v, shifted.model_state[k]) for k, v in plain.model_state.items())
    market = build_market(shifted.cfg.data, seed=shifted.cfg.run.seed)
    obs, starts = torch.randn(4, market.window, market.num_features), torch.ones(4, dtype=torch.bool)  # [4, T, F]
    policies = [restore_policy(ck, market) for ck in (plain, shifted)]
    means = [p.act(obs, p.initial_state(4), starts, deterministic=True).action for p in policies]
    torch.testing.assert_close(means[1], means[0] - 1.5)
    # `backtest --forecast_threshold` deploys a checkpoint with another threshold: the plain run's weights at 1.5
    # trade exactly as the run trained with 1.5, and not as themselves at 0.
    runs = {
        name: backtest(tmp_path / "ck" / run / "latest.pt", out=tmp_path / name, forecast_threshold=d)
        for name, run, d in (("plain", "d0", None), ("plain-at-1.5", "d0", 1.5), ("trained-at-1.5", "d1.5", None))
    }
    equity = {name: (tmp_path / name / "equity.csv").read_bytes() for name in runs}
    assert equity["plain-at-1.5"] == equity["trained-at-1.5"] != equity["plain"]


@pytest.mark.slow
def test_tensorboard_writes_event_files(tmp_path):
    result = train(tmp_path, "--num_episodes", "4", "--run_name", "tb", "--tensorboard", "--policy", "mlp")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "ck" / "tb" / "tensorboard").glob("events.out.tfevents.*"))
