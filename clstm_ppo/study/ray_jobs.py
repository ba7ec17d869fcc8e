"""A study's jobs on a Ray cluster (``clstm-ppo study ... --ray ADDRESS``): the same jobs as the local pool, each a
Ray task on some node of the cluster.

What travels, and when:

* **Inputs, once.** The study's ``spec.json`` and ``prepared/`` (about 5 MB for 20 tickers) are packed into one
  archive that the driver puts in Ray's object store once (`RayJobs`); each node fetches it once and unpacks it into
  a scratch folder of its own (``$TMPDIR/clstm-ppo-ray/<node>/<inputs hash>/``), which every job on that node shares.
* **A job.** A Ray task asking for ``--threads`` CPUs (and a GPU share under ``--cells_per_gpu``) starts the same cell
  process as the local pool (``clstm-ppo study _cell DIR CELLS``) in a study folder of its own beside the inputs
  (links to them, and its cells). A cell the driver holds unfinished (a local run's partial cell) goes with its job,
  so it resumes where it stopped.
* **Results, as each job ends.** The task packs its cells' folders (a one-window clstm cell's is about 24 MB), returns
  the archive, and deletes its folder from the node; the driver fetches it as soon as the job ends, writes the cells into
  the study's folder, and releases it. The folder ends as the local pool writes it; nothing needs shared storage.

Faults: a job whose node or worker is lost (a node dying, Ray's out-of-memory killer) is resubmitted by the driver, up
to `ATTEMPTS` runs in all; Ray itself retries nothing (``max_retries=0``, which also turns off its separate
out-of-memory retries: Ray's task manager grants ``task_oom_retries`` only to a task with ``max_retries != 0``). A
cell that fails for its own reasons (a NaN, a bad setting) ends its process with a failed status, as it does locally,
and is not retried. A stop (Ctrl-C) cancels the running jobs: the finished cells are kept, and an interrupted remote
cell restarts from its beginning on the next run (its partial work was on the node).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clstm_ppo
from clstm_ppo.study.cell import write_status
from clstm_ppo.study.grid import Cell
from clstm_ppo.study.jobs import job_command, job_env
from clstm_ppo.study.spec import SPEC_FILE
from envs.errors import UserError, describe_exception, first_line

ATTEMPTS = 3
"""Runs of one job at most: the first and two more after losing its node or worker (out-of-memory kills
included)."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to reach the cluster's address before saying there is none."""
JOIN_TIMEOUT_S = 25.0
"""Seconds for Ray to join the cluster (it retries for minutes where a node it is told of cannot be reached)."""
INSTALL_HINT = 'pip install -e ".[ray]"'


def _ray() -> Any:
    """The ``ray`` module, or a UserError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass(frozen=True)
class Cluster:
    """What the driver found on joining a cluster."""

    address: str
    nodes: int  # alive nodes
    cpus: int  # CPUs of all alive nodes
    gpus: int  # GPUs of all alive nodes
    largest_node_cpus: int  # the most CPUs one node has: a job may ask for no more


def join(address: str) -> Cluster:
    """Join the Ray cluster at ``address`` (HOST:PORT, or ``auto``: the one this machine runs) as a driver, Ray's
    usage reporting off; one line (UserError) when Ray is missing, nothing answers there, or the cluster runs
    another Ray or Python version."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # not Ray's C++ warnings on the study's console
    ray = _ray()
    if address != "auto":
        _check_reachable(address)
    watchdog = threading.Timer(JOIN_TIMEOUT_S, _give_up, args=(address,))
    watchdog.daemon = True
    watchdog.start()
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    except RuntimeError as err:
        text = str(err)
        if "Version mismatch" in text:
            raise UserError(f"--ray {address}: {_version_words(text)}") from None
        raise _no_cluster(address, err) from None
    except ConnectionError as err:
        if address == "auto":
            raise UserError(
                "--ray auto: this machine is part of no running Ray cluster; start one (ray start --head) or give "
                "the head's HOST:PORT"
            ) from None
        raise _no_cluster(address, err) from None
    finally:
        watchdog.cancel()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    per_node = [int(n.get("Resources", {}).get("CPU", 0)) for n in alive]
    return Cluster(
        address=address,
        nodes=len(alive),
        cpus=sum(per_node),
        gpus=sum(int(n.get("Resources", {}).get("GPU", 0)) for n in alive),
        largest_node_cpus=max(per_node, default=0),
    )


def _no_cluster(address: str, err: Exception) -> UserError:
    """The one line for an address where Ray found no cluster, with the head of Ray's own error."""
    return UserError(f"--ray {address}: no Ray cluster found there ({first_line(err) or type(err).__name__})")


def _give_up(address: str) -> None:
    """Say that the cluster did not answer, and exit (2): nothing of the study has been written yet."""
    print(
        f"error: --ray {address}: the Ray cluster did not answer within {JOIN_TIMEOUT_S:.0f} s (can this machine "
        f"reach its head and its nodes?)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)


def leave() -> None:
    """Disconnect the driver from the cluster (the cluster keeps running)."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """UserError unless something listens at HOST:PORT within `CONNECT_TIMEOUT_S` (Ray itself retries for a minute)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray {address}: give the head's HOST:PORT (e.g. 10.0.0.1:6379), or auto")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(f"--ray {address}: no Ray cluster found there ({err.strerror or err})") from None


def _version_words(text: str) -> str:
    """Ray's version-mismatch error in one line: what the cluster runs, and what this process does."""
    versions = [line.strip() for line in text.splitlines() if line.strip().startswith(("Ray:", "Python:"))]
    if len(versions) == 4:
        return (
            f"the cluster runs {versions[0]}, {versions[1]}; this machine {versions[2]}, {versions[3]}: install the "
            f"cluster's versions here, or start the cluster with these"
        )
    return text.splitlines()[0]


# ---------------------------------------------------------------------------------------------------- the driver
def pack(root: Path, names: list[str]) -> bytes:
    """An uncompressed tar archive of ``names`` (files or folders) under ``root``; those missing are left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            if (root / name).exists():
                tar.add(root / name, arcname=name)
    return buffer.getvalue()


def unpack(archive: bytes, root: Path) -> None:
    """Write the archive's files under ``root``, replacing what is there."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        tar.extractall(root, filter="data")


class RayJobs:
    """Starts the study's jobs as Ray tasks (`RayJob`) with the inputs put in the object store once."""

    def __init__(self, study_dir: Path, threads: int, gpus: int, cells_per_gpu: int, log: Any) -> None:
        ray = _ray()
        self.study_dir = study_dir
        self.log = log
        inputs = pack(study_dir, [SPEC_FILE, "prepared"])
        self.inputs_key = hashlib.sha256(inputs).hexdigest()[:16]
        self.inputs = ray.put(inputs)
        share = {"num_gpus": 1.0 / cells_per_gpu} if gpus else {}
        self.task = ray.remote(run_job).options(num_cpus=threads, max_retries=0, **share)
        self.threads = threads
        self.device = "cuda" if gpus else "cpu"
        self.started = 0

    def start(self, cells: list[Cell]) -> RayJob:
        """Submit the job of ``cells``, with what the driver holds of any of them unfinished."""
        self.started += 1
        return RayJob(self, cells, self.started)

    def submit(self, cells: list[Cell]) -> Any:
        """One run of the job of ``cells`` on the cluster: its object reference."""
        names = [c.name for c in cells]
        partial = pack(self.study_dir / "cells", [n for n in names if (self.study_dir / "cells" / n).is_dir()])
        return self.task.remote(self.inputs, self.inputs_key, names, self.threads, self.device, partial)


class RayJob:
    """A job running as a Ray task, with a `subprocess.Popen`'s ``pid``, ``poll``, ``send_signal`` and ``kill`` for
    the study's pool: ``poll`` fetches the finished job's cells into the study's folder and returns the cell
    process's exit status, resubmits a job whose node was lost, and returns nonzero once a stop cancelled it."""

    def __init__(self, jobs: RayJobs, cells: list[Cell], number: int) -> None:
        self.jobs = jobs
        self.cells = cells
        self.pid = -number  # a key for the pool, never a process of this machine
        self.attempt = 1
        self.node = ""
        self.code: int | None = None
        self.ref = jobs.submit(cells)

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        ray = _ray()
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            result = ray.get(self.ref)
        except ray.exceptions.TaskCancelledError:
            self.code = -signal.SIGTERM
        except ray.exceptions.RayError as err:
            self.code = self._lost(err)
        else:
            self.code = self._settle(result)
        if self.code is not None:
            self.ref = None  # the result is released with its last reference
        return self.code

    def _lost(self, err: Exception) -> int | None:
        """A run lost with its node or worker: submit it again (None: running) until `ATTEMPTS` runs; then mark its
        cells failed (status 1)."""
        what = describe_exception(err)
        names = ", ".join(c.name for c in self.cells)
        if self.attempt < ATTEMPTS:
            self.attempt += 1
            self.jobs.log(f"[study] the job of {names} was lost ({what}); run {self.attempt} of {ATTEMPTS}")
            self.ref = self.jobs.submit(self.cells)
            return None
        return self._fail(f"lost {ATTEMPTS} times on the Ray cluster; last: {what}")

    def _settle(self, result: dict[str, Any]) -> int:
        """Write a finished run's cells into the study's folder; its cell process's exit status."""
        self.node = result["node"]
        if result["version"] != clstm_ppo.__version__:
            return self._fail(
                f"node {self.node} runs clstm-ppo {result['version']}, this machine {clstm_ppo.__version__}: install "
                f"the same on every node"
            )
        unpack(result["cells"], self.jobs.study_dir / "cells")
        return int(result["code"])

    def _fail(self, error: str) -> int:
        """Record every cell of the job failed with ``error``; the status of a job that failed (1)."""
        for cell in self.cells:
            write_status(self.jobs.study_dir / "cells" / cell.name, "failed", error=error)
        return 1

    def send_signal(self, _signum: int) -> None:
        """Cancel the job: Ray kills its worker, and the cell process, orphaned, saves and stops on its node
        (`clstm_ppo.training.signals.stop_when_orphaned`)."""
        if self.ref is not None:
            _ray().cancel(self.ref, force=True)

    def kill(self) -> None:
        """The same as `send_signal`: a cancelled task leaves nothing to kill harder."""
        self.send_signal(signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------- on a node
def run_job(
    inputs: bytes, inputs_key: str, names: list[str], threads: int, device: str, partial: bytes
) -> dict[str, Any]:
    """A Ray task: run the cells ``names`` as one cell process in a folder of this run's own beside this node's
    unpacked inputs (`_scratch_study`), and return their folders packed (``cells``), the process's exit status
    (``code``), this node's address (``node``) and the clstm-ppo version it runs (``version``). The run's folder is
    removed from the node afterwards."""
    import ray

    inputs_dir = _scratch_study(inputs, inputs_key, ray.get_runtime_context().get_node_id()[:12])
    study_dir = Path(tempfile.mkdtemp(prefix="job-", dir=inputs_dir.parent))  # this run's own: a lost run's leftovers
    for name in (SPEC_FILE, "prepared"):  # never meet it
        (study_dir / name).symlink_to(inputs_dir / name)
    try:
        unpack(partial, study_dir / "cells")
        argv, log = job_command(study_dir, names, threads)
        with open(log, "ab") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=job_env(device), check=False)
        archive = pack(study_dir / "cells", names)
    finally:
        shutil.rmtree(study_dir, ignore_errors=True)
    node = ray.util.get_node_ip_address()
    return {"cells": archive, "code": done.returncode, "node": node, "version": clstm_ppo.__version__}


def _scratch_study(inputs: bytes, key: str, node: str) -> Path:
    """This node's copy of the study's inputs ``key`` (spec.json, prepared/): unpacked once (a temporary folder
    renamed into place, so jobs starting together on a node never see half of it)."""
    root = Path(tempfile.gettempdir()) / "clstm-ppo-ray" / node
    folder = root / key
    if (folder / SPEC_FILE).is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    unpack(inputs, staging)
    try:
        os.rename(staging, folder)
    except OSError:  # another job of this node renamed its whole copy into place first
        shutil.rmtree(staging, ignore_errors=True)
    return folder
