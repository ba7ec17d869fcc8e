"""`clstm-ppo study`: the paper's walk-forward protocol over policies x seeds x variants, with the statistics.

    clstm-ppo study --data csv:PATH --policies clstm,lstm,mlp --seeds 1-8 \\
        --trade_start 2016-01-01 --trade_end 2020-05-08 --retrain quarterly --out studies/us [training flags]
    clstm-ppo study merge --out studies/us studies/us-shard1 studies/us-shard2 ...
    clstm-ppo study report studies/us
    clstm-ppo study seal --data csv:PATH --from 2022-01-01 [--to 2023-12-29]

Every training flag sets the cells' common settings (``--num_episodes`` with the study's own default,
`STUDY_NUM_EPISODES`); every command here reads and writes the trials ledger (``--ledger``). See docs/study.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clstm_ppo.cli.main import freeze_imports
from clstm_ppo.cli.train import Parser, add_config_flags, config_from_args
from clstm_ppo.config import OUTPUT_SETTINGS, PRESETS, TrainConfig, read_settings_file
from clstm_ppo.study.config import LEDGER_HELP, ReportSettings, StudyConfig, add_report_flags, add_study_flags
from envs.errors import UserError

if TYPE_CHECKING:
    from clstm_ppo.study.spec import StudySpec

# Settings the study decides for each cell and training run (the rest pass through to every cell).
STUDY_OWNED = frozenset(
    {
        "policy",
        "seed",
        "resume",
        "init_weights",
        "num_gpus",
        "num_workers",
        "backend",
        "master_port",
        "dry_run",
        "train_end",
        "validation_end",
        "test_end",
        *OUTPUT_SETTINGS,
    }
)
STUDY_NUM_EPISODES = 400
"""The study's default training episodes per cell (first window); `train` defaults to 10,000."""


def build_parser() -> argparse.ArgumentParser:
    """``clstm-ppo study [flags]`` runs a study; ``study merge``, ``study report`` and ``study seal`` are its
    sub-commands (``_cell`` is the runner's own, undocumented)."""
    parser = Parser(
        prog="clstm-ppo study",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
        description="Walk-forward study: train on an expanding window up to each trading period, trade it "
        "out of sample, retrain, and stitch the periods; over policies x seeds x variants, next to "
        "buy-and-hold, buy-and-hold with the turbulence stop, 1/N rebalanced monthly, the untrained "
        "network and an index; with confidence intervals, paired block-bootstrap Sharpe differences, "
        "PSR/DSR and the probability of backtest overfitting. Every training flag sets the cells' common settings.",
    )
    add_study_flags(parser)
    parser.add_argument(
        "--num_episodes",
        type=int,
        help=f"training episodes of each cell's first window (default: {STUDY_NUM_EPISODES}, or what --preset or "
        "--config sets; later windows: --retrain_episodes)",
    )
    add_config_flags(parser, skip=STUDY_OWNED | {"num_episodes"})
    commands = parser.add_subparsers(dest="command", metavar="{merge,report,seal,tried}", parser_class=Parser)
    merge = commands.add_parser(
        "merge",
        help="join the finished cells of shard folders into one study",
        description="Join the finished cells of shard folders of one study into --out and write its report.",
    )
    merge.add_argument("--out", required=True, help="the merged study's folder (may be one of the shards)")
    merge.add_argument("shards", nargs="+", help="study folders written with --shard I/N")
    add_report_flags(merge)
    merge.set_defaults(run=_merge)
    report = commands.add_parser(
        "report",
        help="write a study's report again",
        description="Write a study's report again from its cells, adding the study and its finished cells to the "
        "trials ledger (once: reporting again does not count them twice).",
    )
    report.add_argument("folder", help="the study's folder")
    add_report_flags(report)
    report.set_defaults(run=_report)
    seal = commands.add_parser(
        "seal",
        help="seal a hold-out period of a data set",
        description="Seal a hold-out period of a data set: any later study, backtest or compare that would trade "
        "its days refuses unless given --unseal, which the ledger records and every later report on those days "
        "counts. The seal applies to the same market loaded again (a later end date, another file format, a "
        "subset of its tickers): it is recognised by its closes on the first trading day of each month.",
    )
    seal.add_argument("--data", required=True, help="the data source (synthetic[:k=v] | csv:PATH | parquet:PATH)")
    seal.add_argument("--from", dest="start", required=True, help="first sealed day (YYYY-MM-DD)")
    seal.add_argument("--to", dest="end", default="", help="last sealed day (default: none, every later day too)")
    seal.add_argument("--ledger", default=None, help=LEDGER_HELP)
    seal.set_defaults(run=_seal)
    tried = commands.add_parser(
        "tried",
        help="count trials run before or outside the ledger",
        description="Record in the trials ledger that TRIALS trials of CONFIGURATIONS configurations were traded on "
        "--from .. --to of a data set outside the ledger (before it existed, or by hand): every later report on "
        "those days of that market counts them in its Bonferroni family and its deflated Sharpe ratio's number "
        "of trials. Their Sharpe ratios are unknown, so they add to the count only.",
    )
    tried.add_argument("--data", required=True, help="the data source (synthetic[:k=v] | csv:PATH | parquet:PATH)")
    tried.add_argument("--from", dest="start", required=True, help="first traded day (YYYY-MM-DD)")
    tried.add_argument("--to", dest="end", required=True, help="last traded day (YYYY-MM-DD)")
    tried.add_argument("--trials", type=int, required=True, help="how many trials (a configuration and a seed each)")
    tried.add_argument("--configurations", type=int, required=True, help="how many distinct configurations")
    tried.add_argument("--what", required=True, help="what was tried, where it is written down (one line)")
    tried.add_argument("--ledger", default=None, help=LEDGER_HELP)
    tried.set_defaults(run=_tried)
    cell = commands.add_parser("_cell")  # the runner's own: not listed
    cell.add_argument("folder")
    cell.add_argument("cells", help="a cell's name, or several comma-separated: trained as one batch")
    cell.add_argument("--threads", type=int, default=1)
    cell.set_defaults(run=_cell)
    return parser


def study_config(args: dict[str, Any]) -> TrainConfig:
    """The cells' common settings from the parsed training flags (consumed from ``args``), as `config_from_args`
    makes them, but with the study's own default of `STUDY_NUM_EPISODES` episodes unless ``--num_episodes``, the
    ``--preset`` or a ``--config`` file names a number."""
    if "num_episodes" not in args and not (
        "num_episodes" in PRESETS.get(args.get("preset", ""), {})
        or any("num_episodes" in read_settings_file(path) for path in args.get("config", []))
    ):
        args["num_episodes"] = STUDY_NUM_EPISODES
    return config_from_args(args)


def main(argv: list[str]) -> int:
    args = vars(build_parser().parse_args(list(argv)))
    command = args.pop("command", None)
    if command is not None:
        return args.pop("run")(args)
    from clstm_ppo.study.spec import StudySpec

    freeze_imports()
    settings = StudyConfig.from_args(args)
    base = study_config(args)
    from envs.sources import is_synthetic, pin_synthetic, training_draws
    from envs.synthetic import GENERATOR_VERSION

    if is_synthetic(base.data.source) and training_draws(base.data.source.partition(":")[2]) > 1:
        raise UserError(
            "a study trains each window on its own market's days; train_draws is a training run's option: drop it"
        )
    # The market is drawn once, with the study's seed and today's generator, and every cell trains on it with its
    # own seed: the source names both, so each cell's checkpoint regenerates the market it was trained on.
    source = pin_synthetic(base.data.source, seed=base.run.seed, generator=GENERATOR_VERSION)
    spec = StudySpec.of(settings, {**base.to_dict(), "progress": False, "data": source})
    for cell in spec.cells():  # every cell's settings must be valid before anything runs
        cell.config(base)
    return _run(spec, settings)


def _run(spec: StudySpec, settings: StudyConfig) -> int:
    """Run the study on this machine's cores and GPUs, or, with ``--ray``, on the Ray cluster it joins first."""
    from clstm_ppo.study.runner import plan_layout, ray_layout, run_study

    flags = (settings.workers, settings.cells_per_gpu, settings.threads, not settings.cpu, settings.batch_cells)
    if not settings.ray:
        return run_study(spec, settings, layout=plan_layout(*flags))
    from clstm_ppo.study.ray_jobs import join, leave

    cluster = join(settings.ray)
    print(
        f"[study] joined the Ray cluster at {cluster.address}: {cluster.nodes} node(s), {cluster.cpus} CPU(s), "
        f"{cluster.gpus} GPU(s)",
        flush=True,
    )
    try:
        return run_study(spec, settings, layout=ray_layout(cluster, *flags))
    finally:
        leave()


def _merge(args: dict[str, Any]) -> int:
    from clstm_ppo.study.runner import merge_shards

    settings = ReportSettings.from_args(args)
    freeze_imports()
    return merge_shards(Path(args["out"]), [Path(s) for s in args["shards"]], settings)


def _report(args: dict[str, Any]) -> int:
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.study.report import build_report, verdict_lines
    from clstm_ppo.study.spec import StudySpec

    settings = ReportSettings.from_args(args)
    freeze_imports()
    folder = Path(args["folder"])
    ledger = Ledger(settings.ledger)
    StudySpec.load(folder)  # not a study folder: say so before anything else
    ledger.check_writable()
    report = build_report(folder, ledger=ledger, confidence=settings.confidence, n_boot=settings.bootstrap)
    print(f"report: {folder / 'study.md'} ({report['cells']['done']}/{report['cells']['total']} cells done)")
    for line in verdict_lines(report):
        print(f"  {line}")
    return 0


def _seal(args: dict[str, Any]) -> int:
    from clstm_ppo.evaluation.holdout import make_seal
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.market import load_data

    ledger = Ledger(args["ledger"])
    ledger.check_writable()
    source = TrainConfig.from_dict({"data": args["data"]}, source="--data").validate()
    data = load_data(source.data, seed=source.run.seed)
    seal = make_seal(data, args["data"], args["start"], args["end"])
    period = f"{seal['from']} .. {seal['to'] or '(no end: later days too)'}"
    if not ledger.append([seal]):
        print(f"already sealed: {period} of {args['data']} (seal {seal['id']} in {ledger.path})")
        return 0
    print(
        f"sealed {period} of {args['data']}: {seal['sealed_days_then']} trading days there now, "
        f"{len(seal['tickers'])} tickers (seal {seal['id']} in {ledger.path})"
    )
    return 0


def _tried(args: dict[str, Any]) -> int:
    from clstm_ppo.evaluation.holdout import parse_day
    from clstm_ppo.evaluation.ledger import Ledger, tried_record
    from clstm_ppo.market import load_data

    ledger = Ledger(args["ledger"])
    ledger.check_writable()
    source = TrainConfig.from_dict({"data": args["data"]}, source="--data").validate()
    data = load_data(source.data, seed=source.run.seed)
    first, last = (parse_day(args[k], f).strftime("%Y-%m-%d") for k, f in (("start", "--from"), ("end", "--to")))
    entry = tried_record(
        data,
        args["data"],
        first,
        last,
        trials=args["trials"],
        configurations=args["configurations"],
        what=args["what"],
    )
    said = f"{entry['num_trials']} trials of {entry['num_configurations']} configurations on {first} .. {last}"
    if not ledger.append([entry]):
        print(f"already recorded: {said} of {args['data']} ({ledger.path})")
        return 0
    print(f"recorded: {said} of {args['data']}, counted by every later report on those days ({ledger.path})")
    return 0


def _cell(args: dict[str, Any]) -> int:
    """Internal: one cell, or a batch of cells (comma-separated), in its own process (what the runner starts)."""
    import torch

    from clstm_ppo.study.batch import run_batch_guarded
    from clstm_ppo.study.jobs import DEVICE_ENV
    from clstm_ppo.study.runner import STOP_GRACE_S
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.training.signals import stop_when_orphaned

    freeze_imports()
    torch.set_num_threads(max(1, args["threads"]))
    stop_when_orphaned(os.getppid(), STOP_GRACE_S)  # the study's own grace for its cells
    folder = Path(args["folder"])
    cells = {c.name: c for c in StudySpec.load(folder).cells()}
    names = [n for n in args["cells"].split(",") if n]
    unknown = [n for n in names if n not in cells]
    if unknown or not names:
        raise UserError(f"{folder} has no cell {(unknown or [args['cells']])[0]!r}")
    device = os.environ.get(DEVICE_ENV, "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("the study gave this cell a GPU, but torch sees none")
    return run_batch_guarded(folder, [cells[n] for n in names], device)


if __name__ == "__main__":
    from clstm_ppo.cli.main import run_command

    sys.exit(run_command(main))
