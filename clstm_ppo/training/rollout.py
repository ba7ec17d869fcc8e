"""Rollout storage and generalised advantage estimation (GAE).

Shapes: S = n_steps days per rollout, B envs on this worker, T window, F state numbers, N tickers.

Truncation (an episode cut by ``episode_length``, not by the end of the data) is bootstrapped the
way Stable-Baselines3 does it: the value of the final observation, discounted once, is added to
that step's reward when the step is recorded, so GAE below can treat every ``done`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from clstm_ppo.agent.model import LSTMState
from clstm_ppo.agent.windows import WindowStore


@dataclass
class RolloutBuffer:
    """One worker's rollout: S steps x B envs, plus the recurrent state before step 0.

    ``starts[s, b]`` is True when env b's observation at step s is the first of an episode; the
    policy zeroes its recurrent state before processing it. ``dones[s, b]`` is True when the action
    at step s ended the episode (so ``starts[s + 1] == dones[s]``).
    """

    obs: WindowStore  # S x B windows [T, F] float32, kept as distinct rows (see clstm_ppo.agent.windows)
    actions: Tensor  # [S, B, N] float32 (unclipped Gaussian samples)
    log_probs: Tensor  # [S, B] float32
    values: Tensor  # [S, B] float32
    rewards: Tensor  # [S, B] float32 (scaled; truncation bootstrap folded in)
    dones: Tensor  # [S, B] bool
    starts: Tensor  # [S, B] bool
    initial_state: LSTMState  # state before step 0, each [1, B, H]

    @classmethod
    def allocate(cls, n_steps: int, num_envs: int, obs_shape: tuple[int, int], num_tickers: int,
                 device: torch.device | str) -> RolloutBuffer:
        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            obs=WindowStore(n_steps, num_envs, *obs_shape, device), actions=zeros(n_steps, num_envs, num_tickers),
            log_probs=zeros(n_steps, num_envs), values=zeros(n_steps, num_envs), rewards=zeros(n_steps, num_envs),
            dones=zeros(n_steps, num_envs, dtype=torch.bool), starts=zeros(n_steps, num_envs, dtype=torch.bool),
            initial_state=(),
        )

    @property
    def n_steps(self) -> int:
        return self.actions.shape[0]


def compute_gae(rewards: Tensor, values: Tensor, dones: Tensor, last_value: Tensor, gamma: float,
                gae_lambda: float) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) advantages and returns.

    :param rewards: ``[S, B]`` reward of the action at step s.
    :param values: ``[S, B]`` V(obs_s) recorded in the rollout.
    :param dones: ``[S, B]`` bool, the episode ended after step s (no bootstrap across it).
    :param last_value: ``[B]`` V of the observation after the last step (the next rollout's first).
    :return: ``(advantages [S, B], returns [S, B])`` with returns = advantages + values.
    """
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    not_done = (~dones).to(rewards.dtype)
    for s in reversed(range(steps)):
        delta = rewards[s] + gamma * next_value * not_done[s] - values[s]
        next_adv = delta + gamma * gae_lambda * not_done[s] * next_adv
        advantages[s] = next_adv
        next_value = values[s]
    return advantages, advantages + values
