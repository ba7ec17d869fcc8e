"""Rollouts of K cells at once (`clstm_ppo.training.cell_trainer`), each cell's part what `RolloutCollector` records
for its run alone.

The K x B envs are one `VectorStockTradingEnv` whose blocks of B draw their start days from each cell's own
generator (its ``seed`` list), acted on by a `clstm_ppo.agent.stacked.CellPolicy` with each cell's own action-noise
generator. Each cell keeps its own `RewardNormalizer` over its block, its own `RolloutStats` and its
own finished episodes; the buffer's columns are cell-major (cell k's envs are ``k B .. (k + 1) B - 1``), so GAE
runs over all K x B columns at once (`compute_gae` treats every column alike).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.training.reward_norm import RewardNormalizer
from clstm_ppo.training.rollout import RolloutBuffer, RolloutStats
from envs.vector_env import EPISODE_KEYS, VectorStockTradingEnv


class CellRolloutCollector:
    """`RolloutCollector` for K cells of B envs each (see the module docstring).

    :param env: K x B envs, built with one seed per cell (cell-major blocks).
    :param policy: the cells' networks; :param generators: each cell's action-noise generator.
    :param seeds: each cell's seed of its envs' first reset.
    :param gamma: / :param norm_reward: as `RolloutCollector`'s (the same for every cell).
    """

    def __init__(
        self,
        env: VectorStockTradingEnv,
        policy: CellPolicy,
        *,
        gamma: float,
        device: torch.device,
        generators: list[torch.Generator],
        seeds: list[int],
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        norm_reward: bool = False,
    ) -> None:
        self.env, self.policy, self.gamma, self.device = env, policy, gamma, device
        self.generators, self.autocast = generators, autocast
        self.cells = policy.cells
        self.per_cell = policy.columns(env.num_envs)
        per = self.per_cell
        self.reward_norms = [RewardNormalizer(per, gamma, device, enabled=norm_reward) for _ in generators]
        obs, _ = env.reset(seed=seeds)
        self.next_start = torch.ones(env.num_envs, dtype=torch.bool, device=device)  # [K B]
        self.next_obs = obs.to(device)  # [K B, T, F]
        self.state = policy.initial_state(env.num_envs, device)
        self.stats: list[RolloutStats] = []

    def envs_of(self, cell: int) -> slice:
        """Cell ``cell``'s columns."""
        return slice(cell * self.per_cell, (cell + 1) * self.per_cell)

    def collect(self, buf: RolloutBuffer) -> list[Tensor]:
        """Fill ``buf`` (K x B columns) with ``buf.n_steps`` days of every env.

        :return: each cell's finished episodes ``[k, len(EPISODE_KEYS)]`` float64 on the CPU, step-major and in env
            order within a step (as `RolloutCollector.collect`). ``self.stats`` then holds each cell's
            `RolloutStats`.
        """
        policy, device, cells, per = self.policy, self.device, self.cells, self.per_cell
        buf.initial_state = self.state.map(torch.Tensor.clone)
        ep_masks, ep_fields = [], []
        reset_before = True
        width = buf.actions.shape[2]
        sums = {k: torch.zeros(cells, *v.shape, dtype=torch.float64, device=device) for k, v in _zero_stats(width)}
        env_sums = torch.zeros(cells, 3, dtype=torch.float64, device=self.env.device)  # wanted, refused, exposure
        with torch.no_grad(), self.autocast():
            for step in range(buf.n_steps):
                buf.obs.record(step, self.next_obs, anchor=reset_before)
                buf.starts[step] = self.next_start
                action, log_prob, value, self.state = policy.act(
                    self.next_obs, self.state, self.next_start, generators=self.generators
                )
                obs, reward, terminated, truncated, info = self.env.step(policy.env_action(action).to(self.env.device))
                obs, reward = obs.to(device), reward.to(device)
                terminated, truncated = terminated.to(device), truncated.to(device)
                done = terminated | truncated
                if self.reward_norms[0].enabled:
                    reward = torch.cat(
                        [rn(reward[self.envs_of(k)], done[self.envs_of(k)]) for k, rn in enumerate(self.reward_norms)]
                    )
                reset_before = "_episode" in info
                if reset_before:
                    reward = self._bootstrap_truncated(reward, truncated, info["final_obs"].to(device))
                    ep = info["episode"]
                    ep_masks.append(info["_episode"].to(device))
                    ep_fields.append(torch.stack([ep[k].to(device, torch.float64) for k in EPISODE_KEYS], dim=1))
                a = action.double().view(cells, per, -1)
                sums["action_sum"] += a.sum(1)
                sums["action_square_sum"] += a.square().sum(1)
                sums["clipped"] += (a.abs() > 1).sum((1, 2))
                sums["actions"] += a[0].numel()
                env_sums += torch.stack(
                    [
                        info["wanted_buy_value"].view(cells, per).sum(1),
                        info["refused_buy_value"].view(cells, per).sum(1),
                        (1.0 - info["cash"] / info["portfolio_value"]).view(cells, per).sum(1),
                    ],
                    dim=1,
                )
                buf.actions[step] = action
                buf.log_probs[step] = log_prob
                buf.values[step] = value
                buf.rewards[step] = reward
                buf.dones[step] = done
                self.next_obs, self.next_start = obs, done
        sums["wanted_buy_value"], sums["refused_buy_value"], sums["exposure_sum"] = env_sums.to(device).unbind(1)
        self.stats = [RolloutStats(**{name: value[k] for name, value in sums.items()}) for k in range(cells)]
        if not ep_masks:
            return [torch.zeros((0, len(EPISODE_KEYS)), dtype=torch.float64) for _ in range(cells)]
        masks = torch.cat(ep_masks)
        rows = torch.cat(ep_fields)[masks].cpu()
        cell_of = (torch.arange(masks.numel(), device=masks.device) % self.env.num_envs // per)[masks].cpu()
        return [rows[cell_of == k] for k in range(cells)]

    def _bootstrap_truncated(self, reward: Tensor, truncated: Tensor, final_obs: Tensor) -> Tensor:
        """``reward`` plus gamma x V(final observation) where an episode was cut by its length. The stacked network
        takes whole cells, so V is computed for every env on a step where some env was cut (the envs of one run
        all start together: such steps are few) and added where cut."""
        state, no_start = self.state, torch.zeros_like(truncated)
        values = self.policy.value(final_obs, state, no_start).float()
        return torch.where(truncated, reward + self.gamma * values, reward)

    def bootstrap_value(self) -> Tensor:
        """V of the observation after the rollout's last step ``[K B]`` float32 (GAE's ``last_value``)."""
        with torch.no_grad(), self.autocast():
            return self.policy.value(self.next_obs, self.state, self.next_start).float()

    # ------------------------------------------------------------------ one cell's state, in its run's format
    def cell_state_dict(self, cell: int) -> dict[str, Any]:
        """What `RolloutCollector.state_dict` of cell ``cell``'s run alone holds (tensors on the CPU)."""
        envs = self.envs_of(cell)
        state: dict[str, Any] = {
            "action_gen": self.generators[cell].get_state(),
            "next_obs": self.next_obs[envs].cpu().clone(),
            "next_start": self.next_start[envs].cpu().clone(),
            "recurrent": [s[:, envs].cpu().clone() for s in self.state],
            "reward_norm": self.reward_norms[cell].state_dict(),
        }
        state["env"] = self.env.cell_state_dict(cell)
        return state

    def load_cell_state_dict(self, cell: int, state: dict[str, Any]) -> None:
        """Cell ``cell``'s part from a `RolloutCollector.state_dict` of its run (or `cell_state_dict`)."""
        envs = self.envs_of(cell)
        self.generators[cell].set_state(state["action_gen"])
        self.next_obs[envs] = state["next_obs"].to(self.device)
        self.next_start[envs] = state["next_start"].to(self.device)
        for mine, saved in zip(self.state, state["recurrent"], strict=True):
            mine[:, envs] = saved.to(self.device)
        self.env.load_cell_state_dict(cell, state["env"])
        self.reward_norms[cell].load_state_dict(state["reward_norm"])


def _zero_stats(width: int) -> list[tuple[str, Tensor]]:
    """`RolloutStats`'s fields and their shapes for ``width`` tickers (zeros)."""
    return list(RolloutStats.zeros(width, "cpu").named().items())
