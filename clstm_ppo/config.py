"""Every training setting, in typed sections; the presets; JSON and CLI round trips.

`TrainConfig` holds six sections (`SECTIONS`), each setting declared once with its default and help text
(`envs.config.setting`, CleanRL's ``Args`` idea: the command line documents itself); functions take the section they
use. A setting's flag is its field name (``--gamma`` is ``ppo.gamma``; the one exception, ``--data``, is
``data.source``), so flag names are unique across sections and one flat ``{flag: value}`` dict (`TrainConfig.to_dict`)
holds a whole config. Rarely-touched knobs have no flag (`CONFIG_ONLY`, docs/training.md lists them); derived values
are properties of their section.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from clstm_ppo import migrate
from envs.config import EnvConfig, setting
from envs.errors import UserError
from envs.source_spec import alpaca_options, split_source
from envs.state import DEFAULT_PRICE_MODE, INDICATORS, MAX_PRICE_RATIO, PRICE_MODES, column_of, indicator_name_problem

POLICIES = ("clstm", "lstm", "mlp", "shared")
"""The policy families (one module each under `clstm_ppo.agent`): the paper's cascaded LSTM, stage 2 alone on the
current day, no recurrence, one encoder shared by every ticker."""

ACTION_DISTS = ("gaussian", "tanh")
"""The policy's distribution: the paper's Gaussian (samples clipped to [-1, 1] by the env), or a Gaussian squashed by
tanh (log-probabilities corrected)."""

OUTPUT_SETTINGS = ("run_name", "checkpoint_dir", "progress", "tensorboard", "track", "threads")
"""Settings that say where a run writes, how it reports and on how many threads: never what it computes (but the
order of floating-point sums). A study sets them for its cells, and the trials ledger does not tell configurations
apart by them."""


def parse_seeds(text: str) -> list[int]:
    """``"1-4,7,9-10"`` -> [1, 2, 3, 4, 7, 9, 10] (order kept, duplicates dropped)."""
    seeds: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, sep, hi = part.partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if last < first:
                raise ValueError(part)
            seeds += [s for s in range(first, last + 1) if s not in seeds]
    except ValueError:
        raise UserError(f"--seeds {text!r}: expected numbers and ranges like 1-8 or 1,2,5-7") from None
    if not seeds:
        raise UserError("--seeds names no seed")
    return seeds


def format_seeds(seeds: list[int]) -> str:
    """[1, 2, 3, 4, 7, 9, 10] -> ``"1-4,7,9-10"`` (sorted): `parse_seeds`'s inverse."""
    runs: list[list[int]] = []
    for s in sorted(set(seeds)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _positive(section: object, *names: str) -> None:
    for name in names:
        if not getattr(section, name) > 0:
            raise UserError(f"--{name} must be positive, got {getattr(section, name)}")


def parse_track(text: str) -> str:
    """``--track``: none, wandb, wandb:PROJECT or wandb:ENTITY/PROJECT (`tracking_target`); the text itself."""
    tracking_target(text)
    return text


def tracking_target(track: str) -> tuple[str, str, str]:
    """``(tracker, project, entity)`` of a ``--track`` value: ``wandb`` logs to project clstm-ppo of the user's
    default entity, ``wandb:PROJECT`` to another project, ``wandb:ENTITY/PROJECT`` to a team's; UserError otherwise."""
    name, _, where = str(track).partition(":")
    if name not in ("none", "wandb") or (name == "none" and where):
        raise UserError(f"--track must be none, wandb, wandb:PROJECT or wandb:ENTITY/PROJECT, got {track!r}")
    entity, _, project = where.rpartition("/")
    if where and (not project or where.count("/") > 1):
        raise UserError(f"--track {track}: name the project as wandb:PROJECT or wandb:ENTITY/PROJECT")
    return name, project or "clstm-ppo", entity


@dataclass(frozen=True)
class RunConfig:
    """Names, seeds, resuming, checkpoints and logs."""

    run_name: str = setting("", "run folder name under --checkpoint_dir (default: <policy>-<timestamp>)")
    checkpoint_dir: str = setting("checkpoints", "folder holding run folders (checkpoints, metrics.jsonl, config.json)")
    seed: int = setting(
        1,
        "base seed; rank r, env i uses seed + r * num_envs + i; several (1-8, 1,3,5-7): one run per seed in "
        "<run>/seed-<s>, trained as one batch in one process",
    )
    resume: str = setting("", "resume from 'latest', 'best' or a checkpoint PATH (empty: fresh run)")
    init_weights: str = setting(
        "",
        "start from the weights of this checkpoint instead of a random init (same network and tickers); unlike "
        "resume, counters, optimizer and environments start fresh: a walk-forward study's warm start",
        cli=False,
    )
    save_every: int = setting(0, "also keep episode_<n>.pt every this many finished episodes (0: only latest/best)")
    checkpoint_every: int = setting(
        10, "write latest.pt every this many updates (and at the end or on a stop)", cli=False
    )
    eval_every: int = setting(
        10, "score the deterministic policy on the validation split every this many updates (best.pt)"
    )
    deploy: str = setting(
        "last",
        "the checkpoint a run deploys (its last line, a study's trades, the walk-forward warm start): last = "
        "latest.pt, the final weights; best = best.pt, the highest validation score",
        choices=("best", "last"),
    )
    log_every: int = setting(10, "log a line every this many finished episodes (all workers together)")
    tensorboard: bool = setting(False, "write TensorBoard scalars to the run folder (needs the tensorboard package)")
    progress: bool = setting(True, "show a progress bar when stdout is a terminal")
    track: str = setting(
        "none",
        "experiment tracking: wandb, wandb:PROJECT or wandb:ENTITY/PROJECT sends the config and the scalars to "
        "Weights & Biases (rank 0; pip install 'clstm-ppo[wandb]'; WANDB_MODE=offline logs locally)",
        parse=parse_track,
    )
    max_bad_updates: int = setting(
        5, "stop after this many consecutive updates with NaN/inf loss or gradients", cli=False
    )
    dry_run: bool = setting(False, "print the resolved config and world layout, then exit")

    def validate(self) -> None:
        _positive(self, "checkpoint_every", "eval_every", "max_bad_updates")
        tracking_target(self.track)


@dataclass(frozen=True)
class DataConfig:
    """Where the market comes from, its dates and splits, and what a day's state holds."""

    source: str = setting(
        "synthetic",
        "synthetic[:k=v,...] | csv:PATH | parquet:PATH | alpaca[:feed=iex|sip,adjustment=raw|split|dividend|all,"
        "timeframe=1Day] (docs/data.md)",
        flag="data",
    )
    tickers: str = setting("", "comma-separated tickers to use (default: all in the data)")
    start: str = setting("", "first date of data to load (YYYY-MM-DD)")
    end: str = setting("", "last date of data to load (YYYY-MM-DD)")
    train_end: str = setting("", "last training day (default: 70% of days)")
    validation_end: str = setting("", "last validation day (default: 85% of days; the rest is test)")
    test_end: str = setting("", "last test day (default: the end of the data)")
    data_url: str = setting(
        "", "Alpaca data endpoint override, e.g. a proxy (default: ALPACA_DATA_URL or Alpaca's)", cli=False
    )
    data_cache_dir: str = setting("data_cache/alpaca", "where downloaded Alpaca bars are cached", cli=False)
    refresh_data: bool = setting(False, "download Alpaca bars again even when cached")
    max_price_ratio: float = setting(
        MAX_PRICE_RATIO,
        "refuse data where a close is more than this many times the previous close, or less than its 1/this "
        "(a bad tick); 0 allows any jump",
        cli=False,
    )
    gap_policy: str = setting(
        "fail", "tickers with missing dates: fail | intersect | ffill", choices=("fail", "intersect", "ffill")
    )
    window: int = setting(30, "days of history in each observation (T)")
    price_features: str = setting(
        DEFAULT_PRICE_MODE,
        "price column of the state: return (daily log return, MACD / close: stationary) or level (the close "
        "itself, as in the paper)",
        choices=PRICE_MODES,
    )
    indicators: str = setting(
        ",".join(INDICATORS),
        f"technical indicators in each day's state, comma-separated from {', '.join(INDICATORS)}, and col:NAME for "
        "a numeric column NAME of the data file (a forecast, a factor); 'none' leaves cash, prices and holdings only",
    )
    use_turbulence: bool = setting(
        False,
        "the paper's turbulence stop: liquidate and block buys when turbulence >= the 90th training percentile "
        "(off by default: it cost buy-and-hold Sharpe on every real data set, docs/training.md)",
    )

    @property
    def ticker_list(self) -> list[str] | None:
        return [t.strip() for t in self.tickers.split(",") if t.strip()] or None

    @property
    def indicator_list(self) -> tuple[str, ...]:
        """The ``--indicators`` as names (empty for 'none')."""
        if self.indicators.strip().lower() == "none":
            return ()
        names = (n.strip() for n in self.indicators.split(","))
        return tuple(n if column_of(n) is not None else n.lower() for n in names if n)

    @property
    def alpaca_options(self) -> dict[str, str]:
        """An ``alpaca`` source's feed, adjustment and timeframe (`envs.source_spec.alpaca_options`)."""
        return alpaca_options(self.source)

    def validate(self) -> None:
        _positive(self, "window")
        if self.max_price_ratio != 0 and not self.max_price_ratio > 1:
            raise UserError(f"--max_price_ratio must be > 1, or 0 to allow any jump; got {self.max_price_ratio:g}")
        names = self.indicator_list
        given = self.indicators.strip().lower() == "none" or names
        problem = indicator_name_problem(names) if given else "nothing given"
        if problem:
            raise UserError(
                f"--indicators {self.indicators!r}: {problem}; give distinct names from {', '.join(INDICATORS)} "
                "or col:NAME (a column of the data file), or none"
            )
        if split_source(self.source)[0] == "alpaca":
            alpaca_options(self.source)  # names an unknown option or value


@dataclass(frozen=True)
class ModelConfig:
    """The policy network (`clstm_ppo.agent`)."""

    policy: str = setting(
        "clstm",
        "clstm (the paper's cascaded LSTM) | lstm (stage 2 on the current day) | mlp (no recurrence) | shared (one "
        "encoder for every ticker's window: no weight depends on the number of tickers)",
        choices=POLICIES,
    )
    stage1_hidden: int = setting(128, "stage-1 LSTM hidden size (the window LSTM)")
    feature_dim: int = setting(128, "stage-1 output features")
    stage2_hidden: int = setting(512, "stage-2 actor and critic LSTM hidden size (MLP width for --policy mlp)")
    init_log_std: float = setting(
        -2.0,
        "initial log standard deviation of the Gaussian policy (before the tanh squash): -2 is a noise of std 0.14",
        cli=False,
    )
    action_dist: str = setting(
        "tanh",
        "policy distribution: gaussian (the paper's: samples clipped to [-1, 1] by the env) or tanh (samples "
        "squashed by tanh, log-probabilities corrected; entropy estimated from samples)",
        choices=ACTION_DISTS,
        cli=False,
    )
    log_std_max: float = setting(
        0.0,
        "upper bound of the policy's log standard deviation (inf: unbounded, the paper's; with a bound the lower "
        "one is -5)",
        cli=False,
    )
    norm_obs: bool = setting(
        False,
        "normalise each state number by running mean / std over the training rollouts (kept in the checkpoint and "
        "used unchanged by backtest and trade)",
    )

    def validate(self) -> None:
        _positive(self, "stage1_hidden", "feature_dim", "stage2_hidden")


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
    scale_lr: bool = setting(False, "multiply both learning rates by the world size", cli=False)
    anneal_lr: bool = setting(False, "anneal learning rates linearly to 0 over the run")
    adam_eps: float = setting(1e-8, "Adam epsilon", cli=False)
    weight_decay: float = setting(
        0.0, "decoupled weight decay (AdamW) of the weight matrices; 0: plain Adam", cli=False
    )
    max_grad_norm: float = setting(0.5, "global gradient-norm clip")
    gamma: float = setting(0.99, "discount factor")
    gae_lambda: float = setting(0.95, "GAE lambda")
    norm_adv: bool = setting(True, "normalise advantages with statistics over all workers' rollouts", cli=False)
    clip_coef: float = setting(0.2, "PPO clip range")
    clip_value: float = setting(0.0, "value-function clip range (0: off)", cli=False)
    ent_coef: float = setting(0.0, "entropy bonus weight (0: none, as CleanRL's continuous-action PPO)")
    vf_coef: float = setting(0.5, "value loss weight")
    target_kl: float = setting(
        0.01, "stop the update's epochs early when the mean approx KL of an epoch exceeds this (0: off)"
    )
    norm_reward: bool = setting(
        False, "divide rewards by the running std of the discounted return (as SB3's VecNormalize)"
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
        _positive(self, "num_episodes", "num_envs", "n_steps", "epochs", "batch_size", "gradient_accumulation_steps")
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
        if not self.weight_decay >= 0:
            raise UserError(f"--weight_decay must be 0 or more, got {self.weight_decay}")


@dataclass(frozen=True)
class SystemConfig:
    """Processes, devices and speed: how the run is computed, never what it computes (but for float rounding)."""

    num_gpus: int | None = setting(None, "GPUs to use: default all visible, -1 all, 0 CPU only")
    num_workers: int = setting(1, "CPU worker processes when no GPU is used (gloo)")
    backend: str = setting(
        "auto",
        "process-group backend: auto (nccl on GPU, gloo on CPU), nccl or gloo",
        choices=("auto", "nccl", "gloo"),
        cli=False,
    )
    master_port: int = setting(
        0, "rendezvous port (0: MASTER_PORT if set, else a free port chosen by the parent)", cli=False
    )
    env_device: str = setting(
        "auto",
        "where the vector env lives: auto (the worker's device), cpu or cuda",
        choices=("auto", "cpu", "cuda"),
        cli=False,
    )
    threads: int = setting(0, "torch threads per CPU worker (0: cores / workers)")
    mixed_precision: str = setting(
        "none", "autocast: none | bf16 | fp16 (fp16 uses a GradScaler; CUDA only)", choices=("none", "bf16", "fp16")
    )
    tf32: bool = setting(True, "allow TF32 matmuls on Ampere+ GPUs", cli=False)
    compile: bool = setting(False, "torch.compile the model")
    window_kernel: str = setting(
        "auto",
        "how the CLSTM's window LSTM runs: shared (each distinct day's input projection computed once, "
        "hand-written recurrence and backward), fused (nn.LSTM over every dense window: cuDNN/oneDNN) or auto "
        "(shared on CPU, fused on CUDA)",
        choices=("auto", "shared", "fused"),
        cli=False,
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


def scalar_type(annotation: Any) -> type:
    """The scalar type of a setting's annotation (``int | None`` -> int)."""
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
    cli: bool  # a command-line flag (False: --config files and presets only)


def _settings() -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for section, (_title, cls) in SECTIONS.items():
        for f in fields(cls):
            flag = f.metadata.get("flag", f.name)  # flag and flat-dict key: the name unless the field says otherwise
            if flag in out:
                raise TypeError(f"setting {flag} is declared twice ({out[flag].section} and {section})")
            meta, parse = f.metadata, f.metadata.get("parse") or scalar_type(f.type)
            help_, choices, cli = meta.get("help", ""), meta.get("choices"), meta.get("cli", True)
            out[flag] = Setting(flag, section, f.name, f.default, help_, parse, choices, cli)
    return out


SETTINGS: dict[str, Setting] = _settings()
"""Every setting by flag name, in ``--help`` order."""

CONFIG_ONLY: tuple[str, ...] = tuple(s.flag for s in SETTINGS.values() if not s.cli)
"""The settings without a flag (a ``--config`` file or a preset sets them)."""


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
        """Reject inconsistent settings with one clear line; return self. Every rule between settings lives here
        (`EnvConfig` checks its own when built)."""
        for s in SETTINGS.values():  # choices, also for settings from a JSON file or a study spec
            value = getattr(getattr(self, s.section), s.name)
            if s.choices and value not in s.choices:
                raise UserError(f"--{s.flag} must be one of {', '.join(s.choices)}, got {value!r}")
        for section in (self.run, self.data, self.model, self.ppo, self.system):
            section.validate()
        if self.model.policy == "shared" and self.model.norm_obs:
            raise UserError(
                "--norm_obs keeps statistics per state number, which ties a network to its tickers; "
                "--policy shared cannot use it"
            )
        if self.model.log_std_max <= -5:
            raise UserError(f"log_std_max must be above the lower bound -5, got {self.model.log_std_max:g}")
        return self

    # ------------------------------------------------------------------ the flat form
    def to_dict(self) -> dict[str, Any]:
        """``{flag: value}`` for every setting: what checkpoints, config.json and study specs hold."""
        return {s.flag: getattr(getattr(self, s.section), s.name) for s in SETTINGS.values()}

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> TrainConfig:
        """From a flat ``{flag: value}`` dict of this or an earlier version (`clstm_ppo.migrate.settings`; missing
        settings take their defaults); unknown keys are refused."""
        values = _known_settings(values, source)
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


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """The ``{flag: value}`` settings a JSON file names, as this version reads them (`clstm_ppo.migrate.settings`),
    and only those: a ``--config`` file overrides the settings it names and leaves the rest to the preset or the
    defaults. UserError naming the file for a missing or malformed file or an unknown setting."""
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"config file {path} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise UserError(f"config file {path} must hold a JSON object of settings")
    return _known_settings(values, str(path))


def _known_settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` as this version reads them (`clstm_ppo.migrate.settings`); UserError naming unknown settings."""
    values = migrate.settings(values, source)
    if unknown := sorted(set(values) - set(SETTINGS)):
        raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}")
    return values


PAPER_BEHAVIOUR: dict[str, Any] = dict(
    price_features="level",  # the close itself in the state
    action_mode="shares",  # up to hmax shares per stock per day
    reward="value",  # the change of portfolio value in dollars x reward_scaling
    action_dist="gaussian",  # sb3's Gaussian, clipped by the env, with an unbounded log-std
    log_std_max=math.inf,
    execution="close",  # orders fill at the close the policy has just seen
    turnover_penalty=0.0,  # the reward is what the portfolio earns, nothing more
    target_kl=0.0,  # sb3-contrib RecurrentPPO's default: no KL limit on the update's epochs
    use_turbulence=True,  # sell everything when turbulence passes the training days' 90th percentile
)
"""Where today's defaults differ from the paper's method: the ``paper`` preset keeps the paper's
(docs/training.md has the table, with the evidence for each difference)."""

PRESETS: dict[str, dict[str, Any]] = {
    # Zou et al. 2022, Table 1 and the sweeps' winners (window 30, stage-2 LSTM 512, one layer); epochs, minibatch
    # and GAE lambda are sb3-contrib RecurrentPPO's defaults, which the paper used.
    "paper": dict(
        # the networks
        window=30,
        stage1_hidden=128,
        feature_dim=128,
        stage2_hidden=512,
        # PPO
        n_steps=128,
        epochs=10,
        batch_size=128,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.2,
        vf_coef=0.5,
        ent_coef=0.01,
        max_grad_norm=0.5,
        learning_rate_clstm=3e-4,
        learning_rate_actor_critic=3e-4,
        adam_eps=1e-8,
        # the trading env, the policy network and its state
        hmax=100,
        initial_amount=1_000_000.0,
        buy_cost_pct=1e-3,
        sell_cost_pct=1e-3,
        reward_scaling=1e-4,
        policy="clstm",
        portfolio_features="shares",
        **PAPER_BEHAVIOUR,
        init_log_std=-0.5,  # not stated in the paper (sb3's default is 0): 0.1.0's, so the preset trains as it did
    ),
    # A first run in under a minute on one CPU core: a small clstm on a toy lead-lag market (docs/data.md: generator
    # 3, 6 tickers, tickers 1, 3 and 5 follow 0, 2 and 4 at IC 0.3 with a half-life of 5 days, far stronger than
    # anything in real daily data), trained on 16 draws of that market (train_draws=16) so that it learns the signal,
    # not one path; no turnover penalty and no KL limit (chosen on real data, where there is no signal to trade), a 1%
    # band, exploration noise of log-std -1. Chosen on seeds 201-208; its claim is measured on seeds 101-108
    # (docs/learning.md). No turbulence stop (today's default). Cash and holdings enter the state as fractions of the
    # portfolio's value (issue 69): share counts and cash in units of the initial amount drift out of the range of
    # 63-day training episodes over a year's evaluation, and some seeds then froze into one stock.
    "demo": dict(
        data="synthetic:tickers=6,days=2520,signal_ic=0.3,signal_kind=lead_lag,signal_halflife=5,train_draws=16",
        # a small network
        window=5,
        stage1_hidden=32,
        feature_dim=32,
        stage2_hidden=64,
        # rollouts and PPO
        num_envs=64,
        n_steps=16,
        batch_size=512,
        epochs=4,
        episode_length=63,
        gamma=0.9,
        learning_rate_clstm=1e-3,
        learning_rate_actor_critic=1e-3,
        # the run's length, logging and threads
        num_episodes=3000,
        log_every=500,
        threads=1,
        # the choices the paragraph above explains
        turnover_penalty=0.0,
        target_kl=0.0,
        rebalance_band=0.01,
        init_log_std=-1.0,
        portfolio_features="weights",
    ),
}


def preset(name: str, **overrides: Any) -> TrainConfig:
    """A config from a named preset with overrides by flag name, e.g. ``preset("paper", num_envs=8)``."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return TrainConfig.from_dict({**PRESETS[name], **overrides}, source=f"preset {name}")
