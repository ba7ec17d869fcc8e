"""`clstm-ppo train` / `python train_distributed_clstm_ppo.py`: flags -> config -> workers.

Settings resolve in this order, later winning: TrainConfig defaults, ``--preset``, ``--config FILE``
(JSON), then the flags given on the command line. Market data is loaded and validated once in the
parent before any worker starts, so bad data fails fast with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import types
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

from clstm_ppo.config import PRESETS, TrainConfig
from envs.errors import UserError

if TYPE_CHECKING:
    from clstm_ppo.training.distributed import Comm, WorldLayout
    from envs.features import PreparedMarket

# torch and the data stack are imported where first needed: a bad flag, --help or --dry_run then
# answers in a fraction of a second instead of after torch's ~2 s import.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, like every other user error
        raise UserError(f"{message} (see --help)")


def _field_type(annotation: Any) -> Any:
    """The scalar type of a TrainConfig annotation (``int | None`` -> int)."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"Union": Union})  # annotations are postponed strings
    if get_origin(annotation) in (Union, types.UnionType):
        return next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="train_distributed_clstm_ppo.py",
        description="Train CLSTM-PPO on one CPU, several CPU processes (gloo), or 1-8 GPUs per node (NCCL). "
                    "Also launchable by torchrun (single or multi-node).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="JSON file of settings; flags given here override it")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="start from a named preset (paper: Table 1)")
    for f in fields(TrainConfig):
        kind = _field_type(f.type)
        help_ = f.metadata.get("help", "")
        default = f.default if f.default is not MISSING else None
        name = f"--{f.name}"
        if kind is bool:
            parser.add_argument(name, action=argparse.BooleanOptionalAction, help=f"{help_} (default: {default})")
        else:
            parser.add_argument(name, type=kind, choices=f.metadata.get("choices"),
                                help=f"{help_} (default: {default})".replace("%", "%%"))
    return parser


def parse_config(argv: list[str]) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    if "preset" in args:
        values.update(PRESETS[args.pop("preset")])
    if "config" in args:
        values.update(TrainConfig.from_json(args.pop("config")).to_dict())
    values.update(args)
    return TrainConfig.from_dict(values, source="settings").validate()


def _newest_run(checkpoint_dir: Path, name: str) -> Path | None:
    runs = sorted((p.parent for p in checkpoint_dir.glob(f"*/{name}.pt")), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def resolve_run_dir(cfg: TrainConfig) -> Path:
    """The run folder: --run_name, or for --resume latest/best the newest run holding one, else a new name."""
    root = Path(cfg.checkpoint_dir)
    if cfg.run_name:
        return root / cfg.run_name
    if cfg.resume in ("latest", "best"):
        newest = _newest_run(root, cfg.resume)
        if newest is None:
            raise UserError(f"--resume {cfg.resume}: no run in {root} has {cfg.resume}.pt")
        return newest
    return root / f"{cfg.policy}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_writable(folder: Path) -> None:
    """Fail before training when checkpoints could not be written (read-only folder, a file in the way)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to the run folder {folder}: {err.strerror or err}") from None


def _names(tickers: list[str], most: int = 6) -> str:
    return ", ".join(tickers[:most]) + (f", ... ({len(tickers)} in all)" if len(tickers) > most else "")


def check_resume(cfg: TrainConfig, market: PreparedMarket, run_dir: Path) -> Path:
    """Fail in the parent, before any worker starts, when ``--resume`` cannot continue this run.

    :return: the checkpoint file (the trainer loads it again on every rank).
    """
    from clstm_ppo.training.checkpoint import load_checkpoint, resolve_resume
    from clstm_ppo.training.trainer import model_config

    path = resolve_resume(cfg.resume, run_dir)
    ckpt = load_checkpoint(path)
    theirs, ours = [str(t) for t in ckpt.market_spec.get("tickers", [])], [str(t) for t in market.data.tickers]
    if theirs != ours:
        raise UserError(f"--resume {path}: it was trained on {len(theirs)} tickers ({_names(theirs)}) but this run's "
                        f"data has {len(ours)} ({_names(ours)}); use the same --data/--tickers, or start a new run")
    ours_model = model_config(cfg, market).__dict__
    flags = {f.name for f in fields(TrainConfig)}
    diff = [f"{'--' if k in flags else ''}{k} {ckpt.model_config.get(k)} (now {v})"
            for k, v in ours_model.items() if ckpt.model_config.get(k) != v]
    if diff:
        raise UserError(f"--resume {path}: it was trained with {', '.join(diff)}; give the same model settings, "
                        f"or start a new run")
    return path


def _worker(comm: Comm, payload: tuple[TrainConfig, PreparedMarket, Path, WorldLayout]) -> None:
    import torch

    from clstm_ppo.training.distributed import StoppedBySignal
    from clstm_ppo.training.trainer import Trainer

    cfg, market, run_dir, layout = payload
    if comm.device.type == "cpu":
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // max(1, layout.world_size if not layout.torchrun else int(os.environ.get("LOCAL_WORLD_SIZE", 1)))))
    run_dir = comm.broadcast_object(run_dir)  # under torchrun every process named its own; rank 0's wins
    trainer = Trainer(cfg, market, comm, run_dir)
    start = time.perf_counter()
    counters = trainer.train()
    if counters["episodes"] < cfg.num_episodes:  # only a SIGINT/SIGTERM ends train() early without raising
        if comm.master:
            print(f"[Rank 0] stopped after {counters['episodes']} episodes (update {counters['update']}); "
                  f"continue with: --run_name {run_dir.name} --resume latest", flush=True)
        raise StoppedBySignal(trainer.stop_signal or signal.SIGTERM)
    if comm.master:
        seconds = time.perf_counter() - start
        print(f"[Rank 0] done: {counters['episodes']} episodes, {counters['global_step']:,} env steps in "
              f"{seconds:,.1f} s | checkpoints: {run_dir}", flush=True)


def main(argv: list[str]) -> int:
    cfg = parse_config(argv)
    from clstm_ppo.market import build_market
    from clstm_ppo.training.checkpoint import remove_stale_temp_files
    from clstm_ppo.training.distributed import launch, resolve_layout

    layout = resolve_layout(cfg.num_gpus, cfg.num_workers, cfg.backend, cfg.master_port)
    run_dir = resolve_run_dir(cfg)
    if cfg.dry_run:
        print(json.dumps(cfg.to_dict(), indent=2))
        print(f"world layout: {layout.describe(cfg.num_envs)}")
        print(f"run folder: {run_dir}")
        return 0
    market = build_market(cfg)
    check_writable(run_dir)
    if cfg.resume:
        check_resume(cfg, market, run_dir)
    remove_stale_temp_files(run_dir)  # left by a process killed while writing a checkpoint
    return launch(layout, _worker, (cfg, market, run_dir, layout))


if __name__ == "__main__":
    from clstm_ppo.cli import run_guarded

    sys.exit(run_guarded(main, sys.argv[1:]))
