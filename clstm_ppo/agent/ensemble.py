"""Several policies acting as one: an ensemble of seeds (or of any checkpoints trained on one market).

Every member reads the same observation and keeps its own recurrent state; each gives its deterministic action,
and the ensemble acts on their mean: the mean of the members' target portfolios with target-weight actions (mapped
back to the one action whose target it is, `envs.kernel.actions_for_weights`), the mean of their clipped actions
with share actions. It has the acting interface of
`clstm_ppo.agent.model.ActorCritic` (``initial_state``, ``act``, ``env_action``, ``eval``/``train``), so
`clstm_ppo.agent.evaluate.evaluate_policy`, the backtest, the study and the trade plan take it wherever they take one
policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.model import ActorCritic, ActOutput, ModelSpec
from envs.kernel import actions_for_weights, target_weights


class EnsembleState(tuple):
    """One `RecurrentState` per member."""

    def map(self, fn: Any) -> EnsembleState:
        return EnsembleState(s.map(fn) for s in self)


class Ensemble:
    """``members`` trained on one market (same tickers, window and state), acting on the mean of their actions.

    :param action_mode: the members' ``--action_mode``: weights (average the target portfolios) or shares (average
        the clipped actions).
    """

    def __init__(self, members: list[ActorCritic], action_mode: str) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members, self.action_mode = members, action_mode

    @property
    def spec(self) -> ModelSpec:
        return self.members[0].spec

    @property
    def training(self) -> bool:
        return any(m.training for m in self.members)

    def train(self, mode: bool = True) -> Ensemble:
        for m in self.members:
            m.train(mode)
        return self

    def eval(self) -> Ensemble:
        return self.train(False)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> EnsembleState:
        return EnsembleState(m.initial_state(batch_size, device) for m in self.members)

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        state: EnsembleState,
        starts: Tensor,
        *,
        deterministic: bool = True,
        generator: torch.Generator | None = None,
    ) -> ActOutput:
        """The ensemble's action for B envs ``[B, A]``, already as the env takes it (`env_action` is the identity),
        with the members' mean value and their new states (``log_prob`` is 0: the ensemble is not sampled)."""
        if not deterministic:
            raise ValueError("an ensemble acts on its members' deterministic actions only")
        outs = [m.act(obs, s, starts, deterministic=True) for m, s in zip(self.members, state, strict=True)]
        actions = [m.env_action(o.action).to(torch.float64) for m, o in zip(self.members, outs, strict=True)]
        if self.action_mode == "weights":
            action = actions_for_weights(torch.stack([target_weights(a) for a in actions]).mean(0))
        else:
            action = torch.stack([a.clamp(-1.0, 1.0) for a in actions]).mean(0)
        value = torch.stack([o.value for o in outs]).mean(0)
        states = EnsembleState(o.state for o in outs)
        return ActOutput(action.to(torch.float32), torch.zeros_like(value), value, states)  # type: ignore[arg-type]

    def env_action(self, action: Tensor) -> Tensor:
        """The ensemble's actions are already the env's."""
        return action
