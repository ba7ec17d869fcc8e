"""Every training setting, in typed sections; the presets; what old checkpoints meant; JSON and CLI round trips.

`TrainConfig` is composed of six sections, each setting declared once with its default and help text
(`envs.config.setting`, CleanRL's ``Args`` idea: the command line documents itself):

- ``run`` (`RunConfig`): names, seeds, resuming, checkpoints and logs
- ``data`` (`DataConfig`): where the market comes from, its dates and splits, and what a day's state holds
- ``env`` (`envs.config.EnvConfig`): how the environment trades and rewards
- ``model`` (`ModelConfig`): the policy network
- ``ppo`` (`PPOConfig`): the algorithm and its budget
- ``system`` (`SystemConfig`): processes, devices and speed

Functions take the section they use. A setting's flag is its field name (``--gamma`` is ``ppo.gamma``; the one
exception, ``--data``, is ``data.source``), so flag names are unique across sections, and the flat
``{flag: value}`` dict of `TrainConfig.to_dict` is what checkpoints, ``config.json``, ``--config`` files and study
specs hold. Derived values (rollout size, minibatches) are properties of their section; `TrainConfig.validate`
rejects inconsistent settings with one clear line.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from envs.config import EnvConfig, setting
from envs.errors import UserError
from envs.state import DEFAULT_PRICE_MODE, INDICATORS, MAX_PRICE_RATIO, PRICE_MODES

POLICIES = ("clstm", "lstm", "mlp", "shared")
STAGE1S = ("lstm", "conv")
"""How clstm's stage 1 reads the T-day window: the paper's window LSTM, or a causal convolution whose kernel spans
the window."""
FORECASTERS = ("head", "linear")
"""What ``--forecast_skip`` follows: the network's next-day head, or a linear map of the window's price columns."""
FORECASTER_CHOICES = ("auto", *FORECASTERS)
"""``--forecaster``'s values: one of `FORECASTERS`, or auto (`ModelConfig.resolved`)."""
CROSS_SECTIONS = ("mean", "attention")
"""How --policy shared's tickers see each other: their embeddings' mean, or also attention across tickers."""
OUTPUT_SETTINGS = (
    "run_name",
    "checkpoint_dir",
    "progress",
    "tensorboard",
    "track",
    "wandb_project",
    "wandb_entity",
    "threads",
)
"""Settings that say where a run writes, how it reports and on how many threads: never what it computes (but the
order of floating-point sums). A study sets them for its cells, and the trials ledger does not tell configurations
apart by them."""
"""The policy variants: the paper's cascaded LSTM, stage 2 alone on the current day, no recurrence."""


def _positive(section: object, *names: str) -> None:
    for name in names:
        if not getattr(section, name) > 0:
            raise UserError(f"--{name} must be positive, got {getattr(section, name)}")


@dataclass(frozen=True)
class RunConfig:
    """Names, seeds, resuming, checkpoints and logs."""

    run_name: str = setting("", "run folder name under --checkpoint_dir (default: <policy>-<timestamp>)")
    checkpoint_dir: str = setting("checkpoints", "folder holding run folders (checkpoints, metrics.jsonl, config.json)")
    seed: int = setting(1, "base seed; rank r, env i uses seed + r * num_envs + i")
    resume: str = setting("", "resume from 'latest', 'best' or a checkpoint PATH (empty: fresh run)")
    init_weights: str = setting(
        "",
        "start from the weights of this checkpoint instead of a random init (same model settings and tickers); "
        "unlike --resume, counters, optimizer and environments start fresh: a walk-forward study's warm start",
    )
    save_every: int = setting(0, "also keep episode_<n>.pt every this many finished episodes (0: only latest/best)")
    checkpoint_every: int = setting(10, "write latest.pt every this many updates (and always at the end or on a stop)")
    eval_every: int = setting(
        10, "score the deterministic policy on the validation split every this many updates (best.pt)"
    )
    deploy: str = setting(
        "last",
        "the checkpoint a run deploys (its last line, a study's trades, the walk-forward warm start): last = "
        "latest.pt, the final weights; best = best.pt, the highest validation score (the last weights without a "
        "validation split; docs/learning.md section 12 measures both)",
        choices=("best", "last"),
    )
    log_every: int = setting(10, "log a line every this many finished episodes (all workers together)")
    tensorboard: bool = setting(False, "write TensorBoard scalars to the run folder (needs the tensorboard package)")
    progress: bool = setting(True, "show a progress bar when stdout is a terminal")
    track: str = setting(
        "none",
        "experiment tracking: wandb sends the config and the TensorBoard scalars to Weights & Biases "
        "(rank 0; needs pip install 'clstm-ppo[wandb]'; WANDB_MODE=offline logs locally)",
        choices=("none", "wandb"),
    )
    wandb_project: str = setting("clstm-ppo", "W&B project of --track wandb (the run is named after the run folder)")
    wandb_entity: str = setting("", "W&B team or user of --track wandb (default: your W&B default entity)")
    max_bad_updates: int = setting(5, "stop after this many consecutive updates with NaN/inf loss or gradients")
    dry_run: bool = setting(False, "print the resolved config and world layout, then exit")

    def validate(self) -> None:
        _positive(self, "checkpoint_every", "eval_every", "max_bad_updates")


@dataclass(frozen=True)
class DataConfig:
    """Where the market comes from, its dates and splits, and what a day's state holds."""

    source: str = setting("synthetic", "synthetic[:k=v,...] | csv:PATH | parquet:PATH | alpaca", flag="data")
    tickers: str = setting("", "comma-separated tickers to use (default: all in the data)")
    start: str = setting("", "first date of data to load (YYYY-MM-DD)")
    end: str = setting("", "last date of data to load (YYYY-MM-DD)")
    train_end: str = setting("", "last training day (default: 70% of days)")
    validation_end: str = setting("", "last validation day (default: 85% of days; the rest is test)")
    test_end: str = setting("", "last test day (default: the end of the data)")
    alpaca_feed: str = setting("iex", "Alpaca feed: iex (free plan) or sip", choices=("iex", "sip"))
    alpaca_adjustment: str = setting(
        "all", "Alpaca price adjustment: raw | split | dividend | all", choices=("raw", "split", "dividend", "all")
    )
    alpaca_timeframe: str = setting("1Day", "Alpaca bar timeframe (1Day; intraday e.g. 1Hour, 15Min)")
    data_url: str = setting("", "Alpaca data endpoint override, e.g. a proxy (default: ALPACA_DATA_URL or Alpaca's)")
    data_cache_dir: str = setting("data_cache/alpaca", "where downloaded Alpaca bars are cached")
    refresh_data: bool = setting(False, "download Alpaca bars again even when cached")
    max_price_ratio: float = setting(
        MAX_PRICE_RATIO,
        "refuse data where a close is more than this many times the previous close, or less than its 1/this "
        "(a bad tick); 0 allows any jump",
    )
    gap_policy: str = setting(
        "fail", "tickers with missing dates: fail | intersect | ffill", choices=("fail", "intersect", "ffill")
    )
    window: int = setting(30, "days of history in each observation (T)")
    price_features: str = setting(
        DEFAULT_PRICE_MODE,
        "price column of the state: return (daily log return, MACD / close: stationary), vol_return (that return "
        "over its ex-ante 20-day volatility: a move's size against the market's recent noise) or level (the close "
        "itself, as in the paper)",
        choices=PRICE_MODES,
    )
    indicators: str = setting(
        ",".join(INDICATORS),
        f"technical indicators in each day's state, comma-separated from {', '.join(INDICATORS)}; 'none' leaves "
        "cash, prices and holdings only",
    )
    use_turbulence: bool = setting(True, "liquidate and block buys when turbulence >= the 90th training percentile")

    @property
    def ticker_list(self) -> list[str] | None:
        names = [t.strip() for t in self.tickers.split(",") if t.strip()]
        return names or None

    @property
    def indicator_list(self) -> tuple[str, ...]:
        """The ``--indicators`` as names (empty for 'none')."""
        if self.indicators.strip().lower() == "none":
            return ()
        return tuple(n.strip().lower() for n in self.indicators.split(",") if n.strip())

    def validate(self) -> None:
        _positive(self, "window")
        if self.max_price_ratio != 0 and not self.max_price_ratio > 1:
            raise UserError(f"--max_price_ratio must be > 1, or 0 to allow any jump; got {self.max_price_ratio:g}")
        names = self.indicator_list
        given = self.indicators.strip().lower() == "none" or names
        if any(n not in INDICATORS for n in names) or not given or len(set(names)) < len(names):
            raise UserError(
                f"--indicators {self.indicators!r}: give distinct names from {', '.join(INDICATORS)}, or none"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The policy network (`clstm_ppo.agent.model`)."""

    policy: str = setting(
        "clstm",
        "clstm (paper) | lstm (stage 2 on the current day) | mlp (no recurrence) | shared (one encoder for every "
        "ticker's window and a cross-sectional stage: no weight depends on the number of tickers)",
        choices=POLICIES,
    )
    stage1: str = setting(
        "lstm",
        "how clstm's stage 1 reads the T-day window: lstm (the paper's window LSTM) or conv (a causal convolution "
        "whose kernel spans the window: one linear map of the T x F window to stage1_hidden, then tanh)",
        choices=STAGE1S,
    )
    cross_section: str = setting(
        "mean",
        "how --policy shared's tickers see each other: mean (each ticker's embedding next to the mean of all) or "
        "attention (also attention across tickers, scored on their price windows: it can find which ticker leads "
        "which without knowing their order)",
        choices=CROSS_SECTIONS,
    )
    stage1_hidden: int = setting(128, "stage-1 LSTM (or convolution) hidden size")
    feature_dim: int = setting(128, "stage-1 output features")
    stage2_hidden: int = setting(512, "stage-2 actor and critic LSTM hidden size (MLP width for --policy mlp)")
    skip: bool = setting(
        True,
        "shortcuts around the LSTMs: clstm's stage 1 also sees today's state, and the heads of clstm/lstm also see "
        "the stage-1 features (off: the paper's network)",
    )
    init_log_std: float = setting(-0.5, "initial log standard deviation of the Gaussian policy")
    action_dist: str = setting(
        "tanh",
        "policy distribution: gaussian (samples clipped to [-1, 1] by the env) or tanh (samples squashed by tanh, "
        "log-probabilities corrected; entropy estimated from samples)",
        choices=("gaussian", "tanh"),
    )
    log_std_max: float = setting(
        0.0,
        "upper bound of the policy's log standard deviation (inf: unbounded; with a bound the lower one is -5)",
    )
    norm_obs: bool = setting(
        False,
        "normalise each state number by running mean / std over the training rollouts (kept in the checkpoint and "
        "used unchanged by backtest and trade)",
    )
    forecast_skip: bool | None = setting(
        None,
        "the actor's mean for each stock also gets g x a forecast of that stock's next-day return (detached: only "
        "the next-day loss fits it; g one learned number, 0 at the start); the head's needs --aux_coef > 0 (default: "
        "on for clstm, lstm and mlp, off for --policy shared; --no-forecast_skip: the network's own means, the "
        "default until docs/learning.md section 19)",
    )
    forecaster: str = setting(
        "auto",
        "what --forecast_skip follows: head (the network's next-day head) or linear (a linear map of the window's "
        "price columns, [T x N] -> [N], fitted by its own next-day loss term, weight 1 whatever --aux_coef: a "
        "forecast with few weights, which does not memorise the training days the way the network can) (default: "
        "auto, linear for clstm, lstm and mlp, head for --policy shared)",
        choices=FORECASTER_CHOICES,
    )
    forecast_only: bool | None = setting(
        None,
        "with --forecast_skip: the stocks' action means are g x the forecast plus a learned bias per stock, without "
        "the network's part (which adds what it learned of the training days); a threshold on the forecast is "
        "within reach (a bias below 0 keeps a stock out until its forecast clears it); the network keeps the trade "
        "gates and the critic (docs/learning.md sections 17 and 19) (default: on with the linear forecaster)",
    )
    forecast_threshold: float = setting(
        0.0,
        "with --forecast_only: the deployed policy (every deterministic action: validation, backtest, study, trade) "
        "lowers each stock's action mean by this much, so a stock is held only where g x forecast + its bias clears "
        "it: a no-trade threshold on the forecast (0: none). Training's sampled actions do not see it (PPO would "
        "learn it away: its return is highest trading every forecast); choose it by study (docs/learning.md 18)",
    )

    def resolved(self) -> ModelConfig:
        """This config with the forecast settings left at their defaults (None, auto) made concrete for its policy:
        clstm, lstm and mlp follow a linear forecast alone (``forecast_skip``, ``forecaster="linear"``,
        ``forecast_only``; docs/learning.md section 19), ``--policy shared`` its network's own means (the linear
        forecaster's weights would tie it to its tickers). Settings given keep their values."""
        per_ticker = self.policy != "shared"
        skip = per_ticker if self.forecast_skip is None else self.forecast_skip
        forecaster = self.forecaster
        if forecaster == "auto":
            forecaster = "linear" if skip and per_ticker else "head"
        only = skip and forecaster == "linear" if self.forecast_only is None else self.forecast_only
        return replace(self, forecast_skip=skip, forecaster=forecaster, forecast_only=only)

    def validate(self) -> None:
        _positive(self, "stage1_hidden", "feature_dim", "stage2_hidden")
        if not 0 <= self.forecast_threshold < math.inf:
            raise UserError(f"--forecast_threshold must be a finite number >= 0, got {self.forecast_threshold:g}")
        if self.policy == "shared" and self.norm_obs:
            raise UserError(
                "--norm_obs keeps statistics per state number, which ties a network to its tickers; "
                "--policy shared cannot use it"
            )


@dataclass(frozen=True)
class PPOConfig:
    """The algorithm and its budget (counts are per worker unless stated)."""

    num_episodes: int = setting(10_000, "stop after this many finished episodes, counted over all workers")
    num_envs: int = setting(16, "parallel environments per worker")
    n_steps: int = setting(128, "rollout length per environment per update")
    epochs: int = setting(10, "PPO epochs per update")
    batch_size: int = setting(512, "PPO minibatch per worker in env steps (whole env columns: a multiple of n_steps)")
    gradient_accumulation_steps: int = setting(
        1, "split each minibatch into this many micro-batches (no_sync on all but the last)"
    )
    learning_rate_clstm: float = setting(3e-4, "Adam learning rate of stage 1 (the window LSTM)")
    learning_rate_actor_critic: float = setting(3e-4, "Adam learning rate of stage 2 and the heads")
    scale_lr: bool = setting(False, "multiply both learning rates by the world size")
    anneal_lr: bool = setting(False, "anneal learning rates linearly to 0 over the run")
    adam_eps: float = setting(1e-8, "Adam epsilon")
    weight_decay: float = setting(0.0, "decoupled weight decay (AdamW) of the weight matrices; 0: plain Adam")
    max_grad_norm: float = setting(0.5, "global gradient-norm clip")
    gamma: float = setting(0.99, "discount factor")
    gae_lambda: float = setting(0.95, "GAE lambda")
    norm_adv: bool = setting(True, "normalise advantages with statistics over all workers' rollouts")
    clip_coef: float = setting(0.2, "PPO clip range")
    clip_value: float = setting(0.0, "value-function clip range (0: off)")
    ent_coef: float = setting(0.0, "entropy bonus weight (0: none, as CleanRL's continuous-action PPO)")
    vf_coef: float = setting(0.5, "value loss weight")
    aux_coef: float = setting(
        1.0,
        "weight of an auxiliary loss: the actor's latent also predicts tomorrow's price column of the state (each "
        "ticker's z-scored return), a dense supervised signal for the window LSTM (0: off, as in the paper; see "
        "docs/learning.md)",
    )
    forecast_days: int = setting(
        1,
        "days ahead the next-day loss predicts: the mean of the next K days' price columns (1: tomorrow's); with "
        "--forecast_skip the actor follows a forecast of the coming K days, an aim in front of tomorrow's target "
        "that moves less from day to day (docs/learning.md section 17)",
    )
    target_kl: float = setting(0.0, "stop the update's epochs early when approx KL exceeds this (0: off)")
    ema_decay: float = setting(
        0.0,
        "deploy an exponential moving average of the weights, updated after every update with this decay (0: off; "
        "0.99 remembers about 100 updates): validation, best.pt and every backtest use the average, training "
        "continues from the raw weights",
    )
    norm_reward: bool = setting(
        False, "divide rewards by the running std of the discounted return (as SB3's VecNormalize)"
    )
    noise_hold: int = setting(
        1,
        "hold each env's exploration noise for this many days (redrawn at episode starts): a fresh draw every day "
        "re-trades the whole book daily; held noise explores the same Gaussian with far fewer trades",
    )
    permute_tickers: bool = setting(
        False,
        "augmentation: each training episode shows the tickers in a fresh random order (the policy must find a "
        "stock's role in its numbers, not its column)",
    )

    @property
    def rollout_steps(self) -> int:
        """Env steps per worker per update: n_steps x num_envs."""
        return self.n_steps * self.num_envs

    @property
    def envs_per_minibatch(self) -> int:
        """Env columns in one minibatch."""
        return self.batch_size // self.n_steps

    @property
    def num_minibatches(self) -> int:
        return self.num_envs // self.envs_per_minibatch

    def validate(self) -> None:
        if self.num_episodes <= 0:
            raise UserError(f"--num_episodes must be positive, got {self.num_episodes}")
        _positive(self, "num_envs", "n_steps", "epochs", "batch_size", "gradient_accumulation_steps", "noise_hold")
        _positive(self, "forecast_days")
        if self.forecast_days >= self.n_steps:
            raise UserError(
                f"--forecast_days ({self.forecast_days}) must be shorter than a rollout (--n_steps {self.n_steps}): "
                "its targets are the rollout's own next states"
            )
        _positive(self, "learning_rate_clstm", "learning_rate_actor_critic", "gamma", "gae_lambda", "clip_coef")
        if self.batch_size % self.n_steps or self.rollout_steps % self.batch_size:
            raise UserError(
                f"--batch_size {self.batch_size} must be a multiple of --n_steps {self.n_steps} (minibatches are whole "
                f"env columns) and divide the rollout of {self.rollout_steps} steps (--n_steps x --num_envs)"
            )
        if self.envs_per_minibatch % self.gradient_accumulation_steps:
            raise UserError(
                f"--gradient_accumulation_steps {self.gradient_accumulation_steps} must divide the "
                f"{self.envs_per_minibatch} env columns of a minibatch"
            )
        for name in ("weight_decay", "aux_coef"):
            if not getattr(self, name) >= 0:
                raise UserError(f"--{name} must be 0 or more, got {getattr(self, name)}")
        if not 0 <= self.ema_decay < 1:
            raise UserError(f"--ema_decay must be in [0, 1), got {self.ema_decay}")


@dataclass(frozen=True)
class SystemConfig:
    """Processes, devices and speed: how the run is computed, never what it computes (but for float rounding)."""

    num_gpus: int | None = setting(None, "GPUs to use: default all visible, -1 all, 0 CPU only")
    num_workers: int = setting(1, "CPU worker processes when no GPU is used (gloo)")
    backend: str = setting(
        "auto", "process-group backend: auto (nccl on GPU, gloo on CPU), nccl or gloo", choices=("auto", "nccl", "gloo")
    )
    master_port: int = setting(0, "rendezvous port (0: MASTER_PORT if set, else a free port chosen by the parent)")
    env_device: str = setting(
        "auto", "where the vector env lives: auto (the worker's device), cpu or cuda", choices=("auto", "cpu", "cuda")
    )
    threads: int = setting(0, "torch threads per CPU worker (0: cores / workers)")
    mixed_precision: str = setting(
        "none", "autocast: none | bf16 | fp16 (fp16 uses a GradScaler; CUDA only)", choices=("none", "bf16", "fp16")
    )
    tf32: bool = setting(True, "allow TF32 matmuls on Ampere+ GPUs")
    compile: bool = setting(False, "torch.compile the model")
    window_kernel: str = setting(
        "auto",
        "how the CLSTM's window LSTM runs: shared (each distinct day's input projection computed once, "
        "hand-written recurrence and backward), fused (nn.LSTM over every dense window: cuDNN/oneDNN) or auto "
        "(shared on CPU, fused on CUDA)",
        choices=("auto", "shared", "fused"),
    )

    def validate(self) -> None:
        _positive(self, "num_workers")
        if not 0 <= self.master_port < 65536:
            raise UserError(f"--master_port must be in 0..65535, got {self.master_port}")


SECTIONS: dict[str, tuple[str, type]] = {
    "run": ("run and output", RunConfig),
    "data": ("data and the state", DataConfig),
    "env": ("environment", EnvConfig),
    "model": ("model", ModelConfig),
    "ppo": ("PPO", PPOConfig),
    "system": ("devices and speed", SystemConfig),
}
"""Section attribute -> (its heading in ``--help``, its dataclass), in the order ``--help`` shows them."""


def flag_name(f: Any) -> str:
    """The flag (and flat-dict key) of a section field: its name unless the field says otherwise."""
    return f.metadata.get("flag", f.name)


def _scalar_type(annotation: Any) -> type:
    if isinstance(annotation, str):
        annotation = eval(annotation, {"Union": Union})  # annotations are postponed strings
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation


@dataclass(frozen=True)
class Setting:
    """One setting as the command line and the flat dict see it."""

    flag: str  # the flag without dashes, and the key in the flat dict
    section: str  # the TrainConfig attribute holding it
    name: str  # its field name in that section
    default: Any
    help: str
    parse: Any  # str -> value: the field's scalar type or its own parser
    choices: tuple[str, ...] | None


def _settings() -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for section, (_title, cls) in SECTIONS.items():
        for f in fields(cls):
            flag = flag_name(f)
            if flag in out:
                raise TypeError(f"setting {flag} is declared twice ({out[flag].section} and {section})")
            parse = f.metadata.get("parse") or _scalar_type(f.type)
            out[flag] = Setting(
                flag, section, f.name, f.default, f.metadata.get("help", ""), parse, f.metadata.get("choices")
            )
    return out


SETTINGS: dict[str, Setting] = _settings()
"""Every setting by flag name, in ``--help`` order."""


@dataclass(frozen=True)
class TrainConfig:
    """All settings of a training run, by section (see the module docstring)."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    system: SystemConfig = field(default_factory=SystemConfig)

    def validate(self) -> TrainConfig:
        """Reject inconsistent settings with one clear line; return self. (`EnvConfig` checks itself when built.)"""
        for s in SETTINGS.values():  # choices, also for settings from a JSON file or a study spec
            value = getattr(getattr(self, s.section), s.name)
            if s.choices and value not in s.choices:
                raise UserError(f"--{s.flag} must be one of {', '.join(s.choices)}, got {value!r}")
        for section in (self.run, self.data, self.model, self.ppo, self.system):
            section.validate()
        if self.env.trade_gate and self.model.policy == "shared":
            raise UserError("--trade_gate needs two outputs per ticker; --policy shared has one")
        model = self.model.resolved()  # the forecast settings as the network is built with them
        if model.forecaster == "linear" and model.policy == "shared":
            raise UserError(
                "--forecaster linear has N x T x N weights, which ties a network to its tickers; --policy shared "
                "cannot use it"
            )
        if model.forecast_skip and model.forecaster == "head" and not self.ppo.aux_coef > 0:
            raise UserError(
                "--forecast_skip feeds the next-day head's prediction to the actor; it needs --aux_coef > 0"
            )
        if model.forecaster != "head" and not model.forecast_skip:
            raise UserError(
                f"--forecaster {model.forecaster} is what --forecast_skip follows; it needs --forecast_skip"
            )
        if model.forecast_only and (not model.forecast_skip or model.policy == "shared"):
            raise UserError(
                "--forecast_only sets the stocks' means from what --forecast_skip follows; it needs --forecast_skip "
                "and a network with tickers of its own (not --policy shared)"
            )
        if model.forecast_threshold and not model.forecast_only:
            raise UserError("--forecast_threshold lowers the means --forecast_only sets; it needs --forecast_only")
        return self

    # ------------------------------------------------------------------ the flat form
    def to_dict(self) -> dict[str, Any]:
        """``{flag: value}`` for every setting: what checkpoints, config.json and study specs hold."""
        return {s.flag: getattr(getattr(self, s.section), s.name) for s in SETTINGS.values()}

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> TrainConfig:
        """From a flat ``{flag: value}`` dict (missing settings take their defaults); unknown keys are refused."""
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}")
        by_section: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for flag, value in values.items():
            s = SETTINGS[flag]
            by_section[s.section][s.name] = value
        try:
            return cls(**{name: SECTIONS[name][1](**kw) for name, kw in by_section.items()})
        except TypeError as err:
            raise UserError(f"{source}: {err}") from None

    def with_settings(self, **values: Any) -> TrainConfig:
        """A copy with some settings changed, by flag name (``cfg.with_settings(seed=3, window=5)``)."""
        return TrainConfig.from_dict({**self.to_dict(), **values}, source="settings")

    @classmethod
    def from_checkpoint(cls, values: dict[str, Any], *, source: str = "checkpoint") -> TrainConfig:
        """The settings a checkpoint was trained with: settings added after it was written take the meaning
        they had then (`LEGACY`), not today's defaults."""
        return cls.from_dict({**LEGACY, **values}, source=source)

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        path = Path(path)
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"config file {path} is not valid JSON: {err}") from None
        if not isinstance(values, dict):
            raise UserError(f"config file {path} must hold a JSON object of settings")
        return cls.from_dict(values, source=str(path))


PAPER_BEHAVIOUR: dict[str, Any] = dict(
    price_features="level",  # the close itself in the state
    action_mode="shares",  # up to hmax shares per stock per day
    reward="value",  # the change of portfolio value in dollars x reward_scaling
    action_dist="gaussian",  # sb3's Gaussian, clipped by the env, with an unbounded log-std
    log_std_max=math.inf,
    skip=False,  # no shortcuts around the LSTMs
    aux_coef=0.0,  # no next-day loss
    execution="close",  # orders fill at the close the policy has just seen
    turbulence_exit_days=1,  # back in on the first calm day after a turbulence stop
    forecast_skip=False,  # the actor's means are the network's own (clstm, lstm and mlp follow a linear forecast)
    forecaster="head",
    forecast_only=False,
)
"""Where today's defaults differ from the paper's method: the ``paper`` preset keeps the paper's."""

LEGACY: dict[str, Any] = {**PAPER_BEHAVIOUR, "init_weights": "", "max_price_ratio": 0.0, "deploy": "best"}
"""What a setting meant in checkpoints and study specs written before it existed (the settings whose default has
changed since): the paper's behaviour, no warm start, no bad-tick check, and best.pt deployed."""

PRESETS: dict[str, dict[str, Any]] = {
    # Zou et al. 2022, Table 1 and the sweeps' winners (window 30, stage-2 LSTM 512, one layer); epochs, minibatch
    # and GAE lambda are sb3-contrib RecurrentPPO's defaults, which the paper used.
    "paper": dict(
        window=30, stage1_hidden=128, feature_dim=128, stage2_hidden=512, n_steps=128, epochs=10, batch_size=128,
        gamma=0.99, gae_lambda=0.95, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, max_grad_norm=0.5,
        learning_rate_clstm=3e-4, learning_rate_actor_critic=3e-4, adam_eps=1e-8, hmax=100,
        initial_amount=1_000_000.0, buy_cost_pct=1e-3, sell_cost_pct=1e-3, reward_scaling=1e-4, policy="clstm",
        portfolio_features="shares", **PAPER_BEHAVIOUR,
    ),
    # A first run that shows learning in about 40 s on one CPU core: a toy lead-lag market of docs/data.md (5
    # tickers; ticker i's shocks move ticker i+1 over the next days, IC 0.3, half-life 1 day) and the small
    # networks and schedule of docs/learning.md (benchmarks/learning_studies.sh); today's defaults otherwise.
    "demo": dict(
        data="synthetic:tickers=5,days=2520,signal_ic=0.3,signal_kind=lead_lag,signal_halflife=1", window=5,
        stage1_hidden=32, feature_dim=32, stage2_hidden=64, num_envs=32, n_steps=32, batch_size=256, epochs=4,
        episode_length=63, gamma=0.9, learning_rate_clstm=1e-3, learning_rate_actor_critic=1e-3, num_episodes=3000,
        log_every=500, threads=1,
    ),
}  # fmt: skip


def preset(name: str, **overrides: Any) -> TrainConfig:
    """A config from a named preset with overrides by flag name, e.g. ``preset("paper", num_envs=8)``."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return TrainConfig.from_dict({**PRESETS[name], **overrides}, source=f"preset {name}")
