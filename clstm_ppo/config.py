"""Every training setting in one dataclass; the paper preset; JSON and CLI round trips.

Each field carries its help text in ``metadata["help"]`` so the command line documents itself
(CleanRL's ``Args`` idea). Derived values (rollout size, minibatches) are computed once by
`TrainConfig.validate`, which also rejects inconsistent settings with one clear line.
"""

from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from envs.errors import UserError
from envs.state import (
    ACTION_MODES,
    DEFAULT_PRICE_MODE,
    INDICATORS,
    MAX_PRICE_RATIO,
    PORTFOLIO_FEATURES,
    PRICE_MODES,
    REWARDS,
)


def _f(default: Any, help_: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help_, **kw})


@dataclass
class TrainConfig:
    """All settings of a training run (one worker's view; counts are per worker unless stated)."""

    # --- run and output
    run_name: str = _f("", "run folder name under --checkpoint_dir (default: <policy>-<timestamp>)")
    checkpoint_dir: str = _f("checkpoints", "folder holding run folders (checkpoints, metrics.jsonl, config.json)")
    seed: int = _f(1, "base seed; rank r, env i uses seed + r * num_envs + i")
    resume: str = _f("", "resume from 'latest', 'best' or a checkpoint PATH (empty: fresh run)")
    init_weights: str = _f(
        "",
        "start from the weights of this checkpoint instead of a random init (same model "
        "settings and tickers); unlike --resume, counters, optimizer and environments start "
        "fresh: a walk-forward study's warm start",
    )
    save_every: int = _f(0, "also keep episode_<n>.pt every this many finished episodes (0: only latest/best)")
    checkpoint_every: int = _f(10, "write latest.pt every this many updates (and always at the end or on a stop)")
    eval_every: int = _f(10, "score the deterministic policy on the validation split every this many updates (best.pt)")
    log_every: int = _f(10, "log a line every this many finished episodes (all workers together)")
    tensorboard: bool = _f(False, "write TensorBoard scalars to the run folder (needs the tensorboard package)")
    progress: bool = _f(True, "show a progress bar when stdout is a terminal")
    track: str = _f(
        "none",
        "experiment tracking: wandb sends the config and the TensorBoard scalars to Weights & Biases "
        "(rank 0; needs pip install 'clstm-ppo[wandb]'; WANDB_MODE=offline logs locally)",
        choices=("none", "wandb"),
    )
    wandb_project: str = _f("clstm-ppo", "W&B project of --track wandb (the run is named after the run folder)")
    wandb_entity: str = _f("", "W&B team or user of --track wandb (default: your W&B default entity)")
    # --- distributed layout
    num_gpus: int | None = _f(None, "GPUs to use: default all visible, -1 all, 0 CPU only")
    num_workers: int = _f(1, "CPU worker processes when no GPU is used (gloo)")
    backend: str = _f("auto", "process-group backend: auto (nccl on GPU, gloo on CPU), nccl or gloo")
    master_port: int = _f(0, "rendezvous port (0: MASTER_PORT if set, else a free port chosen by the parent)")
    # --- data
    data: str = _f("synthetic", "synthetic[:k=v,...] | csv:PATH | parquet:PATH | alpaca")
    tickers: str = _f("", "comma-separated tickers to use (default: all in the data)")
    start: str = _f("", "first date of data to load (YYYY-MM-DD)")
    end: str = _f("", "last date of data to load (YYYY-MM-DD)")
    train_end: str = _f("", "last training day (default: 70% of days)")
    validation_end: str = _f("", "last validation day (default: 85% of days; the rest is test)")
    test_end: str = _f("", "last test day (default: the end of the data)")
    alpaca_feed: str = _f("iex", "Alpaca feed: iex (free plan) or sip", choices=("iex", "sip"))
    alpaca_adjustment: str = _f(
        "all", "Alpaca price adjustment: raw | split | dividend | all", choices=("raw", "split", "dividend", "all")
    )
    alpaca_timeframe: str = _f("1Day", "Alpaca bar timeframe (1Day; intraday e.g. 1Hour, 15Min)")
    data_url: str = _f("", "Alpaca data endpoint override, e.g. a proxy (default: ALPACA_DATA_URL or Alpaca's)")
    data_cache_dir: str = _f("data_cache/alpaca", "where downloaded Alpaca bars are cached")
    refresh_data: bool = _f(False, "download Alpaca bars again even when cached")
    max_price_ratio: float = _f(
        MAX_PRICE_RATIO,
        "refuse data where a close is more than this many times the previous close, "
        "or less than its 1/this (a bad tick); 0 allows any jump",
    )
    gap_policy: str = _f(
        "fail", "tickers with missing dates: fail | intersect | ffill", choices=("fail", "intersect", "ffill")
    )
    # --- environment
    window: int = _f(30, "days of history in each observation (T)")
    hmax: int = _f(100, "maximum shares traded per stock per day")
    initial_amount: float = _f(1_000_000.0, "starting cash in dollars")
    buy_cost_pct: float = _f(1e-3, "buy cost as a fraction of traded value")
    sell_cost_pct: float = _f(1e-3, "sell cost as a fraction of traded value")
    reward_scaling: float = _f(1e-4, "reward = change of portfolio value in dollars x this")
    episode_length: str = _f("252", "trading days per episode, or 'full' for the whole split")
    price_features: str = _f(
        DEFAULT_PRICE_MODE,
        "price column of the state: return (daily log return, MACD / close: "
        "stationary) or level (the close itself, as in the paper)",
        choices=PRICE_MODES,
    )
    indicators: str = _f(
        ",".join(INDICATORS),
        "technical indicators in each day's state, comma-separated from "
        f"{', '.join(INDICATORS)}; 'none' leaves cash, prices and holdings only",
    )
    portfolio_features: str = _f(
        "shares",
        "cash and holdings in the state: shares (cash / initial amount and "
        "shares / 1,000, as in the paper) or weights (fractions of the portfolio value)",
        choices=PORTFOLIO_FEATURES,
    )
    action_mode: str = _f(
        "weights",
        "what an action means: shares (buy or sell up to --hmax shares per stock per day, "
        "the paper's) or weights (the target portfolio: softmax of 5 x action over the stocks and a "
        "cash logit 0, reached by trading)",
        choices=ACTION_MODES,
    )
    rebalance_band: float = _f(
        0.01,
        "with --action_mode weights: trade a stock only when its order is worth more than "
        "this fraction of the portfolio value",
    )
    reward: str = _f(
        "log_return",
        "value: change of portfolio value in dollars x --reward_scaling (the paper's); "
        "log_return: 100 x the day's log return of the portfolio",
        choices=REWARDS,
    )
    use_turbulence: bool = _f(True, "liquidate and block buys when turbulence >= the 90th training percentile")
    # --- model
    policy: str = _f(
        "clstm",
        "clstm (paper) | lstm (stage 2 on the current day) | mlp (no recurrence)",
        choices=("clstm", "lstm", "mlp"),
    )
    stage1_hidden: int = _f(128, "stage-1 LSTM hidden size")
    feature_dim: int = _f(128, "stage-1 output features")
    stage2_hidden: int = _f(512, "stage-2 actor and critic LSTM hidden size (MLP width for --policy mlp)")
    skip: bool = _f(
        True,
        "shortcuts around the LSTMs: clstm's stage 1 also sees today's state, and the heads of "
        "clstm/lstm also see the stage-1 features (off: the paper's network)",
    )
    # --- PPO
    num_episodes: int = _f(10_000, "stop after this many finished episodes, counted over all workers")
    num_envs: int = _f(16, "parallel environments per worker")
    n_steps: int = _f(128, "rollout length per environment per update")
    epochs: int = _f(10, "PPO epochs per update")
    batch_size: int = _f(512, "PPO minibatch per worker in env steps (whole env columns: a multiple of n_steps)")
    learning_rate_clstm: float = _f(3e-4, "Adam learning rate of stage 1 (the window LSTM)")
    learning_rate_actor_critic: float = _f(3e-4, "Adam learning rate of stage 2 and the heads")
    scale_lr: bool = _f(False, "multiply both learning rates by the world size")
    anneal_lr: bool = _f(False, "anneal learning rates linearly to 0 over the run")
    gamma: float = _f(0.99, "discount factor")
    gae_lambda: float = _f(0.95, "GAE lambda")
    clip_coef: float = _f(0.2, "PPO clip range")
    clip_value: float = _f(0.0, "value-function clip range (0: off)")
    ent_coef: float = _f(0.0, "entropy bonus weight (0: none, as CleanRL's continuous-action PPO)")
    vf_coef: float = _f(0.5, "value loss weight")
    aux_coef: float = _f(
        1.0,
        "weight of an auxiliary loss: the actor's latent also predicts tomorrow's price column of "
        "the state (each ticker's z-scored return), a dense supervised signal for the window "
        "LSTM (0: off, as in the paper; see docs/learning.md)",
    )
    max_grad_norm: float = _f(0.5, "global gradient-norm clip")
    weight_decay: float = _f(0.0, "decoupled weight decay (AdamW) of the weight matrices; 0: plain Adam")
    norm_obs: bool = _f(
        False,
        "normalise each state number by running mean / std over the training rollouts "
        "(kept in the checkpoint and used unchanged by backtest and trade)",
    )
    norm_reward: bool = _f(False, "divide rewards by the running std of the discounted return (as SB3's VecNormalize)")
    permute_tickers: bool = _f(
        False,
        "augmentation: each training episode shows the tickers in a fresh random order "
        "(the policy must find a stock's role in its numbers, not its column)",
    )
    target_kl: float = _f(0.0, "stop the update's epochs early when approx KL exceeds this (0: off)")
    norm_adv: bool = _f(True, "normalise advantages with statistics over all workers' rollouts")
    adam_eps: float = _f(1e-8, "Adam epsilon")
    init_log_std: float = _f(-0.5, "initial log standard deviation of the Gaussian policy")
    action_dist: str = _f(
        "tanh",
        "policy distribution: gaussian (samples clipped to [-1, 1] by the env) or tanh "
        "(samples squashed by tanh, log-probabilities corrected; entropy estimated from samples)",
        choices=("gaussian", "tanh"),
    )
    log_std_max: float = _f(
        0.0, "upper bound of the policy's log standard deviation (inf: unbounded; with a bound the lower one is -5)"
    )
    # --- speed
    mixed_precision: str = _f(
        "none", "autocast: none | bf16 | fp16 (fp16 uses a GradScaler; CUDA only)", choices=("none", "bf16", "fp16")
    )
    gradient_accumulation_steps: int = _f(
        1, "split each minibatch into this many micro-batches (no_sync on all but the last)"
    )
    compile: bool = _f(False, "torch.compile the model")
    window_kernel: str = _f(
        "auto",
        "how the CLSTM's window LSTM runs: shared (each distinct day's input projection "
        "computed once, hand-written recurrence and backward), fused (nn.LSTM over every dense window: "
        "cuDNN/oneDNN) or auto (shared on CPU, fused on CUDA)",
        choices=("auto", "shared", "fused"),
    )
    tf32: bool = _f(True, "allow TF32 matmuls on Ampere+ GPUs")
    env_device: str = _f("auto", "where the vector env lives: auto (the worker's device), cpu or cuda")
    threads: int = _f(0, "torch threads per CPU worker (0: cores / workers)")
    max_bad_updates: int = _f(5, "stop after this many consecutive updates with NaN/inf loss or gradients")
    # --- misc
    dry_run: bool = _f(False, "print the resolved config and world layout, then exit")

    # ------------------------------------------------------------------ derived values
    @property
    def episode_days(self) -> int | None:
        """Episode length in trading days; None means the whole split."""
        return None if self.episode_length == "full" else int(self.episode_length)

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

    @property
    def indicator_list(self) -> tuple[str, ...]:
        """The ``--indicators`` as names (empty for 'none')."""
        if self.indicators.strip().lower() == "none":
            return ()
        return tuple(n.strip().lower() for n in self.indicators.split(",") if n.strip())

    @property
    def ticker_list(self) -> list[str] | None:
        names = [t.strip() for t in self.tickers.split(",") if t.strip()]
        return names or None

    def validate(self) -> TrainConfig:
        """Reject inconsistent settings with one clear line; return self."""
        if self.num_episodes <= 0:
            raise UserError(f"--num_episodes must be positive, got {self.num_episodes}")
        for name in (
            "checkpoint_every",
            "eval_every",
            "num_envs",
            "n_steps",
            "epochs",
            "batch_size",
            "window",
            "hmax",
            "num_workers",
            "gradient_accumulation_steps",
            "stage1_hidden",
            "feature_dim",
            "stage2_hidden",
        ):
            if getattr(self, name) <= 0:
                raise UserError(f"--{name} must be positive, got {getattr(self, name)}")
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
        if self.episode_length != "full":
            try:
                days = int(self.episode_length)
            except ValueError:
                raise UserError(
                    f"--episode_length must be a number of days or 'full', got {self.episode_length!r}"
                ) from None
            if days < 2:
                raise UserError(f"--episode_length must be at least 2 days, got {days}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise UserError(f"--backend must be auto, nccl or gloo, got {self.backend!r}")
        if self.env_device not in ("auto", "cpu", "cuda"):
            raise UserError(f"--env_device must be auto, cpu or cuda, got {self.env_device!r}")
        if not 0 <= self.master_port < 65536:
            raise UserError(f"--master_port must be in 0..65535, got {self.master_port}")
        for name in ("learning_rate_clstm", "learning_rate_actor_critic", "gamma", "gae_lambda", "clip_coef"):
            if not getattr(self, name) > 0:
                raise UserError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.max_price_ratio != 0 and not self.max_price_ratio > 1:
            raise UserError(f"--max_price_ratio must be > 1, or 0 to allow any jump; got {self.max_price_ratio:g}")
        if self.initial_amount <= 0:
            raise UserError(f"--initial_amount must be positive, got {self.initial_amount}")
        unknown = [n for n in self.indicator_list if n not in INDICATORS]
        given = self.indicators.strip().lower() == "none" or self.indicator_list
        if unknown or not given or len(set(self.indicator_list)) < len(self.indicator_list):
            raise UserError(
                f"--indicators {self.indicators!r}: give distinct names from {', '.join(INDICATORS)}, or none"
            )
        if not self.weight_decay >= 0:
            raise UserError(f"--weight_decay must be 0 or more, got {self.weight_decay}")
        if not self.aux_coef >= 0:
            raise UserError(f"--aux_coef must be 0 or more, got {self.aux_coef}")
        return self

    # ------------------------------------------------------------------ serialisation
    @classmethod
    def field_types(cls) -> dict[str, type]:
        """Each setting's scalar type (``int | None`` -> int): what a flag or a ``--vary`` value is parsed as."""
        out = {}
        for f in fields(cls):
            annotation = f.type
            if isinstance(annotation, str):
                annotation = eval(annotation, {"Union": Union})  # annotations are postponed strings
            if get_origin(annotation) in (Union, types.UnionType):
                annotation = next(a for a in get_args(annotation) if a is not type(None))
            out[f.name] = annotation
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_checkpoint(cls, values: dict[str, Any], *, source: str = "checkpoint") -> TrainConfig:
        """The settings a checkpoint was trained with: settings added after it was written take the meaning
        they had then (`LEGACY_SETTINGS`), not today's defaults."""
        return cls.from_dict({**LEGACY_SETTINGS, **values}, source=source)

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


LEGACY_SETTINGS: dict[str, Any] = {
    "action_mode": "shares",
    "rebalance_band": 0.01,
    "reward": "value",
    "action_dist": "gaussian",
    "log_std_max": float("inf"),
    "init_weights": "",
    "max_price_ratio": 0.0,
    "skip": False,
    "aux_coef": 0.0,
}
"""Settings newer than some checkpoints, with the behaviour those checkpoints were trained with."""

PRESETS: dict[str, dict[str, Any]] = {
    # Zou et al. 2022, Table 1 and the sweeps' winners (window 30, stage-2 LSTM 512, one layer);
    # epochs/minibatch/GAE lambda are sb3-contrib RecurrentPPO's defaults, which the paper used.
    "paper": dict(
        window=30,
        stage1_hidden=128,
        feature_dim=128,
        stage2_hidden=512,
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
        hmax=100,
        initial_amount=1_000_000.0,
        buy_cost_pct=1e-3,
        sell_cost_pct=1e-3,
        reward_scaling=1e-4,
        policy="clstm",
        price_features="level",
        portfolio_features="shares",
        action_mode="shares",
        reward="value",
        # sb3's Gaussian, clipped by the env, unbounded log-std, with an entropy bonus
        action_dist="gaussian",
        log_std_max=float("inf"),
        skip=False,
        aux_coef=0.0,
    ),
}


def preset(name: str, **overrides: Any) -> TrainConfig:
    """A config from a named preset with overrides, e.g. ``preset("paper", num_envs=8)``."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return TrainConfig(**{**PRESETS[name], **overrides})
