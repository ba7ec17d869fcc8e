"""The one place for the past (docs/design.md): what files written by earlier versions meant, and how they are read
today. Every reader of a stored file passes it through here once and sees this release's shape after: settings
(`settings`, `recorded_settings`), checkpoints (`checkpoint`: its `CHECKPOINT_STEPS` after the release it records;
0.1.0 and before record none), study specs (`study_spec`) and a study cell's trading record (`traded_record`).
``--config`` files and study specs record no release: `settings` runs on every one, and leaves settings already in
this release's shape alone.

`LEGACY` is also the trials ledger's yardstick (`clstm_ppo.study.trials.config_key`): a setting at the value an old
file is read with is left out of a configuration's key, so keys do not move when a default does. Its values are
history and never change; a changed default adds its old value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from clstm_ppo import __version__ as VERSION
from envs.data import MarketData
from envs.errors import UserError
from envs.fingerprint import data_fingerprint, same_bars
from envs.source_spec import ALPACA_DEFAULTS, split_source

UNRECORDED_VERSION = "0.1.0"
"""The release of a checkpoint that records none: 0.1.0 and before."""

REMOVED_IN = "0.2.0"  # the release that removed the settings of `REMOVED` and `REMOVED_VALUES`
LAST_WITH_REMOVED = "0.1.0 (commit 8bcb3cf, tag v0.1.0)"
"""The last release that had the settings `REMOVED` names."""

UNRECORDED_GENERATOR = 1
"""The synthetic generator of a checkpoint that records none: the only one there was before versions were recorded."""

LEGACY: dict[str, Any] = {
    # the paper's behaviour, every default before its own flag existed (`clstm_ppo.config.PAPER_BEHAVIOUR`)
    "price_features": "level",
    "action_mode": "shares",
    "reward": "value",
    "action_dist": "gaussian",
    "log_std_max": math.inf,
    "execution": "close",
    "turnover_penalty": 0.0,
    "target_kl": 0.0,
    "use_turbulence": True,
    # then
    "init_weights": "",
    "max_price_ratio": 0.0,
    "deploy": "best",
    "init_log_std": -0.5,  # until 0.2.0
    "rebalance_band": 0.01,  # until 0.2.3
}
"""What a setting meant in checkpoints and study specs written before it existed, for every setting whose default
has changed since."""


def _was_on(values: dict[str, Any], flag: str) -> bool:
    """Whether a 0.1.0 forecast setting stored as None or 'auto' (resolved for the policy) was on."""
    per_ticker = values.get("policy", "clstm") != "shared"
    skip = values.get("forecast_skip")
    skip = per_ticker if skip is None else bool(skip)
    if flag == "forecast_skip":
        return skip
    forecaster = values.get("forecaster", "head")
    linear = (forecaster == "linear") or (forecaster == "auto" and skip and per_ticker)
    if flag == "forecaster":
        return skip and linear
    only = values.get("forecast_only")
    return (skip and linear) if only is None else bool(only)


REMOVED: dict[str, tuple[Any, Callable[[dict[str, Any], Any], bool]]] = {
    "stage1": ("lstm", lambda v, x: v.get("policy", "clstm") == "clstm" and x != "lstm"),
    "cross_section": ("mean", lambda v, x: v.get("policy") == "shared" and x != "mean"),
    "skip": (False, lambda v, x: bool(x)),
    "aux_coef": (0.0, lambda v, x: float(x) != 0.0),
    "forecast_skip": (False, lambda v, x: _was_on(v, "forecast_skip")),
    "forecaster": ("head", lambda v, x: _was_on(v, "forecaster")),
    "forecast_only": (False, lambda v, x: _was_on(v, "forecast_only")),
    "forecast_threshold": (0.0, lambda v, x: float(x) != 0.0),
    "forecast_days": (1, lambda v, x: int(x) != 1 and (float(v.get("aux_coef", 0)) > 0 or _was_on(v, "forecaster"))),
    "ema_decay": (0.0, lambda v, x: float(x) != 0.0),
    "permute_tickers": (False, lambda v, x: bool(x)),
    "turbulence_exit_days": (1, lambda v, x: int(x) != 1),
    "trade_gate": (False, lambda v, x: bool(x)),
    "trade_rate": (1.0, lambda v, x: float(x) != 1.0),
    "noise_hold": (1, lambda v, x: int(x) != 1),
}
"""Settings removed in 0.2.0 (research variants whose only evidence was synthetic draws; docs/training.md lists
each with the commit that last had it): flag -> (the value the product now always uses, whether a file's value
``x`` among its other settings ``v`` would change what it computes). A file holding one in effect is refused in one
line; one holding the value now always used loads as before."""

REMOVED_VALUES: dict[str, tuple[Any, ...]] = {"price_features": ("vol_return",)}
"""Values of kept settings removed in 0.2.0."""

FOLDED = ("wandb_project", "wandb_entity", "alpaca_feed", "alpaca_adjustment", "alpaca_timeframe")
"""0.1.0 settings folded into others: the W&B project and entity into ``--track``, the Alpaca feed, adjustment and
timeframe into the ``--data alpaca:...`` spec."""

REMOVED_NETWORK_FIELDS: dict[str, tuple[str, Any]] = {
    "stage1": ("stage1", "lstm"),
    "skip": ("skip", False),
    "next_day_head": ("aux_coef", False),
    "cross_section": ("cross_section", "mean"),
    "forecast_skip": ("forecast_skip", False),
    "forecaster": ("forecaster", "head"),
    "forecast_only": ("forecast_only", False),
    "forecast_threshold": ("forecast_threshold", 0.0),
    "forecast_centre": ("forecast_gain", None),
    "forecast_scale": ("forecast_gain", 1.0),
    "trade_gate": ("trade_gate", False),
}
"""Network fields (a checkpoint's ``model_config``) removed in 0.2.0: field -> (the flag that set it, the value every
network now has). A stored network with another value is refused."""

START_MOMENTS = (0.0, 0.0, 1.0)
"""The reward normaliser's moments before any return (count, mean, variance: `RewardNormalizer`'s start)."""

NETWORK_LEGACY: dict[str, Any] = {
    "action_dist": LEGACY["action_dist"],
    "log_std_max": None,  # LEGACY's unbounded log-std, as a network stores it
    "obs_norm": False,
}
"""What a network field meant in a ``model_config`` written before it existed."""


# ----------------------------------------------------------------------------------------------- settings
def _removed_line(source: str, flag: str, value: Any, *, computes: bool) -> UserError:
    why = "it changes what this file computes, so retrain" if computes else "retrain"
    return UserError(
        f"{source}: --{flag} {value} was removed in clstm-ppo {REMOVED_IN} (the last version with it: "
        f"{LAST_WITH_REMOVED}); {why}, or use that version"
    )


def settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """A flat ``{flag: value}`` settings dict of any earlier version as this version reads it: 0.1.0's folded
    settings folded, its removed ones dropped where they hold the value now always used; UserError naming the
    setting where one would change what the file computes (0.2.0's step)."""
    values = dict(values)
    for flag, (_always, in_effect) in REMOVED.items():
        if flag in values and in_effect(values, values[flag]):
            raise _removed_line(source, flag, values[flag], computes=True)
    for flag in REMOVED:
        values.pop(flag, None)
    for flag, gone in REMOVED_VALUES.items():
        if values.get(flag) in gone:
            raise _removed_line(source, flag, values[flag], computes=False)
    folded = {k: values.pop(k) for k in FOLDED if k in values}
    if values.get("track", "none") == "wandb" and (folded.get("wandb_project") or folded.get("wandb_entity")):
        project = folded.get("wandb_project") or "clstm-ppo"
        entity = folded.get("wandb_entity") or ""
        values["track"] = f"wandb:{entity + '/' if entity else ''}{project}"
    source_text = str(values.get("data", "synthetic"))
    alpaca = {k.removeprefix("alpaca_"): v for k, v in folded.items() if k.startswith("alpaca_")}
    alpaca = {k: v for k, v in alpaca.items() if v != ALPACA_DEFAULTS[k]}
    if alpaca and split_source(source_text)[0] == "alpaca":
        options = {**alpaca, **split_source(source_text)[1]}
        values["data"] = f"alpaca:{','.join(f'{k}={v}' for k, v in options.items())}"
    return values


def recorded_settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The settings a checkpoint or a study spec was written with: `settings`, and every setting the file predates
    at the meaning it had then (`LEGACY`), not today's default."""
    return settings({**LEGACY, **values}, source)


# ----------------------------------------------------------------------------------------------- checkpoints
def network(values: dict[str, Any], source: str) -> dict[str, Any]:
    """A checkpoint's ``model_config`` of any earlier version in this version's fields: 0.2.0's removed fields
    dropped where they hold the value every network now has (UserError in one line at any other), fields added
    since at the meaning they had (`NETWORK_LEGACY`)."""
    values = dict(values)
    for name, (flag, always) in REMOVED_NETWORK_FIELDS.items():
        if name in values and values.pop(name) != always:
            raise UserError(
                f"{source}: its network was built with --{flag}, removed in clstm-ppo {REMOVED_IN} (the last "
                f"version with it: {LAST_WITH_REMOVED}); retrain, or use that version"
            )
    return {**NETWORK_LEGACY, **values}


def market_spec(spec: dict[str, Any], data_source: str) -> dict[str, Any]:
    """A checkpoint's ``market_spec``: a normalisation written before the state's price column was a choice meant
    the paper's (`LEGACY`); a synthetic market's data record without a generator version was generator 1."""
    spec = dict(spec)
    norm = spec.get("normalization")
    if isinstance(norm, dict) and "price_mode" not in norm:
        spec["normalization"] = {**norm, "price_mode": LEGACY["price_features"]}
    record = spec.get("data") or {}
    if split_source(data_source)[0] == "synthetic" and "generator" not in record:
        spec["data"] = {**record, "generator": UNRECORDED_GENERATOR}
    return spec


def resume_state(state: dict[str, Any], counters: dict[str, Any]) -> dict[str, Any]:
    """One rank's resume state (`clstm_ppo.training.rollout.RolloutCollector.state_dict`) with the reward
    normaliser's state as one entry, ``reward_norm`` (before it had one, its moments were in the counters and each
    env's discounted return in the state; without either, the normaliser's start), and stage 2's recurrent state as
    four tensors (an ``mlp``'s zero-width ones were stored as nothing before `RecurrentState`)."""
    import torch  # here: `clstm_ppo.config` imports this module, and `clstm-ppo plot` never loads torch

    state = dict(state)
    if "next_obs" not in state:
        return state
    envs = state["next_obs"].shape[0]
    if "reward_norm" not in state:
        discounted = state.pop("discounted", None)
        state["reward_norm"] = {
            "moments": list(counters.get("reward_moments", START_MOMENTS)),
            "discounted": torch.zeros(envs, dtype=torch.float64) if discounted is None else discounted,
        }
    if not state.get("recurrent"):
        state["recurrent"] = [torch.zeros(1, envs, 0) for _ in range(4)]
    return state


def _before_0_2_0(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """0.2.0's step: the research settings and network fields of 0.1.0 removed or folded (`settings`, `network`),
    the market's price column and synthetic generator recorded (`market_spec`), each rank's resume state in one
    shape (`resume_state`)."""
    config = raw.get("config")
    if isinstance(config, dict):
        raw["config"] = settings(config, f"checkpoint {path}")
        if isinstance(raw.get("market_spec"), dict):
            raw["market_spec"] = market_spec(raw["market_spec"], str(config.get("data", "synthetic")))
    if isinstance(raw.get("model_config"), dict):
        raw["model_config"] = network(raw["model_config"], path)
    counters = raw.get("counters") if isinstance(raw.get("counters"), dict) else {}
    states = raw.get("worker_states")
    if isinstance(states, list):
        raw["worker_states"] = [resume_state(s, counters) if isinstance(s, dict) else s for s in states]
    if "reward_moments" in counters and states:  # now in each rank's reward_norm
        raw["counters"] = {k: v for k, v in counters.items() if k != "reward_moments"}
    return raw


def _settings_added_since(raw: dict[str, Any], _path: str) -> dict[str, Any]:
    """This release's step, for a file of any earlier one: the settings and network fields it predates, at the
    meaning they had then (`LEGACY`, `NETWORK_LEGACY`)."""
    if isinstance(raw.get("config"), dict):
        raw["config"] = {**LEGACY, **raw["config"]}
    if isinstance(raw.get("model_config"), dict):
        raw["model_config"] = {**NETWORK_LEGACY, **raw["model_config"]}
    return raw


@dataclass(frozen=True)
class Step:
    """One change to the files: the release that made it, what changed, and the upgrade of a file written before
    that release (a no-op on a file that already has the newer shape)."""

    release: str
    change: str
    upgrade: Callable[[dict[str, Any], str], dict[str, Any]]


CHECKPOINT_STEPS: tuple[Step, ...] = (
    Step(
        "0.2.0", "0.1.0's research settings removed; one shape for the market spec and the resume state", _before_0_2_0
    ),
    Step(VERSION, "settings and network fields added since the file was written", _settings_added_since),
)
"""A checkpoint's steps, in release order."""


def release(text: str) -> tuple[int, ...]:
    """``"0.2.10"`` -> ``(0, 2, 10)``, for ordering releases."""
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def checkpoint(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """A ``torch.load``-ed checkpoint of any release in this release's shape: the `CHECKPOINT_STEPS` of the releases
    after its own ``version`` (`UNRECORDED_VERSION` where it records none), in order. Its ``version`` stays the
    release that wrote it.

    :param path: the file, as messages name it.
    :raises UserError: in one line, naming the setting, where the file holds a removed one in effect.
    """
    raw = {**raw, "version": str(raw.get("version", UNRECORDED_VERSION))}
    written = release(raw["version"])
    for step in CHECKPOINT_STEPS:
        if written < release(step.release):
            raw = step.upgrade(raw, path)
    return raw


# ----------------------------------------------------------------------------------------------- data records
def unwitnessed_market_matches(record: dict[str, Any], data: MarketData, reference: Callable[[], MarketData]) -> bool:
    """Whether ``data`` is the synthetic market a data record without a witness was made from (0.2.x, before
    `envs.sources.data_record` added one at commit ``40e1ad4``).

    Such a record holds only the fingerprint of the bits its machine's numpy computed, and numpy's AVX-512 ``exp``
    and ``log`` differ from the C library's in the last bit (`envs.libm`), so on a CPU that rounds otherwise the
    same seed gives another fingerprint. The rule: the market generated again in the C library's rounding
    (``reference()``, `envs.libm.reference_rounding`: numpy's on every CPU without AVX-512) has the recorded
    fingerprint, which proves it is the market trained on, bit for bit; and ``data`` holds that market up to float
    rounding (`envs.fingerprint.same_bars`: every price to 1e-9 of itself). A record written on an AVX-512 CPU is
    matched by its fingerprint on such a CPU, and refused on others: nothing reproduces its bits there."""
    market = reference()
    return data_fingerprint(market) == record.get("fingerprint") and same_bars(market, data)


# ----------------------------------------------------------------------------------------------- studies
def study_spec(values: dict[str, Any]) -> dict[str, Any]:
    """A study's ``spec.json`` in this release's shape: its base settings as `recorded_settings` reads them."""
    values = dict(values)
    if isinstance(values.get("base"), dict):
        values["base"] = recorded_settings(values["base"], "the study's base settings")
    return values


def traded_record(fields: dict[str, np.ndarray], dates: np.ndarray) -> dict[str, np.ndarray]:
    """A study cell's stored trading record (``result.npz``, one policy's fields): written before ``--execution``,
    its trades filled at the close the policy decided on, i.e. the previous row's."""
    if "fill_prices" in fields:
        return fields
    return {
        **fields,
        "fill_prices": np.concatenate([fields["prices"][:1], fields["prices"][:-1]]),
        "fill_dates": np.concatenate([dates[:1], dates[:-1]]),
    }
