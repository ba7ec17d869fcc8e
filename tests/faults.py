"""The fault tests' hook on the training loop, and their entry point.

    python -m tests.faults "rank=1,update=3[,kind=raise|kill|nan][,count=K]" [train flags ...]

trains like ``train_distributed_clstm_ppo.py`` with a `FaultHook` on every worker (through
`clstm_ppo.cli.train.main`'s ``callbacks``, the product's test hook): at update ``update`` (1-based, counted like
the checkpoint's counters) rank ``rank`` raises a RuntimeError (``raise``, the default), kills itself with SIGKILL
(``kill``), or turns its rollout rewards into NaN for ``count`` updates (``nan``; default: every update from then
on), which makes the loss and the all-reduced gradients NaN on every rank. The product never reads a switch of its
own for this.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

from clstm_ppo.training.callbacks import Callback

KINDS = ("raise", "kill", "nan")


@dataclass(frozen=True)
class FaultHook(Callback):
    """Where and how to fail (see the module docstring); runs at the end of each rollout."""

    rank: int = 0
    update: int = 1
    kind: str = "raise"
    count: int = 1 << 30

    @classmethod
    def parse(cls, text: str) -> FaultHook:
        """``rank=R,update=U[,kind=K][,count=C]`` -> the hook."""
        values: dict[str, int | str] = {}
        for part in text.split(","):
            key, value = (x.strip() for x in part.split("=", 1))
            values[key] = value if key == "kind" else int(value)
        hook = cls(**values)  # type: ignore[arg-type]
        assert hook.kind in KINDS, hook.kind
        return hook

    def on_rollout_end(self, trainer) -> None:
        update = trainer.counters.update + 1
        if trainer.comm.rank != self.rank or not self.update <= update < self.update + self.count:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {self.rank} at update {update}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        trainer.buf.rewards.fill_(float("nan"))


if __name__ == "__main__":
    from clstm_ppo.cli import run_guarded
    from clstm_ppo.cli.train import main

    spec, *argv = sys.argv[1:]
    sys.exit(run_guarded(lambda args: main(args, callbacks=(FaultHook.parse(spec),)), argv))
