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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clstm_ppo.cli.main import freeze_imports
from clstm_ppo.config import PRESETS, SECTIONS, SETTINGS, TrainConfig, parse_seeds, read_settings_file
from clstm_ppo.migrate import FOLDED, REMOVED, REMOVED_IN
from envs.errors import UserError, shown_list

if TYPE_CHECKING:
    from clstm_ppo.training.seeds import RunPlan

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


def describe_data(cfg: TrainConfig) -> str:
    """What the run will see: the source, its tickers and dates, and each split's first day, last day and length."""
    from clstm_ppo.market import data_splits, load_data

    data = load_data(cfg.data, seed=cfg.run.seed)
    names = shown_list(data.tickers, 10)
    lines = [
        f"data: {cfg.data.source} | {data.num_tickers} tickers ({names}) | {data.date_str(0)} .. {data.date_str(-1)} "
        f"({data.num_days} trading days; the first {cfg.data.window - 1} are the window's lookback)"
    ]
    for name, days in data_splits(data, cfg.data).as_dict().items():
        lines.append(
            f"  {name:<10} none"
            if days is None
            else f"  {name:<10} {data.date_str(days.start)} .. {data.date_str(days.stop - 1)} ({days.num_days} days)"
        )
    return "\n".join(lines)


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
    from clstm_ppo.market import build_market
    from clstm_ppo.training.distributed import resolve_layout
    from clstm_ppo.training.launch import launch
    from clstm_ppo.training.worker import train_worker

    freeze_imports()
    system = cfg.system
    layout = resolve_layout(system.num_gpus, system.num_workers, system.backend, system.master_port)
    plan = RunPlan.of(cfg, seeds, layout)
    if cfg.run.dry_run:
        print(json.dumps(plan.configs()[0].to_dict(), indent=2))
        print(describe_data(plan.cfg))  # with several seeds, the first seed's (split_seed_flag)
        print("\n".join(plan.describe(layout)))
        return 0
    if plan.note:
        print(f"[seeds] {plan.note}", flush=True)
    market = build_market(plan.cfg.data, seed=plan.cfg.run.seed)
    plan = plan.claimed(layout)
    for run_cfg, run_dir in zip(plan.configs(), plan.run_dirs(), strict=True):
        prepare_run_dir(run_cfg, market, run_dir)
    code = launch(layout, train_worker, (plan, market, layout, list(callbacks)))
    if code == 0 and (not layout.torchrun or os.environ.get("RANK") == "0"):
        report_held_out(plan, market)
    return code


def prepare_run_dir(cfg: TrainConfig, market: Any, run_dir: Path) -> None:
    """Before any worker starts: ``run_dir`` writable, a ``--resume`` checkpoint fit to continue the run, and the
    temp files left by a process killed while writing a checkpoint removed."""
    from clstm_ppo.training.resume import check_resume
    from clstm_ppo.training.run_folder import check_writable, remove_stale_temp_files

    check_writable(run_dir)
    if cfg.run.resume:
        check_resume(cfg, market, run_dir)
    remove_stale_temp_files(run_dir)


def report_held_out(plan: RunPlan, market: Any) -> None:
    """The command's last line: the deployed policy (``--deploy``: best.pt or latest.pt) on the held-out test days
    against buy-and-hold (`clstm_ppo.evaluation.backtest.held_out_line`); with several seeds, first their manifest
    ``seeds.json``, then their mean and their ensemble (`seeds_held_out_line`). On ``--threads`` torch threads, one
    by default: the held-out days are one env's, and a parent after several workers would otherwise take torch's
    default, every core, whose threads spin-wait on a busy box (1.5-4.5 s for a line of 0.2 s)."""
    from clstm_ppo.evaluation.backtest import held_out_line, seeds_held_out_line
    from clstm_ppo.threads import torch_threads
    from clstm_ppo.training.run_folder import deployed_checkpoint
    from clstm_ppo.training.seeds import write_manifest

    cfgs, has_validation = plan.configs(), market.splits.validation is not None
    deployed = [
        deployed_checkpoint(d, has_validation, c.run.deploy) for c, d in zip(cfgs, plan.run_dirs(), strict=True)
    ]
    with torch_threads(plan.cfg.system.threads or 1):
        if plan.batch:
            write_manifest(plan.folder, cfgs, deployed)
            line, prefix = seeds_held_out_line(deployed, market, plan.folder), "[seeds]"
        else:
            line, prefix = held_out_line(deployed[0], market) if deployed[0].is_file() else None, "[Rank 0]"
    if line is not None:
        print(f"{prefix} {line}", flush=True)


if __name__ == "__main__":
    from clstm_ppo.cli import run_command

    sys.exit(run_command(main))
