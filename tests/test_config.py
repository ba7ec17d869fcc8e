"""Settings: inconsistent ones are refused with one line; the paper preset holds the paper's numbers."""

from __future__ import annotations

import pytest

from clstm_ppo.config import TrainConfig, preset
from envs.errors import UserError


def test_config_rejects_batch_that_does_not_divide_rollout():
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig(num_envs=4, n_steps=128, batch_size=100).validate()
    with pytest.raises(UserError, match="batch_size"):
        TrainConfig(num_envs=3, n_steps=128, batch_size=256).validate()
    with pytest.raises(UserError, match="num_episodes"):
        TrainConfig(num_episodes=0).validate()


def test_paper_preset_has_the_papers_settings():
    cfg = preset("paper", num_envs=8)
    assert (cfg.window, cfg.stage1_hidden, cfg.feature_dim, cfg.stage2_hidden) == (30, 128, 128, 512)
    assert (cfg.gamma, cfg.n_steps, cfg.vf_coef, cfg.ent_coef, cfg.clip_coef, cfg.max_grad_norm) == (
        0.99,
        128,
        0.5,
        0.01,
        0.2,
        0.5,
    )
    assert cfg.learning_rate_clstm == cfg.learning_rate_actor_critic == 3e-4 and cfg.adam_eps == 1e-8
    cfg.validate()
