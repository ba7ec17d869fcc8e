"""Cells trained as one batch (`Trainer` of K seeds) give what each gives alone (K = 1): weights after 3 updates, every
logged metric, the same on resume, checkpoints in the same format that backtest alike; and a cell fails alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.config import TrainConfig
from clstm_ppo.market import build_market
from clstm_ppo.training.checkpoint import load_checkpoint
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.trainer import Trainer, check_batchable
from envs.errors import UserError
from tests.conftest import TINY_CELL_RUN, assert_same_run, read_metrics, same_number
from tests.faults import FaultHook

pytestmark = pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")

TINY_CELL = {**TINY_CELL_RUN, "eval_every": 2, "checkpoint_every": 1}
"""`TINY_CELL_RUN` with a validation split scored every 2 updates (best.pt) and a checkpoint after each."""

# Cells differ in their seed and in settings that change no shape: the entropy and value weights, the clip, the
# gradient clip, a KL target that stops its epochs early, stage 1's learning rate.
CELL_SETTINGS = [
    dict(seed=1),
    dict(seed=2, ent_coef=0.01, vf_coef=0.25),
    dict(seed=3, target_kl=1e-7, max_grad_norm=0.3),
    dict(seed=4, learning_rate_clstm=1e-3, clip_coef=0.1),
]


def configs(tmp_path: Path, name: str, policy: str, cells: int, **settings) -> list[TrainConfig]:
    return [
        TrainConfig.from_dict(
            {**TINY_CELL, **CELL_SETTINGS[k], "policy": policy, "norm_obs": policy != "shared", **settings}
            | {"checkpoint_dir": str(tmp_path), "run_name": f"{name}{k}"}
        ).validate()
        for k in range(cells)
    ]


def run_dirs(cfgs: list[TrainConfig]) -> list[Path]:
    return [Path(c.run.checkpoint_dir) / c.run.run_name for c in cfgs]


def train_alone(cfgs: list[TrainConfig], market) -> None:
    for cfg, folder in zip(cfgs, run_dirs(cfgs), strict=True):
        Trainer([cfg], market, Comm(), [folder]).train()


@pytest.mark.parametrize("policy, cells", [("clstm", 4), ("mlp", 3), ("lstm", 2), ("shared", 2)])
def test_each_batched_cell_trains_as_it_does_alone_and_resumes_alike(policy, cells, tmp_path):
    alone = configs(tmp_path, "alone", policy, cells)
    market = build_market(alone[0].data, seed=1)  # one market for all, as a study prepares it
    train_alone(alone, market)
    straight = configs(tmp_path, "batch", policy, cells)
    Trainer(straight, market, Comm(), run_dirs(straight)).train()
    # the same batch stopped after 2 updates and resumed from each cell's latest.pt for the third
    halfway = configs(tmp_path, "resumed", policy, cells, num_episodes=8)
    Trainer(halfway, market, Comm(), run_dirs(halfway)).train()
    assert load_checkpoint(run_dirs(halfway)[0] / "latest.pt").counters["update"] == 2
    resumed = configs(tmp_path, "resumed", policy, cells, resume="latest")
    Trainer(resumed, market, Comm(), run_dirs(resumed)).train()
    for a, b, c in zip(run_dirs(alone), run_dirs(straight), run_dirs(resumed), strict=True):
        assert_same_run(a, b)
        assert_same_run(a, c)
        uninterrupted, continued = (load_checkpoint(d / "latest.pt") for d in (b, c))  # a batch resumes bitwise
        for name, weight in uninterrupted.model_state.items():
            assert torch.equal(weight, continued.model_state[name]), (b.name, name)
    if cells > 2:  # the KL target stopped some update's epochs early: the mask kept that cell where it stopped
        _, updates = read_metrics(run_dirs(alone)[2])
        assert any(u["epochs_run"] < 2 for u in updates)


def test_each_seed_follows_its_own_learning_rate_schedule(tmp_path):
    """Seed 2 anneals its learning rates (``--anneal_lr``, `Seed.anneal`) by its own counters and budget, seed 1 keeps
    its own: each as its run alone does, the schedule logged per update (2 seeds on 2 ranks: tests/test_seeds.py)."""
    schedules = [{}, {"anneal_lr": True}]
    alone = [c.with_settings(**s) for c, s in zip(configs(tmp_path, "alone", "mlp", 2), schedules, strict=True)]
    batch = [c.with_settings(**s) for c, s in zip(configs(tmp_path, "batch", "mlp", 2), schedules, strict=True)]
    market = build_market(alone[0].data, seed=1)
    train_alone(alone, market)
    Trainer(batch, market, Comm(), run_dirs(batch)).train()
    for a, b in zip(run_dirs(alone), run_dirs(batch), strict=True):
        assert_same_run(a, b)
    kept, annealed = ([u["lr_clstm"] for u in read_metrics(folder)[1]] for folder in run_dirs(batch))
    assert len(kept) == len(annealed) == 3 and set(kept) == {kept[0]}
    assert annealed[0] == kept[0] and annealed == sorted(set(annealed), reverse=True)


def test_a_cell_resumes_a_checkpoint_its_run_alone_wrote(tmp_path):
    """A single run's latest.pt continues as a batched cell, and ends where that run alone ends."""
    alone = configs(tmp_path, "alone", "clstm", 2)
    market = build_market(alone[0].data, seed=1)
    train_alone(alone, market)
    half = configs(tmp_path, "mixed", "clstm", 2, num_episodes=8)
    train_alone(half, market)
    resumed = configs(tmp_path, "mixed", "clstm", 2, resume="latest")
    Trainer(resumed, market, Comm(), run_dirs(resumed)).train()
    for a, b in zip(run_dirs(alone), run_dirs(resumed), strict=True):
        assert_same_run(a, b)


def test_a_diverging_cell_fails_alone_and_the_others_train_on(tmp_path):
    cfgs = configs(tmp_path, "batch", "mlp", 3, max_bad_updates=2)
    market = build_market(cfgs[0].data, seed=1)
    hooks = [[], [FaultHook(update=2, kind="nan")], [FaultHook(update=1, kind="raise")]]
    trainer = Trainer(cfgs, market, Comm(), run_dirs(cfgs), callbacks=hooks)
    trainer.train()
    errors = [seed.error for seed in trainer.seeds]
    assert errors[0] is None
    assert isinstance(errors[1], UserError) and "2 updates in a row had NaN/inf" in str(errors[1])
    assert isinstance(errors[2], RuntimeError) and "injected fault" in str(errors[2])
    # cell 1 kept its last good checkpoint (update 1); cell 2 failed before its first step: its weights never moved
    assert load_checkpoint(run_dirs(cfgs)[1] / "latest.pt").counters["update"] == 1
    torch.manual_seed(cfgs[2].run.seed)
    initial = build_model(cfgs[2], market)
    for name, weight in initial.state_dict().items():
        assert torch.equal(weight, trainer.seeds[2].model.state_dict()[name]), name
    alone = configs(tmp_path, "alone", "mlp", 1, max_bad_updates=2)
    train_alone(alone, market)
    assert_same_run(run_dirs(alone)[0], run_dirs(cfgs)[0])


def test_cells_that_differ_in_a_shape_or_the_data_are_not_batched(tmp_path):
    cfgs = configs(tmp_path, "x", "mlp", 2)
    check_batchable(cfgs)
    with pytest.raises(ValueError, match="--stage2_hidden"):
        check_batchable([cfgs[0], cfgs[1].with_settings(stage2_hidden=8)])
    with pytest.raises(ValueError, match="--num_envs"):
        check_batchable([cfgs[0], cfgs[1].with_settings(num_envs=4, batch_size=32)])


def test_a_batched_cells_checkpoint_backtests_as_its_run_alone(tmp_path):
    """`clstm-ppo backtest` of a batched cell's latest.pt: the report its run alone gets."""
    from clstm_ppo.cli.backtest import main as backtest

    alone = configs(tmp_path, "alone", "clstm", 1)
    batch = configs(tmp_path, "batch", "clstm", 2)
    market = build_market(alone[0].data, seed=1)
    train_alone(alone, market)
    Trainer(batch, market, Comm(), run_dirs(batch)).train()
    reports = []
    for folder in (run_dirs(alone)[0], run_dirs(batch)[0]):
        out = tmp_path / f"report-{folder.name}"
        assert backtest(["--checkpoint", str(folder / "latest.pt"), "--out", str(out), "--threads", "1"]) == 0
        reports.append(json.loads((out / "report.json").read_text()))
    a, b = (r["metrics"]["policy"] for r in reports)
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, float):
            assert same_number(value, b[key]), key
        else:
            assert value == b[key], key
