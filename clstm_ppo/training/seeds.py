"""Several seeds from one command: ``--seed 1-8`` trains one run per seed as one batch (docs/training.md "Several
seeds from one command").

Each seed is the run it would be alone (`clstm_ppo.training.trainer.Trainer`, K seeds), in its own folder
``<run>/seed-<s>/``. They share one market: a synthetic source that names no ``seed=`` would draw one per seed, so
the seeds train on the first seed's (`shared_market`). When they are done, ``<run>/seeds.json`` lists the checkpoint
each seed deploys, which a backtest, compare or trade given the folder takes as one ensemble (`seed_members`). Not
under torchrun: the command writes the manifest after the seeds finish.
"""

from __future__ import annotations

import json
from pathlib import Path

from clstm_ppo.config import TrainConfig, format_seeds, parse_seeds
from clstm_ppo.training.distributed import WorldLayout
from envs.errors import UserError

SEED_FOLDER = "seed-{}"
MANIFEST = "seeds.json"


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


def shared_market(cfg: TrainConfig, seeds: list[int]) -> tuple[TrainConfig, str | None]:
    """``cfg`` on the market the seeds share, and the line that says which market that is when its source would
    have drawn one per seed (a synthetic source without ``seed=``: the first seed's; None otherwise)."""
    from envs.sources import is_synthetic, names_option, pin_synthetic
    from envs.synthetic import GENERATOR_VERSION

    source = cfg.data.source
    if not is_synthetic(source) or names_option(source, "seed"):
        return cfg, None
    source = pin_synthetic(source, seed=seeds[0], generator=GENERATOR_VERSION)
    note = (
        f"seeds {format_seeds(seeds)} share the synthetic market of seed {seeds[0]} ({source}): the source names "
        f"no seed=, which would draw one market per seed"
    )
    return cfg.with_settings(data=source), note


def seed_configs(cfg: TrainConfig, seeds: list[int], folder: Path) -> list[TrainConfig]:
    """Each seed's settings: ``cfg`` (on its shared market, `shared_market`) with the seed and its folder
    ``folder/seed-<s>``."""
    return [
        cfg.with_settings(seed=s, checkpoint_dir=str(folder), run_name=SEED_FOLDER.format(s)).validate() for s in seeds
    ]


def check_seed_run(cfg: TrainConfig, layout: WorldLayout) -> None:
    """UserError when several seeds cannot train as one batch with these settings (one line each)."""
    if layout.torchrun:
        raise UserError(
            "several seeds (--seed 1-8) are launched by this command (--num_workers/--num_gpus), not by torchrun: "
            "it writes the seeds' manifest after they finish"
        )
    if cfg.run.resume and cfg.run.resume not in ("latest", "best"):
        raise UserError("with several seeds --resume takes latest or best (each seed continues its own folder)")
    if cfg.run.resume and not cfg.run.run_name:
        raise UserError("with several seeds --resume needs --run_name: the folder that holds the seeds")


def write_manifest(folder: Path, cfgs: list[TrainConfig], deployed: list[Path]) -> Path:
    """``folder/seeds.json``: the seeds and the checkpoint each deploys (relative to ``folder``)."""
    path = folder / MANIFEST
    entries = [
        {"seed": c.run.seed, "checkpoint": str(p.relative_to(folder))} for c, p in zip(cfgs, deployed, strict=True)
    ]
    path.write_text(json.dumps({"seeds": entries}, indent=2) + "\n", encoding="utf-8")
    return path


def seed_members(folder: str | Path) -> list[Path]:
    """The checkpoints a folder of seeds deploys (its ``seeds.json``), in seed order: what a backtest, compare or
    trade given the folder takes as one ensemble. UserError when the folder holds no finished seeds."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(
            f"{folder} is a folder, not a checkpoint, and holds no finished seeds ({MANIFEST}): give a .pt file, or "
            f"finish its seeds' training (--run_name {folder.name} --seed ... --resume latest)"
        )
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["seeds"]
        members = [folder / entry["checkpoint"] for entry in entries]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path} is not a seeds manifest ({type(err).__name__}: {err})") from None
    if not members:
        raise UserError(f"{path} lists no seed")
    return members


def expand_members(paths: list[str | Path]) -> list[str | Path]:
    """``paths`` with every folder of seeds replaced by its seeds' deployed checkpoints (`seed_members`)."""
    out: list[str | Path] = []
    for p in paths:
        out += seed_members(p) if Path(p).is_dir() else [p]
    return out
