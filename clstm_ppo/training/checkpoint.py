"""Checkpoint files: what one holds, writing it atomically, loading it safely, and rebuilding its market and
policy; every reader (backtest, study, trade) and the trainer go through here.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)``: no pickled code runs on load. It is written atomically (`envs.atomic`): a crash
mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from clstm_ppo import __version__ as VERSION
from clstm_ppo import migrate
from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.spec import ModelSpec
from clstm_ppo.config import TrainConfig
from clstm_ppo.market import build_market, rebuild_market
from envs.atomic import atomic_write
from envs.data import DayRange, MarketData, Splits
from envs.errors import UserError, first_line
from envs.features import TURBULENCE_LOOKBACK, PreparedMarket, split_ranges
from envs.sources import data_record

FORMAT_VERSION = 1
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format since torch 1.6
REQUIRED_KEYS = ("format_version", "config", "model_config", "market_spec", "model_state", "counters")


@dataclass
class Checkpoint:
    """A loaded checkpoint; see the module docstring for where each part comes from."""

    path: Path
    config: dict[str, Any]  # TrainConfig.to_dict()
    model_config: dict[str, Any]  # ModelSpec.to_dict()
    # PreparedMarket.to_spec(): tickers, normalisation, threshold, splits; and "data" (envs.sources.data_record: the
    # data's fingerprint, first and last day, a synthetic generator's version), absent from files written before it
    market_spec: dict[str, Any]
    model_state: dict[str, torch.Tensor]  # raw ActorCritic state_dict (no module./_orig_mod. prefixes)
    optimizer_state: dict[str, Any] | None
    scaler_state: dict[str, Any] | None
    counters: dict[str, Any]  # global_step, update, episodes, best_score, ...
    worker_states: list[dict[str, Any]] | None  # per rank: RNG, env and recurrent state (exact resume)
    version: str = migrate.UNRECORDED_VERSION  # the clstm-ppo release that wrote it (0.1.0 and before record none)

    @cached_property
    def cfg(self) -> TrainConfig:
        """The run's settings; UserError when they do not parse (another version's or a damaged file)."""
        if not isinstance(self.config, dict):
            raise UserError(f"{self.path} is not a clstm-ppo checkpoint (its config is not a mapping)")
        return TrainConfig.from_dict(self.config, source=f"checkpoint {self.path}")

    @property
    def tickers(self) -> list[str]:
        return [str(t) for t in self.market_spec["tickers"]]

    @property
    def window(self) -> int:
        """T, the observation window the policy was trained with (trading days)."""
        return int(self.market_spec["window"])

    @property
    def policy(self) -> str | None:
        return self.model_config.get("policy")


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict as a checkpoint stores it: detached copies on the CPU. Copies, because a tensor is saved
    with its whole storage: a stacked cell's weights are views of every cell's (`clstm_ppo.agent.stacked`)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically to ``path`` (temp file in the same folder, fsync, os.replace)."""
    path = Path(path)
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except OSError as err:
        raise UserError(f"cannot write checkpoint {path}: {err.strerror or err}") from None
    return path


RESUME_ONLY_KEYS = ("optimizer_state", "scaler_state", "worker_states")
"""What only continuing a run's training reads (``--resume``): the optimizer's state, the loss scaler's, and each
rank's RNG, env and recurrent state. The paper network's Adam moments are twice its weights."""


def keep_weights_only(path: str | Path) -> int:
    """Rewrite checkpoint ``path`` without `RESUME_ONLY_KEYS` (atomically; a no-op on a file already without them);
    return the bytes it shrank by.

    The network's weights, its market, settings and counters stay, so a backtest, the study's ensembles and report,
    ``trade`` and ``init_weights`` read the file as before, bit for bit; ``--resume`` refuses it
    (`clstm_ppo.training.resume.check_resume`). A study does this to each window it has traded, whose training it
    never continues: the paper network's checkpoint goes from 34.5 to 11.2 MB.
    """
    path = Path(path)
    before = path.stat().st_size
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the file is checked again, in full, by whoever reads it next
        raise UserError(f"{path} is not a readable clstm-ppo checkpoint: {first_line(err)[:160]}") from None
    if all(raw.get(key) is None for key in RESUME_ONLY_KEYS):
        return 0
    save_checkpoint(path, {**raw, **dict.fromkeys(RESUME_ONLY_KEYS)})
    return before - path.stat().st_size


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load and check a checkpoint; every problem is a `UserError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as err:
        raise UserError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    if head != ZIP_MAGIC:  # torch.save writes a zip archive; anything else is some other file
        raise UserError(f"{path} is not a readable clstm-ppo checkpoint (not a file written by torch.save)")
    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch.load fails in many ways on a damaged archive (RuntimeError, OSError, ...)
        reason = first_line(err) or type(err).__name__
        if isinstance(err, pickle.UnpicklingError) and "weights_only" in str(err):
            raise UserError(
                f"{path} is not a clstm-ppo checkpoint: it holds Python objects other than tensors "
                f"and plain data, which are not loaded for safety (weights_only)"
            ) from None
        raise UserError(
            f"{path} is not a readable clstm-ppo checkpoint (truncated or corrupt, "
            f"{path.stat().st_size:,} bytes): {reason[:160]}"
        ) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise UserError(f"{path} is not a clstm-ppo checkpoint (missing {', '.join(missing)})")
    if raw["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path} has checkpoint format {raw['format_version']}, this version reads {FORMAT_VERSION}")
    raw = migrate.checkpoint(raw, str(path))  # an earlier release's file in this release's shape
    required = {k: raw[k] for k in REQUIRED_KEYS if k != "format_version"}
    return Checkpoint(path, **required, **{k: raw.get(k) for k in RESUME_ONLY_KEYS}, version=raw["version"])


def open_checkpoint(path: str | Path) -> Checkpoint:
    """`load_checkpoint` on the CPU, then check that its config parses and its market spec names tickers and
    a window: what every reader (backtest, study, trade) needs before it trusts the file. UserError otherwise."""
    ckpt = load_checkpoint(path, map_location="cpu")
    spec = ckpt.market_spec
    if not isinstance(spec, dict):
        raise UserError(f"{ckpt.path} is not a clstm-ppo checkpoint (its market spec is not a mapping)")
    _ = ckpt.cfg  # parses, or names the problem
    if not isinstance(spec.get("tickers"), list) or not isinstance(spec.get("window"), int):
        raise UserError(f"{ckpt.path}: its market spec has no ticker list or window (not a clstm-ppo checkpoint?)")
    return ckpt


def checkpoint_payload(
    *,
    cfg: TrainConfig,
    model: ActorCritic,
    market: PreparedMarket,
    optimizer_state: dict[str, Any],
    scaler_state: dict[str, Any] | None,
    counters: dict[str, Any],
    worker_states: list[dict[str, Any]] | None,
    world_size: int,
) -> dict[str, Any]:
    """Everything a checkpoint holds (see `Checkpoint`); ``model`` is the raw ActorCritic (no wrappers), the states
    are ``state_dict()``s of its optimizer and fp16 GradScaler (None without one)."""
    return {
        "format_version": FORMAT_VERSION,
        "version": VERSION,
        "config": {**cfg.to_dict(), "resume": ""},
        "model_config": model.spec.to_dict(),
        "market_spec": {**market.to_spec(), "data": data_record(cfg.data.source, market.data)},
        "model_state": cpu_state(model),
        "optimizer_state": optimizer_state,
        "scaler_state": scaler_state,
        "counters": {k: (float(v) if isinstance(v, float) else v) for k, v in counters.items()},
        "worker_states": worker_states,
        "world_size": world_size,
    }


def restore_market(ckpt: Checkpoint, data: MarketData) -> PreparedMarket:
    """``ckpt``'s market over ``data``: its stored normalisation and turbulence threshold, never refitted."""
    try:
        return rebuild_market(data, ckpt.market_spec)
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"{ckpt.path}: its market spec is incomplete or invalid ({type(err).__name__}: {err})"
        ) from None


def refit_market(ckpt: Checkpoint, data: MarketData) -> PreparedMarket:
    """``ckpt``'s market recipe on other ``data`` (another universe): prepared as training prepares one
    (`clstm_ppo.market.build_market` with the run's data settings: window, indicators, price features, turbulence)
    on the checkpoint's own split dates mapped onto ``data``, so the normalisation statistics and the turbulence
    threshold are refitted on ``data``'s days of the checkpoint's training split, never on a later day.

    :raises UserError: ``data`` holds fewer than 2 days of that training split (after the window's lookback), or
        the run's settings do not rebuild the features its policy was trained on.
    """
    ranges = split_ranges(data, ckpt.market_spec["splits"])
    stored = ckpt.market_spec["splits"]["train"]
    train = ranges.get("train")
    if train is not None:
        train = DayRange(max(train.start, ckpt.window - 1), train.stop)  # training's first day has its lookback
    if train is None or train.num_days < 2:
        held = "fewer than 2" if train is None else str(max(train.num_days, 0))
        raise UserError(
            f"{ckpt.path}: the data holds {held} trading day(s) of its "
            f"training split {stored['start']} .. {stored['end']} (after {ckpt.window - 1} days of lookback), where "
            f"another universe's normalisation and turbulence threshold are refitted; it needs at least 2"
        )
    splits = Splits(train=train, validation=ranges.get("validation"), test=ranges.get("test"))
    market = build_market(ckpt.cfg.data, seed=ckpt.cfg.run.seed, data=data, splits=splits)
    _check_recipe(ckpt, market)
    return market


def _check_recipe(ckpt: Checkpoint, market: PreparedMarket) -> None:
    """UserError unless ``market`` (refitted from ``ckpt``'s settings) computes the features of ``ckpt``'s stored
    market: the same indicators, window, turbulence lookback and price column."""
    spec, norm = ckpt.market_spec, ckpt.market_spec.get("normalization") or {}
    stored = {
        "indicators": list(spec.get("indicator_names", [])),
        "window": ckpt.window,
        "turbulence lookback": int(spec.get("turbulence_lookback", TURBULENCE_LOOKBACK)),
        "price features": norm.get("price_mode"),
    }
    rebuilt = {
        "indicators": list(market.indicator_names),
        "window": market.window,
        "turbulence lookback": market.turbulence_lookback,
        "price features": market.normalization.price_mode,
    }
    wrong = [f"{k} {rebuilt[k]} (stored {stored[k]})" for k in stored if stored[k] != rebuilt[k]]
    if wrong:
        raise UserError(f"{ckpt.path}: its settings do not rebuild its market's features: {', '.join(wrong)}")


def restore_policy(
    ckpt: Checkpoint, market: PreparedMarket, device: torch.device | str = "cpu", *, resize: bool = False
) -> ActorCritic:
    """The checkpoint's ActorCritic, weights loaded, in eval mode on ``device``; UserError on any mismatch.

    :param resize: build the stored network for ``market``'s tickers (and state width) instead of the stored
        count: a ``shared`` policy on another universe, whose weights must still load strictly.
    """
    path = ckpt.path
    try:
        spec = ModelSpec.from_dict(ckpt.model_config, source=str(path))
    except TypeError as err:
        raise UserError(f"{path}: its model config does not fit this version ({err})") from None
    if resize:
        spec = dataclasses.replace(spec, num_features=market.num_features, num_tickers=market.num_tickers)
    want = {"num_features": market.num_features, "num_tickers": market.num_tickers, "window": market.window}
    wrong = {k: (getattr(spec, k), v) for k, v in want.items() if getattr(spec, k) != v}
    if wrong:
        what = ", ".join(f"{k} {a} (market gives {b})" for k, (a, b) in wrong.items())
        raise UserError(f"{path}: the stored model does not fit its market spec: {what}")
    try:
        model = make_policy(spec)
        model.load_state_dict(ckpt.model_state, strict=True)
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        detail = " ".join(line.strip() for line in str(err).strip().splitlines()[:3])[:300]
        if resize:
            raise UserError(
                f"{path}: its {spec.policy} weights do not fit {market.num_tickers} tickers: {detail}"
            ) from None
        raise UserError(f"{path}: stored weights do not match its model config ({spec.policy}): {detail}") from None
    return model.to(device).eval()
