"""``--policy shared``: one encoder applied to every ticker (weights shared across tickers) and a cross-sectional
stage, so the network has no parameter whose size depends on the number of tickers N.

Shapes: M observations (M = L x E: L days of E envs, step-major), T window days, F = 1 + (2 + K) N state numbers
(`envs.state.StateLayout`: cash, N prices, N holdings, K indicator blocks of N).

1. Per ticker and window day, ``k = 3 + K`` inputs: the ticker's price column, its holding, its K indicators, and
   the portfolio's cash column (the one number every ticker shares): ``[M, N, T, k]`` (`ticker_windows`).
2. Stage 1, shared across tickers: an LSTM (k -> stage1_hidden) over each ticker's T-day window, its last output
   through two tanh layers -> per-ticker embeddings ``e [M, N, D]``.
3. Cross-sectional stage (DeepSets): each ticker's ``[e_i, mean_j e_j]`` through a shared tanh layer ->
   ``z [M, N, H]``; the actor's mean for ticker i is one shared linear map of ``z_i``; the critic reads
   ``[mean_j e_j, max_j e_j]`` through a tanh layer.
4. No recurrence across days (memory comes from the window), so the recurrent state has zero width, as for mlp.
   The Gaussian's log-std is one learned number shared by all tickers.

Permuting the tickers of an observation permutes the action means the same way and leaves the value unchanged, and
the same weights act on a market of any N with the same K indicators (tests/test_shared.py, and
``clstm-ppo backtest --new_universe``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal
from clstm_ppo.agent.lstm import feature_layers
from clstm_ppo.agent.model import ActorCritic, ModelSpec, RecurrentState
from clstm_ppo.agent.windows import Windows
from envs.state import StateLayout


def ticker_windows(windows: Tensor, num_indicators: int) -> Tensor:
    """Dense windows ``[M, T, F]`` -> per-ticker windows ``[M, N, T, 3 + K]``: each ticker's price, holding and K
    indicators, then the cash column, per window day."""
    m, t, f = windows.shape
    blocks = 2 + num_indicators
    n, rest = divmod(f - 1, blocks)
    if rest:
        raise ValueError(f"a state of {f} numbers is not 1 + {blocks} blocks of tickers")
    per_ticker = windows[..., 1:].reshape(m, t, blocks, n).permute(0, 3, 1, 2)  # [M, N, T, 2 + K]
    cash = windows[..., :1].unsqueeze(1).expand(m, n, t, 1)
    return torch.cat([per_ticker, cash], dim=-1)


class SharedTickerNet(nn.Module):
    """Stages 1-3 of the module docstring: dense windows ``[M, T, F]`` -> action means ``[M, N]`` and values
    ``[M]``."""

    def __init__(self, num_indicators: int, stage1_hidden: int, feature_dim: int, hidden: int) -> None:
        super().__init__()
        self.num_indicators = num_indicators
        k = 3 + num_indicators
        self.window_lstm = orthogonal(nn.LSTM(k, stage1_hidden, batch_first=True), 1.0)
        self.features = feature_layers(stage1_hidden, feature_dim)
        self.mix = nn.Sequential(orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.actor_mean = orthogonal(nn.Linear(hidden, 1), 0.01)
        self.critic_body = nn.Sequential(orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.critic = orthogonal(nn.Linear(hidden, 1), 1.0)

    def stage1_parameters(self) -> list[nn.Parameter]:
        """The per-ticker encoder's parameters (trained at ``learning_rate_clstm``)."""
        return [*self.window_lstm.parameters(), *self.features.parameters()]

    def embed(self, tickers: Tensor) -> Tensor:
        """Stages 1-2: per-ticker windows ``[M, N, T, k]`` -> per-ticker embeddings ``[M, N, D]``."""
        m, n, t, k = tickers.shape
        out, _ = self.window_lstm(tickers.reshape(m * n, t, k))
        return self.features(out[:, -1]).reshape(m, n, -1)

    def forward(self, windows: Tensor) -> tuple[Tensor, Tensor]:
        """Dense windows ``[M, T, F]`` -> (action means ``[M, N]``, values ``[M]``)."""
        e = self.embed(ticker_windows(windows, self.num_indicators))  # [M, N, D]
        pooled = e.mean(dim=1, keepdim=True)  # [M, 1, D]
        z = self.mix(torch.cat([e, pooled.expand_as(e)], dim=-1))  # [M, N, H]
        mean = self.actor_mean(z).squeeze(-1)
        value = self.critic(self.critic_body(torch.cat([pooled.squeeze(1), e.amax(dim=1)], dim=-1))).squeeze(-1)
        return mean, value


class SharedPolicy(ActorCritic):
    """`SharedTickerNet` and one log-std for every ticker: no parameter is N wide."""

    stackable = False  # its forward is one network's: a batch runs each in turn

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        if spec.obs_norm:
            raise ValueError("--norm_obs keeps statistics per state number, which ties a network to N tickers")
        layout = StateLayout.of_width(spec.num_features, spec.num_tickers)
        self.shared = SharedTickerNet(layout.num_indicators, spec.stage1_hidden, spec.feature_dim, spec.stage2_hidden)
        self._finish(1)

    def stage1_parameters(self) -> list[nn.Parameter]:
        return self.shared.stage1_parameters()

    @classmethod
    def forward_cells(
        cls, net: Any, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """One network's (``net`` is this one: a batch of ``shared`` runs each network in turn, `LoopedCells`)."""
        dense = windows.dense()  # [L, B, T, F]
        steps, envs = dense.shape[:2]
        mean, value = net.shared(dense.reshape(steps * envs, *dense.shape[2:]))
        return mean.reshape(steps, envs, -1), value.reshape(steps, envs), state
