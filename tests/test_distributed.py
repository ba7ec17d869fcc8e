"""The PPO update through a real DDP process group (2 CPU ranks on gloo, spawned processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.training.distributed import WorldLayout, find_free_port, init_worker, shutdown_worker
from clstm_ppo.training.ppo import SeedLearner, ppo_update
from clstm_ppo.training.rollout import RolloutBuffer, compute_gae
from tests.conftest import fake_rollout, net_spec, ppo_cfg, small_model

TOTAL_ENVS, STEPS = 8, 12


def run_update(model, buf, comm, num_envs, through_ddp=True):
    cfg = ppo_cfg(num_envs=num_envs, n_steps=STEPS, batch_size=STEPS * num_envs, epochs=3)
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(num_envs), cfg.gamma, cfg.gae_lambda)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    trained = DDP(model) if (comm.distributed and through_ddp) else model
    ppo_update(trained, [SeedLearner(cfg, opt, torch.Generator().manual_seed(0))], buf, adv, ret, comm)
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


# ------------------------------------------------------------------ K seeds as one batch on 2 ranks
CELLS, PER_RANK = 2, 4  # two seeds; each rank holds 4 envs of each, one rank alone 8


def cell_policy() -> CellPolicy:
    """Two clstm networks of different seeds stacked (`clstm_ppo.agent.stacked`), the same on every rank."""
    nets = []
    for k in range(CELLS):
        torch.manual_seed(100 + k)
        nets.append(make_policy(net_spec("clstm", 16, 3, 5, stage1_hidden=8, feature_dim=8, stage2_hidden=12)))
    return CellPolicy(nets)


def dense_cell_rollout(per_cell: int) -> tuple[dict[str, torch.Tensor], RecurrentState]:
    """A rollout of the stacked network on random windows (`fake_rollout`'s) over CELLS x ``per_cell`` columns,
    cell-major, kept dense so that any columns can be recorded into a buffer of their own."""
    policy = cell_policy()
    spec, envs = policy.spec, CELLS * per_cell
    gen = torch.Generator().manual_seed(0)
    gens = [torch.Generator().manual_seed(10 + k) for k in range(CELLS)]
    state = policy.initial_state(envs)
    initial = state.map(torch.Tensor.clone)
    start = torch.ones(envs, dtype=torch.bool)
    obs = torch.randn(envs, spec.window, spec.num_features, generator=gen)
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("obs", "starts", "actions", "log_probs", "values")}
    out.update(rewards=[], dones=[])
    for s in range(STEPS):
        fresh = torch.randn(envs, spec.window, spec.num_features, generator=gen)
        moved = torch.cat([obs[:, 1:], fresh[:, :1]], dim=1)
        obs = torch.where(start.view(-1, 1, 1), fresh, moved) if s else fresh
        action, log_prob, value, state = policy.act(obs, state, start, generators=gens)
        done = torch.rand(envs, generator=gen) < 0.2
        for name, value_ in zip(out, (obs, start, action, log_prob, value), strict=False):
            out[name].append(value_.clone())
        out["rewards"].append(torch.randn(envs, generator=gen))
        out["dones"].append(done)
        start = done
    return {k: torch.stack(v) for k, v in out.items()}, initial


def buffer_of(dense: dict[str, torch.Tensor], initial: RecurrentState, cols: torch.Tensor) -> RolloutBuffer:
    """The rollout's columns ``cols`` as a buffer of their own (what a rank that ran only those envs holds)."""
    _, _, window, features = dense["obs"].shape
    buf = RolloutBuffer.allocate(STEPS, len(cols), (window, features), dense["actions"].shape[-1], "cpu")
    buf.initial_state = initial.envs(cols)
    for s in range(STEPS):
        buf.obs.record(s, dense["obs"][s, cols], anchor=s == 0 or bool(dense["starts"][s].any()))
        for name in ("starts", "actions", "log_probs", "values", "rewards", "dones"):
            getattr(buf, name)[s] = dense[name][s, cols]
    return buf


def run_cell_update(
    buf: RolloutBuffer, comm, per_cell: int, scalers=None, micro: int = 1, compile_options=None
) -> list[torch.Tensor]:
    """One update of the two seeds as one batch (`ppo_update`, each seed with its own fused Adam over its own
    network's parameters, views of the stacked ones); their stacked weights after."""
    policy = cell_policy()
    if compile_options is not None:
        policy.compile(**compile_options)
    cfg = ppo_cfg(
        num_envs=per_cell, n_steps=STEPS, batch_size=STEPS * per_cell, epochs=3, gradient_accumulation_steps=micro
    )
    adv, ret = compute_gae(buf.rewards, buf.values, buf.dones, torch.zeros(buf.num_envs), cfg.gamma, cfg.gae_lambda)
    adams = [
        torch.optim.Adam(
            [{"params": net.stage1_parameters(), "lr": lr1}, {"params": net.stage2_parameters(), "lr": lr2}],
            eps=1e-8,
            fused=True,
        )
        for net, (lr1, lr2) in zip(policy.models, [(3e-3, 3e-3), (1e-3, 2e-3)], strict=True)
    ]
    scalers = scalers or [None] * CELLS
    learners = [
        SeedLearner(cfg, adam, torch.Generator().manual_seed(k), scaler)
        for k, (adam, scaler) in enumerate(zip(adams, scalers, strict=True))
    ]
    ppo_update(policy, learners, buf, adv, ret, comm)
    return [flat.clone() for flat in policy.flat]


def rank_columns(rank: int) -> torch.Tensor:
    """Rank ``rank``'s envs of each seed among one rank's 2 x PER_RANK per seed (cell-major)."""
    full = 2 * PER_RANK
    return torch.cat([torch.arange(k * full + rank * PER_RANK, k * full + (rank + 1) * PER_RANK) for k in range(CELLS)])


def _cells_rank_main(rank: int, port: int, out_dir: str) -> None:
    layout = WorldLayout(2, "cpu", "gloo", "127.0.0.1", port, False)
    comm = init_worker(layout, rank, rank)
    try:
        torch.set_num_threads(1)
        dense, initial = dense_cell_rollout(2 * PER_RANK)
        flat = run_cell_update(buffer_of(dense, initial, rank_columns(rank)), comm, PER_RANK)
        torch.save(flat, Path(out_dir) / f"cells{rank}.pt")
        comm.barrier()
    finally:
        shutdown_worker()


@pytest.mark.slow
def test_two_seeds_as_one_batch_on_two_ranks_equal_one_rank_with_twice_the_envs(tmp_path):
    """Each rank holds the same two seeds and half of each seed's envs; their gradients are averaged over the ranks
    per seed before each seed's step, so the replicas agree and equal one process with all the envs."""
    mp.spawn(_cells_rank_main, args=(find_free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0, rank1 = (torch.load(tmp_path / f"cells{r}.pt", weights_only=True) for r in range(2))
    for a, b in zip(rank0, rank1, strict=True):
        assert torch.equal(a, b)
    from clstm_ppo.training.distributed import Comm

    dense, initial = dense_cell_rollout(2 * PER_RANK)
    single = run_cell_update(buffer_of(dense, initial, torch.arange(CELLS * 2 * PER_RANK)), Comm(), 2 * PER_RANK)
    for a, b in zip(rank0, single, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)
    before = cell_policy().flat
    assert all(not torch.equal(a[k], b[k]) for a, b in zip(single, before, strict=True) for k in range(CELLS))


def test_each_seed_of_a_batch_scales_its_own_fp16_loss():
    """fp16's dynamic loss scaling per seed: each seed's loss is multiplied by its own GradScaler's scale and its
    gradients unscaled by it (a power of two: the same weights as without scaling, bit for bit), and a seed whose
    scaled gradients overflow (an infinite scale: every step) skips its steps alone, the other's scale untouched
    (CPU GradScalers, the arithmetic CUDA's do)."""
    from clstm_ppo.training.distributed import Comm

    dense, initial = dense_cell_rollout(PER_RANK)
    buf = buffer_of(dense, initial, torch.arange(CELLS * PER_RANK))
    plain = run_cell_update(buf, Comm(), PER_RANK)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**12), torch.amp.GradScaler("cpu", init_scale=float("inf"))]
    scaled = run_cell_update(buf, Comm(), PER_RANK, scalers)
    before = cell_policy().flat
    for mine, theirs, start in zip(scaled, plain, before, strict=True):
        assert torch.equal(mine[0], theirs[0])  # seed 0: its scale undone exactly
        assert torch.equal(mine[1], start[1]) and not torch.equal(theirs[1], start[1])  # seed 1 overflowed: no step
    assert scalers[0].get_scale() == 2.0**12


def test_a_batch_accumulates_each_seeds_gradients_over_micro_batches():
    """``--gradient_accumulation_steps 2`` for K seeds: each minibatch's two halves add into each seed's gradients
    (each half's loss over half the columns, halved), then one step per seed: the weights of the whole minibatch."""
    from clstm_ppo.training.distributed import Comm

    dense, initial = dense_cell_rollout(PER_RANK)
    buf = buffer_of(dense, initial, torch.arange(CELLS * PER_RANK))
    whole, halves = (run_cell_update(buf, Comm(), PER_RANK, micro=m) for m in (1, 2))
    for a, b, start in zip(whole, halves, cell_policy().flat, strict=True):
        torch.testing.assert_close(b, a, rtol=2e-4, atol=2e-5)
        assert not torch.equal(a, start)


def test_a_batch_compiles_its_loss_forward():
    """``--compile`` for K seeds: the update's loss forward goes through ``torch.compile(evaluate)`` (torch's eager
    backend here: the CPU suite cannot wait minutes for inductor, which the CUDA tests run), with the same weights."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from clstm_ppo.training.distributed import Comm

    dense, initial = dense_cell_rollout(PER_RANK)
    buf = buffer_of(dense, initial, torch.arange(CELLS * PER_RANK))
    plain = run_cell_update(buf, Comm(), PER_RANK)
    torch._dynamo.reset()
    captured = counters["stats"]["calls_captured"]
    compiled = run_cell_update(buf, Comm(), PER_RANK, compile_options={"backend": "eager"})
    assert counters["stats"]["calls_captured"] > captured  # the loss forward went through dynamo
    for a, b in zip(plain, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
