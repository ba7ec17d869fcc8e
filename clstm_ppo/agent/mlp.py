"""``--policy mlp`` (PPO in the paper's tables): no recurrence. The current day's state ``[F]`` goes through two tanh
layers to ``feature_dim`` features, then a tanh layer (``stage2_hidden`` wide) for the actor and one for the
critic, each with its linear head. The recurrent state has zero width.
"""

from __future__ import annotations

from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal
from clstm_ppo.agent.lstm import feature_layers, today
from clstm_ppo.agent.model import ActorCritic, from_cells
from clstm_ppo.agent.net import Net
from clstm_ppo.agent.spec import ModelSpec, RecurrentState
from clstm_ppo.agent.windows import Windows


class MLPPolicy(ActorCritic):
    """See the module docstring."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        hidden = spec.stage2_hidden
        self.features = feature_layers(spec.num_features, spec.feature_dim)
        self.actor_body = nn.Sequential(orthogonal(nn.Linear(spec.feature_dim, hidden)), nn.Tanh())
        self.critic_body = nn.Sequential(orthogonal(nn.Linear(spec.feature_dim, hidden)), nn.Tanh())
        self.actor_mean = orthogonal(nn.Linear(hidden, spec.action_dim), 0.01)
        self.critic = orthogonal(nn.Linear(hidden, 1), 1.0)
        self._finish(spec.action_dim)

    def stage1_parameters(self) -> list[nn.Parameter]:
        return list(self.features.parameters())

    @classmethod
    def forward_cells(
        cls, net: Net, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        steps = windows.steps
        feats = net.layers("features", today(windows, net.cells))
        mean = net.layers("actor_mean", net.layers("actor_body", feats))
        value = net.layers("critic", net.layers("critic_body", feats)).squeeze(-1)
        return from_cells(mean, steps), from_cells(value, steps), state
