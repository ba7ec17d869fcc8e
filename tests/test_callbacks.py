"""The training loop's hooks: a callback sees the declared `RunState` and nothing else of a trainer, a loop's
``callbacks=`` adds to the product's and never replaces them, and the normalisers' sync is part of the update."""

from __future__ import annotations

from typing import Any

import pytest

from clstm_ppo.cli.train import parse_config
from clstm_ppo.market import build_market
from clstm_ppo.training.callbacks import Callback, Checkpointer, Logger, RunState, with_defaults
from clstm_ppo.training.checkpoint import load_checkpoint
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.seed import Seed
from clstm_ppo.training.trainer import Trainer
from tests.conftest import TINY, read_metrics

pytestmark = pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")

RUN_STATE = {name for name in vars(RunState) if not name.startswith("_")} | set(RunState.__annotations__)
"""Every member `RunState` declares."""


class DeclaredOnly:
    """A run seen through `RunState` alone: reading anything it does not declare fails the test."""

    def __init__(self, run: Any) -> None:
        object.__setattr__(self, "_run", run)

    def __getattr__(self, name: str) -> Any:
        if name not in RUN_STATE:
            raise AttributeError(f"a callback read run.{name}, which RunState does not declare")
        return getattr(object.__getattribute__(self, "_run"), name)


class Recorder(Callback):
    """Counts the hooks it sees."""

    def __init__(self) -> None:
        self.updates: list[int] = []
        self.ended = False

    def on_update_end(self, run: RunState, result) -> None:
        self.updates.append(run.counters.update)

    def on_training_end(self, run: RunState) -> None:
        self.ended = True


def tiny(tmp_path, name: str, *extra: str):
    cfg = parse_config([*TINY, "--num_episodes", "8", "--checkpoint_dir", str(tmp_path), "--run_name", name, *extra])
    return cfg, build_market(cfg.data, seed=cfg.run.seed)


def test_the_products_callbacks_read_only_what_run_state_declares(tmp_path):
    """Logger and Checkpointer driven through a proxy that refuses every undeclared attribute still write the run
    folder; a callback that reaches for the trainer's optimizer or model fails here."""
    cfg, market = tiny(tmp_path, "declared", "--norm_reward")
    trainer = Trainer([cfg], market, Comm(), [tmp_path / "declared"], callbacks=[[]])
    (seed,) = trainer.seeds
    run, counters = DeclaredOnly(seed), seed.counters
    callbacks = with_defaults()
    for callback in callbacks:
        callback.on_training_start(run)
    while counters.episodes < cfg.ppo.num_episodes:
        result = trainer.gather(seed, trainer.update()[0])
        for callback in callbacks:
            callback.on_update_end(run, result)
    for callback in callbacks:
        callback.on_training_end(run)
    _, updates = read_metrics(tmp_path / "declared")
    assert len(updates) == counters.update >= 2
    assert {"policy_std", "reward_scale", "lr_clstm", "lr_actor_critic"} <= set(updates[-1])
    assert load_checkpoint(tmp_path / "declared" / "latest.pt").counters["update"] == counters.update
    with pytest.raises(AttributeError, match="run.optimizer, which RunState does not declare"):
        run.optimizer  # noqa: B018


def test_a_run_and_a_batched_seed_both_offer_every_declared_member(tmp_path):
    cfg, market = tiny(tmp_path, "a")
    cfgs = [tiny(tmp_path, f"cell{k}", "--seed", str(k + 1))[0] for k in range(2)]
    batch = Trainer(cfgs, market, Comm(), [tmp_path / f"cell{k}" for k in range(2)])
    for run in (*Trainer([cfg], market, Comm(), [tmp_path / "a"]).seeds, *batch.seeds):
        assert isinstance(run, Seed)
        missing = sorted(name for name in RUN_STATE if not hasattr(run, name))
        assert not missing, f"{type(run).__name__} lacks {missing}"
        assert set(run.figures()) == {"policy_std", "lr_clstm", "lr_actor_critic"}


def test_callbacks_add_to_the_products_and_never_replace_them(tmp_path):
    """A run given its own callbacks still logs and checkpoints, alone and as a batched cell: dropping a default
    (``callbacks=`` replacing them) leaves no metrics.jsonl or latest.pt and fails here."""
    cfg, market = tiny(tmp_path, "alone")
    mine = Recorder()
    trainer = Trainer([cfg], market, Comm(), [tmp_path / "alone"], callbacks=[[mine]])
    assert [type(c) for c in trainer.seeds[0].callbacks] == [Logger, Checkpointer, Recorder]
    trainer.train()
    cfgs = [tiny(tmp_path, f"cell{k}", "--seed", str(k + 1))[0] for k in range(2)]
    hooks = [[Recorder()], [Recorder()]]
    batch = Trainer(cfgs, market, Comm(), [tmp_path / f"cell{k}" for k in range(2)], callbacks=hooks)
    batch.train()
    for folder, recorder in [("alone", mine), ("cell0", hooks[0][0]), ("cell1", hooks[1][0])]:
        episodes, updates = read_metrics(tmp_path / folder)
        assert len(updates) == len(recorder.updates) >= 2 and len(episodes) >= 8, folder
        assert recorder.updates == list(range(1, len(updates) + 1)) and recorder.ended, folder
        assert load_checkpoint(tmp_path / folder / "latest.pt").counters["update"] == len(updates), folder


def test_the_update_itself_merges_the_normalisers_statistics(tmp_path):
    """``Trainer.update`` with no callback at all leaves the observation and reward statistics merged with its
    rollout's: no hook can be forgotten that a run's next rollout depends on."""
    cfg, market = tiny(tmp_path, "norm", "--norm_obs", "--norm_reward")
    trainer = Trainer([cfg], market, Comm(), [tmp_path / "norm"])
    trainer.update()
    rows = cfg.ppo.num_envs * cfg.ppo.n_steps
    (seed,) = trainer.seeds
    assert seed.model.obs_count.item() == rows
    assert seed.actor.reward_norm.moments[0] == rows
