"""The one exception type for problems the user can fix (bad data, flags, keys, checkpoints).

Raise `UserError("one clear line naming the problem")`; the CLI prints it as `error: ...`
and exits with status 2, without a traceback (unless `--debug`).
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line and a nonzero exit."""


def shown_list(items: list[str] | tuple[str, ...], limit: int) -> str:
    """``a, b, c, ... (N in all)``: the first ``limit`` items, and the count when there are more."""
    items = [str(i) for i in items]
    return ", ".join(items[:limit]) + (f", ... ({len(items)} in all)" if len(items) > limit else "")
