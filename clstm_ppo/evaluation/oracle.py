"""The oracle of a synthetic market with a planted signal: what the rule that knows the signal earns through the same
env as a backtest (costs, fills, no-trade band, turbulence stop), so a trained policy's result has a ceiling to be
read against.

``oracle_run(market, "test", env, source=..., seed=...)`` regenerates the market's planted predictor from its source
string (`envs.oracle.planted_signal`, checked against ``market``'s closes), trades the rule that knows it
(`envs.oracle.oracle_actions`: target weights ~ exp(1.5 x predictor)) day by day through
`clstm_ppo.agent.evaluate.evaluate_policy` and returns the run with its Sharpe, return, turnover and exposure, next
to equal-weight buy-and-hold on the same days and terms (the backtest's baseline)::

    from clstm_ppo.evaluation.oracle import oracle_run
    result = oracle_run(market, "test", cfg.env, source=cfg.data.source, seed=cfg.run.seed)
    result.sharpe, result.buy_and_hold_sharpe, result.annual_turnover
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from clstm_ppo.agent.evaluate import PolicyRun, evaluate_policy
from clstm_ppo.agent.model import RecurrentState
from clstm_ppo.evaluation.report import BacktestResult, compute_metrics
from clstm_ppo.evaluation.statistics import mean_exposure
from envs.config import EnvConfig
from envs.data import DayRange
from envs.errors import UserError
from envs.execution import Terms
from envs.features import PreparedMarket
from envs.oracle import oracle_actions, planted_signal
from envs.sources import is_synthetic, parse_synthetic_options, synthetic_version

ORACLE = "oracle (knows the planted signal)"
"""The oracle's name where it stands beside the baselines (a study's report)."""


class OracleRule:
    """The oracle's rule as the policy interface `evaluate_policy` drives (``initial_state``, ``act``, ``env_action``):
    it acts on day ``first_day + k`` at its k-th call since a start, from the actions of every day, worked out once.

    :param actions: ``[D, N]`` the rule's actions for each day of the market (`oracle_actions`).
    :param first_day: the day index of the split's first day (where `evaluate_policy` starts).
    """

    training = False

    def __init__(self, actions: np.ndarray, first_day: int) -> None:
        self.actions = torch.as_tensor(actions, dtype=torch.float32)
        self.first_day = first_day
        self.day = first_day

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        return RecurrentState.zeros(batch_size, 0, device)

    def act(self, obs: Tensor, state: RecurrentState, start: Tensor, **_: object) -> tuple[Tensor, None, None, Any]:
        """Actions ``[1, N]`` for the day whose observation ``obs`` is (the observation itself is not read)."""
        if bool(start.any()):
            self.day = self.first_day
        action = self.actions[self.day].unsqueeze(0)
        self.day += 1
        return action, None, None, state

    def env_action(self, action: Tensor) -> Tensor:
        return action

    def eval(self) -> OracleRule:
        return self

    def train(self, mode: bool = True) -> OracleRule:
        return self


class OracleRun(NamedTuple):
    """What the oracle earned over a split, after costs, at the env's fills; buy-and-hold on the same days and terms."""

    run: PolicyRun  # the day-by-day record, as a backtest's
    sharpe: float  # annualised, of the daily portfolio returns (in excess of the env's risk-free rate)
    cumulative_return: float  # fraction
    annual_turnover: float  # traded value / mean portfolio value, a year
    exposure: float  # mean invested fraction of the portfolio
    buy_and_hold_sharpe: float
    buy_and_hold_return: float


def oracle_run(
    market: PreparedMarket, split: str | DayRange, env: EnvConfig, *, source: str, seed: int = 0
) -> OracleRun:
    """The oracle of ``market`` (see the module docstring) over ``split``.

    :param market: a market prepared from the synthetic data ``source`` draws (or some of its days and tickers).
    :param split: "train" | "validation" | "test", or a `DayRange` of day indices into ``market.data``.
    :param env: the env settings of the backtest (costs, fills, band; ``--action_mode weights``).
    :param source: the market's ``synthetic:...`` source string, with a planted signal (``signal_ic`` > 0).
    :param seed: the seed the market was drawn from (when the source names none).
    :raises UserError: no planted signal, a market that is not the source's, a split the market lacks, or share
        actions (the rule names target weights).
    """
    if env.action_mode != "weights":
        raise UserError("the oracle names target weights: it needs --action_mode weights")
    days = split if isinstance(split, DayRange) else market.splits.as_dict().get(split)
    if days is None:
        raise UserError(f"the market has no {split} split")
    actions = oracle_actions(planted_signal(source, seed).on(market.data))
    run = evaluate_policy(OracleRule(actions, days.start), market, days, env)
    result = BacktestResult.from_run(
        run,
        initial_amount=env.initial_amount,
        buy_cost_pct=env.buy_cost_pct,
        sell_cost_pct=env.sell_cost_pct,
        terms=Terms.of(market.data, env.execution, env.risk_free).days(days.start, days.stop),
    )
    metrics = compute_metrics(result, risk_free=env.risk_free)
    return OracleRun(
        run=run,
        sharpe=metrics["policy"]["sharpe"],
        cumulative_return=metrics["policy"]["cumulative_return"],
        annual_turnover=metrics["policy"]["annual_turnover"],
        exposure=mean_exposure(run.values, run.holdings_value),
        buy_and_hold_sharpe=metrics["baseline"]["sharpe"],
        buy_and_hold_return=metrics["baseline"]["cumulative_return"],
    )


def planted(source: str) -> bool:
    """Does ``source`` name a synthetic market with a planted signal the oracle can read (``signal_ic`` > 0)?"""
    if not is_synthetic(source):
        return False
    options = source.strip().partition(":")[2]
    if synthetic_version(options) == 1:
        return False
    return float(parse_synthetic_options(options).get("signal_ic", 0.0)) > 0


def oracle_words(oracle: OracleRun, learned_sharpe: float) -> str:
    """``the oracle (the rule that knows the signal) Sharpe 3.91 after costs; learned 15% of it``: what a result on a
    planted market is read against."""
    share = learned_sharpe / oracle.sharpe if oracle.sharpe > 0 else float("nan")
    said = f"learned {share:.0%} of it" if share == share else "the oracle earns nothing to share"
    return f"the oracle (the rule that knows the signal) Sharpe {oracle.sharpe:.2f} after costs; {said}"
