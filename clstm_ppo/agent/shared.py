"""``--policy shared``: one encoder applied to every ticker (weights shared across tickers) and a cross-sectional
stage, so the network has no parameter whose size depends on the number of tickers N.

Shapes: M observations (M = L x E: L days of E envs, step-major), T window days, F = 1 + (2 + K) N state numbers
(`envs.state.StateLayout`: cash, N prices, N holdings, K indicator blocks of N).

1. Per ticker and window day, ``k = 3 + K`` inputs: the ticker's price column, its holding, its K indicators, and
   the portfolio's cash column (the one number every ticker shares): ``[M, N, T, k]`` (`ticker_windows`).
2. Stage 1, shared across tickers: an LSTM (k -> stage1_hidden) over each ticker's T-day window, its last output
   next to the ticker's today row (with ``skip``), two tanh layers -> per-ticker embeddings ``e [M, N, D]``.
3. Cross-sectional stage: each ticker's ``[e_i, mean_j e_j]`` through a shared tanh layer -> ``z [M, N, H]``
   (DeepSets); the actor's mean for ticker i is one shared linear map of ``z_i``; the next-day head (``--aux_coef``)
   is another; the critic reads ``[mean_j e_j, max_j e_j]`` through a tanh layer.
4. No recurrence across days (memory comes from the window), so the recurrent state has zero width, as for mlp.
   The Gaussian's log-std is one learned number shared by all tickers.

Permuting the tickers of an observation permutes the action means the same way and leaves the value unchanged, and
the same weights act on a market of any N with the same K indicators (tests/test_shared.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from clstm_ppo.agent.layers import orthogonal as _orthogonal


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
    """Stages 1-3 of the module docstring: dense windows ``[M, T, F]`` -> action means ``[M, N]``, values ``[M]``
    and, with the next-day head, predictions of tomorrow's price column ``[M, N]``."""

    def __init__(
        self, num_indicators: int, stage1_hidden: int, feature_dim: int, hidden: int, skip: bool, next_day: bool
    ) -> None:
        super().__init__()
        self.num_indicators, self.skip = num_indicators, skip
        k = 3 + num_indicators
        self.window_lstm = _orthogonal(nn.LSTM(k, stage1_hidden, batch_first=True), 1.0)
        f_in = stage1_hidden + (k if skip else 0)
        self.features = nn.Sequential(
            _orthogonal(nn.Linear(f_in, feature_dim)),
            nn.Tanh(),
            _orthogonal(nn.Linear(feature_dim, feature_dim)),
            nn.Tanh(),
        )
        self.mix = nn.Sequential(_orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.actor_mean = _orthogonal(nn.Linear(hidden, 1), 0.01)
        self.critic_body = nn.Sequential(_orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.critic = _orthogonal(nn.Linear(hidden, 1), 1.0)
        self.next_day = _orthogonal(nn.Linear(hidden, 1), 1.0) if next_day else None

    def stage1_parameters(self) -> list[nn.Parameter]:
        """The per-ticker encoder's parameters (trained at ``learning_rate_clstm``)."""
        return [*self.window_lstm.parameters(), *self.features.parameters()]

    def embed(self, windows: Tensor) -> Tensor:
        """Stages 1: dense windows ``[M, T, F]`` -> per-ticker embeddings ``[M, N, D]``."""
        tickers = ticker_windows(windows, self.num_indicators)  # [M, N, T, k]
        m, n, t, k = tickers.shape
        flat = tickers.reshape(m * n, t, k)
        out, _ = self.window_lstm(flat)
        summary = out[:, -1]  # [M N, stage1_hidden]
        if self.skip:
            summary = torch.cat([summary, flat[:, -1].to(summary.dtype)], dim=-1)
        return self.features(summary).reshape(m, n, -1)

    def forward(self, windows: Tensor, predict_next: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """Dense windows ``[M, T, F]`` -> (action means ``[M, N]``, values ``[M]``, next-day ``[M, N]`` or None)."""
        e = self.embed(windows)  # [M, N, D]
        pooled = e.mean(dim=1, keepdim=True)  # [M, 1, D]
        z = self.mix(torch.cat([e, pooled.expand_as(e)], dim=-1))  # [M, N, H]
        mean = self.actor_mean(z).squeeze(-1)
        value = self.critic(self.critic_body(torch.cat([pooled.squeeze(1), e.amax(dim=1)], dim=-1))).squeeze(-1)
        next_day = self.next_day(z).squeeze(-1) if predict_next and self.next_day is not None else None
        return mean, value, next_day
