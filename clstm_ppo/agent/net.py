"""`Net`: everything a policy family's forward may call on the networks it runs.

A family writes its forward once (`clstm_ppo.agent.model.ActorCritic.forward_cells`) for K >= 1 networks of one
shape and reaches their weights only through a `Net`, so its arithmetic exists once whatever K. Two things are a
`Net`: one network (`ActorCritic`, K = 1, on torch's own modules) and K stacked ones
(`clstm_ppo.agent.stacked.CellPolicy`, batched kernels over ``[K, ...]`` weights).

Shapes: K networks; E = K x M env columns (cell-major: network k's M columns are ``k M .. (k + 1) M - 1``); L days;
R = L x M rows per network, step-major; D = ``feature_dim``; H1 = ``stage1_hidden``; H = ``stage2_hidden``.

Weights are asked for by the single network's dotted submodule names (``nn.Module.get_submodule``'s): `LayerName`
lists every layer a family may ask for, `WindowLSTMName` every window LSTM (``tests/test_net.py`` checks that the
families ask for exactly these).
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from torch import Tensor

from clstm_ppo.agent.spec import ModelSpec, RecurrentState
from clstm_ppo.agent.windows import Windows

LayerName = Literal[
    "features",  # stage 1's two tanh layers: lstm, mlp (the day's F numbers) and clstm (the window LSTM's H1)
    "actor_body",  # mlp: D -> H and tanh
    "critic_body",  # mlp: D -> H and tanh
    "actor_mean",  # lstm, clstm, mlp: H -> A, the Gaussian's means
    "critic",  # lstm, clstm, mlp: H -> 1, the value
    "shared.features",  # shared: per ticker H1 -> D, two tanh layers
    "shared.mix",  # shared: per ticker [e_i, mean e] 2D -> H and tanh
    "shared.actor_mean",  # shared: per ticker H -> 1
    "shared.critic_body",  # shared: [mean e, max e] 2D -> H and tanh
    "shared.critic",  # shared: H -> 1
]
"""The layers (an ``nn.Linear``, or an ``nn.Sequential`` of Linear and Tanh) a family's forward may run."""

WindowLSTMName = Literal[
    "window_lstm",  # clstm's stage 1: F -> H1 over each observation's T-day window
    "shared.window_lstm",  # shared's stage 1: 3 + K_ind -> H1 over each ticker's T-day window
]
"""The window LSTMs (one-layer ``nn.LSTM``, ``batch_first``) a family's forward may run."""


@runtime_checkable
class Net(Protocol):
    """K >= 1 networks of one family and shape, as a family's forward sees them: these members and no others."""

    spec: ModelSpec  # the networks' shared shapes and settings
    cells: int  # K

    def layers(self, name: LayerName, x: Tensor) -> Tensor:
        """The K networks' layer ``name`` on their own rows: ``x [K, R, in] -> [K, R, out]``."""
        ...

    def window_summary(self, windows: Windows, name: WindowLSTMName = "window_lstm") -> Tensor:
        """The K networks' window LSTM ``name``, state zero at each window's oldest day, on L x E windows of ``[T,
        F_in]`` rows: the last output of each ``[K, L x M, H1]`` (network k's M columns, step-major)."""
        ...

    def stage2(
        self, feats: Tensor, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """The K networks' stage-2 LSTMs across days (the actor's and the critic's; families recurrent across days).

        :param feats: ``[K, L, M, D]`` features.
        :param state: the E columns' state before day 0 (``[1, E, H]`` each, cell-major).
        :param starts: ``[L, E]`` bool episode starts (the state is zeroed before such a day).
        :param host_starts: a CPU copy of ``starts``, or None.
        :return: the actors' and the critics' outputs ``[K, L x M, H]`` each, and the state after day L-1.
        """
        ...
