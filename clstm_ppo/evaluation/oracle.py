"""The oracle of a market with a planted signal (docs/data.md): the rule that trades the signal, run through the same
env as a backtest (costs, fills, no-trade band, turbulence stop), so a trained policy's result has a ceiling to be
read against. `oracle_run` recomputes the predictor from the market's closes (`envs.predictor.predictor_from_prices`:
what the file holds up to each day's close, nothing else) and trades `envs.oracle.oracle_actions` day by day.

A policy's share of the oracle is of its *excess* over buy-and-hold (`excess_share`): raw Sharpe ratios would credit
the policy with the market's own rise.
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
from envs.oracle import oracle_actions, planted_rule
from envs.predictor import SignalRule, predictor_from_prices

ORACLE = "oracle (trades the planted signal, from prices)"
"""The oracle's name where it stands beside the baselines (a study's report)."""
MIN_ORACLE_EXCESS = 0.5
"""A share of the oracle is given only where the oracle's Sharpe is at least this much above buy-and-hold's: below it
the denominator is as small as one Sharpe ratio's noise, and the share means nothing."""


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
    """What a run (the oracle's, or any policy's: `run_figures`) earned over a split, after costs, at the env's
    fills; buy-and-hold on the same days and terms."""

    run: PolicyRun  # the day-by-day record, as a backtest's
    sharpe: float  # annualised, of the daily portfolio returns (in excess of the env's risk-free rate)
    cumulative_return: float  # fraction
    annual_turnover: float  # traded value / mean portfolio value, a year
    exposure: float  # mean invested fraction of the portfolio
    buy_and_hold_sharpe: float
    buy_and_hold_return: float


def oracle_run(market: PreparedMarket, split: str | DayRange, env: EnvConfig, rule: SignalRule) -> OracleRun:
    """The oracle of ``market`` (see the module docstring) over ``split``.

    :param market: any prepared market (a generated one, or a file's): the predictor is computed from its closes.
    :param split: "train" | "validation" | "test", or a `DayRange` of day indices into ``market.data``.
    :param env: the env settings of the backtest (costs, fills, band; ``--action_mode weights``).
    :param rule: the predictor's rule (`envs.oracle.planted_rule` of a synthetic source).
    :raises UserError: a split the market lacks, or share actions (the rule names target weights).
    """
    if env.action_mode != "weights":
        raise UserError("the oracle names target weights: it needs --action_mode weights")
    days = split if isinstance(split, DayRange) else market.splits.as_dict().get(split)
    if days is None:
        raise UserError(f"the market has no {split} split")
    actions = oracle_actions(predictor_from_prices(market.data.close, rule))
    return run_figures(evaluate_policy(OracleRule(actions, days.start), market, days, env), market, days, env)


def run_figures(run: PolicyRun, market: PreparedMarket, days: DayRange, env: EnvConfig) -> OracleRun:
    """``run``'s Sharpe, return, turnover a year and exposure over ``days`` of ``market`` as the backtest counts them
    (costs, fills, cash interest), beside equal-weight buy-and-hold's on the same days and terms."""
    terms = Terms.of(market.data, env.execution, env.risk_free).days(days.start, days.stop)
    metrics = compute_metrics(BacktestResult.from_run(run, env, terms), risk_free=env.risk_free)
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
    """Does ``source`` name a synthetic market whose planted signal the oracle can compute from prices
    (`envs.oracle.planted_rule`)?"""
    return planted_rule(source) is not None


def excess_share(learned: float, buy_and_hold: float, oracle: float) -> float | None:
    """``(learned - buy_and_hold) / (oracle - buy_and_hold)`` of Sharpe ratios on the same days: the share of the
    oracle's edge over buy-and-hold that a policy keeps (1: all of it, 0: none, < 0: it trails buy-and-hold). None
    where the oracle's excess is under `MIN_ORACLE_EXCESS`."""
    excess = oracle - buy_and_hold
    return (learned - buy_and_hold) / excess if excess >= MIN_ORACLE_EXCESS else None


def share_words(learned: float, buy_and_hold: float, oracle: float) -> str:
    """``the oracle ... Sharpe 4.64 after costs, +3.95 over buy-and-hold; learned 12% of that excess`` (or "share n/a"
    where the oracle's excess is under `MIN_ORACLE_EXCESS`): what a result on a planted market is read against."""
    share = excess_share(learned, buy_and_hold, oracle)
    said = (
        f"learned {share:.0%} of that excess"
        if share is not None
        else f"share n/a (the oracle's excess is under {MIN_ORACLE_EXCESS:g})"
    )
    return f"the {ORACLE} Sharpe {oracle:.2f} after costs, {oracle - buy_and_hold:+.2f} over buy-and-hold; {said}"


def oracle_words(oracle: OracleRun, learned_sharpe: float) -> str:
    """`share_words` of a policy's Sharpe ``learned_sharpe`` against ``oracle`` and its buy-and-hold (same days)."""
    return share_words(learned_sharpe, oracle.buy_and_hold_sharpe, oracle.sharpe)
