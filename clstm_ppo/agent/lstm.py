"""``--policy lstm`` (RecurrentPPO in the paper's tables): no window LSTM; the current day's state (the last window
row ``[F]``) goes through two tanh layers to ``feature_dim`` features, then stage 2: separate actor and critic LSTMs
(``stage2_hidden``, one layer) across days, a linear head for the action means and one for the value.

`clstm_ppo.agent.clstm` is this network with the paper's stage 1 (an LSTM over the T-day window) in front.
"""

from __future__ import annotations

from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal
from clstm_ppo.agent.model import ActorCritic, from_cells, to_cells
from clstm_ppo.agent.net import Net
from clstm_ppo.agent.recurrence import cut_days, run_lstm
from clstm_ppo.agent.spec import ModelSpec, RecurrentState
from clstm_ppo.agent.windows import Windows


def feature_layers(width: int, feature_dim: int) -> nn.Sequential:
    """Stage 1's two tanh layers: ``[M, width] -> [M, feature_dim]``."""
    return nn.Sequential(
        orthogonal(nn.Linear(width, feature_dim)),
        nn.Tanh(),
        orthogonal(nn.Linear(feature_dim, feature_dim)),
        nn.Tanh(),
    )


def today(windows: Windows, cells: int) -> Tensor:
    """Each window's last day, the current state, for K = ``cells`` networks: ``[K, L x M, F]`` (each network's M
    columns of E = K x M, step-major)."""
    return to_cells(windows.last_rows(), cells)


class LSTMPolicy(ActorCritic):
    """Stage 1 on the current day, stage 2's LSTMs across days (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self._build_stage1()
        self.features = feature_layers(self._stage1_width(), spec.feature_dim)
        self.actor_lstm = orthogonal(nn.LSTM(spec.feature_dim, spec.stage2_hidden), 1.0)
        self.critic_lstm = orthogonal(nn.LSTM(spec.feature_dim, spec.stage2_hidden), 1.0)
        self.actor_mean = orthogonal(nn.Linear(spec.stage2_hidden, spec.action_dim), 0.01)
        self.critic = orthogonal(nn.Linear(spec.stage2_hidden, 1), 1.0)
        self._finish(spec.action_dim)

    def _build_stage1(self) -> None:
        """Layers in front of the tanh layers (none here; clstm's window LSTM)."""

    def _stage1_width(self) -> int:
        """Width of what the tanh layers read: the day's state ``F`` here."""
        return self.spec.num_features

    def stage1_parameters(self) -> list[nn.Parameter]:
        return list(self.features.parameters())

    @classmethod
    def encode(cls, net: Net, windows: Windows) -> Tensor:
        """Stage 1 of the K networks ``net``: L x E windows -> features ``[K, L x M, feature_dim]``."""
        return net.layers("features", today(windows, net.cells))

    @classmethod
    def forward_cells(
        cls, net: Net, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        steps, envs = windows.steps, windows.envs
        feats = cls.encode(net, windows).view(net.cells, steps, envs // net.cells, -1)  # [K, L, M, D]
        actor_out, critic_out, state = net.stage2(feats, state, starts, host_starts)  # [K, L x M, H] each
        mean = net.layers("actor_mean", actor_out)
        value = net.layers("critic", critic_out).squeeze(-1)
        return from_cells(mean, steps), from_cells(value, steps), state

    def stage2(
        self, feats: Tensor, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """Stage 2 of this network (K = 1), its LSTMs through `run_lstm` (cuDNN / oneDNN): features ``[1, L, B, D]``
        -> the actor's and the critic's outputs ``[1, L x B, H]`` and the state after day L-1."""
        x = feats[0]
        cuts = cut_days(starts if host_starts is None else host_starts)  # once for both LSTMs
        actor_out, actor = run_lstm(self.actor_lstm, x, state.actor, starts, cuts)
        critic_out, critic = run_lstm(self.critic_lstm, x, state.critic, starts, cuts)
        width = actor_out.shape[-1]
        return actor_out.reshape(1, -1, width), critic_out.reshape(1, -1, width), RecurrentState(*actor, *critic)
