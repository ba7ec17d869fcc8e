"""`clstm-ppo` command line: one entry point dispatching to the sub-command modules of `COMMANDS`.

Every sub-command module exposes ``main(argv: list[str]) -> int``. Problems the user can fix are raised as
`envs.errors.UserError` and printed here as one line with exit status 2; ``--debug`` anywhere on the command line shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from envs.errors import DEBUG_ENV, UserError, describe_exception

COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("clstm_ppo.cli.train", "main", "train CLSTM-PPO (single process, multi-process CPU, or multi-GPU)"),
    "backtest": ("clstm_ppo.cli.backtest", "main", "backtest a saved checkpoint against buy-and-hold"),
    "compare": ("clstm_ppo.cli.backtest", "compare_main", "backtest several checkpoints on one period"),
    "study": ("clstm_ppo.cli.study", "main", "walk-forward study over policies x seeds x variants, with statistics"),
    "trade": ("clstm_ppo.cli.trade", "main", "paper-trade a checkpoint on Alpaca, one decision per session"),
    "plot": ("clstm_ppo.cli.plot", "main", "plot a run's training curves to PNG"),
    "data": ("clstm_ppo.cli.data", "main", "generate, inspect or download market data"),
    "doctor": ("clstm_ppo.cli.doctor", "main", "check torch, CUDA, NCCL/gloo, ports, folders and keys"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line and exit status 2 (a UserError), like every other user error,
    instead of the usage text."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


_ONE_COMMAND = False  # this interpreter runs one command, then exits (`run_command`, `main` without arguments)


def freeze_imports() -> None:
    """Put every object alive now out of the cyclic garbage collector's reach (``gc.freeze``), in a process that runs
    one command and exits; call it once the command's imports are done. Those are the imported modules' objects (torch
    alone makes ~170k), which every full collection and the exit's would walk again (benchmarks/README.md). A test
    calling commands in its own interpreter keeps its collector as it is."""
    if _ONE_COMMAND:
        gc.freeze()


def run_command(entry: Callable[[list[str]], int]) -> int:
    """The process's one command: ``entry(sys.argv[1:])`` under `run_guarded`, its imports frozen
    (`freeze_imports`). What the ``__main__`` blocks and the training script call."""
    global _ONE_COMMAND
    _ONE_COMMAND = True
    return run_guarded(entry, sys.argv[1:])


def run_guarded(entry: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run ``entry(argv)`` after `freeze_imports`; turn user errors into one line on stderr and exit status 2."""
    freeze_imports()
    args = list(argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
        os.environ[DEBUG_ENV] = "1"  # spawned training workers print their tracebacks too
    try:
        return int(entry(args) or 0)
    except UserError as err:
        if debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not the user's fault: still one line, the traceback on request
        if debug:
            traceback.print_exc()
            print(f"error: unexpected {type(err).__name__}: {err}", file=sys.stderr)
        else:
            print(f"error: unexpected {describe_exception(err)} (--debug shows the traceback)", file=sys.stderr)
        return 1


def _usage() -> str:
    lines = ["usage: clstm-ppo COMMAND [ARGS...] [--debug]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`clstm-ppo COMMAND --help` explains each command's flags."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: ``argv`` None is the process's own command line (`run_command`)."""
    global _ONE_COMMAND
    _ONE_COMMAND = _ONE_COMMAND or argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    entry = getattr(importlib.import_module(module_name), function_name)
    return run_guarded(entry, rest)


if __name__ == "__main__":
    sys.exit(main())
