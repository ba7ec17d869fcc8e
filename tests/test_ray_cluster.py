"""The loopback Ray cluster harness (`tests.ray_cluster`) on its own: two real nodes in a loopback-only network
namespace run tasks on both, register as 127.0.0.1, and a task whose node is killed outright is retried on the head.

Skipped without root and ``unshare`` (the namespace) or without Ray."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_cluster import has_trained, in_loopback_namespace, loopback_namespace_works, run_scenario

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install -e .[ray])"),
    pytest.mark.skipif(
        not loopback_namespace_works(), reason="needs root and `unshare -n` (a loopback-only network namespace)"
    ),
]

SPREAD = """
import json, sys, time
import ray

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)


@ray.remote(num_cpus=1)
def where(k):
    time.sleep(1)
    return {"task": k, "node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}


print(json.dumps(ray.get([where.remote(k) for k in range(4)])))
"""
"""A driver (``python -c SPREAD ADDRESS``): 4 one-CPU tasks of a second each; prints where each ran, as JSON."""

FAKE_CELL = """
import json, pathlib, sys, time
study_dir, cell, seconds = sys.argv[3], sys.argv[4], float(sys.argv[5])
metrics = pathlib.Path(study_dir, "cells", cell, "periods", "000", "metrics.jsonl")
metrics.parent.mkdir(parents=True, exist_ok=True)
metrics.write_text(json.dumps({"kind": "update", "update": 1}) + "\\n")
time.sleep(seconds)
"""
"""``python -c FAKE_CELL study _cell DIR CELL SECONDS``: a process whose command line reads like a study cell's, that
logs an update in DIR's cell CELL and then works for SECONDS (what the harness's kill trigger watches for)."""

RETRY = """
import json, subprocess, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

address, study_dir, fake_cell = sys.argv[1:4]
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
nodes = ray.nodes()
head = next(n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"])
other = next(n["NodeID"] for n in nodes if n["NodeID"] != head)


@ray.remote(num_cpus=1, max_retries=2)
def cell():
    here = ray.get_runtime_context().get_node_id()
    seconds = "0.5" if here == head else "20"  # not killed on the other node: it finishes there, and the test fails
    done = subprocess.run([sys.executable, "-c", fake_cell, "study", "_cell", study_dir, "c1", seconds])
    return {"node_id": here, "returncode": done.returncode}


submitted = time.time()
strategy = NodeAffinitySchedulingStrategy(node_id=other, soft=True)
out = ray.get(cell.options(scheduling_strategy=strategy).remote())
finished = time.time()
while any(n["Alive"] for n in ray.nodes() if n["NodeID"] == other) and time.time() < finished + 30:
    time.sleep(0.05)
dead = {n["NodeID"]: not n["Alive"] for n in ray.nodes()}
print(json.dumps(out | {"head": head, "other": other, "dead": dead, "submitted": submitted, "finished": finished,
                        "seen_dead": time.time()}))
"""
"""A driver (``python -c RETRY ADDRESS DIR FAKE_CELL``): one task placed on the non-head node (soft affinity, so a
retry may run elsewhere) that runs `FAKE_CELL`; prints where it finished, the head's and the other node's ids, which
nodes are dead once the other is seen dead (at most 30 s after the task finished), and the times (epoch seconds)."""


def test_two_loopback_nodes_share_tasks_and_a_killed_node_s_task_is_retried_on_the_head(tmp_path: Path) -> None:
    """One cluster of two one-CPU nodes: 4 tasks run on both nodes; every node registers as 127.0.0.1; a task on
    the second node is killed with its node once its (fake) cell has logged an update, and its retry finishes on the
    head."""
    study_dir = tmp_path / "study"
    scenario = {
        "nodes": 2,
        "num_cpus": 1,
        "steps": [
            {"argv": ["{python}", "-c", SPREAD, "{address}"], "timeout": 60},
            {
                "argv": ["{python}", "-c", RETRY, "{address}", str(study_dir), FAKE_CELL],
                "timeout": 90,
                "kill_node_when_cell_starts": 1,
            },
        ],
    }
    began = time.monotonic()
    result = run_scenario(scenario, tmp_path / "run", timeout=300)
    wall = time.monotonic() - began
    print(f"harness wall {wall:.1f} s; cluster {result['seconds']}; steps {[s['seconds'] for s in result['steps']]}")
    assert result["node_ips"] == ["127.0.0.1", "127.0.0.1"], result["nodes"]
    assert [n["index"] for n in result["nodes"]] == [0, 1] and result["nodes"][0]["is_head"], result["nodes"]
    assert result["address"].startswith("127.0.0.1:")
    spread, retry = result["steps"]
    assert spread["returncode"] == 0, spread["stderr_tail"]
    ran = json.loads(spread["stdout_tail"].strip().splitlines()[-1])
    assert sorted(t["task"] for t in ran) == [0, 1, 2, 3]
    assert {t["node_id"] for t in ran} == {n["node_id"] for n in result["nodes"]}, ran  # both nodes worked
    assert {t["ip"] for t in ran} == {"127.0.0.1"}, ran

    assert retry["returncode"] == 0, retry["stderr_tail"]
    kill = retry["kill"]
    assert kill["hit"] and kill["node"] == 1 and kill["cell"] == "c1", kill
    assert kill["dir"] == str(study_dir) and kill["killed"] >= 3, kill  # ray start, raylet, the worker, the cell...
    assert has_trained(study_dir, "c1")
    out = json.loads(retry["stdout_tail"].strip().splitlines()[-1])
    head, other = (n["node_id"] for n in result["nodes"])
    assert (out["head"], out["other"]) == (head, other), out
    assert out["node_id"] == head and out["returncode"] == 0, out  # retried on the head, where it finished
    assert out["dead"] == {head: False, other: True}, out
    print(
        f"killed {kill['at_epoch'] - out['submitted']:.1f} s after submission; retry done"
        f" {out['finished'] - kill['at_epoch']:.1f} s and node seen dead {out['seen_dead'] - kill['at_epoch']:.1f} s"
        " after the kill"
    )
    assert result["seconds"]["shutdown"] < 10


def test_the_namespace_holds_only_loopback() -> None:
    """A command run through `in_loopback_namespace` sees ``lo`` alone, up."""
    code = "import socket; print([n for _, n in socket.if_nameindex()])"
    done = subprocess.run(in_loopback_namespace([sys.executable, "-c", code]), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lo']"
