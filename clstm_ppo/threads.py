"""torch's CPU thread count for one block of work, restored after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on ``count`` CPU threads inside the block, the previous count restored after it (also on an error), so
    a command run inside a longer-lived process (`clstm-ppo backtest` called by a test or a notebook, the study's
    report) leaves the process's setting as it found it.

    The study's report trades the seeds' ensembles on one thread: these networks gain nothing from a second, and on
    a box whose cores another job keeps busy, torch's OpenMP threads spin-wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
