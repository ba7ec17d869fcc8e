"""The loopback Ray cluster harness (`tests.ray_cluster`) on its own: its namespace holds loopback alone. The cluster
itself (two nodes registered as 127.0.0.1, both running cells, a killed node's job retried on the head) is what
tests/test_study_ray.py asserts, through a study.

Skipped without root and ``unshare`` (the namespace) or without Ray."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.ray_cluster import in_loopback_namespace, loopback_namespace_works

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install -e .[ray])"),
    pytest.mark.skipif(
        not loopback_namespace_works(), reason="needs root and `unshare -n` (a loopback-only network namespace)"
    ),
]


def test_the_namespace_holds_only_loopback() -> None:
    """A command run through `in_loopback_namespace` sees ``lo`` alone, up."""
    code = "import socket; print([n for _, n in socket.if_nameindex()])"
    done = subprocess.run(in_loopback_namespace([sys.executable, "-c", code]), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lo']"
