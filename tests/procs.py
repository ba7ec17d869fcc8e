"""The live processes of this machine, read from /proc: the one reading the tests' process checks share (orphans
after a kill, `tests.conftest.descendants`; a Ray node's process tree, `tests.ray_cluster`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def proc_table() -> dict[int, tuple[int, int]]:
    """Every live (not zombie) process: pid -> (parent pid, session id), from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # zombies are dead, just not reaped
            table[int(stat.parent.name)] = (int(fields[1]), int(fields[3]))
    return table


def live_tree(roots: Iterable[int], sessions: Iterable[int] = ()) -> set[int]:
    """Live pids among ``roots``, the processes in any of ``sessions`` (orphans whose parent died keep their
    session) and all their descendants, recursively, in any session."""
    table = proc_table()
    wanted = set(sessions)
    found = (set(roots) & table.keys()) | {pid for pid, (_, sid) in table.items() if sid in wanted}
    frontier = set(found)
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier} - found
        found |= frontier
    return found
