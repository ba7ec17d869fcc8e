"""One rank's whole job of a train command (what `clstm_ppo.training.launch.launch` runs on every worker)."""

from __future__ import annotations

import copy
import os
import time

import torch

from clstm_ppo.config import TrainConfig
from clstm_ppo.training.callbacks import Callback
from clstm_ppo.training.distributed import Comm, WorldLayout
from clstm_ppo.training.progress import Counters
from clstm_ppo.training.seeds import RunPlan
from clstm_ppo.training.signals import StoppedBySignal
from clstm_ppo.training.trainer import Trainer
from envs.errors import UserError
from envs.features import PreparedMarket


def train_worker(comm: Comm, payload: tuple[RunPlan, PreparedMarket, WorldLayout, list[Callback]]) -> None:
    """Train the plan's seeds (a plain run is one) on this rank, with the payload's callbacks after the product's
    (each seed its own copies: the first seed the given ones). Raises UserError naming every seed of a batch that
    failed, after the others finished."""
    plan, market, layout, extra = payload
    cfg = plan.cfg
    if comm.device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if layout.torchrun else layout.world_size
        torch.set_num_threads(cfg.system.threads or max(1, (os.cpu_count() or 1) // max(1, local_world)))
    plan = comm.broadcast_object(plan)  # under torchrun every process named its own folder; rank 0's wins
    cfgs = plan.configs()
    callbacks = [list(extra)] + [copy.deepcopy(list(extra)) for _ in cfgs[1:]]
    trainer = Trainer(cfgs, market, comm, plan.run_dirs(), callbacks)
    start = time.perf_counter()
    try:
        trainer.train()
    except StoppedBySignal:
        if comm.master:
            for seed in trainer.seeds:
                c = seed.counters
                print(
                    f"{seed.tag} stopped after {c.episodes} episodes (update {c.update}); "
                    f"continue with: {plan.again()} --resume latest",
                    flush=True,
                )
        raise
    seconds = time.perf_counter() - start
    if comm.master:
        for seed in trainer.seeds:
            if seed.error is None:
                done = done_line(seed.counters, seed.cfg, comm.world_size, seconds)
                print(f"{seed.tag} {done} | checkpoints: {plan.folder}", flush=True)
    failed = [seed for seed in trainer.seeds if seed.error is not None]
    if failed:
        raise UserError("; ".join(f"seed {seed.cfg.run.seed} failed: {seed.error}" for seed in failed))


def done_line(counters: Counters, cfg: TrainConfig, world_size: int, seconds: float) -> str:
    """``done: 64 episodes, ...``, saying why there are more episodes than asked: training stops after the update
    in which the budget is reached, and each update runs every env for ``n_steps`` days."""
    asked = cfg.ppo.num_episodes
    rounded = (
        f" ({asked:,} asked; training stops at the end of the update that reaches them, and each update runs "
        f"{cfg.ppo.num_envs * world_size:,} envs x {cfg.ppo.n_steps} days)"
        if counters.episodes > asked
        else ""
    )
    return f"done: {counters.episodes:,} episodes{rounded}, {counters.global_step:,} env steps in {seconds:,.1f} s"
