"""Several policies acting as one: an ensemble of seeds (or of any checkpoints trained on one market).

Every member reads the same observation and keeps its own recurrent state; each gives its deterministic action
(members of one family and shape in one forward of the stacked network, `clstm_ppo.agent.stacked`: the same up to
float rounding), and the ensemble acts on their mean: the mean of the members' target portfolios with target-weight
actions (mapped back to the one action whose target it is, `envs.kernel.actions_for_weights`), the mean of their
clipped actions with share actions. It has the acting interface of `ActorCritic` (``initial_state``, ``act``,
``env_action``, ``eval``/``train``), so whatever takes one policy takes it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.model import ActorCritic, ActOutput
from clstm_ppo.agent.spec import ModelSpec, RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
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
        # One forward a day instead of one per member (their parameters become views of the stacked weights); None
        # for one member, one network twice (acting in turn is as fast), or members of another family, shape or
        # distribution (each then acts in turn).
        self.stacked: CellPolicy | None = None
        if len(members) > 1 and len({id(m) for m in members}) == len(members):
            with contextlib.suppress(ValueError):
                self.stacked = CellPolicy(members)

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
        if self.stacked is not None:
            means, values, states = self._stacked_act(obs, state, starts)
        else:
            outs = [m.act(obs, s, starts, deterministic=True) for m, s in zip(self.members, state, strict=True)]
            means, values = [o.action for o in outs], [o.value for o in outs]
            states = EnsembleState(o.state for o in outs)
        actions = [m.env_action(u).to(torch.float64) for m, u in zip(self.members, means, strict=True)]
        if self.action_mode == "weights":
            action = actions_for_weights(torch.stack([target_weights(a) for a in actions]).mean(0))
        else:
            action = torch.stack([a.clamp(-1.0, 1.0) for a in actions]).mean(0)
        value = torch.stack(values).mean(0)
        return ActOutput(action.to(torch.float32), torch.zeros_like(value), value, states)  # type: ignore[arg-type]

    def _stacked_act(
        self, obs: Tensor, state: EnsembleState, starts: Tensor
    ) -> tuple[list[Tensor], list[Tensor], EnsembleState]:
        """Every member's action means ``[B, A]`` and values ``[B]`` from one forward of the stacked members (member
        k on columns ``k B .. (k + 1) B - 1``), and their new states."""
        cells, envs = len(self.members), obs.shape[0]
        joint = RecurrentState(*(torch.cat([s[i] for s in state], dim=1) for i in range(4)))
        out = self.stacked.evaluate(  # type: ignore[union-attr]
            obs.repeat(cells, 1, 1).unsqueeze(0), joint, starts.repeat(cells).unsqueeze(0)
        )
        means, values = out.mean[0].split(envs), out.value[0].split(envs)
        states = EnsembleState(out.state.map(lambda t, k=k: t[:, k * envs : (k + 1) * envs]) for k in range(cells))
        return list(means), list(values), states

    def env_action(self, action: Tensor) -> Tensor:
        """The ensemble's actions are already the env's."""
        return action
