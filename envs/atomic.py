"""Atomic file writes: a crash or kill mid-write never leaves a half-written file under the real name."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` by calling ``write(handle)`` on a temporary file in the same folder (named
    ``.<name>.<random>.tmp``), flushing and fsyncing it, then ``os.replace``-ing it over ``path``.

    The temporary file is removed if ``write`` fails; a process killed mid-write leaves only that
    temporary file behind, never a truncated ``path``. Raises OSError when the folder is not writable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
