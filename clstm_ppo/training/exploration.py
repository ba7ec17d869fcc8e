"""Held exploration noise (``--noise_hold K``): each env's action noise is drawn at its episode start and then
every K days, and held in between.

With target-weight actions, a fresh draw every day moves every target every day, and every move is a trade: the
policy learns in a world whose costs come mostly from its own exploration, one the deterministic policy it deploys
never faces. Holding the standard-normal draw ``eps`` for K days explores the same Gaussian (each day's action is
still ``mean + std x eps`` with ``eps ~ N(0, 1)``, so PPO scores it with the same log-probability) while the targets
move only as fast as the mean does between redraws (Stable-Baselines3's ``sde_sample_freq`` idea, for a
state-independent Gaussian).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class HeldNoise:
    """Standard-normal draws ``[B, A]`` per env (A numbers per action), redrawn where an episode starts or the draw
    is ``hold`` days old.

    :param generator: the action-noise generator (on its own device); one full ``[B, A]`` draw is taken every day
        whatever is kept, so the stream stays in step across a resume.
    """

    def __init__(self, num_envs: int, action_dim: int, hold: int, generator: torch.Generator) -> None:
        self.hold, self.generator = hold, generator
        self.shape = (num_envs, action_dim)
        self.noise = torch.zeros(self.shape, device=generator.device)
        self.age = torch.full((num_envs,), hold, dtype=torch.int64, device=generator.device)  # days since the draw

    def draw(self, starting: Tensor) -> Tensor:
        """Today's draws ``[B, A]`` float32 for envs whose episode starts where ``starting [B]`` (bool)."""
        fresh = torch.randn(self.shape, device=self.generator.device, generator=self.generator)
        renew = starting.to(self.age.device) | (self.age >= self.hold)
        self.noise = torch.where(renew.unsqueeze(1), fresh, self.noise)
        self.age = torch.where(renew, 1, self.age + 1)
        return self.noise

    def state_dict(self) -> dict[str, Any]:
        return {"noise": self.noise.cpu(), "age": self.age.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise = state["noise"].to(self.noise.device)
        self.age = state["age"].to(self.age.device)
