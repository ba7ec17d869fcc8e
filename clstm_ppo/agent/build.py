"""From settings (or a checkpoint's spec) to the policy family they name."""

from __future__ import annotations

from clstm_ppo.agent.clstm import CLSTMPolicy
from clstm_ppo.agent.lstm import LSTMPolicy
from clstm_ppo.agent.mlp import MLPPolicy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.shared import SharedPolicy
from clstm_ppo.agent.spec import ModelSpec
from clstm_ppo.config import TrainConfig
from envs.features import PreparedMarket

FAMILIES: dict[str, type[ActorCritic]] = {
    "clstm": CLSTMPolicy,
    "lstm": LSTMPolicy,
    "mlp": MLPPolicy,
    "shared": SharedPolicy,
}
"""Each `clstm_ppo.config.POLICIES` name -> its class."""


def make_policy(spec: ModelSpec) -> ActorCritic:
    """The untrained network ``spec`` describes (its weights from torch's current RNG)."""
    if spec.policy not in FAMILIES:
        raise ValueError(f"unknown policy family {spec.policy!r}")
    return FAMILIES[spec.policy](spec)


def model_spec(cfg: TrainConfig, market: PreparedMarket) -> ModelSpec:
    """The network of ``cfg`` sized for ``market`` (its F features, N tickers and T window)."""
    model = cfg.model
    same = ("policy", "stage1_hidden", "feature_dim", "stage2_hidden", "init_log_std", "action_dist")  # by name
    return ModelSpec(
        **{name: getattr(model, name) for name in same},
        num_features=market.num_features,
        num_tickers=market.num_tickers,
        window=market.window,
        log_std_max=model.log_std_max if model.log_std_max != float("inf") else None,
        obs_norm=model.norm_obs,
    )


def build_model(cfg: TrainConfig, market: PreparedMarket) -> ActorCritic:
    """The network of ``cfg`` sized for ``market``, its stage-1 kernel set from ``window_kernel``."""
    model = make_policy(model_spec(cfg, market))
    model.window_kernel = cfg.system.window_kernel
    return model
