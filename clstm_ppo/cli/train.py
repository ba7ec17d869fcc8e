"""`clstm-ppo train` / `python train_distributed_clstm_ppo.py`: flags -> config -> workers.

Settings resolve in this order, later winning: TrainConfig defaults, ``--preset``, each ``--config FILE`` (JSON,
repeatable: each overrides the settings it names), then the flags given on the command line. Market data is loaded and
validated once in the parent before any worker starts, so bad data fails fast with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from clstm_ppo.cli.main import freeze_imports
from clstm_ppo.config import PRESETS, SECTIONS, SETTINGS, TrainConfig, parse_seeds, read_settings_file
from clstm_ppo.migrate import FOLDED, REMOVED, REMOVED_IN
from envs.errors import UserError

# torch and the data stack are imported where first needed: a bad flag, --help or --dry_run then
# answers in a fraction of a second instead of after torch's ~2 s import.


class Parser(argparse.ArgumentParser):
    """argparse that reports bad flags as one line and exit 2 (a UserError), like every other user error; a flag removed
    in 0.2.0 (`clstm_ppo.migrate.REMOVED`, `FOLDED`) or a config-only knob given as a flag is named as such."""

    def error(self, message: str) -> None:
        if message.startswith("unrecognized arguments:"):
            for word in message.split(":", 1)[1].split():
                flag = word.split("=", 1)[0].removeprefix("--").removeprefix("no-")
                if flag in REMOVED or flag in FOLDED:
                    raise UserError(
                        f"--{flag} was removed in clstm-ppo {REMOVED_IN} (docs/training.md lists the removed settings)"
                    )
                if flag in SETTINGS and not SETTINGS[flag].cli:
                    raise UserError(f"--{flag} is set in a --config file, not on the command line (docs/training.md)")
        raise UserError(f"{message} (see --help)")


def add_config_flags(parser: argparse.ArgumentParser, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """``--config``, ``--preset`` and one flag per TrainConfig setting (but ``skip``), each with its help and default,
    grouped under the config's sections. The parser must use ``argument_default=argparse.SUPPRESS`` so that only
    flags given override the config."""
    group = parser.add_argument_group("settings files")
    group.add_argument(
        "--config",
        action="append",
        metavar="FILE",
        help="JSON file of settings, e.g. the knobs without a flag (docs/training.md); repeatable, later files win; "
        "flags given here override them",
    )
    group.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="start from a named preset (paper: Table 1; demo: a small clstm that learns a planted signal in seconds)",
    )
    groups = {name: parser.add_argument_group(title) for name, (title, _cls) in SECTIONS.items()}
    for s in SETTINGS.values():
        if s.flag in skip or not s.cli:  # a config-only knob: --config files and presets set it
            continue
        text = s.help if "default" in s.help else f"{s.help} (default: {s.default})"
        text = text.replace("%", "%%")  # argparse formats help with %
        group = groups[s.section]
        if s.parse is bool:
            group.add_argument(f"--{s.flag}", action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(f"--{s.flag}", type=s.parse, choices=s.choices, help=text)


def config_from_args(args: dict[str, Any]) -> TrainConfig:
    """Defaults, then ``preset``, then each ``config`` file (the settings it names), then the given settings;
    validated. Consumes the keys it knows from ``args`` (the parsed flags as a dict)."""
    values: dict[str, Any] = {}
    if "preset" in args:
        values.update(PRESETS[args.pop("preset")])
    for path in args.pop("config", []):
        values.update(read_settings_file(path))
    values.update({k: args.pop(k) for k in list(args) if k in SETTINGS})
    return TrainConfig.from_dict(values, source="settings").validate()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="train_distributed_clstm_ppo.py",
        description="Train CLSTM-PPO on one CPU, several CPU processes (gloo), or 1-8 GPUs per node (NCCL). "
        "Also launchable by torchrun (single or multi-node).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    add_config_flags(parser)
    return parser


def split_seed_flag(argv: list[str]) -> tuple[list[str], list[int] | None]:
    """``argv`` with a ``--seed`` naming several seeds (``1-8``, ``1,3,5-7``) replaced by its first, and those seeds;
    ``(argv, None)`` when ``--seed`` names one seed or none."""
    out, seeds = list(argv), None
    for i, word in enumerate(out):
        if word == "--seed" and i + 1 < len(out):
            where, text = i + 1, out[i + 1]
        elif word.startswith("--seed="):
            where, text = i, word.split("=", 1)[1]
        else:
            continue
        if text.strip().lstrip("-").isdigit():
            continue
        try:
            parsed = parse_seeds(text)
        except UserError:
            raise UserError(f"--seed {text!r}: expected a number, or numbers and ranges like 1-8 or 1,3,5-7") from None
        seeds = parsed if len(parsed) > 1 else None
        out[where] = str(parsed[0]) if where == i + 1 else f"--seed={parsed[0]}"
    return out, seeds


def parse_config(argv: list[str]) -> TrainConfig:
    return config_from_args(vars(build_parser().parse_args(argv)))


def main(argv: list[str], callbacks: tuple = ()) -> int:
    """Train with the settings of ``argv``: one seed (a plain run), or several as one batch (``--seed 1-8``, each in
    ``<run>/seed-<s>/``; `clstm_ppo.training.seeds.RunPlan` chooses the layout). ``callbacks`` (picklable
    `clstm_ppo.training.callbacks.Callback`s) run on every worker after the product's: the tests' fault injector
    comes in this way."""
    from clstm_ppo.training.seeds import RunPlan

    argv, seeds = split_seed_flag(argv)
    cfg = parse_config(argv)
    from clstm_ppo.training.tracking import check_tracking

    check_tracking(cfg.run.track)  # a missing wandb is one line now, not a worker's crash after the data loaded
    from clstm_ppo.market import build_market, describe_data
    from clstm_ppo.training.distributed import resolve_layout
    from clstm_ppo.training.launch import launch
    from clstm_ppo.training.worker import train_worker

    freeze_imports()
    system = cfg.system
    layout = resolve_layout(system.num_gpus, system.num_workers, system.backend, system.master_port)
    plan = RunPlan.of(cfg, seeds, layout)
    if cfg.run.dry_run:
        print(json.dumps(plan.configs()[0].to_dict(), indent=2))
        print(describe_data(plan.cfg.data, seed=plan.cfg.run.seed))  # several seeds: the first's (split_seed_flag)
        print("\n".join(plan.describe(layout)))
        return 0
    if plan.note:
        print(f"[seeds] {plan.note}", flush=True)
    market = build_market(plan.cfg.data, seed=plan.cfg.run.seed)
    plan = plan.prepared(market, layout)
    code = launch(layout, train_worker, (plan, market, layout, list(callbacks)))
    if code == 0 and (not layout.torchrun or os.environ.get("RANK") == "0"):
        from clstm_ppo.evaluation.backtest import report_held_out  # after training: a dry run never pays for it

        report_held_out(plan, market)
    return code


if __name__ == "__main__":
    from clstm_ppo.cli import run_command

    sys.exit(run_command(main))
