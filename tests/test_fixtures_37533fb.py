"""Checkpoints written at `37533fb`, the commit before the training loop's per-seed state moved into one `Seed` object
per seed (issue 71 point 7): a tiny CPU run trained alone (``plain``) and the first seed of the same run trained as the
batch ``--seed 1-2`` (``seed-1``). Today's code loads each, backtests it to the figures 37533fb's own backtest wrote
(its report.json files, kept as written) and resumes its training. How they were written:
``tests/fixtures/old_versions/37533fb/make.sh`` (the commands) and that folder's README line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from clstm_ppo import __version__
from clstm_ppo.cli.main import main as cli_main
from clstm_ppo.training.checkpoint import load_checkpoint
from tests.conftest import ROOT, SHARPE_ATOL, TINY_RUN, VALUE_RTOL, read_metrics

HERE = ROOT / "tests" / "fixtures" / "old_versions" / "37533fb"
RUNS = {"plain": HERE / "plain", "seed-1": HERE / "seeds" / "seed-1"}
"""Each fixture's run folder as 37533fb wrote it: latest.pt and config.json."""
MORE_UPDATES = 2
"""Updates a resume trains beyond the fixture's."""


def recorded(name: str) -> dict:
    """The settings the fixture's run recorded (its config.json, written by 37533fb)."""
    return json.loads((RUNS[name] / "config.json").read_text())


def written_by_then(name: str, mode: str) -> dict:
    """The report.json 37533fb's `clstm-ppo backtest` wrote for fixture ``name``: ``mode`` is "" (deterministic) or
    ".stochastic" (``--stochastic --episodes 2 --seed 0``)."""
    return json.loads((HERE / "backtest" / f"{name}{mode}.json").read_text())


def updates_run(settings: dict) -> int:
    """The updates a run of ``settings`` trains: every update ends each env's episode (episode length = n_steps)."""
    assert settings["episode_length"] == settings["n_steps"]
    return settings["num_episodes"] // settings["num_envs"]


@pytest.mark.parametrize("name", RUNS)
def test_a_37533fb_checkpoint_loads_with_the_counters_of_its_command(name):
    settings = recorded(name)
    ckpt = load_checkpoint(RUNS[name] / "latest.pt")
    assert ckpt.version == "0.3.0"  # what 37533fb's clstm_ppo.__version__ wrote
    assert ckpt.counters["episodes"] == settings["num_episodes"]
    assert ckpt.counters["update"] == updates_run(settings)
    assert ckpt.counters["global_step"] == ckpt.counters["update"] * settings["num_envs"] * settings["n_steps"]


def backtest_today(checkpoint: Path, out: Path, mode: str) -> dict:
    """Today's `clstm-ppo backtest` of ``checkpoint`` (as ``written_by_then``'s ``mode``): its report.json."""
    flags = ["--stochastic", "--episodes", "2", "--seed", "0"] if mode else []
    assert cli_main(["backtest", "--checkpoint", str(checkpoint), "--out", str(out), "--threads", "1", *flags]) == 0
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("mode", ["", ".stochastic"])
@pytest.mark.parametrize("name", RUNS)
def test_a_37533fb_checkpoint_backtests_to_the_figures_37533fb_wrote(name, mode, tmp_path, capsys):
    """The same held-out days, and final values and Sharpe ratios to the tolerances of figures written on another
    machine (`tests.conftest.VALUE_RTOL`, `SHARPE_ATOL`; docs/design.md "What is the same on another machine":
    another CPU's float rounding may trade a share more or less); one machine gives them exactly."""
    then = written_by_then(name, mode)
    now = backtest_today(RUNS[name] / "latest.pt", tmp_path / "bt", mode)
    assert now["period"] == then["period"] and now["metadata"]["trained"] == then["metadata"]["trained"]
    for side in ("policy", "baseline"):
        figures, expected = now["metrics"][side], then["metrics"][side]
        assert figures["final_value"] == pytest.approx(expected["final_value"], rel=VALUE_RTOL)
        assert figures["sharpe"] == pytest.approx(expected["sharpe"], abs=SHARPE_ATOL)
    if mode:
        values = [run["final_value"] for run in now["stochastic"]["runs"]]
        assert values == pytest.approx([run["final_value"] for run in then["stochastic"]["runs"]], rel=VALUE_RTOL)


@pytest.mark.parametrize("name", RUNS)
def test_a_37533fb_checkpoint_resumes_and_its_counters_advance(name, tmp_path, capsys):
    """A copy of the run folder resumes with its recorded data and seed, trains `MORE_UPDATES` more updates (their
    episodes and env steps counted on from the fixture's) and writes a checkpoint of this release."""
    settings = recorded(name)
    run = tmp_path / "ck" / name
    run.mkdir(parents=True)
    for file in ("latest.pt", "config.json"):
        shutil.copy(RUNS[name] / file, run / file)
    before = load_checkpoint(run / "latest.pt")
    episodes = settings["num_episodes"] + MORE_UPDATES * settings["num_envs"]
    args = [*TINY_RUN, "--data", settings["data"], "--seed", str(settings["seed"]), "--log_every", "1"]
    args += ["--num_episodes", str(episodes), "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", name]
    assert cli_main(["train", *args, "--resume", "latest"]) == 0
    after = load_checkpoint(run / "latest.pt")
    update = before.counters["update"] + MORE_UPDATES
    steps = MORE_UPDATES * settings["num_envs"] * settings["n_steps"]
    assert after.version == __version__
    assert (after.counters["update"], after.counters["episodes"]) == (update, episodes)
    assert after.counters["global_step"] == before.counters["global_step"] + steps
    _, logged = read_metrics(run)
    assert [row["update"] for row in logged] == list(range(before.counters["update"] + 1, update + 1))
    assert any(not torch.equal(after.model_state[k], w) for k, w in before.model_state.items())
