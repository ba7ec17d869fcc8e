"""``--policy shared``: one encoder applied to every ticker (weights shared across tickers) and a cross-sectional
stage, so the network has no parameter whose size depends on the number of tickers N.

Shapes: M observations (M = L x E: L days of E envs, step-major), T window days, F = 1 + (2 + K) N state numbers
(`envs.state.StateLayout`: cash, N prices, N holdings, K indicator blocks of N).

1. Per ticker and window day, ``k = 3 + K`` inputs: the ticker's price column, its holding, its K indicators, and
   the portfolio's cash column (the one number every ticker shares): ``[M, N, T, k]`` (`ticker_windows`).
2. Stage 1, shared across tickers: an LSTM (k -> stage1_hidden) over each ticker's T-day window, its last output
   next to the ticker's today row (with ``skip``), two tanh layers -> per-ticker embeddings ``e [M, N, D]``.
3. Cross-sectional stage (``--cross_section``): each ticker's ``[e_i, mean_j e_j]`` (``mean``, DeepSets), or
   ``[e_i, mean_j e_j, a_i]`` (``attention``), through a shared tanh layer -> ``z [M, N, H]``; the actor's mean for
   ticker i is one shared linear map of ``z_i``; the next-day head (``--aux_coef``) is another; the critic reads
   ``[mean_j e_j, max_j e_j]`` through a tanh layer.
   ``attention``: ``a_i = sum_j softmax_j(q_i . k_j / sqrt(d)) v_j`` over all tickers j (itself included), ``HEADS``
   heads of width ``d``; ``q``, ``k`` and ``v`` are shared linear maps of ``[x_j, e_j]``, where ``x_j [T]`` is ticker
   j's price column over the window divided by the observation's root-mean-square price column (scale-free: a
   return series keeps its relative size across tickers and days). A bilinear score ``x_i^T W x_j`` can be a lagged
   cross-covariance, so a follower can find *which* ticker leads it from the window itself, without knowing ticker
   order, and read the leader's latest move through ``v``.
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


HEADS, HEAD_DIM = 4, 8
"""``--cross_section attention``: heads, and the width of each head's query, key and value."""


class TickerAttention(nn.Module):
    """Stage 3's attention across tickers (module docstring): price windows ``x [M, N, T]`` and embeddings
    ``e [M, N, D]`` -> ``a [M, N, HEADS * HEAD_DIM]``. No weight depends on N; permuting the tickers permutes ``a``."""

    def __init__(self, window: int, feature_dim: int) -> None:
        super().__init__()
        self.qkv = _orthogonal(nn.Linear(window + feature_dim, 3 * HEADS * HEAD_DIM), 1.0)

    def weights_and_values(self, prices: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
        """Attention weights ``[M, heads, N (i), N (j)]`` (each row sums to 1 over j) and values
        ``[M, heads, N, d]``."""
        m, n, _ = prices.shape
        scale = prices.float().square().mean(dim=(1, 2), keepdim=True).add(1e-12).rsqrt()  # [M, 1, 1]
        x = torch.cat([(prices * scale).to(e.dtype), e], dim=-1)  # [M, N, T + D]
        q, k, v = self.qkv(x).reshape(m, n, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)  # 3 x [M, heads, N, d]
        return (q @ k.transpose(-1, -2) * HEAD_DIM**-0.5).softmax(dim=-1), v

    def forward(self, prices: Tensor, e: Tensor) -> Tensor:
        weights, v = self.weights_and_values(prices, e)
        m, _, n, _ = v.shape
        return (weights @ v).transpose(1, 2).reshape(m, n, HEADS * HEAD_DIM)


class SharedTickerNet(nn.Module):
    """Stages 1-3 of the module docstring: dense windows ``[M, T, F]`` -> action means ``[M, N]``, values ``[M]``
    and, with the next-day head, predictions of tomorrow's price column ``[M, N]``."""

    def __init__(
        self,
        num_indicators: int,
        stage1_hidden: int,
        feature_dim: int,
        hidden: int,
        skip: bool,
        next_day: bool,
        cross_section: str,
        window: int,
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
        self.attention = TickerAttention(window, feature_dim) if cross_section == "attention" else None
        mix_in = 2 * feature_dim + (HEADS * HEAD_DIM if self.attention is not None else 0)
        self.mix = nn.Sequential(_orthogonal(nn.Linear(mix_in, hidden)), nn.Tanh())
        self.actor_mean = _orthogonal(nn.Linear(hidden, 1), 0.01)
        self.critic_body = nn.Sequential(_orthogonal(nn.Linear(2 * feature_dim, hidden)), nn.Tanh())
        self.critic = _orthogonal(nn.Linear(hidden, 1), 1.0)
        self.next_day = _orthogonal(nn.Linear(hidden, 1), 1.0) if next_day else None

    def stage1_parameters(self) -> list[nn.Parameter]:
        """The per-ticker encoder's parameters (trained at ``learning_rate_clstm``)."""
        return [*self.window_lstm.parameters(), *self.features.parameters()]

    def embed(self, tickers: Tensor) -> Tensor:
        """Stages 1-2: per-ticker windows ``[M, N, T, k]`` -> per-ticker embeddings ``[M, N, D]``."""
        m, n, t, k = tickers.shape
        flat = tickers.reshape(m * n, t, k)
        out, _ = self.window_lstm(flat)
        summary = out[:, -1]  # [M N, stage1_hidden]
        if self.skip:
            summary = torch.cat([summary, flat[:, -1].to(summary.dtype)], dim=-1)
        return self.features(summary).reshape(m, n, -1)

    def forward(self, windows: Tensor, predict_next: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """Dense windows ``[M, T, F]`` -> (action means ``[M, N]``, values ``[M]``, next-day ``[M, N]`` or None)."""
        tickers = ticker_windows(windows, self.num_indicators)  # [M, N, T, k]
        e = self.embed(tickers)  # [M, N, D]
        pooled = e.mean(dim=1, keepdim=True)  # [M, 1, D]
        per_ticker = [e, pooled.expand_as(e)]
        if self.attention is not None:
            per_ticker.append(self.attention(tickers[..., 0], e))  # the price column: [M, N, T]
        z = self.mix(torch.cat(per_ticker, dim=-1))  # [M, N, H]
        mean = self.actor_mean(z).squeeze(-1)
        value = self.critic(self.critic_body(torch.cat([pooled.squeeze(1), e.amax(dim=1)], dim=-1))).squeeze(-1)
        next_day = self.next_day(z).squeeze(-1) if predict_next and self.next_day is not None else None
        return mean, value, next_day
