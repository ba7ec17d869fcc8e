"""Windowed observations stored once per distinct row, and the rollout's compact record of them.

An observation is a window of the last T daily state rows (F numbers each). Consecutive observations
of one episode share T - 1 rows, so a rollout of S steps holds about S distinct rows per env, not
S x T. Shapes: E envs (columns), L steps, T window days, F state numbers, R distinct rows per env.

`Windows` is what the model reads: a table of distinct rows per env plus, for every (step, env), the
T row numbers that make up its window. `WindowStore` builds that record during a rollout from the
env's dense observations and the host-known fact of whether any env restarted on that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Windows:
    """L steps x E envs of T-day observation windows over per-env row tables.

    The window of env e at step l is ``rows[e, index[l, e]]``: ``[T, F]``, oldest day first.
    """

    rows: Tensor  # [E, R, F] float: distinct state rows of each env
    index: Tensor  # [L, E, T] int32/int64: row numbers (into rows[e]) of each window
    given_dense: Tensor | None = field(default=None, repr=False)  # [L, E, T, F] when built from_dense

    @classmethod
    def from_dense(cls, obs: Tensor) -> Windows:
        """Wrap dense windows ``[L, E, T, F]`` (no rows shared: R = L x T)."""
        steps, envs, window, features = obs.shape
        rows = obs.transpose(0, 1).reshape(envs, steps * window, features)
        index = torch.arange(steps * window, device=obs.device).view(steps, 1, window).expand(steps, envs, window)
        return cls(rows, index, obs)

    @property
    def steps(self) -> int:
        return self.index.shape[0]

    @property
    def envs(self) -> int:
        return self.index.shape[1]

    @property
    def window(self) -> int:
        return self.index.shape[2]

    @property
    def rows_shared(self) -> bool:
        """Whether windows may share rows (built from row tables, as the rollout's store keeps them), not dense."""
        return self.given_dense is None

    def flat_index(self) -> Tensor:
        """``[L, E, T]`` int64 row numbers into ``rows.reshape(E * R, F)``."""
        offsets = torch.arange(self.envs, device=self.index.device).mul_(self.rows.shape[1]).view(1, -1, 1)
        return self.index.long() + offsets

    def dense(self) -> Tensor:
        """The windows themselves: ``[L, E, T, F]``."""
        if self.given_dense is not None:
            return self.given_dense
        flat = self.rows.reshape(-1, self.rows.shape[-1])
        return flat.index_select(0, self.flat_index().reshape(-1)).view(*self.index.shape, -1)

    def last_rows(self) -> Tensor:
        """Each window's newest row (the current day's state): ``[L, E, F]``."""
        flat = self.rows.reshape(-1, self.rows.shape[-1])
        return flat.index_select(0, self.flat_index()[..., -1].reshape(-1)).view(self.steps, self.envs, -1)

    def select(self, envs: Tensor) -> Windows:
        """The windows of env columns ``envs`` ([E'] int64 on the rows' device)."""
        return Windows(self.rows.index_select(0, envs), self.index.index_select(1, envs))

    def to(self, device: torch.device | str) -> Windows:
        return Windows(
            self.rows.to(device),
            self.index.to(device),
            None if self.given_dense is None else self.given_dense.to(device),
        )


class WindowStore:
    """The observations of one rollout (S steps x B envs), recorded as distinct rows.

    Per env the row table is ``[newest row of steps 0..S-1 | anchor windows]``: each step contributes its window's
    newest row; an *anchor* step (step 0, and any step on which some env had just been reset) stores every env's whole
    window, because a reset env's window is not the previous window moved on by a day. On other steps a window is the
    previous one moved on by a day, which is what ``VectorStockTradingEnv`` returns for every env that did not reset
    (``tests/test_windows.py`` checks the reconstruction against the env's own observations).

    Memory: ``S x B x F`` floats + ``S x B x T`` int32 + ``B x T x F`` per anchor, instead of
    ``S x B x T x F`` (at the paper's T = 30, F = 181: ~7x smaller with one anchor per rollout).
    """

    def __init__(self, n_steps: int, num_envs: int, window: int, num_features: int, device: torch.device | str) -> None:
        self.n_steps, self.window = n_steps, window
        self.newest = torch.zeros(n_steps, num_envs, num_features, device=device)  # [S, B, F]
        self.index = torch.zeros(n_steps, num_envs, window, dtype=torch.int32, device=device)  # [S, B, T]
        self.anchors: list[Tensor] = []  # each [B, T, F]
        self._anchor_rows = torch.arange(window, dtype=torch.int32, device=device)  # [T]

    def record(self, step: int, obs: Tensor, anchor: bool) -> None:
        """Record the observations ``[B, T, F]`` of ``step`` (steps in order, 0 first).

        ``anchor`` must be True where some env's window is not its previous one moved on by a day
        (after a reset); step 0 is always an anchor.
        """
        self.newest[step] = obs[:, -1]
        if step == 0:
            self.anchors.clear()
        if anchor or step == 0:
            first = self.n_steps + len(self.anchors) * self.window
            self.anchors.append(obs.clone())
            self.index[step] = self._anchor_rows + first
        else:
            self.index[step, :, :-1] = self.index[step - 1, :, 1:]
            self.index[step, :, -1] = step

    def windows(self) -> Windows:
        """All recorded windows: rows ``[B, S + anchors x T, F]``, index ``[S, B, T]``."""
        table = torch.cat([self.newest.transpose(0, 1), *self.anchors], dim=1)
        return Windows(table, self.index)

    def columns(self, envs: slice) -> WindowStore:
        """A store holding only env columns ``envs`` (views of this one's tensors)."""
        part = WindowStore.__new__(WindowStore)
        part.n_steps, part.window, part._anchor_rows = self.n_steps, self.window, self._anchor_rows
        part.newest, part.index = self.newest[:, envs], self.index[:, envs]
        part.anchors = [a[envs] for a in self.anchors]
        return part

    @property
    def rows_per_env(self) -> int:
        """R: rows in each env's table (one per step, plus T per anchor window)."""
        return self.n_steps + len(self.anchors) * self.window

    def nbytes(self) -> int:
        """Bytes held (rows, index and anchors)."""
        tensors = [self.newest, self.index, *self.anchors]
        return sum(t.numel() * t.element_size() for t in tensors)
