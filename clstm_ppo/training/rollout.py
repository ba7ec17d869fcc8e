"""Rollouts: running the policy in the envs, their storage, and generalised advantage estimation (GAE).

Shapes: S = n_steps days per rollout, B envs on this worker, T window, F state numbers, N tickers.

Truncation (an episode cut by ``episode_length``, not by the end of the data) is bootstrapped the way
Stable-Baselines3 does it: the value of the final observation, discounted once, is added to that step's reward when
the step is recorded, so GAE below can treat every ``done`` alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.agent.windows import WindowStore
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.reward_norm import RewardNormalizer
from envs.vector_env import EPISODE_KEYS, VectorStockTradingEnv


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
    initial_state: RecurrentState  # state before step 0, each [1, B, H]

    @classmethod
    def allocate(
        cls, n_steps: int, num_envs: int, obs_shape: tuple[int, int], action_dim: int, device: torch.device | str
    ) -> RolloutBuffer:
        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            obs=WindowStore(n_steps, num_envs, *obs_shape, device),
            actions=zeros(n_steps, num_envs, action_dim),
            log_probs=zeros(n_steps, num_envs),
            values=zeros(n_steps, num_envs),
            rewards=zeros(n_steps, num_envs),
            dones=zeros(n_steps, num_envs, dtype=torch.bool),
            starts=zeros(n_steps, num_envs, dtype=torch.bool),
            initial_state=RecurrentState.zeros(num_envs, 0, device),
        )

    @property
    def n_steps(self) -> int:
        return self.actions.shape[0]

    @property
    def num_envs(self) -> int:
        return self.actions.shape[1]

    def columns(self, cols: slice) -> RolloutBuffer:
        """The envs ``cols`` of this rollout: views, so writing them writes this buffer (a batched cell's columns,
        a rank's share of a rollout)."""
        steps = ("actions", "log_probs", "values", "rewards", "dones", "starts")
        return RolloutBuffer(
            obs=self.obs.columns(cols),
            initial_state=self.initial_state.envs(cols),
            **{name: getattr(self, name)[:, cols] for name in steps},
        )


def compute_gae(
    rewards: Tensor, values: Tensor, dones: Tensor, last_value: Tensor, gamma: float, gae_lambda: float
) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) advantages and returns.

    :param rewards: ``[S, B]`` reward of the action at step s.
    :param values: ``[S, B]`` V(obs_s) recorded in the rollout.
    :param dones: ``[S, B]`` bool, the episode ended after step s (no bootstrap across it).
    :param last_value: ``[B]`` V of the observation after the last step (the next rollout's first).
    :return: ``(advantages [S, B], returns [S, B])`` with returns = advantages + values.
    """
    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    not_done = (~dones).to(rewards.dtype)
    for s in reversed(range(rewards.shape[0])):
        delta = rewards[s] + gamma * next_value * not_done[s] - values[s]
        next_adv = delta + gamma * gae_lambda * not_done[s] * next_adv
        advantages[s] = next_adv
        next_value = values[s]
    return advantages, advantages + values


@dataclass
class RolloutStats:
    """What the policy did in one rollout, as float64 sums by name (so workers' rollouts add up with one all-reduce)."""

    action_sum: Tensor  # [N] the sampled actions, per stock in the env's ticker order
    action_square_sum: Tensor  # [N] their squares
    clipped: Tensor  # [] actions with |a| > 1 (clipped by the env)
    actions: Tensor  # [] all actions
    wanted_buy_value: Tensor  # [] dollars of buys wanted
    refused_buy_value: Tensor  # [] dollars of buys refused for cash
    exposure_sum: Tensor  # [] the fraction of value in stock after each env step, summed over env steps

    def named(self) -> dict[str, Tensor]:
        return dict(self.__dict__)

    def all_reduced(self, comm: Comm) -> RolloutStats:
        """The sums over every worker's rollout."""
        return RolloutStats(**comm.all_reduce_named(self.named()))

    def as_dict(self) -> dict[str, Any]:
        """``action_mean`` / ``action_std`` [N] lists, ``clipped_fraction``, ``refused_buy_fraction``, ``exposure``."""
        n = self.action_sum.numel()
        actions = float(self.actions)
        per_stock = max(actions / n, 1.0)  # actions of one stock = env steps
        mean = self.action_sum.double().cpu() / per_stock
        std = (self.action_square_sum.double().cpu() / per_stock - mean.square()).clamp_min(0).sqrt()
        wanted = float(self.wanted_buy_value)
        return {
            "action_mean": mean.tolist(),
            "action_std": std.tolist(),
            "clipped_fraction": float(self.clipped) / max(actions, 1.0),
            "refused_buy_fraction": float(self.refused_buy_value) / wanted if wanted > 0 else 0.0,
            "exposure": float(self.exposure_sum) / per_stock,
        }


@dataclass
class SeedActor:
    """What acting in the envs keeps of one seed (K of them share a `RolloutCollector`; a run is one): its action
    noise, its envs' first reset, its reward normaliser, and what its policy did in the last rollout."""

    noise: torch.Generator  # the action samples' generator, on the policy's device
    env_seed: int  # the seed of its envs' first reset (this worker's)
    reward_norm: RewardNormalizer  # its envs' rewards (enabled with --norm_reward); merged over workers by the trainer
    stats: RolloutStats | None = None  # what its policy did in the last rollout (`RolloutCollector.collect`)


class RolloutCollector:
    """Runs the policy in the envs for ``n_steps`` days per rollout; the envs, the last observation and the recurrent
    state carry over from one rollout to the next. For K >= 1 runs as one batch the E env columns are K blocks of B
    (seed-major), and what a run keeps of its own is its seed's `SeedActor` (action noise, envs' first reset, reward
    normaliser, `RolloutStats`); its finished episodes come back per seed.

    :param env: the K x B envs (auto-reset), seeded per seed; its device may differ from the policy's.
    :param policy: the raw ActorCritic (K = 1; no DDP wrapper: acting needs no gradient all-reduce), or the K seeds'
        `clstm_ppo.agent.stacked.CellPolicy`.
    :param seeds: each seed's `SeedActor`, in column-block order.
    :param gamma: discount, for folding a truncated episode's bootstrap value into its last reward.
    """

    def __init__(
        self,
        env: VectorStockTradingEnv,
        policy: ActorCritic | CellPolicy,
        seeds: list[SeedActor],
        *,
        gamma: float,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        self.env, self.policy, self.seeds, self.gamma, self.device = env, policy, seeds, gamma, device
        self.autocast = autocast
        self.cells = len(seeds)
        if env.num_envs % self.cells:
            raise ValueError(f"{env.num_envs} envs do not split into {self.cells} seeds")
        self.per_cell = env.num_envs // self.cells
        self.stacked = isinstance(policy, CellPolicy)
        obs, _ = env.reset(seed=[seed.env_seed for seed in seeds])
        self.next_start = torch.ones(env.num_envs, dtype=torch.bool, device=device)  # [E] it starts an episode
        self.next_obs = obs.to(device)  # [E, T, F] what the next step acts on
        self.state = policy.initial_state(env.num_envs, device)  # recurrent state before the next step

    def envs_of(self, cell: int) -> slice:
        """Cell ``cell``'s env columns."""
        return slice(cell * self.per_cell, (cell + 1) * self.per_cell)

    def _normalise(self, reward: Tensor, done: Tensor) -> Tensor:
        """Each seed's rewards through its own normaliser (or as they are, without ``--norm_reward``)."""
        if not self.seeds[0].reward_norm.enabled:  # --norm_reward is a setting the seeds share
            return reward
        envs = [self.envs_of(k) for k in range(self.cells)]
        return torch.cat([seed.reward_norm(reward[e], done[e]) for seed, e in zip(self.seeds, envs, strict=True)])

    def collect(self, buf: RolloutBuffer) -> list[Tensor]:
        """Fill ``buf`` (all E columns) with ``buf.n_steps`` days of every env.

        :return: each seed's finished episodes ``[k, len(EPISODE_KEYS)]`` float64 on the CPU, step-major and in env
            order within a step. Each seed's `SeedActor.stats` then holds its `RolloutStats`.
        """
        device, cells, per = self.device, self.cells, self.per_cell
        buf.initial_state = self.state.map(torch.Tensor.clone)
        noise = [seed.noise for seed in self.seeds]  # each seed's action noise, as the policy's act() takes it
        ep_masks, ep_fields = [], []  # finished episodes stay on the device until the rollout ends
        reset_before = True  # some env's window is not its previous one moved on a day (host-known)
        # each cell's `RolloutStats` sums of its actions; the env's three come from env_sums after the steps
        wide, one = (cells, buf.actions.shape[2]), (cells,)
        shapes = {"action_sum": wide, "action_square_sum": wide, "clipped": one, "actions": one}
        sums = {name: torch.zeros(shape, dtype=torch.float64, device=device) for name, shape in shapes.items()}
        env_sums = torch.zeros(cells, 3, dtype=torch.float64, device=self.env.device)  # wanted, refused, exposure
        with torch.no_grad(), self.autocast():
            for step in range(buf.n_steps):
                buf.obs.record(step, self.next_obs, anchor=reset_before)
                buf.starts[step] = self.next_start
                action, log_prob, value, self.state = self.policy.act(
                    self.next_obs, self.state, self.next_start, generators=noise
                )
                env_action = self.policy.env_action(action)
                obs, reward, terminated, truncated, info = self.env.step(env_action.to(self.env.device))
                obs, reward = obs.to(device), reward.to(device)
                terminated, truncated = terminated.to(device), truncated.to(device)
                done = terminated | truncated
                reward = self._normalise(reward, done)
                # The env decides episode ends on the host and sets "_episode" only on steps where some
                # env finished, so other steps need no device sync here.
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
                env_sums += torch.stack(  # on the env's device: no copy per step
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
        for k, seed in enumerate(self.seeds):
            seed.stats = RolloutStats(**{name: value[k] for name, value in sums.items()})
        if not ep_masks:
            return [torch.zeros((0, len(EPISODE_KEYS)), dtype=torch.float64) for _ in range(cells)]
        masks = torch.cat(ep_masks)
        rows = torch.cat(ep_fields)[masks].cpu()
        cell_of = (torch.arange(masks.numel(), device=masks.device) % self.env.num_envs // per)[masks].cpu()
        return [rows[cell_of == k] for k in range(cells)]

    def _bootstrap_truncated(self, reward: Tensor, truncated: Tensor, final_obs: Tensor) -> Tensor:
        """``reward [E]`` plus gamma x V(final observation) where an episode was cut by its length (not by the data's
        end). A single network evaluates the cut envs only (a second forward over all E would double the step); the
        stacked network takes whole cells, so it evaluates every env on such a step (the envs of one run all start
        together: such steps are few) and adds V where cut."""
        if self.stacked:
            values = self.policy.value(final_obs, self.state, torch.zeros_like(truncated)).float()
            return torch.where(truncated, reward + self.gamma * values, reward)
        cut = torch.nonzero(truncated).flatten()
        if not cut.numel():
            return reward
        obs = final_obs.to(self.device).index_select(0, cut)
        no_start = torch.zeros(cut.numel(), dtype=torch.bool, device=self.device)
        return reward.index_add(0, cut, self.gamma * self.policy.value(obs, self.state.envs(cut), no_start).float())

    def bootstrap_value(self) -> Tensor:
        """V of the observation after the rollout's last step ``[E]`` float32 (GAE's ``last_value``)."""
        with torch.no_grad(), self.autocast():
            return self.policy.value(self.next_obs, self.state, self.next_start).float()

    # ------------------------------------------------------------------ a cell's state, in its run's format
    def state_dict(self, cell: int = 0) -> dict[str, Any]:
        """What makes cell ``cell``'s next rollout bitwise reproducible, as its run alone saves it (CPU tensors)."""
        envs = self.envs_of(cell)
        return {
            "action_gen": self.seeds[cell].noise.get_state(),
            "next_obs": self.next_obs[envs].cpu().clone(),
            "next_start": self.next_start[envs].cpu().clone(),
            "recurrent": [s[:, envs].cpu().clone() for s in self.state],
            "reward_norm": self.seeds[cell].reward_norm.state_dict(),
            "env": self.env.state_dict() if self.cells == 1 else self.env.cell_state_dict(cell),
        }

    def load_state_dict(self, state: dict[str, Any], cell: int = 0) -> None:
        """Cell ``cell``'s part from a `state_dict` of its run, alone or batched (a checkpoint's of any release:
        `clstm_ppo.migrate.resume_state`)."""
        envs = self.envs_of(cell)
        self.seeds[cell].noise.set_state(state["action_gen"])
        self.next_obs[envs] = state["next_obs"].to(self.device)
        self.next_start[envs] = state["next_start"].to(self.device)
        for mine, saved in zip(self.state, state["recurrent"], strict=True):
            mine[:, envs] = saved.to(self.device)
        if self.cells == 1:
            self.env.load_state_dict(state["env"])
        else:
            self.env.load_cell_state_dict(cell, state["env"])
        self.seeds[cell].reward_norm.load_state_dict(state["reward_norm"])
