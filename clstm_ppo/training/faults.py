"""Fault injection for the fault tests: ``CLSTM_PPO_FAULT_INJECT="rank=1,update=2[,kind=raise|kill|nan][,count=K]"``.

At update ``update`` (1-based, counted like the checkpoint's counters) rank ``rank`` raises a
RuntimeError (``raise``, the default), kills itself with SIGKILL (``kill``), or turns its rollout
rewards into NaN for ``count`` updates (``nan``; default: every update from then on), which makes
the loss and the all-reduced gradients NaN on every rank. Nothing but the tests sets it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import torch

from envs.errors import UserError

FAULT_INJECT_ENV = "CLSTM_PPO_FAULT_INJECT"
KINDS = ("raise", "kill", "nan")


@dataclass(frozen=True)
class FaultSpec:
    """Where and how to fail (see the module docstring)."""

    rank: int = 0
    update: int = 1
    kind: str = "raise"
    count: int = 1 << 30

    @classmethod
    def parse(cls, text: str) -> FaultSpec | None:
        """The spec in ``text`` (the variable's value); None when empty; UserError when malformed."""
        if not text.strip():
            return None
        values: dict[str, int | str] = {}
        try:
            for part in text.split(","):
                key, value = (x.strip() for x in part.split("=", 1))
                if key not in cls.__dataclass_fields__:
                    raise ValueError(key)
                values[key] = value if key == "kind" else int(value)
        except ValueError:
            raise UserError(
                f"{FAULT_INJECT_ENV}={text!r}: expected rank=R,update=U[,kind=raise|kill|nan][,count=K]"
            ) from None
        spec = cls(**values)  # type: ignore[arg-type]
        if spec.kind not in KINDS:
            raise UserError(f"{FAULT_INJECT_ENV}: kind must be raise, kill or nan, got {spec.kind!r}")
        return spec

    @classmethod
    def from_environment(cls) -> FaultSpec | None:
        return cls.parse(os.environ.get(FAULT_INJECT_ENV, ""))

    def apply(self, rank: int, update: int, rewards: torch.Tensor) -> None:
        """Fail now if this is the rank and update (1-based) the spec names; ``rewards [S, B]`` for kind nan."""
        if rank != self.rank or not self.update <= update < self.update + self.count:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault ({FAULT_INJECT_ENV}) on rank {rank} at update {update}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        rewards.fill_(float("nan"))
