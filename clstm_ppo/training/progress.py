"""Where a seed's training stands (`Counters`, kept in its checkpoints) and what one update did for it
(`UpdateResult`): what the loop hands its callbacks beside the run itself."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from clstm_ppo.training.ppo import UpdateStats


@dataclass
class Counters:
    """Where training stands, the same on every rank (kept in every checkpoint)."""

    update: int = 0  # updates done
    global_step: int = 0  # env steps over all workers
    episodes: int = 0  # finished episodes over all workers
    best_score: float = -math.inf  # best validation Sharpe so far (best.pt)
    bad_updates: int = 0  # consecutive updates with NaN/inf loss or gradients
    skipped_steps: int = 0  # optimizer steps skipped for NaN/inf gradients
    elapsed: float = 0.0  # seconds of training, resumes included

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Counters:
        """From a checkpoint's counters (keys of other versions ignored)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


@dataclass
class UpdateResult:
    """What one update did for one seed over all workers (`Trainer.gather`), the same on every rank."""

    episodes: Tensor  # [k, len(EPISODE_KEYS) + 1] float64: every worker's finished episodes, then each one's rank
    stats: UpdateStats  # losses, KL, clip fraction, gradient norm (all workers)
    behaviour: dict[str, Any]  # what the policy did (`RolloutStats.as_dict`, all workers)
    rollout_seconds: float  # this rank's rollout and GAE
    update_seconds: float  # this rank's PPO epochs

    @property
    def bad(self) -> bool:
        """Some optimizer step was skipped for NaN/inf gradients, or the loss was not finite."""
        return self.stats.skipped_steps > 0 or not math.isfinite(self.stats.policy_loss)
