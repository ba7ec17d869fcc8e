"""Launching workers and talking between them: mp.spawn or torchrun, process groups, collectives.

Layout: one worker process per GPU (NCCL), or ``num_workers`` CPU processes (gloo) when no GPU is
used. Under torchrun (RANK, LOCAL_RANK and WORLD_SIZE set) each process *is* a worker: nothing is
spawned and multi-node works the same way. The rendezvous port is chosen once, in the parent,
and handed to every rank; MASTER_ADDR / MASTER_PORT are honoured when set.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from envs.errors import UserError

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass
class Comm:
    """This worker's place in the world and the few collectives training needs.

    With ``world_size == 1`` and no process group every collective is the identity, so the same
    trainer code runs in a single process.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str = "none"

    @property
    def master(self) -> bool:
        """True on rank 0, the only process that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _on_backend_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device) if self.backend == "nccl" else tensor.cpu()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over workers (a new tensor on ``tensor``'s device)."""
        if not self.distributed:
            return tensor.clone()
        work = self._on_backend_device(tensor).clone()
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
        return work.to(tensor.device)

    def all_gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Concatenate every worker's ``[k_r, C]`` rows in rank order -> ``[sum k_r, C]``.

        Two fixed-shape collectives: the counts, then the rows padded to the largest count.
        """
        if not self.distributed:
            return rows.clone()
        local = self._on_backend_device(rows)
        count = torch.tensor([local.shape[0]], device=local.device, dtype=torch.long)
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        dist.all_gather(counts, count)
        sizes = [int(c.item()) for c in counts]
        padded = torch.zeros((max(sizes), rows.shape[1]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        return torch.cat([g[:n] for g, n in zip(gathered, sizes, strict=True)]).to(rows.device)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every worker's picklable ``obj`` on rank 0 (a list in rank order); None elsewhere."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size if self.master else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every worker."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def find_free_port() -> int:
    """A TCP port free on this machine right now (asked of the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


@dataclass(frozen=True)
class WorldLayout:
    """How many workers, on what, and where they meet."""

    world_size: int
    device_type: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo" ("none" for one process)
    master_addr: str
    master_port: int
    torchrun: bool

    def describe(self, num_envs: int) -> str:
        where = f"{self.world_size} x GPU" if self.device_type == "cuda" else f"{self.world_size} x CPU process"
        return (f"world size {self.world_size} ({where}), backend {self.backend}, "
                f"{num_envs} envs per worker = {num_envs * self.world_size} envs, "
                f"rendezvous {self.master_addr}:{self.master_port}{' (torchrun)' if self.torchrun else ''}")


def resolve_layout(num_gpus: int | None, num_workers: int, backend: str, master_port: int) -> WorldLayout:
    """Decide world size, device and backend from the flags and what the machine has."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        device_type = "cuda" if visible and num_gpus != 0 else "cpu"
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ.get("MASTER_PORT", "0"))
        torchrun = True
    else:
        wanted = visible if num_gpus in (None, -1) else num_gpus
        if wanted < 0:
            raise UserError(f"--num_gpus must be -1 (all), 0 (CPU) or a positive count, got {num_gpus}")
        if wanted > visible:
            raise UserError(f"--num_gpus {wanted} asked for, but this machine has {visible} visible CUDA GPU(s)")
        device_type = "cuda" if wanted > 0 else "cpu"
        world = wanted if wanted > 0 else num_workers
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = master_port or int(os.environ.get("MASTER_PORT", "0") or 0) or (find_free_port() if world > 1 else 0)
        torchrun = False
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise UserError("--backend nccl needs CUDA GPUs; use gloo (the default) for CPU workers")
    if world == 1 and not torchrun:
        backend = "none"
    return WorldLayout(world, device_type, backend, addr, port, torchrun)


def init_worker(layout: WorldLayout, rank: int, local_rank: int) -> Comm:
    """Join the process group (when there is more than one worker) and pick this worker's device."""
    if layout.device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if layout.backend != "none":
        os.environ["MASTER_ADDR"] = layout.master_addr
        os.environ["MASTER_PORT"] = str(layout.master_port)
        dist.init_process_group(
            layout.backend, rank=rank, world_size=layout.world_size, timeout=timedelta(minutes=10),
            **({"device_id": device} if layout.backend == "nccl" else {}),
        )
    return Comm(rank=rank, local_rank=local_rank, world_size=layout.world_size, device=device, backend=layout.backend)


def shutdown_worker() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


WorkerFn = Callable[[Comm, Any], None]

DEBUG_ENV = "CLSTM_PPO_DEBUG"  # set by `--debug` (cli.run_guarded): workers print full tracebacks
STOP_GRACE_ENV = "CLSTM_PPO_STOP_GRACE_S"  # seconds a stop may take before the parent kills the workers
STOP_GRACE_S = 30.0
CRASH_GRACE_S = 3.0  # after one worker failed, the others get this long to exit by themselves
EXIT_CRASH, EXIT_USER_ERROR = 1, 2


class StoppedBySignal(Exception):  # noqa: N818 (a stop, not an error)
    """Training ended early because SIGINT/SIGTERM asked it to (a checkpoint was saved)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def describe_exception(err: BaseException) -> str:
    """``Type: first line of the message`` -- what a user sees of an unexpected error."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first[:300]}" if first else type(err).__name__


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


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


def _run_worker(layout: WorldLayout, rank: int, local_rank: int, fn: WorkerFn, payload: Any,
                report: Callable[[WorkerReport], None]) -> int:
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
    if _debug():
        print(item.traceback, file=sys.stderr, end="")
    if item.kind == "user":
        print(f"error: {item.message}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    where = f"worker rank {item.rank}" if world_size > 1 else "training"
    hint = "" if _debug() else " (--debug shows the traceback)"
    print(f"error: {where} failed: {item.message}{hint}", file=sys.stderr, flush=True)
    return EXIT_CRASH


def _watch_parent(parent_pid: int) -> None:
    """Stop this worker when the launching process disappears (killed with SIGKILL), so no orphan keeps running.

    The worker first gets SIGTERM (a graceful stop with a checkpoint); if it is still alive after the
    stop grace period it exits hard.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_stop_grace())
        os._exit(EXIT_CRASH)

    threading.Thread(target=watch, name="clstm-ppo-parent-watch", daemon=True).start()


def _spawned_entry(rank: int, layout: WorldLayout, fn: WorkerFn, payload: Any, reports: Any, parent_pid: int) -> None:
    # Ctrl-C reaches the whole terminal process group; the parent alone handles it and forwards one
    # SIGTERM, so a single Ctrl-C is never counted twice by a worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent_pid)
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
    """Start one process per rank and watch them.

    * A worker that fails ends the job: the others get `CRASH_GRACE_S` to exit, then SIGKILL; the
      earliest error is printed as one line (others are consequences: a peer's collective failing).
    * SIGINT/SIGTERM to this process is forwarded to every worker as one SIGTERM: they finish the
      update, rank 0 writes latest.pt, all exit. A second signal, or a stop taking longer than
      ``CLSTM_PPO_STOP_GRACE_S`` (30 s), kills them (the previous checkpoint stays intact).
    """
    ctx = mp.get_context("spawn")
    reports = ctx.SimpleQueue()  # put() writes straight to a pipe: the report is out before the worker exits
    procs = [ctx.Process(target=_spawned_entry, args=(rank, layout, fn, payload, reports, os.getpid()),
                         name=f"clstm-ppo-rank{rank}", daemon=False) for rank in range(layout.world_size)]
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
            print(f"{signal.Signals(signum).name}: finishing the current update and saving a checkpoint "
                  f"(signal again to quit at once)", file=sys.stderr, flush=True)
            kill_all(signal.SIGTERM)
        else:
            print("stopping at once: workers killed; the last complete checkpoint is kept", file=sys.stderr, flush=True)
            kill_all(signal.SIGKILL)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    collected: list[WorkerReport] = []
    failed_at: float | None = None
    try:
        for proc in procs:
            proc.start()
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
                print(f"stop took longer than {_stop_grace():.0f} s: workers killed; the last complete checkpoint "
                      f"is kept", file=sys.stderr, flush=True)
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
    codes = [p.exitcode for p in procs]
    return _outcome(codes, collected, signals, layout.world_size)


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
        code = _run_worker(layout, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), fn, payload,
                           _print_direct)
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
