"""Settings: typed sections with one home per default, flags derived from them, inconsistent settings refused
with one line, the paper preset and what old checkpoints meant."""

from __future__ import annotations

import json
import math
import re

import pytest

from clstm_ppo.cli.train import build_parser, parse_config
from clstm_ppo.config import CONFIG_ONLY, SECTIONS, SETTINGS, TrainConfig, preset
from envs.config import EnvConfig
from envs.errors import UserError
from tests.conftest import ROOT


def test_config_rejects_batch_that_does_not_divide_rollout():
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig.from_dict(dict(num_envs=4, n_steps=128, batch_size=100)).validate()
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig.from_dict(dict(num_envs=3, n_steps=128, batch_size=256)).validate()
    with pytest.raises(UserError, match="num_episodes"):
        TrainConfig.from_dict(dict(num_episodes=0)).validate()
    with pytest.raises(UserError, match="--backend must be one of"):  # choices hold for a JSON file's values too
        TrainConfig.from_dict(dict(backend="mpi")).validate()
    with pytest.raises(UserError, match="unknown setting"):
        TrainConfig.from_dict(dict(gama=0.9))


def test_paper_preset_has_the_papers_settings():
    cfg = preset("paper", num_envs=8)
    assert (cfg.data.window, cfg.model.stage1_hidden, cfg.model.feature_dim, cfg.model.stage2_hidden) == (
        30,
        128,
        128,
        512,
    )
    ppo = cfg.ppo
    assert (ppo.gamma, ppo.n_steps, ppo.vf_coef, ppo.ent_coef, ppo.clip_coef, ppo.max_grad_norm) == (
        0.99,
        128,
        0.5,
        0.01,
        0.2,
        0.5,
    )
    assert ppo.learning_rate_clstm == ppo.learning_rate_actor_critic == 3e-4 and ppo.adam_eps == 1e-8
    assert (cfg.env.action_mode, cfg.env.reward, cfg.model.action_dist, cfg.env.execution) == (
        "shares",
        "value",
        "gaussian",
        "close",
    )
    assert cfg.ppo.num_envs == 8
    cfg.validate()


def test_each_default_has_one_home_and_the_flags_are_derived_from_it():
    """The env section is the environment's own settings class, so a vector env built with ``EnvConfig()`` runs what
    training runs by default; no flag is declared twice; the parsed defaults are the sections' defaults."""
    assert TrainConfig().env == EnvConfig()
    assert EnvConfig().action_mode == "weights" and EnvConfig().reward == "log_return"
    flags = [s.flag for s in SETTINGS.values()]
    assert len(flags) == len(set(flags)) == len(TrainConfig().to_dict())
    assert parse_config([]) == TrainConfig()


def test_help_groups_the_flags_under_their_sections():
    text = build_parser().format_help()
    headings = [title for title, _cls in SECTIONS.values()]
    positions = [text.index(f"\n{title}:\n") for title in headings]
    assert positions == sorted(positions)  # in the documented order
    for s in SETTINGS.values():  # every flag sits under its own section's heading; config-only knobs have none
        found = re.search(rf"\n  --(no-)?{s.flag}\b", text)
        assert (found is not None) == s.cli, s.flag
        if found is None:
            continue
        at = found.start()
        owner = max((p, t) for p, t in zip(positions, headings, strict=True) if p < at)[1]
        assert owner == SECTIONS[s.section][0], s.flag


def test_flat_settings_round_trip_through_json_and_keep_their_types():
    cfg = TrainConfig.from_dict(dict(episode_length="full", log_std_max=math.inf, data="csv:x.csv", gamma=0.9))
    assert cfg.env.episode_days is None and cfg.data.source == "csv:x.csv" and cfg.ppo.gamma == 0.9
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert TrainConfig.from_dict({"episode_length": "63"}).env.episode_length == 63  # as old files wrote it
    assert cfg.with_settings(seed=7).run.seed == 7 and cfg.with_settings(seed=7).ppo == cfg.ppo


def test_every_default_that_differs_from_the_paper_has_a_row_in_the_defaults_table():
    """docs/training.md's table of defaults that differ from the paper names every setting where the plain defaults
    and ``--preset paper`` disagree (a changed default without its evidence fails here)."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    table = text.split("### Defaults that differ from the paper", 1)[1].split("\n### ", 1)[0]
    named = {
        name
        for cell in re.findall(r"^\| ([^|]+)\|", table, flags=re.MULTILINE)
        for name in re.findall(r"`(\w+)`", cell)
    }
    paper, default = preset("paper").to_dict(), TrainConfig().to_dict()
    differ = {k for k in paper if paper[k] != default[k]}
    assert "target_kl" in differ and differ <= named, sorted(differ - named)


def test_the_command_line_has_at_most_65_flags_and_the_rare_knobs_live_in_config_files(tmp_path):
    """The budget: ``train --help`` lists at most 65 flags (``--config`` and ``--preset`` included). A config-only
    knob is still a setting: a ``--config`` file sets it, and it is not a flag."""
    text = build_parser().format_help()
    flags = re.findall(r"^  --([a-z0-9_]+)", text, flags=re.MULTILINE)
    assert len(flags) <= 65 and {"config", "preset", "data", "num_gpus", "policy"} <= set(flags)
    assert {"adam_eps", "master_port", "max_price_ratio"} <= set(CONFIG_ONLY) and not set(CONFIG_ONLY) & set(flags)
    (tmp_path / "knobs.json").write_text(json.dumps({"adam_eps": 1e-5, "master_port": 29511, "max_price_ratio": 0}))
    cfg = parse_config(["--config", str(tmp_path / "knobs.json"), "--gamma", "0.9"])
    assert (cfg.ppo.adam_eps, cfg.system.master_port, cfg.data.max_price_ratio, cfg.ppo.gamma) == (1e-5, 29511, 0, 0.9)
    # each file overrides what it names and nothing else: a preset's other settings stay; later files win
    (tmp_path / "later.json").write_text(json.dumps({"adam_eps": 1e-4}))
    both = ["--preset", "paper", "--config", str(tmp_path / "knobs.json"), "--config", str(tmp_path / "later.json")]
    layered = parse_config(both)
    assert (layered.ppo.adam_eps, layered.system.master_port, layered.ppo.batch_size) == (1e-4, 29511, 128)
    assert layered.env.action_mode == "shares"  # the paper preset's, not the default
    with pytest.raises(UserError, match="--adam_eps is set in a --config file, not on the command line"):
        parse_config(["--adam_eps", "1e-5"])
