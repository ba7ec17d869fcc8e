"""An exponential moving average of the policy's weights (Polyak averaging), the network a run deploys.

PPO's last iterate is a noisy point: every update moves it by a step sized for learning, not for trading,
and seeds' ensembles (docs/learning.md) show how much of a deployed policy's turnover is that noise. With
``--ema_decay D`` the trainer keeps, beside the weights it trains, their running average

    average <- D * average + (1 - D) * weights        after every update (``1 / (1 - D)`` updates' memory)

and deploys it: validation scores it, ``best.pt`` is chosen by it and every backtest, study and trade reads it
(`clstm_ppo.training.checkpoint.Checkpoint.deployed_state`). Training itself continues from the raw weights,
so the average changes nothing the optimiser sees. Buffers (the observation normaliser's running moments)
are the model's own, copied, not averaged. Polyak & Juditsky (1992); for PPO's policies, Nikishin et al.,
"Improving Stability in Deep Reinforcement Learning with Weight Averaging" (2018).
"""

from __future__ import annotations

import copy

import torch

from clstm_ppo.agent.model import ActorCritic


class WeightAverage:
    """The moving average of ``model``'s parameters, held as a second `ActorCritic` of the same spec."""

    def __init__(self, model: ActorCritic, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: ActorCritic) -> None:
        """Fold ``model``'s current weights in: ``average += (1 - decay) * (weights - average)``; buffers copied."""
        for mine, theirs in zip(self.model.parameters(), model.parameters(), strict=True):
            mine.lerp_(theirs.detach(), 1.0 - self.decay)
        for mine, theirs in zip(self.model.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state, strict=True)
