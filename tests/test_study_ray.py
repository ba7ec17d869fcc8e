"""A study on a real Ray cluster of two nodes on 127.0.0.1 (`tests.ray_cluster`: a head and a node that joins it, one
CPU each, in a network namespace that holds only loopback) gives the local pool's outcomes, cell for cell: run
whole, stopped by Ctrl-C and resumed, and with its second node killed (the node's processes, cells included) while a
cell trains there. Bad ``--ray`` input gets one line and a nonzero exit within 30 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import clean_env
from tests.ray_cluster import ROOT, loopback_namespace_works, run_scenario
from tests.test_study import FULL_GRID, outcomes

pytest.importorskip("ray")
needs_namespace = pytest.mark.skipif(
    not loopback_namespace_works(), reason="needs root and `unshare -n` (a loopback-only network namespace)"
)
# The local pool's own batches: two workers, one thread each (the same as tests/test_study.py's full study).
STUDY = ["study", *FULL_GRID, "--workers", "2", "--threads", "1"]


def ray_study(out: str, ledger: str, *flags: str, **step: object) -> dict:
    """A scenario step: the study (with ``flags`` after its own) through ``--ray`` on the scenario's cluster, into
    ``out``."""
    argv = ["{python}", "-m", "clstm_ppo.cli", *STUDY, *flags, "--out", out, "--ledger", ledger, "--ray", "{address}"]
    return {"argv": argv, "timeout": 240, **step}


OTHER_VERSION_HEAD = (
    "import sys, ray; ray.__version__ = '2.0.0'; from ray.scripts.scripts import main; "
    "sys.argv = ['ray', 'start', *sys.argv[1:]]; main()"
)
"""A real ``ray start`` run by an interpreter that calls itself Ray 2.0.0: a head whose recorded Ray version is
another."""


@pytest.fixture(scope="module")
def cluster_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """One scenario on one two-node cluster for the module's tests (a cluster takes seconds to start), beside the
    local pool's study of the same grid: the folder, the scenario's result and the local study.

    Its steps, in order: a study against a head on another Ray version (started by the step, beside the cluster);
    ``--threads 2`` on one-CPU nodes; the study stopped by Ctrl-C once one cell is done, then the same command again;
    a study whose cell mlp-s2 fails for its own reason; and last (the node stays down) a study whose second node's
    whole process tree, cells included, is killed once a cell there has logged an update."""
    tmp_path = tmp_path_factory.mktemp("ray")
    local = subprocess.Popen(  # the local pool's study, beside the cluster's
        [sys.executable, "-m", "clstm_ppo.cli", *STUDY, "--out", "local", "--ledger", str(tmp_path / "local.jsonl")],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    too_big = ["{python}", "-m", "clstm_ppo.cli", *STUDY, "--threads", "2", "--out", "big", "--ray", "{address}"]
    scenario = {
        "steps": [
            {
                "argv": ["{python}", "-c", _start_other_head_and_study(OTHER_VERSION_HEAD, tmp_path / "out")],
                "env": {"PYTHONPATH": str(ROOT)},  # tests.ray_cluster
                "timeout": 120,
            },
            {"argv": too_big, "timeout": 60},
            ray_study("ray", "ray.jsonl", interrupt_when_done={"folder": "ray", "cells": 1}),
            ray_study("ray", "ray.jsonl"),  # the same command again: it resumes
            # mlp-s2 fails for its own reason, alone (each cell its own job) and not retried
            ray_study("failing", "failing.jsonl", "--policies", "mlp", "--batch_cells", "1"),
            ray_study("lost", "lost.jsonl", kill_node_when_cell_starts=1),  # last: the node stays down
        ]
    }
    # a file stands where mlp-s2's run folders go: it travels with the cell's job and fails it on its node
    (tmp_path / "failing" / "cells" / "mlp-s2").mkdir(parents=True)
    (tmp_path / "failing" / "cells" / "mlp-s2" / "periods").write_text("not a folder\n")
    try:
        result = run_scenario(scenario, tmp_path, timeout=600, env=clean_env())
    finally:
        out, err = local.communicate(timeout=300)
    return tmp_path, result, subprocess.CompletedProcess(local.args, local.returncode, out, err)


@needs_namespace
@pytest.mark.slow
def test_a_study_on_a_two_node_ray_cluster_ends_as_the_local_pools_after_ctrl_c_and_a_lost_node(cluster_study):
    tmp_path, result, local = cluster_study
    assert local.returncode == 0, local.stderr[-3000:]
    stopped, resumed, failing, lost = result["steps"][2:]

    assert result["node_ips"] == ["127.0.0.1", "127.0.0.1"], result["nodes"]
    assert stopped["returncode"] == 130 and stopped["interrupt"]["at_seconds"], stopped
    assert "run the same command again to continue" in stopped["stdout_tail"], stopped["stdout_tail"]
    assert resumed["returncode"] == 0, resumed["stderr_tail"]
    assert "already done (kept)" in resumed["stdout_tail"], resumed["stdout_tail"]
    assert lost["kill"]["hit"], lost
    assert lost["returncode"] == 0, lost["stderr_tail"]
    assert "was lost" in lost["stdout_tail"] and "run 2 of 3" in lost["stdout_tail"], lost["stdout_tail"]

    assert failing["returncode"] == 1, failing["stderr_tail"]
    assert "mlp-s2 FAILED" in failing["stdout_tail"] and "was lost" not in failing["stdout_tail"], failing
    cells = pd.read_csv(tmp_path / "failing" / "cells.csv", index_col=0)
    assert cells.loc["mlp-s1", "status"] == "done" and cells.loc["mlp-s2", "status"] == "failed", cells

    expected = outcomes(pd.read_csv(tmp_path / "local" / "cells.csv", index_col=0))
    for folder in ("ray", "lost"):
        got = outcomes(pd.read_csv(tmp_path / folder / "cells.csv", index_col=0))
        pd.testing.assert_frame_equal(got, expected, check_exact=True)
        files = {p.relative_to(tmp_path / folder) for p in (tmp_path / folder).rglob("*") if p.is_file()}
        local_files = {p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*") if p.is_file()}
        assert files == local_files, sorted(files ^ local_files)  # the folder reads like a local study's
    print(f"Ray scenario {result['seconds']} and steps {[s['seconds'] for s in result['steps']]} s")


@needs_namespace
@pytest.mark.slow
def test_a_cluster_on_another_ray_version_or_too_small_for_a_job_is_refused_in_one_line(cluster_study):
    """A head whose recorded Ray version is another (`OTHER_VERSION_HEAD`): the study says which versions differ, in
    one line, before writing anything. A job asking for more CPUs than any node has (``--threads 2`` on one-CPU
    nodes) would wait forever: refused in one line too."""
    tmp_path, result, _ = cluster_study
    step, big = result["steps"][:2]
    assert big["returncode"] == 2 and not (tmp_path / "big").exists(), big
    said = [line for line in big["stderr_tail"].strip().splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "--threads 2: the largest node" in said[0] and "1 CPU(s)" in said[0], said
    lines = step["stderr_tail"].strip().splitlines()
    assert step["returncode"] == 0, step["stderr_tail"]
    assert lines[-1].startswith("study exit 2 in "), lines
    error = [line for line in lines if line.startswith("error:")]
    assert len(error) == 1 and "Ray: 2.0.0" in error[0] and "Ray: " in error[0].split("this machine")[1], lines
    assert float(lines[-1].split()[-2]) < 30, lines
    assert not (tmp_path / "out").exists()


def _start_other_head_and_study(head: str, out: Path) -> str:
    """A program that starts a head on another Ray version beside the scenario's cluster, runs the study against it,
    prints the study's stderr and ``study exit CODE in SECONDS s``, and kills that head."""
    args = [*STUDY, "--out", str(out), "--ledger", str(out.parent / "v.jsonl")]
    return f"""
import os, signal, socket, subprocess, sys, tempfile, time
from tests.ray_cluster import free_port, kill_tree
port, temp = free_port(), tempfile.mkdtemp(prefix="r", dir="/tmp")
flags = ["--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--include-dashboard", "false", "--disable-usage-stats", "--object-store-memory", str(80 * 2**20),
         "--temp-dir", temp]
head = subprocess.Popen([sys.executable, "-c", {head!r}, *flags], start_new_session=True,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(2)  # the head records its versions once its GCS is up
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "clstm_ppo.cli", *{args!r}, "--ray", f"127.0.0.1:{{port}}"],
                          capture_output=True, text=True, timeout=90)
    print(done.stderr, file=sys.stderr)
    print(f"study exit {{done.returncode}} in {{time.monotonic() - began:.1f}} s", file=sys.stderr)
finally:
    kill_tree([head.pid], [head.pid])
"""


def test_bad_ray_input_gets_one_line_and_a_nonzero_exit_within_30_s(tmp_path, capfd, monkeypatch):
    """No cluster at the address, an address that is no HOST:PORT, --ray with --shard, and Ray not installed: each
    through the entry point ``clstm-ppo`` calls, in this process (the cases start no cluster)."""
    from clstm_ppo.cli import main as cli_main

    free = tmp_path / "nothing"
    study_flags = [*STUDY, "--out", str(free)]
    cases = [
        (["--ray", "127.0.0.1:1"], "no Ray cluster found there"),
        (["--ray", "localhost"], "give the head's HOST:PORT"),
        (["--ray", "auto", "--shard", "1/2"], "drop one"),
        (["--ray", "auto"], 'pip install -e ".[ray]"'),  # with Ray hidden, below
    ]
    environ = dict(os.environ)
    for flags, words in cases:
        began = time.monotonic()
        with monkeypatch.context() as mp:
            if "install" in words:
                mp.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
            try:
                code = cli_main([*study_flags, *flags])
            finally:
                os.environ.clear()
                os.environ.update(environ)
        err = capfd.readouterr().err.strip()
        assert code == 2 and time.monotonic() - began < 30, (flags, err)
        assert len(err.splitlines()) == 1 and err.startswith("error:") and words in err, (flags, err)
    assert not free.exists()
