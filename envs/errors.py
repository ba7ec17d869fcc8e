"""The one exception type for problems the user can fix (bad data, flags, keys, checkpoints), and the helpers every
one-line message is made with: `shown_list` (a long list cut to its first items and a count), `first_line` and
`describe_exception` (another error quoted in one line, never its whole multi-line message).

Raise `UserError("one clear line naming the problem")`; the CLI prints it as `error: ...` and exits with status 2,
without a traceback (unless `--debug`, which sets `DEBUG_ENV` so that spawned training workers print theirs too).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

DEBUG_ENV = "CLSTM_PPO_DEBUG"
"""Set to 1 by ``--debug`` (`clstm_ppo.cli.main.run_guarded`); read by the launcher and its workers."""


class UserError(Exception):
    """A problem with the user's input, reported as one line and a nonzero exit."""


def debug_enabled() -> bool:
    """Did the user ask for tracebacks (``--debug``, or ``CLSTM_PPO_DEBUG`` set to anything but 0)?"""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def shown_list(
    items: Iterable[object], limit: int, *, noun: str = "", sep: str = ", ", total: int | None = None
) -> str:
    """The first ``limit`` items joined by ``sep``, then how many there are when some were left out.

    ``shown_list("abcd", 2)`` -> ``"a, b, ... (4 in all)"``; ``noun="rows"`` -> ``"... (4 rows in all)"``.

    :param total: the full count when ``items`` holds only the first few (default: ``len(items)``).
    """
    names = [str(x) for x in items]
    count = len(names) if total is None else total
    text = sep.join(names[:limit])
    if count > limit:
        text += f"{sep}... ({count}{' ' + noun if noun else ''} in all)"
    return text


def first_line(err_or_text: BaseException | str, limit: int | None = None) -> str:
    """The first line of an exception's message (or of a text), stripped, cut to ``limit`` characters; ``""``
    when there is none. Library errors often carry a whole report; a one-line error quotes only its head."""
    text = str(err_or_text).strip()
    line = text.splitlines()[0].strip() if text else ""
    return line if limit is None else line[:limit]


def describe_exception(err: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (just ``Type`` without one): what a user sees of an unexpected error."""
    line = first_line(err, limit)
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
