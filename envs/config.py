"""The trading environment's settings (`EnvConfig`) and the way every setting of the project is declared.

A light module (no numpy, pandas or torch), so the command line can build its flags from `EnvConfig` and ``--help``
stays fast. `EnvConfig` is the ``env`` section of the training settings (`clstm_ppo.config.TrainConfig`): its defaults
are what training runs, declared here once. The paper's own meanings (share actions, dollar rewards, fills at the
observed close) are the ``paper`` preset, and what checkpoints written before a setting existed meant is
`clstm_ppo.migrate.LEGACY`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from envs.errors import UserError
from envs.state import ACTION_MODES, EXECUTIONS, PORTFOLIO_FEATURES, REWARDS


def setting(
    default: Any,
    help_: str,
    *,
    choices: tuple[str, ...] | None = None,
    parse: Callable | None = None,
    flag: str | None = None,
    cli: bool = True,
) -> Any:
    """A dataclass field that is also a command-line flag: its default, its help text and, where the field's type
    does not say it, ``choices``, a ``parse`` function for the flag's text, or a ``flag`` name other than the field's
    (CleanRL's ``Args`` idea: the settings document themselves). ``cli=False``: a rarely-touched knob, set in a
    ``--config`` file (or a preset) only, never a flag; it is still a setting, stored in every checkpoint."""
    meta = {"help": help_, "choices": choices, "parse": parse, "flag": flag, "cli": None if cli else False}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def parse_episode_length(text: str | int) -> int | str:
    """``--episode_length``: a number of trading days (at least 2), or ``full`` for the whole split."""
    if isinstance(text, int) and not isinstance(text, bool):
        days = text
    elif str(text).strip().lower() == "full":
        return "full"
    else:
        try:
            days = int(str(text).strip())
        except ValueError:
            raise UserError(f"--episode_length must be a number of days or 'full', got {text!r}") from None
    if days < 2:
        raise UserError(f"--episode_length must be at least 2 days, got {days}")
    return days


TRAINING_ONLY = frozenset({"episode_length", "reward", "reward_scaling", "turnover_penalty"})
"""`EnvConfig` settings that shape only training's episodes and reward: a backtest, a study's trading and live
trading never read them."""


@dataclass(frozen=True)
class EnvConfig:
    """How the trading environment trades and rewards (module `envs.kernel` has the rules). The observation window
    is not one of these: it is the market's (`envs.features.PreparedMarket.window`, from ``--window``)."""

    hmax: int = setting(100, "maximum shares traded per stock per day (with --action_mode shares: action 1.0 = hmax)")
    initial_amount: float = setting(1_000_000.0, "starting cash in dollars")
    buy_cost_pct: float = setting(1e-3, "buy cost as a fraction of traded value")
    sell_cost_pct: float = setting(1e-3, "sell cost as a fraction of traded value")
    reward_scaling: float = setting(
        1e-4, "with --reward value: reward = change of portfolio value in dollars x this", cli=False
    )
    episode_length: int | str = setting(
        252,
        "trading days per training episode (a random start that leaves a full episode), or 'full': from the "
        "split's first day to its end",
        parse=parse_episode_length,
    )
    portfolio_features: str = setting(
        "shares",
        "cash and holdings in the state: shares (cash / initial amount and shares / 1,000, as in the paper) or "
        "weights (fractions of the portfolio value)",
        choices=PORTFOLIO_FEATURES,
        cli=False,
    )
    action_mode: str = setting(
        "weights",
        "what an action means: shares (buy or sell up to --hmax shares per stock per day, the paper's) or weights "
        "(the target portfolio: softmax of 5 x action over the stocks and a cash logit 0, reached by trading)",
        choices=ACTION_MODES,
    )
    rebalance_band: float = setting(
        0.02,
        "with --action_mode weights: trade a stock only when its order is worth more than this fraction of the "
        "portfolio value",
    )
    turnover_penalty: float = setting(
        0.005,
        "training's reward only: each dollar traded costs this much more in the reward than the portfolio pays "
        "(0.005: the policy learns as if costs were 0.6 percent a side instead of 0.1; 0: none, the paper's); "
        "backtests and trading never pay it",
    )
    execution: str = setting(
        "auto",
        "when an order decided on a day's close fills: close (that same close, the paper's: a look-ahead no trader "
        "gets), next_open (the next day's open, what trading after the close gets), next_close (the next day's "
        "close), or auto: next_open where the data has opens, next_close on close-only data",
        choices=EXECUTIONS,
    )
    risk_free: float = setting(
        0.0,
        "annual risk-free rate (fraction, e.g. 0.04): cash earns it every trading day, and Sharpe and Sortino are on "
        "returns in excess of it",
    )
    reward: str = setting(
        "log_return",
        "value: change of portfolio value in dollars x --reward_scaling (the paper's); log_return: 100 x the day's "
        "log return of the portfolio",
        choices=REWARDS,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "episode_length", parse_episode_length(self.episode_length))
        if self.hmax < 1:
            raise UserError(f"--hmax must be at least 1, got {self.hmax}")
        if not self.initial_amount > 0:
            raise UserError(f"--initial_amount must be positive, got {self.initial_amount}")
        if not (0 <= self.buy_cost_pct < 1 and 0 <= self.sell_cost_pct < 1):
            raise UserError("--buy_cost_pct and --sell_cost_pct must be in [0, 1)")
        if not -0.5 < self.risk_free < 1:
            raise UserError(f"--risk_free is an annual fraction in (-0.5, 1), e.g. 0.04; got {self.risk_free}")
        if not 0 <= self.turnover_penalty < 1:
            raise UserError(f"--turnover_penalty must be in [0, 1), got {self.turnover_penalty}")
        if not 0 <= self.rebalance_band < 1:
            raise UserError(f"--rebalance_band must be in [0, 1), got {self.rebalance_band}")
        for f in fields(self):  # settings given in code (not by a flag) are checked against their choices too
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise UserError(f"--{f.name} must be one of {', '.join(choices)}, got {getattr(self, f.name)!r}")

    @property
    def episode_days(self) -> int | None:
        """Trading days per episode; None: from the split's first day to its end (and no random start)."""
        return None if self.episode_length == "full" else int(self.episode_length)

    def inert(self) -> frozenset[str]:
        """The settings these ones leave without effect: the band with share actions, hmax with target weights, the
        reward's scaling with the log-return reward."""
        ignored = {"rebalance_band" if self.action_mode == "shares" else "hmax"}
        return frozenset(ignored | ({"reward_scaling"} if self.reward == "log_return" else set()))

    def in_effect(self, other: EnvConfig, *, skip: frozenset[str] = frozenset()) -> list[str]:
        """The settings (in field order, less ``skip``) that act in these settings or in ``other``'s: all but those
        both leave inert (`inert`), where a difference changes nothing."""
        idle = self.inert() & other.inert()
        return [f.name for f in fields(self) if f.name not in idle | skip]

    def differences(self, other: EnvConfig, *, skip: frozenset[str] = frozenset()) -> list[str]:
        """The settings `in_effect` whose values differ from ``other``'s."""
        return [k for k in self.in_effect(other, skip=skip) if getattr(self, k) != getattr(other, k)]

    def whole_split(self) -> EnvConfig:
        """These settings with every episode running from the split's first day to its end (evaluation)."""
        return EnvConfig(**{**self.__dict__, "episode_length": "full"})
