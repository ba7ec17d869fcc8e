"""Starting the workers (`launch`) and watching them: torch.multiprocessing, torchrun, or one process."""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mp_connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as mp

from clstm_ppo.training.distributed import Comm, WorldLayout, init_worker, shutdown_worker
from clstm_ppo.training.signals import StoppedBySignal, stop_when_orphaned
from envs.errors import UserError, debug_enabled, describe_exception

WorkerFn = Callable[[Comm, Any], None]

STOP_GRACE_ENV = "CLSTM_PPO_STOP_GRACE_S"  # seconds a stop may take before the parent kills the workers
STOP_GRACE_S = 30.0
CRASH_GRACE_S = 3.0  # after one worker failed, the others get this long to exit by themselves
EXIT_CRASH, EXIT_USER_ERROR = 1, 2


def _stop_grace() -> float:
    try:
        return float(os.environ.get(STOP_GRACE_ENV, STOP_GRACE_S))
    except ValueError:
        return STOP_GRACE_S


@dataclass(frozen=True)
class WorkerReport:
    """What a failing worker tells the parent before it exits (the parent prints one of them)."""

    time: float  # time.time() when the error was caught: the earliest one is the cause
    rank: int
    kind: str  # "user" (UserError) or "crash" (anything else)
    message: str
    traceback: str


def _run_worker(
    layout: WorldLayout, rank: int, local_rank: int, fn: WorkerFn, payload: Any, report: Callable[[WorkerReport], None]
) -> int:
    """Run one worker; return its exit status (0, 1 crash, 2 user error, 128 + signal after a stop)."""
    try:
        comm = init_worker(layout, rank, local_rank)
        fn(comm, payload)
        # Leave together: under multi-node torchrun the store lives in one node's agent, and a rank
        # tearing down while its peer is still mid-collective aborts the peer.
        comm.barrier()
        return 0
    except StoppedBySignal as stop:
        return 128 + stop.signum
    except UserError as err:
        report(WorkerReport(time.time(), rank, "user", str(err), traceback.format_exc()))
        return EXIT_USER_ERROR
    except Exception as err:
        report(WorkerReport(time.time(), rank, "crash", describe_exception(err), traceback.format_exc()))
        return EXIT_CRASH
    finally:
        shutdown_worker()


def _print_report(item: WorkerReport, world_size: int) -> int:
    """Print a worker's error as the one ``error:`` line (traceback first under --debug); return the exit status."""
    if debug_enabled():
        print(item.traceback, file=sys.stderr, end="")
    if item.kind == "user":
        print(f"error: {item.message}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    where = f"worker rank {item.rank}" if world_size > 1 else "training"
    hint = "" if debug_enabled() else " (--debug shows the traceback)"
    print(f"error: {where} failed: {item.message}{hint}", file=sys.stderr, flush=True)
    return EXIT_CRASH


def _spawned_entry(rank: int, layout: WorldLayout, fn: WorkerFn, payload: Any, reports: Any, parent_pid: int) -> None:
    # Ctrl-C reaches the whole terminal process group; the parent alone handles it and forwards one
    # SIGTERM, so a single Ctrl-C is never counted twice by a worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_when_orphaned(parent_pid, _stop_grace())  # the launcher killed outright: stop, save, exit
    try:
        code = _run_worker(layout, rank, rank, fn, payload, reports.put)
    except KeyboardInterrupt:  # a second SIGTERM: leave at once
        code = 128 + signal.SIGTERM
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: it can take seconds after gloo and adds nothing


def _print_direct(item: WorkerReport) -> None:
    """torchrun: no parent of ours to tell, so a worker prints its own error (rank 0 alone for user errors,
    which every rank raises alike)."""
    if item.kind == "user" and item.rank != 0:
        return
    _print_report(item, world_size=2)


def _exit_reason(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


def _failed(code: int | None, signalled: bool) -> bool:
    """Did a worker end badly? A clean stop exits 0 or 128 + SIGINT/SIGTERM; after a signal to the job,
    dying of the SIGTERM we forwarded (before its handler was installed) is expected too."""
    if code is None or code in (0, 128 + signal.SIGINT, 128 + signal.SIGTERM):
        return False
    return not (signalled and code < 0)


def _spawn_and_supervise(layout: WorldLayout, fn: WorkerFn, payload: Any) -> int:
    """Start one process per rank and watch them (docs/distributed.md "What happens when..."). A worker that fails
    ends the job: the others get `CRASH_GRACE_S` to exit, then SIGKILL; the earliest error is printed as one line
    (others are consequences: a peer's collective failing). SIGINT/SIGTERM is forwarded to every worker as one SIGTERM;
    a second signal, or a stop taking longer than `_stop_grace`, kills them."""
    reports = mp.get_context("spawn").SimpleQueue()  # put() writes straight to a pipe: out before the worker exits
    procs: list[Any] = []  # the started processes, filled once `mp.start_processes` returns
    signals: list[int] = []
    stop_at: list[float] = []

    def kill_all(sig: int) -> None:
        for proc in procs:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    def on_signal(signum: int, _frame: Any) -> None:
        signals.append(signum)
        if len(signals) == 1:
            stop_at.append(time.monotonic() + _stop_grace())
            print(
                f"{signal.Signals(signum).name}: finishing the current update and saving a checkpoint "
                f"(signal again to quit at once)",
                file=sys.stderr,
                flush=True,
            )
            kill_all(signal.SIGTERM)
        else:
            print("stopping at once: workers killed; the last complete checkpoint is kept", file=sys.stderr, flush=True)
            kill_all(signal.SIGKILL)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    collected: list[WorkerReport] = []
    failed_at: float | None = None
    try:
        # torch.multiprocessing starts the ranks; join=False hands back the processes so that the loop below,
        # not mp's own join (which ends at the first failure without stopping or reporting the others), supervises.
        context = mp.start_processes(
            _spawned_entry,
            args=(layout, fn, payload, reports, os.getpid()),
            nprocs=layout.world_size,
            join=False,
            daemon=False,
            start_method="spawn",
        )
        procs.extend(context.processes)
        if signals:  # a signal that came while the processes were starting had no one to forward to
            kill_all(signal.SIGTERM if len(signals) == 1 else signal.SIGKILL)
        while any(p.exitcode is None for p in procs):
            mp_connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.5)
            while not reports.empty():
                collected.append(reports.get())
            now = time.monotonic()
            if failed_at is None and any(_failed(p.exitcode, bool(signals)) for p in procs):
                failed_at = now
            if failed_at is not None and now - failed_at > CRASH_GRACE_S:
                kill_all(signal.SIGKILL)
            if stop_at and now > stop_at[0]:
                print(
                    f"stop took longer than {_stop_grace():.0f} s: workers killed; the last complete checkpoint "
                    f"is kept",
                    file=sys.stderr,
                    flush=True,
                )
                stop_at.clear()
                kill_all(signal.SIGKILL)
        for proc in procs:
            proc.join()
        while not reports.empty():
            collected.append(reports.get())
    finally:
        kill_all(signal.SIGKILL)  # only if we got here by an exception of our own
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _outcome([p.exitcode for p in procs], collected, signals, layout.world_size)


def _outcome(codes: list[int | None], collected: list[WorkerReport], signals: list[int], world_size: int) -> int:
    """The job's exit status and its one error line from the workers' exit codes and reports."""
    # A worker killed by a signal we did not send is the cause; its peers' errors follow from it.
    if not signals:
        killed = [(r, c) for r, c in enumerate(codes) if c is not None and c < 0]
        if killed:
            rank, code = killed[0]
            print(f"error: worker rank {rank} {_exit_reason(code)}", file=sys.stderr, flush=True)
            return EXIT_CRASH
    if collected:
        return _print_report(min(collected, key=lambda r: r.time), world_size)
    if signals:
        return 128 + signals[0]
    stops = [c for c in codes if c is not None and c > 128]
    bad = [(r, c) for r, c in enumerate(codes) if c not in (0, None) and c <= 128]
    if bad:
        rank, code = bad[0]
        print(f"error: worker rank {rank} {_exit_reason(code)}", file=sys.stderr, flush=True)
        return EXIT_CRASH
    return stops[0] if stops else 0


def launch(layout: WorldLayout, fn: WorkerFn, payload: Any) -> int:
    """Run ``fn(comm, payload)`` on every worker of ``layout``; return the exit status.

    0 done, 1 a worker crashed, 2 a user error, 128 + signal number after a stop by SIGINT/SIGTERM.
    Errors are printed here as one ``error:`` line (tracebacks only with --debug); nothing hangs on a
    failed rank and no worker outlives the job (see `_spawn_and_supervise`).
    """
    if layout.torchrun:
        code = _run_worker(layout, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), fn, payload, _print_direct)
        # As in spawned workers: skip interpreter teardown, where gloo's threads can abort the process
        # ("terminate called without an active exception") after a multi-node torchrun finished cleanly.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if layout.world_size == 1:
        collected: list[WorkerReport] = []
        code = _run_worker(layout, 0, 0, fn, payload, collected.append)
        return _print_report(collected[0], 1) if collected else code
    return _spawn_and_supervise(layout, fn, payload)
