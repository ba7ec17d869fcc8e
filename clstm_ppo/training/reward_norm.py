"""Reward normalisation (``--norm_reward``): rewards divided by the running standard deviation of the discounted
return and clipped to +-10, as Stable-Baselines3's ``VecNormalize`` does; one object owns the whole concern.

The observation statistics of ``--norm_obs`` live in the model's buffers instead, because they differ in kind: they
are part of the function the policy computes, so the backtest and trade must apply them exactly as training ended;
the reward scale only shapes training's targets, and its per-env state belongs to the rollout's envs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.moments import merge_moments, moment_sums
from clstm_ppo.migrate import START_MOMENTS
from clstm_ppo.training.distributed import Comm

REWARD_CLIP = 10.0  # normalised rewards are clipped to +-this
VAR_EPS = 1e-8  # variance floor of the scale


class RewardNormalizer:
    """For B envs with discount ``gamma``; a no-op (scale 1, nothing recorded) unless ``enabled``.

    The scale applies from the rollout after the one whose returns it has seen, and is the same on every rank:
    each rank records its rollout's returns (`record`), then `sync` merges every rank's into the moments.
    """

    def __init__(self, num_envs: int, gamma: float, device: torch.device | str, *, enabled: bool) -> None:
        self.enabled, self.gamma = enabled, gamma
        self.discounted = torch.zeros(num_envs, dtype=torch.float64, device=device)  # [B] running discounted return
        self.batch = torch.zeros(3, dtype=torch.float64, device=device)  # this rollout's count, sum, sum of squares
        self.moments = START_MOMENTS  # all workers' returns so far: count, mean, variance

    @property
    def scale(self) -> float:
        """What rewards are multiplied by: 1 / the running std of the discounted return (1 when disabled or before
        any return was seen)."""
        count, _mean, var = self.moments
        return 1.0 / math.sqrt(var + VAR_EPS) if self.enabled and count > 0 else 1.0

    def __call__(self, reward: Tensor, done: Tensor) -> Tensor:
        """Record the raw ``reward [B]`` into each env's discounted return (restarting after ``done [B]``) and return
        it scaled and clipped (unchanged when disabled)."""
        if not self.enabled:
            return reward
        self.discounted = self.discounted * self.gamma + reward.double()
        self.batch += moment_sums(self.discounted)
        self.discounted = self.discounted.masked_fill(done, 0.0)
        return (reward * self.scale).clamp(-REWARD_CLIP, REWARD_CLIP)

    def sync(self, comm: Comm) -> None:
        """After a rollout: merge every worker's recorded returns into the moments (one all-reduce, on every rank
        alike) and start the next rollout's record."""
        if not self.enabled:
            return
        sums = comm.all_reduce_sum(self.batch.cpu())
        merged = merge_moments(*(torch.tensor(v, dtype=torch.float64) for v in self.moments), sums)
        self.moments = tuple(float(v) for v in merged)
        self.batch.zero_()

    def state_dict(self) -> dict[str, Any]:
        """The moments (the same on every rank) and this rank's envs' discounted returns (CPU)."""
        return {"moments": list(self.moments), "discounted": self.discounted.cpu()}

    def load_state_dict(self, state: dict[str, Any], *, envs: bool = True) -> None:
        """Restore the moments, and with ``envs`` this rank's discounted returns (not when the envs start afresh,
        e.g. a resume with another world size)."""
        self.moments = tuple(float(v) for v in state["moments"])
        if envs:
            self.discounted = state["discounted"].to(self.discounted.device)
