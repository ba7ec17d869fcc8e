"""The command line: one module per command, the only place that parses flags (see `clstm_ppo.cli.main`)."""

from clstm_ppo.cli.main import main, run_command, run_guarded

__all__ = ["main", "run_command", "run_guarded"]
