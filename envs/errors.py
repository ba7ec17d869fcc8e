"""The one exception type for problems the user can fix (bad data, flags, keys, checkpoints).

Raise `UserError("one clear line naming the problem")`; the CLI prints it as `error: ...`
and exits with status 2, without a traceback (unless `--debug`).
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line and a nonzero exit."""
