"""Stopping on SIGINT/SIGTERM: the trainer asks to stop, finishes its update with every rank, saves, then raises
`StoppedBySignal`, which the launcher (`clstm_ppo.training.launch`) and a study's cell runner turn into their exit."""

from __future__ import annotations

import contextlib
import signal
from typing import Any


class StoppedBySignal(Exception):  # noqa: N818 (a stop, not an error)
    """Training ended early because SIGINT/SIGTERM asked it to (a checkpoint was saved)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """Catches the first SIGINT/SIGTERM as a request (``signum``), so the loop can stop where every rank agrees.
    A second one quits at once (KeyboardInterrupt; an interrupted checkpoint write leaves the old file). A signal
    already ignored stays ignored: spawned workers leave Ctrl-C to their parent, which forwards it."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        def request_stop(signum: int, _frame: Any) -> None:
            if self.signum is not None:
                raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
            self.signum = signum

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (e.g. in tests)
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    signal.signal(sig, request_stop)
