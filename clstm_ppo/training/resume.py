"""Whether a checkpoint may continue this run (``--resume``) or seed it (``--init_weights``): both ask for the
same tickers and the same network, and name every setting that differs by its flag, in one line."""

from __future__ import annotations

from pathlib import Path

import torch

from clstm_ppo.agent.build import model_spec
from clstm_ppo.agent.spec import ModelSpec
from clstm_ppo.config import SETTINGS, TrainConfig
from clstm_ppo.training.checkpoint import Checkpoint, load_checkpoint
from clstm_ppo.training.own_market import trained_on
from clstm_ppo.training.run_folder import check_writable, remove_stale_temp_files, resolve_resume
from envs.errors import UserError, shown_list
from envs.features import PreparedMarket
from envs.fingerprint import data_fingerprint
from envs.sources import is_synthetic, pin_synthetic, synthetic_version

FLAG_OF_SPEC_FIELD = {"obs_norm": "norm_obs"}
"""Network fields that a flag decides: a difference is named by the flag and its values."""

INIT_ONLY = ("init_log_std",)
"""Network fields that set only the initial weights, which a checkpoint's weights replace: a run that continues or
starts from a checkpoint may differ there."""

RESUME_ALSO_MATCH = ("price_features", "use_turbulence")
"""Settings beyond the env's that give a state its meaning: the state's price column and the turbulence stop."""


def resume_must_match(then: TrainConfig, now: TrainConfig) -> tuple[str, ...]:
    """The settings a resumed run must keep from its checkpoint, as they give an action, a state or a reward its
    meaning: every env setting but the episode length, less those both runs leave inert (`EnvConfig.inert`: the
    band when both trade shares), and `RESUME_ALSO_MATCH`."""
    return (*then.env.in_effect(now.env, skip=frozenset({"episode_length"})), *RESUME_ALSO_MATCH)


def _shown(value: object) -> object:
    """A setting as the user types it (an unbounded log-std is stored as None: shown as inf)."""
    return "inf" if value is None or value == float("inf") else value


def _then_and_now(flag: str, then: TrainConfig, now: TrainConfig) -> str | None:
    a, b = then.to_dict()[flag], now.to_dict()[flag]
    return None if a == b else f"--{flag} {_shown(a)} (now {_shown(b)})"


def other_tickers(ckpt: Checkpoint, market: PreparedMarket) -> str | None:
    """Why ``ckpt`` cannot act on ``market``'s tickers (None when they are the same, in the same order)."""
    theirs, ours = ckpt.tickers, [str(t) for t in market.data.tickers]
    if theirs == ours:
        return None
    return (
        f"it was trained on {len(theirs)} tickers ({shown_list(theirs, 6)}) but this run's data has {len(ours)} "
        f"({shown_list(ours, 6)}); use the same --data/--tickers"
    )


def differences(
    ckpt: Checkpoint, cfg: TrainConfig, market: PreparedMarket, *, settings: tuple[str, ...] = ()
) -> list[str]:
    """What keeps ``ckpt`` from being this run's network on ``market``, one phrase per difference: each field of the
    network (``--stage2_hidden 16 (now 32)``; a field a flag decides, by that flag), then each of ``settings`` by
    flag."""
    then = ckpt.cfg
    stored = ModelSpec.from_dict(ckpt.model_config, source=str(ckpt.path)).to_dict()
    wanted = model_spec(cfg, market).to_dict()
    out = []
    for key, value in wanted.items():
        if stored.get(key) == value or key in INIT_ONLY:
            continue
        if key in FLAG_OF_SPEC_FIELD:
            out.append(_then_and_now(FLAG_OF_SPEC_FIELD[key], then, cfg))
        else:
            out.append(f"{'--' if key in SETTINGS else ''}{key} {_shown(stored.get(key))} (now {_shown(value)})")
    out += [_then_and_now(flag, then, cfg) for flag in settings]
    return list(dict.fromkeys(d for d in out if d is not None))  # a flag that is both is named once


def prepare_run_dir(cfg: TrainConfig, market: PreparedMarket, run_dir: Path) -> None:
    """Before any worker starts: ``run_dir`` writable, a ``--resume`` checkpoint fit to continue the run
    (`check_resume`), and the temp files left by a process killed while writing a checkpoint removed."""
    check_writable(run_dir)
    if cfg.run.resume:
        check_resume(cfg, market, run_dir)
    remove_stale_temp_files(run_dir)


def check_resume(cfg: TrainConfig, market: PreparedMarket, run_dir: Path) -> Path:
    """Fail in the parent, before any worker starts, when ``--resume`` cannot continue this run.

    :return: the checkpoint file (the trainer loads it again on every rank).
    """
    path = resolve_resume(cfg.run.resume, run_dir)
    ckpt = load_checkpoint(path)
    if ckpt.optimizer_state is None:
        raise UserError(
            f"--resume {path}: it holds the network's weights only (a study keeps the windows it has traded so), "
            f"not the optimizer and random state a run continues from; a --config file with "
            f'{{"init_weights": "{path}"}} starts a new run from its weights'
        )
    if tickers := other_tickers(ckpt, market):
        raise UserError(f"--resume {path}: {tickers}, or start a new run")
    if diff := differences(ckpt, cfg, market, settings=resume_must_match(ckpt.cfg, cfg)):
        raise UserError(
            f"--resume {path}: it was trained with {', '.join(diff)}; give the same settings, or start a new run"
        )
    if other_data := other_market(ckpt, cfg, market):
        raise UserError(f"--resume {path}: {other_data}")
    return path


def other_market(ckpt: Checkpoint, cfg: TrainConfig, market: PreparedMarket) -> str | None:
    """Why ``market``'s data is not the data ``ckpt`` was trained on (None when it is, as far as can be told): the
    synthetic source names another generator than the recorded one (generator 1 where a file records none:
    `clstm_ppo.migrate.market_spec`), or the data is not the recorded one (`clstm_ppo.training.own_market.trained_on`)."""
    record = ckpt.market_spec.get("data") or {}
    source, generator = cfg.data.source, record.get("generator")
    if is_synthetic(source) and generator is not None and synthetic_version(source.partition(":")[2]) != generator:
        return (
            f"it was trained on synthetic generator {generator}; give --data "
            f"{pin_synthetic(source, generator=int(generator))} to continue on that market"
        )
    if not trained_on(ckpt, market.data):
        found = data_fingerprint(market.data)
        return (
            f"this run's data (fingerprint {found}) is not the data it was trained on ({record['fingerprint']}, "
            f"{record['first']} .. {record['last']}); use the same --data, dates and tickers"
        )
    return None


def load_weights(path: str | Path, cfg: TrainConfig, market: PreparedMarket) -> dict[str, torch.Tensor]:
    """The model weights of checkpoint ``path`` for a new run of ``cfg`` on ``market`` (--init_weights): UserError
    unless it holds the same network (variant, sizes, window, features) for the same tickers."""
    ckpt = load_checkpoint(path)
    if tickers := other_tickers(ckpt, market):
        raise UserError(f"--init_weights {path}: {tickers}")
    if diff := differences(ckpt, cfg, market):
        raise UserError(f"--init_weights {path}: it holds another network: {', '.join(diff)}")
    return ckpt.model_state
