"""CUDA paths: GPU-resident env, bf16/fp16 autocast, TF32, NCCL through torchrun. Skipped without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from clstm_ppo.training.checkpoint import load_checkpoint
from clstm_ppo.training.distributed import find_free_port
from tests.conftest import SCRIPT, TINY, TINY_CELL_RUN, clean_env, fake_rollout, read_metrics, small_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GPU = [a for a in TINY if a not in ("--num_gpus", "0")] + ["--num_gpus", "1"]


def run(tmp_path, *args, launcher=None):
    cmd = [*(launcher or [sys.executable]), SCRIPT, *GPU, "--checkpoint_dir", str(tmp_path / "ck"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("precision", ["none", "bf16", "fp16"])
def test_gpu_training_with_autocast(tmp_path, precision):
    result = run(tmp_path, "--num_episodes", "8", "--mixed_precision", precision, "--run_name", precision)
    assert result.returncode == 0, result.stderr
    assert "devices cuda:0" in result.stdout
    ckpt = load_checkpoint(tmp_path / "ck" / precision / "latest.pt")
    assert ckpt.counters["episodes"] == 8
    assert (ckpt.scaler_state is not None) == (precision == "fp16")
    assert all(torch.isfinite(v).all() for v in ckpt.model_state.values())


def test_torchrun_single_gpu_uses_nccl_and_ddp(tmp_path):
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        str(find_free_port()),
    ]
    result = run(tmp_path, "--num_episodes", "8", "--run_name", "nccl", launcher=launcher)
    assert result.returncode == 0, result.stderr
    assert "backend nccl" in result.stdout
    episodes, _ = read_metrics(tmp_path / "ck" / "nccl")
    assert len(episodes) == 8


def test_rollout_and_update_agree_on_gpu():
    model = small_model("clstm").cuda()
    buf = fake_rollout(model.cpu(), steps=10, envs=4)
    model = model.cuda()
    obs, starts, actions = buf.obs.windows().to("cuda"), buf.starts.cuda(), buf.actions.cuda()
    out = model(obs, buf.initial_state.map(lambda t: t.cuda()), starts, actions)
    torch.testing.assert_close(out.log_prob.cpu(), buf.log_probs, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out.value.cpu(), buf.values, rtol=1e-3, atol=1e-3)


def test_compiled_model_trains_on_gpu(tmp_path):
    args = ("--num_episodes", "8", "--compile", "--mixed_precision", "bf16", "--run_name", "compiled")
    result = run(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    ckpt = load_checkpoint(tmp_path / "ck" / "compiled" / "latest.pt")
    assert not any(k.startswith("_orig_mod.") for k in ckpt.model_state)
    assert all(torch.isfinite(v).all() for v in ckpt.model_state.values())
    assert ckpt.counters["update"] >= 1 and ckpt.counters["skipped_steps"] == 0


def test_sampled_actions_match_across_devices_with_a_cpu_generator():
    """Stochastic backtests seed a CPU generator, so CPU and GPU runs draw the same noise."""
    model = small_model("clstm")
    obs = torch.randn(3, model.spec.window, model.spec.num_features)
    starts = torch.ones(3, dtype=torch.bool)
    actions = []
    for device in ("cpu", "cuda"):
        m = model.to(device)
        state = m.initial_state(3, device)
        out = m.act(obs.to(device), state, starts.to(device), generator=torch.Generator().manual_seed(7))
        actions.append(out.action.cpu())
    torch.testing.assert_close(actions[0], actions[1], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("policy", ["clstm", "mlp", "shared"])
def test_batched_cells_train_on_the_gpu_as_each_cell_alone(tmp_path, policy):
    """Three cells (seeds) trained as one batch on the GPU against each trained alone on the GPU: the same weights up
    to float rounding (TF32 matmuls on both sides), checkpoints that load on the CPU."""
    from clstm_ppo.config import TrainConfig
    from clstm_ppo.market import build_market
    from clstm_ppo.training.checkpoint import restore_policy
    from clstm_ppo.training.distributed import Comm
    from clstm_ppo.training.trainer import Trainer

    settings = {**TINY_CELL_RUN, "policy": policy, "checkpoint_dir": str(tmp_path)}
    cfgs = {
        f"{who}{s}": TrainConfig.from_dict({**settings, "seed": s, "run_name": f"{who}{s}"})
        for who in ("a", "b")
        for s in (1, 2, 3)
    }
    market = build_market(cfgs["a1"].data, seed=1)
    for s in (1, 2, 3):
        Trainer([cfgs[f"a{s}"]], market, Comm(device=torch.device("cuda")), [tmp_path / f"a{s}"]).train()
    batch = [cfgs[f"b{s}"] for s in (1, 2, 3)]
    trainer = Trainer(batch, market, Comm(device=torch.device("cuda")), [tmp_path / f"b{s}" for s in (1, 2, 3)])
    trainer.train()
    assert [seed.error for seed in trainer.seeds] == [None, None, None]
    for s in (1, 2, 3):
        alone, batched = (load_checkpoint(tmp_path / f"{who}{s}" / "latest.pt") for who in ("a", "b"))
        scale = max(float(v.abs().max()) for v in alone.model_state.values() if v.is_floating_point() and v.numel())
        for name, weight in alone.model_state.items():
            assert float((weight - batched.model_state[name]).abs().max()) < 1e-3 * scale, (s, name)
        assert restore_policy(batched, market).spec.policy == policy


def test_several_seeds_train_as_one_batch_on_the_gpu(tmp_path):
    """``--seed 1-2`` on one GPU: both seeds' folders with bf16, and with fp16 each seed its own GradScaler (its state
    in its checkpoint); with --compile (inductor) too."""
    for precision in ("bf16", "fp16"):
        result = run(
            tmp_path, "--num_episodes", "8", "--seed", "1-2", "--mixed_precision", precision, "--run_name", precision
        )
        assert result.returncode == 0, result.stderr
        assert "[seeds] held-out test" in result.stdout and "2 seeds'" in result.stdout
        for seed in (1, 2):
            ckpt = load_checkpoint(tmp_path / "ck" / precision / f"seed-{seed}" / "latest.pt")
            assert ckpt.counters["episodes"] >= 8 and ckpt.cfg.run.seed == seed
            assert bool(ckpt.scaler_state) == (precision == "fp16")
    compiled = run(
        tmp_path, *"--num_episodes 8 --seed 1-2 --compile --mixed_precision bf16 --run_name compiled".split()
    )
    assert compiled.returncode == 0, compiled.stderr
    assert (tmp_path / "ck" / "compiled" / "seeds.json").is_file()
