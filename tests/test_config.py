"""Settings: typed sections with one home per default, flags derived from them, inconsistent settings refused
with one line, the paper preset and what old checkpoints meant."""

from __future__ import annotations

import json
import math
import re

import pytest

from clstm_ppo.cli.train import build_parser, parse_config
from clstm_ppo.config import LEGACY, PAPER_BEHAVIOUR, SECTIONS, SETTINGS, TrainConfig, preset
from envs.config import EnvConfig
from envs.errors import UserError


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


def forecast_of(cfg: TrainConfig) -> tuple[bool | None, str, bool | None]:
    m = cfg.model.resolved()
    return m.forecast_skip, m.forecaster, m.forecast_only


def test_the_forecast_defaults_resolve_per_policy_and_given_settings_win():
    for policy in ("clstm", "lstm", "mlp"):  # a linear forecast alone (docs/learning.md 19)
        cfg = TrainConfig.from_dict(dict(policy=policy)).validate()
        assert (cfg.model.forecast_skip, cfg.model.forecaster, cfg.model.forecast_only) == (None, "auto", None)
        assert forecast_of(cfg) == (True, "linear", True)
    assert forecast_of(TrainConfig.from_dict(dict(policy="shared")).validate()) == (False, "head", False)
    assert forecast_of(TrainConfig.from_dict(dict(forecast_skip=False)).validate()) == (False, "head", False)
    assert forecast_of(TrainConfig.from_dict(dict(forecast_only=False)).validate()) == (True, "linear", False)
    assert forecast_of(TrainConfig.from_dict(dict(forecaster="head")).validate()) == (True, "head", False)
    shared_head = TrainConfig.from_dict(dict(policy="shared", forecast_skip=True)).validate()
    assert forecast_of(shared_head) == (True, "head", False)
    assert forecast_of(preset("paper")) == (False, "head", False)  # the paper's network's own means
    assert forecast_of(TrainConfig.from_checkpoint({})) == (False, "head", False)  # files older than the setting
    # a study's base config keeps auto, so one grid can hold clstm and shared cells
    base = TrainConfig.from_dict(dict(policy="clstm")).validate()
    assert forecast_of(base.with_settings(policy="shared").validate()) == (False, "head", False)


def test_forecast_skip_needs_the_next_day_loss_only_when_it_follows_the_head():
    with pytest.raises(UserError, match="it needs --aux_coef > 0"):
        TrainConfig.from_dict(dict(forecaster="head", aux_coef=0.0)).validate()
    linear = TrainConfig.from_dict(dict(aux_coef=0.0)).validate()
    assert forecast_of(linear) == (True, "linear", True) and linear.ppo.aux_coef == 0.0  # its own term (test_ppo)
    with pytest.raises(UserError, match="--forecast_only sets the stocks' means"):
        TrainConfig.from_dict(dict(forecast_only=True, forecast_skip=False)).validate()
    with pytest.raises(UserError, match="--forecast_only sets the stocks' means"):
        TrainConfig.from_dict(dict(forecast_only=True, policy="shared")).validate()
    with pytest.raises(UserError, match="--forecaster linear has N x T x N weights"):
        TrainConfig.from_dict(dict(forecaster="linear", policy="shared")).validate()
    with pytest.raises(UserError, match="--forecaster linear is what --forecast_skip follows"):
        TrainConfig.from_dict(dict(forecaster="linear", forecast_skip=False)).validate()
    assert TrainConfig.from_dict(dict(forecast_threshold=1.5)).validate().model.forecast_threshold == 1.5
    with pytest.raises(UserError, match="--forecast_threshold lowers the means --forecast_only sets"):
        TrainConfig.from_dict(dict(forecast_threshold=1.5, forecast_only=False)).validate()
    with pytest.raises(UserError, match="--forecast_threshold must be a finite number >= 0, got -1"):
        TrainConfig.from_dict(dict(forecast_threshold=-1.0)).validate()


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
    assert (cfg.env.action_mode, cfg.env.reward, cfg.model.action_dist, cfg.model.skip) == (
        "shares",
        "value",
        "gaussian",
        False,
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
    for s in SETTINGS.values():  # every flag sits under its own section's heading
        at = re.search(rf"\n  --(no-)?{s.flag}\b", text).start()
        owner = max((p, t) for p, t in zip(positions, headings, strict=True) if p < at)[1]
        assert owner == SECTIONS[s.section][0], s.flag


def test_flat_settings_round_trip_through_json_and_keep_their_types():
    cfg = TrainConfig.from_dict(dict(episode_length="full", log_std_max=math.inf, data="csv:x.csv", gamma=0.9))
    assert cfg.env.episode_days is None and cfg.data.source == "csv:x.csv" and cfg.ppo.gamma == 0.9
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert TrainConfig.from_dict({"episode_length": "63"}).env.episode_length == 63  # as old files wrote it
    assert cfg.with_settings(seed=7).run.seed == 7 and cfg.with_settings(seed=7).ppo == cfg.ppo


def test_a_checkpoint_without_newer_settings_keeps_the_meaning_they_had():
    old = TrainConfig.from_checkpoint({"gamma": 0.98})
    for flag, value in LEGACY.items():
        assert old.to_dict()[flag] == value, flag
    assert {k: old.to_dict()[k] for k in PAPER_BEHAVIOUR} == {k: preset("paper").to_dict()[k] for k in PAPER_BEHAVIOUR}
    assert TrainConfig.from_checkpoint({"action_mode": "weights"}).env.action_mode == "weights"  # stored wins
