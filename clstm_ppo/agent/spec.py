"""What a network is made of, beneath every family: `ModelSpec` (what rebuilds it, stored in checkpoints) and
`RecurrentState` (stage 2's LSTM state across days)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import torch
from torch import Tensor

from envs.errors import UserError


@dataclass(frozen=True)
class ModelSpec:
    """What is needed to rebuild a policy, stored in checkpoints (``model_config``): the model settings
    (`clstm_ppo.config.ModelConfig`), the market's sizes and the env's action width."""

    policy: str  # clstm | lstm | mlp | shared
    num_features: int  # F, numbers per day's state
    num_tickers: int  # N
    window: int  # T
    stage1_hidden: int
    feature_dim: int
    stage2_hidden: int
    init_log_std: float
    action_dist: str  # gaussian (the env clips samples to [-1, 1]) | tanh (samples squashed by tanh)
    log_std_max: float | None  # upper bound of the policy's log-std (None: unbounded)
    obs_norm: bool  # running mean / std of each state number (module docstring)

    @property
    def action_dim(self) -> int:
        """A: numbers in one action, one per stock (N)."""
        return self.num_tickers

    @property
    def recurrent_width(self) -> int:
        """H of `RecurrentState`: stage 2's hidden size for the families recurrent across days, else 0."""
        return self.stage2_hidden if self.policy in ("clstm", "lstm") else 0

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "checkpoint") -> ModelSpec:
        """From a checkpoint's ``model_config`` (in this version's fields: `clstm_ppo.migrate.network` reads an
        earlier version's); UserError in one line naming fields this version does not know."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise UserError(f"{source}: its model config has fields this version does not know: {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RecurrentState(NamedTuple):
    """Stage 2's LSTM state for B envs: the actor's and the critic's ``(h, c)``, each ``[1, B, H]`` float32
    (H = 0 for the families without recurrence across days)."""

    actor_h: Tensor
    actor_c: Tensor
    critic_h: Tensor
    critic_c: Tensor

    @classmethod
    def zeros(cls, batch_size: int, hidden: int, device: torch.device | str = "cpu") -> RecurrentState:
        return cls(*(torch.zeros(1, batch_size, hidden, device=device) for _ in range(4)))

    @property
    def actor(self) -> tuple[Tensor, Tensor]:
        return self.actor_h, self.actor_c

    @property
    def critic(self) -> tuple[Tensor, Tensor]:
        return self.critic_h, self.critic_c

    def map(self, fn: Any) -> RecurrentState:
        """``fn`` applied to each of the four tensors (``state.map(Tensor.clone)``, ``state.map(lambda t: t.cpu())``)."""
        return RecurrentState(*(fn(t) for t in self))

    def envs(self, index: Tensor) -> RecurrentState:
        """The state of the envs ``index`` ``[k]`` (int64, or a bool mask ``[B]``)."""
        return self.map(lambda t: t[:, index])
