"""The PPO update through a real DDP process group (2 CPU ranks on gloo, spawned processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.training.distributed import WorldLayout, find_free_port, init_worker, shutdown_worker
from clstm_ppo.training.ppo import ppo_update
from clstm_ppo.training.rollout import compute_gae
from tests.conftest import fake_rollout, ppo_cfg, small_model

TOTAL_ENVS, STEPS = 8, 12


def run_update(model, buf, comm, num_envs, through_ddp=True):
    cfg = ppo_cfg(num_envs=num_envs, n_steps=STEPS, batch_size=STEPS * num_envs, epochs=3)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(num_envs), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    trained = DDP(model) if (comm.distributed and through_ddp) else model
    ppo_update(trained, opt, buf, adv, ret, cfg, comm, generators=[torch.Generator().manual_seed(0)])[0]
    return [p.detach().clone() for p in model.parameters()]


def _rank_main(rank: int, port: int, out_dir: str, through_ddp: bool) -> None:
    layout = WorldLayout(2, "cpu", "gloo", "127.0.0.1", port, False)
    comm = init_worker(layout, rank, rank)
    try:
        torch.set_num_threads(1)
        model = small_model("clstm")
        full = fake_rollout(model, steps=STEPS, envs=TOTAL_ENVS)
        half = TOTAL_ENVS // 2
        local = full.columns(slice(rank * half, (rank + 1) * half))
        params = run_update(model, local, comm, half, through_ddp)
        torch.save(params, Path(out_dir) / f"rank{rank}.pt")
        comm.barrier()  # leave together, as the launcher's workers do: a rank tearing gloo down mid-exchange aborts its peer
    finally:
        shutdown_worker()


def spawn_two_ranks(tmp_path: Path, through_ddp: bool = True) -> list[list[torch.Tensor]]:
    mp.spawn(_rank_main, args=(find_free_port(), str(tmp_path), through_ddp), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.slow
def test_two_ranks_equal_one_rank_with_twice_the_envs(tmp_path):
    rank0, rank1 = spawn_two_ranks(tmp_path)
    # replicas hold identical parameters after the updates
    for a, b in zip(rank0, rank1, strict=True):
        assert torch.equal(a, b)
    # and they equal one process that saw all 2B envs (global advantage normalisation)
    from clstm_ppo.training.distributed import Comm

    model = small_model("clstm")
    full = fake_rollout(model, steps=STEPS, envs=TOTAL_ENVS)
    single = run_update(model, full, Comm(), TOTAL_ENVS)
    for a, b in zip(rank0, single, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_bypassing_ddp_trains_replicas_apart(tmp_path):
    """The bug of the project this replaces: a loss computed outside the DDP wrapper never syncs."""
    rank0, rank1 = spawn_two_ranks(tmp_path, through_ddp=False)
    assert any(not torch.allclose(a, b) for a, b in zip(rank0, rank1, strict=True))
