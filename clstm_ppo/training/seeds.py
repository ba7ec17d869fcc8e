"""What one train command trains, and where: one seed (a plain run), or several from one command: ``--seed 1-8``
trains one run per seed as one batch (docs/training.md "Several seeds from one command"). The folder layout is chosen
here alone (`RunPlan`).

Each seed is the run it would be alone (`clstm_ppo.training.trainer.Trainer`, K seeds), in its own folder
``<run>/seed-<s>/``. They share one market: a synthetic source that names no ``seed=`` would draw one per seed, so
the seeds train on the first seed's (`shared_market`). When they are done, ``<run>/seeds.json`` lists the checkpoint
each seed deploys, which a backtest, compare or trade given the folder takes as one ensemble (`seed_members`). Not
under torchrun: the command writes the manifest after the seeds finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clstm_ppo.config import TrainConfig, format_seeds
from clstm_ppo.training.distributed import WorldLayout
from envs.errors import UserError

if TYPE_CHECKING:
    from envs.features import PreparedMarket

SEED_FOLDER = "seed-{}"
MANIFEST = "seeds.json"


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


@dataclass(frozen=True)
class RunPlan:
    """What one train command trains and where. One seed is a plain run in its run's folder (``folder``); several
    train as one batch, each in ``folder/seed-<s>/``, and the folder gets the manifest ``seeds.json`` when they are
    done. The train command's every step (dry run, market, claim, prepare, launch, held-out line) reads the layout
    from here.

    :param cfg: the command's settings (several seeds: on the market they share, `shared_market`, with the first
        seed's ``--seed``).
    :param seeds: the seeds, in order (a plain run's one: ``cfg.run.seed``).
    :param folder: the run's folder, or the one that holds the seeds.
    :param note: the line saying which market several seeds share, where the source would have drawn one each.
    """

    cfg: TrainConfig
    seeds: tuple[int, ...]
    folder: Path
    note: str | None = None

    @classmethod
    def of(cls, cfg: TrainConfig, seeds: list[int] | None, layout: WorldLayout) -> RunPlan:
        """The plan of ``cfg`` with several ``seeds`` (``--seed 1-8``, `clstm_ppo.cli.train.split_seed_flag`) or none (a plain run), its
        folder not yet claimed (`claimed`). UserError when several seeds cannot train with these settings."""
        from clstm_ppo.training.run_folder import resolve_run_dir

        if seeds is None:
            return cls(cfg, (cfg.run.seed,), resolve_run_dir(cfg.run, cfg.model.policy))
        check_seed_run(cfg, layout)
        cfg, note = shared_market(cfg, seeds)
        return cls(cfg, tuple(seeds), resolve_run_dir(cfg.run, cfg.model.policy), note)

    @property
    def batch(self) -> bool:
        """Several seeds, as one batch."""
        return len(self.seeds) > 1

    def claimed(self, layout: WorldLayout) -> RunPlan:
        """The plan in a folder of its own: a generated name is created now (NAME-2, ... when taken), so that runs
        started in the same second never share one; a named, resumed or torchrun folder stays as it is."""
        from clstm_ppo.training.run_folder import claim_run_dir

        if self.cfg.run.run_name or self.cfg.run.resume or layout.torchrun:
            return self
        return replace(self, folder=claim_run_dir(self.folder))

    def prepared(self, market: PreparedMarket, layout: WorldLayout) -> RunPlan:
        """The plan `claimed`, each seed's folder ready before any worker starts (writable, its ``--resume``
        checked against ``market``, stale temp files gone: `clstm_ppo.training.resume.prepare_run_dir`)."""
        from clstm_ppo.training.resume import prepare_run_dir

        plan = self.claimed(layout)
        for cfg, run_dir in zip(plan.configs(), plan.run_dirs(), strict=True):
            prepare_run_dir(cfg, market, run_dir)
        return plan

    def configs(self) -> list[TrainConfig]:
        """Each seed's settings: a plain run's own, or each seed's in its folder ``folder/seed-<s>``."""
        return seed_configs(self.cfg, list(self.seeds), self.folder) if self.batch else [self.cfg]

    def run_dirs(self) -> list[Path]:
        """Each seed's run folder."""
        return [self.folder / SEED_FOLDER.format(s) for s in self.seeds] if self.batch else [self.folder]

    def finish(self, has_validation: bool) -> list[Path]:
        """The checkpoint each seed deploys now that it is trained (``--deploy``: `deployed_checkpoint`, best.pt
        only where the market has a validation split); a batch's manifest ``seeds.json`` lists them, written now."""
        from clstm_ppo.training.run_folder import deployed_checkpoint

        cfgs = self.configs()
        deployed = [
            deployed_checkpoint(d, has_validation, c.run.deploy) for c, d in zip(cfgs, self.run_dirs(), strict=True)
        ]
        if self.batch:
            write_manifest(self.folder, cfgs, deployed)
        return deployed

    def again(self) -> str:
        """The flags that continue this command's folder (``--resume latest`` after them)."""
        seeds = f" --seed {format_seeds(list(self.seeds))}" if self.batch else ""
        return f"--run_name {self.folder.name}{seeds}"

    def describe(self, layout: WorldLayout) -> list[str]:
        """The dry run's lines on where the seeds train and into which folders."""
        if not self.batch:
            return [f"world layout: {layout.describe(self.cfg.ppo.num_envs)}", f"run folder: {self.folder}"]
        return [
            f"seeds: {format_seeds(list(self.seeds))}, as one batch on every worker "
            f"({layout.describe(self.cfg.ppo.num_envs)})",
            f"run folders: {self.folder}/seed-<s>",
        ]


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
