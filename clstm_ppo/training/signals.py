"""Stopping on SIGINT/SIGTERM: the trainer asks to stop, finishes its update with every rank, saves, then raises
`StoppedBySignal`, which the launcher (`clstm_ppo.training.launch`) and a study's cell runner turn into their exit.
A spawned worker or a study's cell also stops this way when the process that started it dies (`stop_when_orphaned`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
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


def stop_when_orphaned(parent_pid: int, grace_s: float, poll_s: float = 0.5) -> threading.Thread:
    """Watch this process's parent ``parent_pid`` from a daemon thread: once it has gone (a launcher or a study
    runner killed with SIGKILL: their workers and cells would otherwise train on unseen, and a study's cells race a
    re-run for their folders), send this process SIGTERM (the trainer finishes its update, saves and stops), and
    exit hard (status 1) if it is still alive ``grace_s`` seconds later.

    :return: the started thread.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="clstm-ppo-parent-watch", daemon=True)
    thread.start()
    return thread
