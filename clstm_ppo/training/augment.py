"""Ticker permutation: the training augmentation behind ``--permute_tickers``.

Every training episode shows the policy the N tickers in its own random order: ticker slot j of the
policy is the env's ticker ``perm[b, j]`` for the whole episode of env b. The state's per-ticker blocks
(price column, holdings and each indicator, `envs.vector_env` documents the layout
``F = 1 + N + N + K*N``) are gathered in that order, and the policy's action for slot j is sent to env
ticker ``perm[b, j]``. A policy can then no longer learn "column 3 rose in the training years"; it has to
read a stock's role from its numbers. Evaluation, backtest and trade show the tickers in their own order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from envs.state import StateLayout


class TickerPermutation:
    """Per-env ticker orders ``perm [B, N]`` int64, redrawn for every env that starts an episode.

    :param num_envs: B; :param num_tickers: N; :param num_features: F (must be 1 + a multiple of N).
    :param device: where the observations and actions live; :param seed: of its own generator there.
    """

    def __init__(self, num_envs: int, num_tickers: int, num_features: int, device: torch.device, seed: int) -> None:
        layout = StateLayout.of_width(num_features, num_tickers)
        self.num_tickers, self.num_features, self.device = num_tickers, num_features, device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.perm = torch.arange(num_tickers, device=device).repeat(num_envs, 1)  # [B, N]
        self._blocks = torch.tensor(layout.ticker_blocks, device=device)  # [K+2] first column of each block

    def redraw(self, starting: Tensor) -> None:
        """New random orders for the envs where ``starting [B]`` (bool) is True; the others keep theirs.
        Drawn for all B and selected on the device (no host sync)."""
        fresh = torch.rand(self.perm.shape, device=self.device, generator=self.generator).argsort(dim=1)
        self.perm = torch.where(starting.to(self.device).unsqueeze(1), fresh, self.perm)

    def columns(self) -> Tensor:
        """``[B, F]`` int64: the env's state column behind each of the policy's columns."""
        per_block = self._blocks.view(1, -1, 1) + self.perm.unsqueeze(1)  # [B, K+2, N]
        cash = torch.zeros(self.perm.shape[0], 1, dtype=torch.int64, device=self.device)
        return torch.cat([cash, per_block.flatten(1)], dim=1)

    def observe(self, obs: Tensor) -> Tensor:
        """The env's observations ``[B, T, F]`` in each env's ticker order (same shape)."""
        cols = self.columns().unsqueeze(1).expand(-1, obs.shape[1], -1)
        return obs.gather(2, cols.to(obs.device))

    def to_env(self, action: Tensor) -> Tensor:
        """The policy's actions ``[B, k N]`` (slot order; k blocks of N, e.g. weight logits then gates) as the env's
        actions (ticker order, each block permuted alike)."""
        blocks = action.reshape(action.shape[0], -1, self.num_tickers)  # [B, k, N]
        index = self.perm.to(action.device).unsqueeze(1).expand_as(blocks)
        return torch.empty_like(blocks).scatter_(2, index, blocks).reshape(action.shape)

    def state_dict(self) -> dict[str, Any]:
        return {"perm": self.perm.cpu(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.perm = state["perm"].to(self.device)
        self.generator.set_state(state["generator"])
