"""The spread of a ``--forecast_only`` policy's stock means over its training days: the unit of a no-trade threshold
measured in the forecast's own size (``--forecast_threshold 2sd``; docs/learning.md sections 20-21).

A ``--forecast_only`` policy's deterministic stock means are ``g x forecast + b`` (weight logits); its
``--forecast_threshold D`` holds a stock only where that clears D. D is in logit units, so one D means a different
selectivity for a policy whose forecasts are larger or smaller. The policy's own spread is::

    s = sqrt( mean over stocks i of Var over training days t of m[t, i] )

the pooled standard deviation of its stock means ``m [days, N]`` over the days it was fitted on (the ``train``
split, at D = 0; stocks whose forecast barely moves add little, so the strong forecasts set the unit). A threshold of
K spreads is ``D = K x s`` (`ForecastThreshold`).

With a gain G (``--forecast_gain G``, docs/learning.md section 22) the deployed stock means are instead::

    G x ((m[t, i] - mu_i) / s - K)

with ``mu_i`` stock i's mean of its means over the same days: each stock's forecast read as its distance from its
usual level, in spreads, and weights that grow G logits per spread past the threshold (the trained gain g and the
learned per-stock bias b of ``g x forecast + b`` are replaced by G / s and the centre).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch

from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.agent.model import ActorCritic, ActOutput, RecurrentState
from envs.config import EnvConfig
from envs.errors import UserError
from envs.features import PreparedMarket


class ForecastThreshold(NamedTuple):
    """A deploy-time ``--forecast_threshold``: ``value`` in logits, or in spreads of the policy's stock means over its
    training days where ``in_spreads`` (written ``2sd``); with ``gain`` (``--forecast_gain``, spreads only) the means
    are centred and rescaled first (module docstring)."""

    value: float
    in_spreads: bool = False
    gain: float | None = None

    @classmethod
    def with_gain(cls, threshold: ForecastThreshold | None, gain: float | None) -> ForecastThreshold | None:
        """``threshold`` with ``--forecast_gain`` (None: as it is); UserError unless it is in spreads and G > 0."""
        if gain is None:
            return threshold
        if threshold is None or not threshold.in_spreads:
            raise UserError(
                "--forecast_gain G deploys G x (the stock mean's distance from its usual level, in spreads, minus K): "
                "it needs --forecast_threshold in spreads (e.g. 2sd)"
            )
        if not 0 < gain < float("inf"):
            raise UserError(f"--forecast_gain must be a finite number > 0, got {gain:g}")
        return threshold._replace(gain=float(gain))

    @classmethod
    def parse(cls, text: str) -> ForecastThreshold:
        """``"0.3"`` (logits) or ``"1.75sd"`` (spreads); UserError naming the flag otherwise."""
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(sd)?\s*", text)
        if match is None:
            raise UserError(
                f"--forecast_threshold: {text!r} is not a number >= 0 in logits (0.3) or in spreads of the policy's "
                "forecast over its training days (1.75sd)"
            )
        return cls(float(match.group(1)), match.group(2) is not None)

    def __str__(self) -> str:
        return f"{self.value:g}sd" if self.in_spreads else f"{self.value:g}"


class DelegatingPolicy:
    """What `evaluate_policy` calls of a policy, delegated to ``policy`` (deterministic), with `adjust` applied to
    its stocks' means ``[N]`` each day (weight logits before its ``forecast_threshold``): override it."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy

    @property
    def training(self) -> bool:
        return self.policy.training

    def eval(self) -> None:
        self.policy.eval()

    def train(self, mode: bool) -> None:
        self.policy.train(mode)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        return self.policy.initial_state(batch_size, device)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        return self.policy.env_action(u)

    def adjust(self, means: torch.Tensor) -> torch.Tensor:
        return means

    def act(self, obs, state, starts, *, deterministic: bool = True, generator=None) -> ActOutput:
        """One day ``obs [1, T, F]``: the policy's means ``[1, A]`` (`ActorCritic.forward`, before `deployed_mean`)
        with the stocks' adjusted."""
        out = self.policy.forward(obs.unsqueeze(0), state, starts.unsqueeze(0))
        mean, n = out.mean[0, 0], self.policy.spec.num_tickers
        action = torch.cat([self.adjust(mean[:n]), mean[n:]]).unsqueeze(0)
        return ActOutput(action, out.log_prob[0], out.value[0], out.state)


class _Recorder(DelegatingPolicy):
    """Records each day's stock means ``[N]`` and acts on them unchanged."""

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__(policy)
        self.means: list[np.ndarray] = []

    def adjust(self, means: torch.Tensor) -> torch.Tensor:
        self.means.append(means.double().numpy())
        return means


def stock_means(policy: ActorCritic, market: PreparedMarket, env_config: EnvConfig, split: str = "train") -> np.ndarray:
    """The policy's deterministic stock means (weight logits, before any threshold) on every day of ``split``:
    ``[days, N]`` float64. The policy acts through the split as in a backtest (`evaluate_policy`) at those means."""
    recorder = _Recorder(policy)
    with torch.no_grad():
        evaluate_policy(recorder, market, split, env_config)
    return np.stack(recorder.means)


def pooled_spread(means: np.ndarray) -> float:
    """``s``: the square root of the mean over stocks of each stock's variance over days of ``means [days, N]``."""
    return float(np.sqrt(means.var(axis=0).mean()))


def spread_and_centre(policy: ActorCritic, market: PreparedMarket, env_config: EnvConfig) -> tuple[float, np.ndarray]:
    """``(s, mu [N])`` of a ``--forecast_only`` policy over ``market``'s training days (its own market: the days it
    was fitted on): the pooled spread and each stock's mean of its means. UserError for another policy (its means are
    not ``g x forecast + b``) or a spread of 0."""
    if not policy.spec.forecast_only:
        raise UserError("--forecast_threshold in spreads needs a --forecast_only policy (g x forecast + b)")
    means = stock_means(policy, market, env_config)
    spread = pooled_spread(means)
    if not spread > 0:
        raise UserError(
            "--forecast_threshold in spreads: this policy's stock means do not move over its training days (spread 0: "
            "its forecast is not followed), so no multiple of it is a threshold; give one in logits"
        )
    return spread, means.mean(axis=0)


def forecast_spread(policy: ActorCritic, market: PreparedMarket, env_config: EnvConfig) -> float:
    """``s`` of `spread_and_centre`."""
    return spread_and_centre(policy, market, env_config)[0]
