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

import torch
from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal
from clstm_ppo.agent.lstm import feature_layers
from clstm_ppo.agent.model import ActorCritic, from_cells, to_cells
from clstm_ppo.agent.net import Net
from clstm_ppo.agent.spec import ModelSpec, RecurrentState
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
    """The layers of stages 1-3 (module docstring); `SharedPolicy.forward_cells` is their forward."""

    def __init__(self, num_indicators: int, stage1_hidden: int, feature_dim: int, hidden: int) -> None:
        super().__init__()
        self.window_lstm = orthogonal(nn.LSTM(3 + num_indicators, stage1_hidden, batch_first=True), 1.0)
        self.features = feature_layers(stage1_hidden, feature_dim)
        self.mix = nn.Sequential(orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.actor_mean = orthogonal(nn.Linear(hidden, 1), 0.01)
        self.critic_body = nn.Sequential(orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.critic = orthogonal(nn.Linear(hidden, 1), 1.0)

    def stage1_parameters(self) -> list[nn.Parameter]:
        """The per-ticker encoder's parameters (trained at ``learning_rate_clstm``)."""
        return [*self.window_lstm.parameters(), *self.features.parameters()]


class SharedPolicy(ActorCritic):
    """`SharedTickerNet` and one log-std for every ticker: no parameter is N wide."""

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
        cls, net: Net, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """Stages 1-3 (module docstring) of K >= 1 networks (here K counts networks): each network's R = L x M
        observations, of N tickers each (any N: the state's width says it)."""
        spec, cells, steps = net.spec, net.cells, windows.steps
        indicators = StateLayout.of_width(spec.num_features, spec.num_tickers).num_indicators
        dense = to_cells(windows.dense(), cells)  # [K, R, T, F]
        rows, days = dense.shape[1:3]
        tickers = ticker_windows(dense.reshape(cells * rows, days, -1), indicators)  # [K R, N, T, k]
        n = tickers.shape[1]
        each_ticker = Windows.from_dense(tickers.reshape(1, cells * rows * n, days, -1))  # one window per ticker
        e = net.layers("shared.features", net.window_summary(each_ticker, "shared.window_lstm"))
        e = e.view(cells, rows, n, -1)  # [K, R, N, D]
        pooled = e.mean(dim=2, keepdim=True)  # [K, R, 1, D]
        z = net.layers("shared.mix", torch.cat([e, pooled.expand_as(e)], dim=-1).view(cells, rows * n, -1))
        mean = net.layers("shared.actor_mean", z).view(cells, rows, n)
        pooled_both = torch.cat([pooled.squeeze(2), e.amax(dim=2)], dim=-1)  # [K, R, 2D]
        value = net.layers("shared.critic", net.layers("shared.critic_body", pooled_both)).squeeze(-1)
        return from_cells(mean, steps), from_cells(value, steps), state
