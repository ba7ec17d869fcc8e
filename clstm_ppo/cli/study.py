"""`clstm-ppo study`: the paper's walk-forward protocol over policies x seeds x variants, with the statistics.

    clstm-ppo study --data csv:PATH --policies clstm,lstm,mlp --seeds 1-8 \\
        --trade_start 2016-01-01 --trade_end 2020-05-08 --retrain quarterly --out studies/us [training flags]
    clstm-ppo study merge --out studies/us studies/us-shard1 studies/us-shard2 ...
    clstm-ppo study report studies/us
    clstm-ppo study seal --data csv:PATH --from 2022-01-01 [--to 2023-12-29]

Every training flag of `train_distributed_clstm_ppo.py` (``--num_episodes``, ``--window``, ``--preset``,
``--config``, ...) sets the cells' common settings, but ``--num_episodes`` defaults to `STUDY_NUM_EPISODES` (a
study trains every cell once per window; training's 10,000 would take hours per cell on a CPU). Every command here
reads and writes the trials ledger (``--ledger``, `clstm_ppo.evaluation.ledger`). See docs/study.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from clstm_ppo.cli.main import freeze_imports
from clstm_ppo.cli.train import Parser, add_config_flags, config_from_args
from clstm_ppo.config import OUTPUT_SETTINGS, POLICIES, PRESETS, TrainConfig, read_settings_file
from clstm_ppo.evaluation.statistics import BOOTSTRAP_DRAWS
from envs.errors import UserError

BOOTSTRAP_HELP = (
    f"bootstrap draws of every interval and Sharpe difference of the report (default {BOOTSTRAP_DRAWS:,}; study.md "
    "states the count and each difference bound's Monte Carlo standard error)"
)

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
LEDGER_HELP = (
    "the trials ledger (JSON lines) that counts every configuration traded on the data's days and holds the seals "
    "(default: $CLSTM_PPO_LEDGER, else ~/.clstm_ppo/ledger.jsonl)"
)
DEVICE_ENV = "CLSTM_PPO_STUDY_DEVICE"  # set by the runner for each cell process: cpu or cuda


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="clstm-ppo study",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
        description="Walk-forward study: train on an expanding window up to each trading period, trade it "
        "out of sample, retrain, and stitch the periods; over policies x seeds x variants, next to "
        "buy-and-hold, buy-and-hold with the turbulence stop, 1/N rebalanced monthly, the untrained "
        "network and an index; with confidence intervals, paired block-bootstrap Sharpe differences, "
        "PSR/DSR and the probability of backtest overfitting. Sub-commands: `study merge` (join shards), "
        "`study report DIR` (write the report again), `study seal` (seal a hold-out period). Every training flag sets the cells' common settings.",
    )
    g = parser.add_argument_group("study")
    g.add_argument("--out", required=True, help="the study's folder (re-running the same command continues it)")
    g.add_argument(
        "--policies",
        default="clstm,lstm,mlp",
        help=f"comma-separated policy variants to compare ({', '.join(POLICIES)})",
    )
    g.add_argument(
        "--seeds",
        default="1-4",
        help="seeds per configuration: numbers and ranges, e.g. 1-8 or 1,3,5-7; more seeds on a study's folder grow it",
    )
    g.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="SETTING=V1,V2",
        help="a training setting to vary (repeatable: the grid is every combination), e.g. window=5,30",
    )
    g.add_argument(
        "--trade_start", required=True, help="first trading day of the out-of-sample walk-forward (YYYY-MM-DD)"
    )
    g.add_argument("--trade_end", default="", help="last trading day (default: the data's last day)")
    g.add_argument(
        "--retrain",
        default="quarterly",
        choices=("none", "monthly", "quarterly", "yearly"),
        help="retrain every month, quarter or year on the window extended by the traded period; none: one "
        "training window up to --trade_start and one traded period (a single split)",
    )
    g.add_argument(
        "--retrain_from",
        default="warm",
        choices=("warm", "scratch"),
        help="warm: each window's training starts from the previous window's selected weights; scratch: "
        "from the seed's random initial weights",
    )
    g.add_argument(
        "--validation_days",
        type=int,
        default=63,
        help="trading days at the end of each training window that select the checkpoint (best "
        "validation Sharpe); 0: no selection, the last weights trade (as in the paper; FinRL uses 3 months)",
    )
    g.add_argument(
        "--retrain_episodes",
        type=int,
        default=0,
        help="training episodes for each window after the first (0: --num_episodes)",
    )
    g.add_argument("--index", default="", help="CSV (date,value) of an index to compare with on the traded days")
    g.add_argument(
        "--workers",
        type=int,
        default=0,
        help="cells run at once (0: visible GPUs x --cells_per_gpu, or CPU cores / --threads)",
    )
    g.add_argument(
        "--cells_per_gpu", type=int, default=1, help="cells sharing one GPU at a time (small models fit many)"
    )
    g.add_argument("--threads", type=int, default=0, help="torch threads per CPU process (0: cores / workers)")
    g.add_argument(
        "--batch_cells",
        type=int,
        default=0,
        help="train up to this many cells as one batch in one process: cells that differ only in their seed or in "
        "settings that change no shape (docs/study.md); 0: automatic, sized by each cell's work (small cells batch, "
        "large ones on the CPU train alone, no worker left waiting; at most 64 cells each); 1: every cell in its own "
        "process",
    )
    g.add_argument(
        "--cpu", action="store_true", default=False, help="run every cell on the CPU even when GPUs are visible"
    )
    g.add_argument(
        "--shard",
        default="",
        metavar="I/N",
        help="run only the I-th of N deterministic slices of the grid (1-based), e.g. one task of a SLURM "
        "job array; join the folders with `clstm-ppo study merge`",
    )
    g.add_argument("--max_cells", type=int, default=1000, help="refuse a grid larger than this (a typo guard)")
    g.add_argument("--confidence", type=float, default=0.95, help="confidence level of every interval")
    g.add_argument("--bootstrap", type=int, default=BOOTSTRAP_DRAWS, help=BOOTSTRAP_HELP)
    g.add_argument(
        "--num_episodes",
        type=int,
        help=f"training episodes of each cell's first window (default: {STUDY_NUM_EPISODES}, or what --preset or "
        "--config sets; later windows: --retrain_episodes)",
    )
    g.add_argument("--ledger", help=LEDGER_HELP)  # no "(default: None)": the help names the default
    g.add_argument(
        "--unseal",
        action="store_true",
        default=False,
        help="trade days sealed with `clstm-ppo study seal` anyway; the ledger records it and every report on those "
        "days says how many times they were unsealed",
    )
    add_config_flags(parser, skip=STUDY_OWNED | {"num_episodes"})
    return parser


def study_config(args: dict[str, Any]) -> TrainConfig:
    """The cells' common settings from the parsed training flags (consumed from ``args``), as `config_from_args`
    makes them, but with the study's own default of `STUDY_NUM_EPISODES` episodes unless ``--num_episodes``, the
    ``--preset`` or a ``--config`` file names a number."""
    if "num_episodes" not in args and not _names_num_episodes(args):
        args["num_episodes"] = STUDY_NUM_EPISODES
    return config_from_args(args)


def _names_num_episodes(args: dict[str, Any]) -> bool:
    if "num_episodes" in PRESETS.get(args.get("preset", ""), {}):
        return True
    return any("num_episodes" in read_settings_file(path) for path in args.get("config", []))


def main(argv: list[str]) -> int:
    args_list = list(argv)
    if args_list[:1] == ["merge"]:
        return _merge(args_list[1:])
    if args_list[:1] == ["report"]:
        return _report(args_list[1:])
    if args_list[:1] == ["seal"]:
        return _seal(args_list[1:])
    if args_list[:1] == ["_cell"]:
        return _cell(args_list[1:])
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.study.grid import parse_seeds, parse_shard, parse_variants
    from clstm_ppo.study.runner import plan_layout, run_study
    from clstm_ppo.study.spec import StudySpec

    freeze_imports()
    args = vars(build_parser().parse_args(args_list))
    policies = [p.strip() for p in args.pop("policies").split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UserError(f"--policies {','.join(policies) or '(none)'}: choose among {', '.join(POLICIES)}")
    seeds, variants = parse_seeds(args.pop("seeds")), parse_variants(args.pop("vary"))
    shard_of = parse_shard(args.pop("shard")) if args.get("shard") else None
    args.pop("shard", None)
    if args["validation_days"] < 0 or args["retrain_episodes"] < 0 or args["max_cells"] < 1:
        raise UserError("--validation_days and --retrain_episodes must be >= 0, --max_cells >= 1")
    if not 0 < args["confidence"] < 1 or args["bootstrap"] < 100:
        raise UserError("--confidence must be in (0, 1) and --bootstrap at least 100")
    out = Path(args.pop("out"))
    layout = plan_layout(
        args.pop("workers"),
        args.pop("cells_per_gpu"),
        args.pop("threads"),
        not args.pop("cpu"),
        args.pop("batch_cells"),
    )
    study_flags = {
        k: args.pop(k)
        for k in (
            "trade_start",
            "trade_end",
            "retrain",
            "retrain_from",
            "validation_days",
            "retrain_episodes",
            "index",
            "max_cells",
            "confidence",
            "bootstrap",
        )
    }
    ledger, unseal = Ledger(args.pop("ledger", None)), args.pop("unseal")
    base = study_config(args)
    if study_flags["index"] and not Path(study_flags["index"]).is_file():
        raise UserError(f"--index: file not found: {study_flags['index']}")
    from envs.sources import is_synthetic, pin_synthetic, training_draws
    from envs.synthetic import GENERATOR_VERSION

    if is_synthetic(base.data.source) and training_draws(base.data.source.partition(":")[2]) > 1:
        raise UserError(
            "a study trains each window on its own market's days; train_draws is a training run's option: drop it"
        )
    # The market is drawn once, with the study's seed and today's generator, and every cell trains on it with its
    # own seed: the source names both, so each cell's checkpoint regenerates the market it was trained on.
    source = pin_synthetic(base.data.source, seed=base.run.seed, generator=GENERATOR_VERSION)
    spec = StudySpec(
        base={**base.to_dict(), "progress": False, "data": source},
        policies=policies,
        seeds=seeds,
        variants=[[list(kv) for kv in v] for v in variants],
        trade_start=study_flags["trade_start"],
        trade_end=study_flags["trade_end"],
        retrain=study_flags["retrain"],
        retrain_from=study_flags["retrain_from"],
        validation_days=study_flags["validation_days"],
        retrain_episodes=study_flags["retrain_episodes"],
        index=study_flags["index"],
    )
    for cell in spec.cells():  # every cell's settings must be valid before anything runs
        cell.config(base)
    return run_study(
        out,
        spec,
        layout=layout,
        ledger=ledger,
        unseal=unseal,
        shard_of=shard_of,
        max_cells=study_flags["max_cells"],
        confidence=study_flags["confidence"],
        n_boot=study_flags["bootstrap"],
    )


def _merge(argv: list[str]) -> int:
    parser = Parser(
        prog="clstm-ppo study merge",
        description="Join the finished cells of shard folders of one study into --out and write its report.",
    )
    parser.add_argument("--out", required=True, help="the merged study's folder (may be one of the shards)")
    parser.add_argument("shards", nargs="+", help="study folders written with --shard I/N")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level of every interval")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP_DRAWS, help=BOOTSTRAP_HELP)
    parser.add_argument("--ledger", default=None, help=LEDGER_HELP)
    args = parser.parse_args(argv)
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.study.runner import merge_shards

    freeze_imports()
    return merge_shards(
        Path(args.out),
        [Path(s) for s in args.shards],
        ledger=Ledger(args.ledger),
        confidence=args.confidence,
        n_boot=args.bootstrap,
    )


def _report(argv: list[str]) -> int:
    parser = Parser(
        prog="clstm-ppo study report",
        description="Write a study's report again from its cells, adding the study and its finished cells to the "
        "trials ledger (once: reporting again does not count them twice).",
    )
    parser.add_argument("folder", help="the study's folder")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level of every interval")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP_DRAWS, help=BOOTSTRAP_HELP)
    parser.add_argument("--ledger", default=None, help=LEDGER_HELP)
    args = parser.parse_args(argv)
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.study.report import build_report, verdict_lines
    from clstm_ppo.study.spec import StudySpec

    freeze_imports()
    ledger = Ledger(args.ledger)
    StudySpec.load(Path(args.folder))  # not a study folder: say so before anything else
    ledger.check_writable()
    report = build_report(Path(args.folder), ledger=ledger, confidence=args.confidence, n_boot=args.bootstrap)
    print(f"report: {Path(args.folder) / 'study.md'} ({report['cells']['done']}/{report['cells']['total']} cells done)")
    for line in verdict_lines(report):
        print(f"  {line}")
    return 0


def _seal(argv: list[str]) -> int:
    parser = Parser(
        prog="clstm-ppo study seal",
        description="Seal a hold-out period of a data set: any later study, backtest or compare that would trade "
        "its days refuses unless given --unseal, which the ledger records and every later report on those days "
        "counts. The seal applies to the same market loaded again (a later end date, another file format, a "
        "subset of its tickers): it is recognised by its closes on the first trading day of each month.",
    )
    parser.add_argument("--data", required=True, help="the data source (synthetic[:k=v] | csv:PATH | parquet:PATH)")
    parser.add_argument("--from", dest="start", required=True, help="first sealed day (YYYY-MM-DD)")
    parser.add_argument("--to", dest="end", default="", help="last sealed day (default: none, every later day too)")
    parser.add_argument("--ledger", default=None, help=LEDGER_HELP)
    args = parser.parse_args(argv)
    from clstm_ppo.evaluation.holdout import make_seal
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.market import load_data

    ledger = Ledger(args.ledger)
    ledger.check_writable()
    source = TrainConfig.from_dict({"data": args.data}, source="--data").validate()
    data = load_data(source.data, seed=source.run.seed)
    seal = make_seal(data, args.data, args.start, args.end)
    period = f"{seal['from']} .. {seal['to'] or '(no end: later days too)'}"
    if not ledger.append([seal]):
        print(f"already sealed: {period} of {args.data} (seal {seal['id']} in {ledger.path})")
        return 0
    print(
        f"sealed {period} of {args.data}: {seal['sealed_days_then']} trading days there now, "
        f"{len(seal['tickers'])} tickers (seal {seal['id']} in {ledger.path})"
    )
    return 0


def _cell(argv: list[str]) -> int:
    """Internal: one cell, or a batch of cells (comma-separated), in its own process (what the study's runner
    starts)."""
    parser = Parser(prog="clstm-ppo study _cell")
    parser.add_argument("folder")
    parser.add_argument("cells", help="a cell's name, or several comma-separated: trained as one batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    from clstm_ppo.study.batch import run_batch_guarded
    from clstm_ppo.study.cell import run_cell_guarded
    from clstm_ppo.study.runner import STOP_GRACE_S
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.training.signals import stop_when_orphaned

    freeze_imports()
    torch.set_num_threads(max(1, args.threads))
    stop_when_orphaned(os.getppid(), STOP_GRACE_S)  # the study's own grace for its cells
    folder = Path(args.folder)
    cells = {c.name: c for c in StudySpec.load(folder).cells()}
    names = [n for n in args.cells.split(",") if n]
    unknown = [n for n in names if n not in cells]
    if unknown or not names:
        raise UserError(f"{folder} has no cell {(unknown or [args.cells])[0]!r}")
    device = os.environ.get(DEVICE_ENV, "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("the study gave this cell a GPU, but torch sees none")
    if len(names) == 1:
        return run_cell_guarded(folder, cells[names[0]], device)
    return run_batch_guarded(folder, [cells[n] for n in names], device)


if __name__ == "__main__":
    from clstm_ppo.cli.main import run_command

    sys.exit(run_command(main))
