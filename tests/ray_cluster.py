"""A real Ray cluster of several nodes on 127.0.0.1, for the tests and the benchmark of ``study --ray`` (issue 72).

Ray registers a node under the machine's interface address even with ``--node-ip-address 127.0.0.1``, so the cluster
is meant to run inside a network namespace that holds only loopback (`in_loopback_namespace`, root only; check with
`loopback_namespace_works` and skip without it). There every node registers as 127.0.0.1.

`LoopbackCluster` starts the head (``ray start --head --block``) and the other nodes (``ray start --address HEAD
--block``), each in its own session with its own short temp folder (Ray's socket paths must stay under 107 bytes) and
its own ``TMPDIR`` inside it (node-local scratch, as on separate machines), and kills every node's process tree on exit
(never ``ray stop``: it stops every Ray process on the machine). `LoopbackCluster.kill_node` is a machine going down:
SIGKILL for the node's ``ray start`` process and all its descendants, the tasks' own processes included.

    python -m tests.ray_cluster SCENARIO.json

runs a scenario, inside the loopback-only namespace (start it through `in_loopback_namespace`, or call
`run_scenario`): it starts a cluster, runs the steps one after the other and writes a result. SCENARIO.json::

    {
      "nodes": 2,                       # optional (2): the head and the nodes that join it
      "num_cpus": 1,                    # optional (1): CPUs each node offers
      "health_check": {...},            # optional (HEALTH_CHECK): the head's --system-config; {}: Ray's defaults
      "result": "result.json",          # optional (SCENARIO.result.json): where the result goes (relative: to
                                        # the scenario's folder)
      "steps": [
        {
          "argv": ["{python}", "-m", "clstm_ppo.cli", "study", "--ray", "{address}", "..."],
                                        # {address} -> 127.0.0.1:PORT, {python} -> this interpreter, in every word
          "cwd": "/some/folder",        # optional (the scenario's folder)
          "env": {"NAME": "value"},     # optional: added to the environment the harness was started with
          "timeout": 300,               # optional seconds (600): then the step's process tree is killed
          "kill_node_when_cell_starts": 1,
                                        # optional: node index (0 is the head) whose whole process tree is killed
                                        # once a study cell process runs there (``... study _cell DIR CELLS ...``)
                                        # and DIR/cells/<its first cell>/periods/*/metrics.jsonl has logged an
                                        # update; the step itself runs on
          "interrupt_when_done": {"folder": "study", "cells": 1}
                                        # optional: SIGINT to the step's process group (Ctrl-C in its terminal)
                                        # once that many cells of the study folder (relative to cwd) are done
        }
      ]
    }

The result (JSON)::

    {
      "address": "127.0.0.1:PORT",
      "node_ips": ["127.0.0.1", "127.0.0.1"],   # NodeManagerAddress of every node registered at start
      "nodes": [{"index": 0, "node_id": "...", "ip": "127.0.0.1", "alive": true, "is_head": true}, ...],
      "seconds": {"head": 0.6, "join": 6.6, "start": 7.2, "shutdown": 0.1},
                                # the head's GCS port open; then all nodes alive; both; killing every node
      "steps": [
        {
          "argv": [...], "cwd": "...", "returncode": 0, "timed_out": false, "seconds": 12.3,
          "stdout_tail": "...", "stderr_tail": "...",  # the last 4000 characters of each
          "kill": null or {"node": 1, "hit": true, "at_seconds": 5.2, "dir": "...", "cells": ["mlp-s1"],
                           "cell": "mlp-s1", "killed": 14, "at_epoch": 1.7e9}
                                        # at_seconds: since the step started; killed: processes
          "interrupt": null or {"folder": "...", "cells": 1, "at_seconds": 4.1}
                                        # when the step's process group got SIGINT (interrupt_when_done)
        }
      ]
    }

A step that does not finish in time has ``"returncode": null, "timed_out": true``; the steps after it still run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.errors import UserError
from tests.procs import live_tree

ROOT = Path(__file__).resolve().parents[1]

OBJECT_STORE_BYTES = 100 * 1024 * 1024
"""Each node's object store: 100 MiB (Ray 2.60 refuses less than 75 MiB, 78643200 bytes:
``ray._private.ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES``)."""

HEALTH_CHECK = {"health_check_period_ms": 500, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 5}
"""The head's node health checks (its ``--system-config``): every 0.5 s, a node dead after 5 failures in a row
(Ray's default: every 3 s). A SIGKILLed raylet refuses the check at once: on a 2-core box its node was seen dead, and
its task retried and finished on the head, 3.5-6 s after the kill (about 16 s with Ray's defaults). A node that is
only slow must miss 5 checks in a row, each given 1 s."""

TAIL_CHARS = 4000
"""How much of a step's stdout and stderr the result keeps (the last characters)."""

LOOPBACK_SCRIPT = 'ip link set lo up && exec "$@"'

NODES_SCRIPT = """
import json, sys, time
import ray
address, want, deadline = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
while True:
    nodes = ray.nodes()
    if sum(bool(n["Alive"]) for n in nodes) >= want or time.time() > deadline:
        break
    time.sleep(0.1)
print(json.dumps(nodes, default=str))
"""
"""Run as ``python -c NODES_SCRIPT ADDRESS N TIMEOUT``: waits (up to TIMEOUT seconds) until N nodes are alive, then
prints ``ray.nodes()`` as JSON."""


def ray_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with Ray's usage reporting off, plus ``extra``."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(extra or {})}


def in_loopback_namespace(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run in a network namespace of its own that holds only loopback, brought up (root only)."""
    return ["unshare", "-n", "sh", "-c", LOOPBACK_SCRIPT, "sh", *argv]


@functools.cache
def loopback_namespace_works() -> bool:
    """Whether `in_loopback_namespace` works here: root, ``unshare`` and ``ip`` present, and a trial run succeeds."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    try:
        trial = subprocess.run(in_loopback_namespace(["true"]), capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return trial.returncode == 0


def only_loopback() -> bool:
    """Whether this process's network namespace holds no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


def cmdline(pid: int) -> list[str]:
    """Process ``pid``'s command line ([] if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode("utf-8", "replace") for word in raw.split(b"\0")[:-1]]


def cwd_of(pid: int) -> Path | None:
    """Process ``pid``'s working folder (None if it is gone)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def kill_tree(roots: Iterable[int], sessions: Iterable[int] = ()) -> int:
    """SIGKILL `live_tree` ``(roots, sessions)`` as one: every process is first stopped (SIGSTOP, so none can fork
    or be reparented out of reach meanwhile), the tree looked up again until it holds no running process, then all
    are killed. Returns how many processes were killed."""
    roots, sessions = list(roots), list(sessions)
    stopped: set[int] = set()
    while fresh := live_tree(roots, sessions) - stopped:
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(stopped)


def exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it (its pid stays reserved, a zombie, until it is waited for)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of a text file ("" if it is missing)."""
    if not path.is_file():
        return ""
    return path.read_bytes()[-chars:].decode("utf-8", "replace")


@dataclass
class Node:
    """One node of the cluster: its ``ray start --block`` process, its temp folder and its log."""

    index: int
    proc: subprocess.Popen
    temp_dir: Path

    @property
    def log(self) -> Path:
        return self.temp_dir / "node.log"


class ClusterStartError(RuntimeError):
    """The cluster did not come up (the message holds the failing node's log tail)."""


class LoopbackCluster:
    """A Ray cluster of ``nodes`` nodes on 127.0.0.1 (a context manager): the head and ``nodes - 1`` that join it,
    each offering ``num_cpus`` CPUs and an object store of ``object_store_bytes``.

    Run it inside a loopback-only network namespace (module docstring): elsewhere Ray registers the nodes under the
    machine's own address. Entering starts every node and waits (up to ``timeout`` seconds) until all are alive;
    leaving kills every node's process tree and removes the temp folders."""

    def __init__(
        self,
        nodes: int = 2,
        num_cpus: int = 1,
        object_store_bytes: int = OBJECT_STORE_BYTES,
        health_check: Mapping[str, int] | None = None,
        timeout: float = 120,
    ) -> None:
        if nodes < 1 or num_cpus < 1:
            raise UserError(f"a cluster needs at least 1 node and 1 CPU a node, not {nodes} and {num_cpus}")
        self.size, self.num_cpus, self.object_store_bytes = nodes, num_cpus, object_store_bytes
        self.health_check = dict(HEALTH_CHECK if health_check is None else health_check)
        self.timeout = timeout
        self.port = 0
        self.nodes: list[Node] = []
        self.registered: list[dict[str, Any]] = []
        self.seconds: dict[str, float] = {}

    @property
    def address(self) -> str:
        """The head's GCS address, ``127.0.0.1:PORT`` (what ``ray.init(address=...)`` and ``--ray`` take)."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LoopbackCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the head, then the other nodes, and wait until all are alive (`seconds`: ``head``, until the head's
        GCS port accepts connections; ``join``, from then until every node is alive; ``start``, both)."""
        began = time.monotonic()
        self.port = free_port()
        self.nodes.append(self._start_node(0, ["--head", "--port", str(self.port), "--include-dashboard", "false"]))
        self._wait(lambda: port_open(self.port), "the head's GCS port to open")
        self.seconds["head"] = time.monotonic() - began
        joining = time.monotonic()
        for i in range(1, self.size):
            self.nodes.append(self._start_node(i, ["--address", self.address]))
        self.registered = self._alive_nodes()
        self.seconds["join"] = time.monotonic() - joining
        self.seconds["start"] = time.monotonic() - began

    def _start_node(self, index: int, role: list[str]) -> Node:
        """``ray start ROLE --block`` for node ``index``, in its own session, its output in its temp folder."""
        temp_dir = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
        (temp_dir / "tmp").mkdir()
        argv = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            *role,
            "--block",
            "--num-cpus",
            str(self.num_cpus),
            "--node-ip-address",
            "127.0.0.1",
            "--disable-usage-stats",
            "--object-store-memory",
            str(self.object_store_bytes),
            "--temp-dir",
            str(temp_dir),
        ]
        if index == 0 and self.health_check:
            argv += ["--system-config", json.dumps(self.health_check)]
        with open(temp_dir / "node.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=ray_env({"TMPDIR": str(temp_dir / "tmp")}),
                start_new_session=True,
            )
        return Node(index, proc, temp_dir)

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready()`` until it is true; raise `ClusterStartError` when a node exits or `timeout` passes."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            self._check_nodes_run(what)
            if time.monotonic() > deadline:
                raise ClusterStartError(f"waited {self.timeout:.0f} s for {what}\n{self._log_tails()}")
            time.sleep(0.05)

    def _check_nodes_run(self, what: str) -> None:
        for node in self.nodes:
            if exited(node.proc):
                raise ClusterStartError(
                    f"node {node.index}'s `ray start` exited while waiting for {what}\n" + tail(node.log, 3000)
                )

    def _log_tails(self) -> str:
        return "\n".join(f"--- node {n.index} ---\n{tail(n.log, 2000)}" for n in self.nodes)

    def _alive_nodes(self) -> list[dict[str, Any]]:
        """Wait until every node is alive; their `ray.nodes` records, each with this cluster's ``index`` added."""
        poll = subprocess.Popen(
            [sys.executable, "-c", NODES_SCRIPT, self.address, str(self.size), str(self.timeout)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=ray_env(),
            text=True,
        )
        try:
            self._wait(lambda: poll.poll() is not None, f"{self.size} nodes to be alive")
        finally:
            if poll.poll() is None:
                poll.kill()
            out, err = poll.communicate()
        if poll.returncode != 0:
            raise ClusterStartError(f"`ray.nodes()` failed ({poll.returncode}): {err[-2000:]}\n{self._log_tails()}")
        records = [dict(n, index=self._index_of(n)) for n in json.loads(out)]
        if sum(bool(n["Alive"]) for n in records) < self.size:
            raise ClusterStartError(f"only {records} of {self.size} nodes came alive\n{self._log_tails()}")
        return records

    def _index_of(self, record: Mapping[str, Any]) -> int | None:
        """The index of the node whose temp folder holds the raylet socket of the `ray.nodes` ``record``."""
        socket_path = str(record.get("RayletSocketName", ""))
        for node in self.nodes:
            if socket_path.startswith(f"{node.temp_dir}/"):
                return node.index
        return None

    def refresh(self) -> list[dict[str, Any]]:
        """Ask the cluster again (`registered`): every node it knows, the dead ones included (``"Alive": false``)."""
        poll = subprocess.run(
            [sys.executable, "-c", NODES_SCRIPT, self.address, "0", "0"],
            capture_output=True,
            env=ray_env(),
            text=True,
            timeout=self.timeout,
        )
        if poll.returncode != 0:
            raise RuntimeError(f"`ray.nodes()` failed ({poll.returncode}): {poll.stderr[-2000:]}")
        self.registered = [dict(n, index=self._index_of(n)) for n in json.loads(poll.stdout)]
        return self.registered

    def node_ips(self) -> list[str]:
        """Every registered node's address (``NodeManagerAddress``), in the order of `nodes`."""
        return [n["NodeManagerAddress"] for n in sorted(self.registered, key=lambda n: n["index"] or 0)]

    def node_id(self, i: int) -> str:
        """Node ``i``'s Ray node id (hex)."""
        return next(n["NodeID"] for n in self.registered if n["index"] == i)

    def summary(self) -> list[dict[str, Any]]:
        """Each registered node's index, id, address, liveness and whether it is the head."""
        return [
            {
                "index": n["index"],
                "node_id": n["NodeID"],
                "ip": n["NodeManagerAddress"],
                "alive": bool(n["Alive"]),
                "is_head": "node:__internal_head__" in n.get("Resources", {}) or n["index"] == 0,
            }
            for n in sorted(self.registered, key=lambda n: n["index"] or 0)
        ]

    def processes(self, i: int) -> list[int]:
        """The pids of node ``i``'s ``ray start`` process and all its live descendants, recursively, in any session
        (its tasks' own processes too), and of any process left in its session whose parent died."""
        node = self.nodes[i]
        return sorted(live_tree([node.proc.pid], [node.proc.pid]))

    def kill_node(self, i: int) -> int:
        """SIGKILL node ``i``'s whole process tree (`processes`) at once, as a machine going down; returns how many
        processes were killed."""
        node = self.nodes[i]
        return kill_tree([node.proc.pid], [node.proc.pid])

    def close(self) -> None:
        """Kill every node's process tree (all at once), reap the ``ray start`` processes and remove the temp
        folders (`seconds`: ``shutdown``). Only here are they reaped: until then a node's pid, and so its session id,
        cannot be reused by another process, which `processes` and `kill_node` would find."""
        began = time.monotonic()
        pids = [node.proc.pid for node in self.nodes]
        kill_tree(pids, pids)
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        self.nodes = []
        self.seconds["shutdown"] = time.monotonic() - began


# --- scenarios ---------------------------------------------------------------------------------------------------


def cell_processes(pids: Iterable[int]) -> list[tuple[Path, list[str]]]:
    """The study cell processes among ``pids`` (a command line holding ``study`` and ``_cell DIR CELLS``): each
    one's DIR (made absolute against its working folder) and CELLS."""
    found = []
    for pid in pids:
        argv = cmdline(pid)
        if "study" not in argv or "_cell" not in argv[:-2]:
            continue
        at = argv.index("_cell")
        cwd = cwd_of(pid)
        if cwd is not None:
            found.append((cwd / argv[at + 1], [c for c in argv[at + 2].split(",") if c]))
    return found


def has_trained(study_dir: Path, cell: str) -> bool:
    """Whether a window of ``cell`` in ``study_dir`` has logged an update (a ``"kind": "update"`` record in
    ``cells/CELL/periods/*/metrics.jsonl``)."""
    for metrics in (study_dir / "cells" / cell / "periods").glob("*/metrics.jsonl"):
        with contextlib.suppress(OSError):
            if b'"kind": "update"' in metrics.read_bytes():
                return True
    return False


def run_step(cluster: LoopbackCluster, step: Mapping[str, Any], base: Path, out_dir: Path) -> dict[str, Any]:
    """Run one scenario step (module docstring) on ``cluster``; its record for the result."""
    words = {"{address}": cluster.address, "{python}": sys.executable}
    argv = [_substitute(str(word), words) for word in step["argv"]]
    cwd = Path(base, step.get("cwd", "."))
    timeout = float(step.get("timeout", 600))
    victim = step.get("kill_node_when_cell_starts")
    out, err = out_dir / "stdout", out_dir / "stderr"
    record: dict[str, Any] = {"argv": argv, "cwd": str(cwd)}
    began = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=ray_env({k: str(v) for k, v in step.get("env", {}).items()}),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    kill = None if victim is None else {"node": int(victim), "hit": False}
    interrupt = step.get("interrupt_when_done")
    stop = (
        None if interrupt is None else {"folder": str(Path(cwd, interrupt["folder"])), "cells": int(interrupt["cells"])}
    )
    try:
        while proc.poll() is None and time.monotonic() - began < timeout:
            if kill is not None and not kill["hit"]:
                _kill_when_trained(cluster, kill, began)
            if stop is not None and "at_seconds" not in stop and _cells_done(Path(stop["folder"])) >= stop["cells"]:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the driver's terminal
                stop["at_seconds"] = round(time.monotonic() - began, 3)
            time.sleep(0.1)
    finally:
        timed_out = proc.poll() is None  # still running (not reaped): its pid is still its own
        if timed_out:
            kill_tree([proc.pid], [proc.pid])
        proc.wait()
    record |= {
        "returncode": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - began, 3),
        "stdout_tail": tail(out),
        "stderr_tail": tail(err),
        "kill": kill,
        "interrupt": stop,
    }
    return record


def _cells_done(study_dir: Path) -> int:
    """How many cells of a study's folder say they are done."""
    return sum(b'"status": "done"' in p.read_bytes() for p in study_dir.glob("cells/*/status.json"))


def _substitute(word: str, words: Mapping[str, str]) -> str:
    for key, value in words.items():
        word = word.replace(key, value)
    return word


def _kill_when_trained(cluster: LoopbackCluster, kill: dict[str, Any], began: float) -> None:
    """Kill node ``kill["node"]`` if a cell process there has logged an update; note it in ``kill``."""
    for study_dir, cells in cell_processes(cluster.processes(kill["node"])):
        if cells and has_trained(study_dir, cells[0]):
            killed = cluster.kill_node(kill["node"])
            kill |= {
                "hit": True,
                "at_seconds": round(time.monotonic() - began, 3),
                "at_epoch": time.time(),
                "dir": str(study_dir),
                "cells": cells,
                "cell": cells[0],
                "killed": killed,
            }
            return


def read_scenario(path: Path) -> dict[str, Any]:
    """The scenario at ``path``, checked (`UserError` names what is wrong)."""
    try:
        scenario = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the scenario {path}: {err}") from None
    steps = scenario.get("steps") if isinstance(scenario, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("argv"), list) for s in steps):
        raise UserError(f"{path}: a scenario is an object whose 'steps' is a list of objects with an 'argv' list")
    nodes = scenario.get("nodes", 2)
    for s in steps:
        victim = s.get("kill_node_when_cell_starts")
        if victim is not None and not (isinstance(victim, int) and 0 <= victim < nodes):
            raise UserError(f"{path}: kill_node_when_cell_starts must be a node index below {nodes}, not {victim!r}")
    return scenario


def run_scenario_here(path: Path) -> dict[str, Any]:
    """Run the scenario at ``path`` in this process (which must be in a loopback-only namespace); write and return
    its result."""
    scenario = read_scenario(path)
    if not only_loopback():
        raise UserError("run the scenario inside a loopback-only network namespace (tests.ray_cluster.run_scenario)")
    base = path.resolve().parent
    result_path = Path(base, scenario.get("result", f"{path.stem}.result.json"))
    result: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="rs", dir="/tmp") as scratch,
        LoopbackCluster(
            scenario.get("nodes", 2), scenario.get("num_cpus", 1), health_check=scenario.get("health_check")
        ) as cluster,
    ):
        result |= {"address": cluster.address, "node_ips": cluster.node_ips(), "nodes": cluster.summary(), "steps": []}
        for k, step in enumerate(scenario["steps"]):
            out_dir = Path(scratch, str(k))
            out_dir.mkdir()
            result["steps"].append(run_step(cluster, step, base, out_dir))
    result["seconds"] = {k: round(v, 3) for k, v in cluster.seconds.items()}
    result_path.write_text(json.dumps(result, indent=1))
    return result


def run_scenario(
    scenario: Mapping[str, Any], folder: Path, timeout: float = 900, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write ``scenario`` to ``folder``/scenario.json, run it in a loopback-only namespace of its own (`python -m
    tests.ray_cluster`), and return its result. Raises RuntimeError, with the runner's output, if it fails."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scenario.json"
    path.write_text(json.dumps({**scenario, "result": "scenario.result.json"}, indent=1))
    proc = subprocess.Popen(
        in_loopback_namespace([sys.executable, "-m", "tests.ray_cluster", str(path)]),
        cwd=ROOT,
        env=ray_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the runner kills its cluster and its running step, then exits
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise RuntimeError(f"the scenario took over {timeout:.0f} s:\n{out[-3000:]}{err[-5000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the scenario runner failed ({proc.returncode}):\n{out[-3000:]}{err[-5000:]}")
    return json.loads((folder / "scenario.result.json").read_text())


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    """``python -m tests.ray_cluster SCENARIO.json``: run the scenario, write its result (module docstring)."""
    if len(argv) != 1:
        raise UserError("usage: python -m tests.ray_cluster SCENARIO.json")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `run_scenario`'s timeout: the cluster and the step go too
    try:
        run_scenario_here(Path(argv[0]))
    except ClusterStartError as err:
        print(f"error: the cluster did not start: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from clstm_ppo.cli.main import run_command

    sys.exit(run_command(main))
