"""The reference trader of a market with a signal (docs/data.md, "The reference trader"; "oracle" is its short
internal name): the best member of a declared family of signal traders (`envs.oracle`: tilt scales x no-trade bands),
chosen by its Sharpe after costs on the market's training days only (`choose_member`), then run on the days asked for
(`reference_run`), through the same env as a backtest (costs, fills, no-trade band, turbulence stop).

A policy's share of the reference is of its *excess* over buy-and-hold (`excess_share`): raw Sharpe ratios would
credit the policy with the market's own rise. The reference is a yardstick, not a bound: a share may exceed 100%.
Over seeds, the share's interval is Student-t by the delta method, beside the paired test of share >= a target
(`share_over_seeds`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from clstm_ppo.agent.evaluate import PolicyRun, evaluate_actions
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.report import BacktestResult, compute_metrics
from clstm_ppo.evaluation.statistics import mean_exposure, ratio_t_interval, t_interval
from envs.config import EnvConfig
from envs.data import DayRange
from envs.errors import UserError
from envs.execution import Terms
from envs.features import PreparedMarket
from envs.oracle import (
    REFERENCE_BANDS,
    REFERENCE_SCALES,
    Member,
    Signal,
    member_actions,
    planted_rule,
    signal_predictor,
)

REFERENCE = "reference trader (the best of a signal-trading family on the training days)"
"""The reference trader's name where it stands beside the baselines (a study's report)."""
MIN_ORACLE_EXCESS = 0.5
"""A share of the reference's excess is given only where the reference's Sharpe is at least this much above
buy-and-hold's: below it the denominator is as small as one Sharpe ratio's noise, and the share means nothing."""
SHARE_TARGET = 0.5
"""The share of the reference's excess a claim is tested against by default (issue 58's target)."""


class ReferencePolicy:
    """A table of day-by-day actions as the policy interface `evaluate_policy` drives (``initial_state``, ``act``,
    ``env_action``): it acts on day ``first_day + k`` at its k-th call since a start (one member of the reference
    trader's family, where a single run is wanted: a study's windows).

    :param actions: ``[D, N]`` the member's actions for each day of the market (`envs.oracle.member_actions`).
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

    def eval(self) -> ReferencePolicy:
        return self

    def train(self, mode: bool = True) -> ReferencePolicy:
        return self


class RunFigures(NamedTuple):
    """What a run (a reference member's, or any policy's: `run_figures`) earned over a split, after costs, at the
    env's fills; buy-and-hold on the same days and terms."""

    run: PolicyRun  # the day-by-day record, as a backtest's
    sharpe: float  # annualised, of the daily portfolio returns (in excess of the env's risk-free rate)
    cumulative_return: float  # fraction
    annual_turnover: float  # traded value / mean portfolio value, a year
    exposure: float  # mean invested fraction of the portfolio
    buy_and_hold_sharpe: float
    buy_and_hold_return: float
    record: BacktestResult  # the run and buy-and-hold day by day as the backtest counts them (values, costs)


class FamilyChoice(NamedTuple):
    """The reference trader's choice: every member's Sharpe after costs on the training days, and the best."""

    days: DayRange  # the training days the members were run on
    sharpe: np.ndarray  # [len(REFERENCE_BANDS), len(REFERENCE_SCALES)] annualised, after costs
    member: Member  # the highest Sharpe (the first in `envs.oracle.family`'s order on a tie)
    figures: RunFigures  # the chosen member on the training days, beside buy-and-hold there

    def table(self) -> list[list[str]]:
        """The Sharpe ratios as rows of text: a header of scales, then one row per band (for `envs.text`)."""
        rows = [["band \\ scale", *(f"{s:g}" for s in REFERENCE_SCALES)]]
        rows += [[f"{b:.0%}", *(f"{x:.2f}" for x in row)] for b, row in zip(REFERENCE_BANDS, self.sharpe, strict=True)]
        return rows


class ReferenceRun(NamedTuple):
    """The reference trader over a split: the member chosen on the training days, and what it earned there."""

    choice: FamilyChoice
    figures: RunFigures  # the chosen member over the split asked for

    @property
    def member(self) -> Member:
        return self.choice.member

    @property
    def sharpe(self) -> float:
        return self.figures.sharpe

    @property
    def buy_and_hold_sharpe(self) -> float:
        return self.figures.buy_and_hold_sharpe


def choose_member(market: PreparedMarket, env: EnvConfig, predictor: np.ndarray) -> FamilyChoice:
    """Run every member of the family on ``market.splits.train`` (the market's own training days: a training pool's
    other draws are not read, nor any later day) and keep the one with the highest Sharpe after costs, as
    `run_figures` counts it. One env pass: every member a column (band-major, the scales within), each with its
    band (`evaluate_actions`).

    :param predictor: ``[D, N]`` the signal on every day of ``market.data`` (`envs.oracle.signal_predictor`).
    """
    train, scales = market.splits.train, len(REFERENCE_SCALES)
    actions = np.tile(member_actions(predictor, REFERENCE_SCALES), (1, len(REFERENCE_BANDS), 1))
    bands = [band for band in REFERENCE_BANDS for _ in range(scales)]
    columns = evaluate_actions(actions, market, train, env, bands)
    runs = [columns[b * scales : (b + 1) * scales] for b in range(len(REFERENCE_BANDS))]
    sharpe = np.array([[M.sharpe_ratio(r.values, env.risk_free) for r in row] for row in runs])
    best = int(np.argmax(np.where(np.isfinite(sharpe), sharpe, -np.inf)))
    b, s = divmod(best, len(REFERENCE_SCALES))
    member = Member(REFERENCE_SCALES[s], REFERENCE_BANDS[b])
    return FamilyChoice(train, sharpe, member, run_figures(runs[b][s], market, train, member_env(env, member.band)))


def member_env(env: EnvConfig, band: float) -> EnvConfig:
    """``env`` (the backtest's costs, fills, stop) with a member's no-trade band."""
    return dataclasses.replace(env, rebalance_band=band)


def reference_run(market: PreparedMarket, split: str | DayRange, env: EnvConfig, signal: Signal) -> ReferenceRun:
    """The reference trader of ``market`` (see the module docstring): chosen on its training days, run over ``split``.

    :param market: any prepared market (a generated one, or a file's).
    :param split: "train" | "validation" | "test", or a `DayRange` of day indices into ``market.data``.
    :param env: the env settings of the backtest (costs, fills; ``--action_mode weights``); the band is the member's.
    :param signal: a rule computed from the closes (`envs.oracle.planted_rule` of a synthetic source) or a column.
    :raises UserError: a split the market lacks, share actions (the members name target weights), or a bad column.
    """
    if env.action_mode != "weights":
        raise UserError("the reference trader names target weights: it needs --action_mode weights")
    days = split if isinstance(split, DayRange) else market.splits.as_dict().get(split)
    if days is None:
        raise UserError(f"the market has no {split} split")
    predictor = signal_predictor(market.data, signal, market.splits.train)
    choice = choose_member(market, env, predictor)
    if days == choice.days:
        return ReferenceRun(choice, choice.figures)
    return ReferenceRun(choice, member_run(market, days, env, predictor, choice.member))


def member_run(
    market: PreparedMarket, days: DayRange, env: EnvConfig, predictor: np.ndarray, member: Member
) -> RunFigures:
    """One member of the family over ``days`` (`run_figures`), its signal ``predictor [D, N]`` on every day."""
    acting = member_env(env, member.band)
    (run,) = evaluate_actions(member_actions(predictor, [member.scale]), market, days, acting)
    return run_figures(run, market, days, acting)


def run_figures(run: PolicyRun, market: PreparedMarket, days: DayRange, env: EnvConfig) -> RunFigures:
    """``run``'s Sharpe, return, turnover a year and exposure over ``days`` of ``market`` as the backtest counts them
    (costs, fills, cash interest), beside equal-weight buy-and-hold's on the same days and terms."""
    terms = Terms.of(market.data, env.execution, env.risk_free).days(days.start, days.stop)
    record = BacktestResult.from_run(run, env, terms)
    metrics = compute_metrics(record, risk_free=env.risk_free)
    return RunFigures(
        run=run,
        sharpe=metrics["policy"]["sharpe"],
        cumulative_return=metrics["policy"]["cumulative_return"],
        annual_turnover=metrics["policy"]["annual_turnover"],
        exposure=mean_exposure(run.values, run.holdings_value),
        buy_and_hold_sharpe=metrics["baseline"]["sharpe"],
        buy_and_hold_return=metrics["baseline"]["cumulative_return"],
        record=record,
    )


def planted(source: str) -> bool:
    """Does ``source`` name a synthetic market whose planted signal a trader can compute from prices
    (`envs.oracle.planted_rule`)?"""
    return planted_rule(source) is not None


def excess_share(learned: float, buy_and_hold: float, reference: float) -> float | None:
    """``(learned - buy_and_hold) / (reference - buy_and_hold)`` of Sharpe ratios on the same days: the share of the
    reference trader's edge over buy-and-hold that a policy keeps (1: as much, > 1: more, 0: none, < 0: it trails
    buy-and-hold). None where the reference's excess is under `MIN_ORACLE_EXCESS`."""
    excess = reference - buy_and_hold
    return (learned - buy_and_hold) / excess if excess >= MIN_ORACLE_EXCESS else None


def share_words(learned: float, buy_and_hold: float, reference: float, member: Member) -> str:
    """``the reference trader (tilt 1, no-trade band 1%, chosen on the training days) Sharpe 4.64 after costs, +3.95
    over buy-and-hold; learned 12% of that excess`` (or "share n/a" where the reference's excess is under
    `MIN_ORACLE_EXCESS`): what a result on a market with a signal is read against."""
    share = excess_share(learned, buy_and_hold, reference)
    said = (
        f"learned {share:.0%} of that excess"
        if share is not None
        else f"share n/a (the reference's excess is under {MIN_ORACLE_EXCESS:g})"
    )
    return (
        f"the reference trader ({member.describe()}, chosen on the training days) Sharpe {reference:.2f} after "
        f"costs, {reference - buy_and_hold:+.2f} over buy-and-hold; {said}"
    )


def reference_words(reference: ReferenceRun, learned_sharpe: float) -> str:
    """`share_words` of a policy's Sharpe ``learned_sharpe`` against ``reference`` and its buy-and-hold (same days)."""
    return share_words(learned_sharpe, reference.buy_and_hold_sharpe, reference.sharpe, reference.member)


class SeedShare(NamedTuple):
    """A share of the reference's excess over S seeds, and the paired test of share >= ``target``."""

    share: float | None  # (mean trained - mean B&H) / (mean reference - mean B&H); None: the excess is too small
    lo: float  # its 95% Student-t interval (delta method; nan with one seed or no share)
    hi: float
    target: float
    margin: float  # mean over seeds of trained - B&H - target x (reference - B&H): >= 0 iff share >= target
    margin_lo: float  # its 95% Student-t interval over the seeds (nan with one seed)
    margin_hi: float
    margin_lower: float  # its one-sided 95% lower bound: above 0, share >= target is shown
    seeds: int


def share_over_seeds(
    trained: Any, buy_and_hold: Any, reference: Any, target: float = SHARE_TARGET, confidence: float = 0.95
) -> SeedShare:
    """The share of the reference's excess kept over seeds, with an honest interval for a handful of them.

    :param trained: ``[S]`` Sharpe ratios, one per seed; :param buy_and_hold: ``[S]`` buy-and-hold's on the same
        days; :param reference: ``[S]`` the reference trader's (constant where every seed trades one market).
    The share's interval is `statistics.ratio_t_interval` (delta method) of trained - B&H over reference - B&H,
    paired by seed; the test of share >= ``target`` is `statistics.t_interval` of the paired differences
    ``trained - B&H - target x (reference - B&H)``, given even where the share is n/a.
    """
    t, b, r = (np.asarray(x, dtype=np.float64) for x in (trained, buy_and_hold, reference))
    gained, room = t - b, r - b
    share = excess_share(float(t.mean()), float(b.mean()), float(r.mean()))
    lo = hi = math.nan
    if share is not None and t.size > 1:
        lo, hi = ratio_t_interval(gained, room, confidence)
    margin = gained - target * room
    m_lo, m_hi, m_one = t_interval(margin, confidence)
    return SeedShare(share, lo, hi, target, float(margin.mean()), m_lo, m_hi, m_one, int(t.size))


def seed_share_words(s: SeedShare) -> str:
    """``share of the reference's excess: 45.1% [30%, 60%] (95% t over 8 seeds, delta method); paired test of share
    >= 50%: trained - B&H - 0.5 x (reference - B&H) = -0.12 [-0.80, +0.56], one-sided lower bound -0.66: not shown``."""
    if s.share is None:
        share = f"n/a (the reference's mean excess is under {MIN_ORACLE_EXCESS:g})"
    elif _missing(s.lo):
        share = f"{s.share:.1%}"
    else:
        share = f"{s.share:.1%} [{s.lo:.0%}, {s.hi:.0%}] (95% t over {s.seeds} seeds, delta method)"
    if _missing(s.margin_lo):
        margin = f"{s.margin:+.2f} (one seed: no interval)"
        verdict = "not shown"
    else:
        margin = (
            f"{s.margin:+.2f} [{s.margin_lo:+.2f}, {s.margin_hi:+.2f}], one-sided lower bound {s.margin_lower:+.2f}"
        )
        verdict = "shown" if s.margin_lower > 0 else "not shown"
    return (
        f"share of the reference's excess: {share}; paired test of share >= {s.target:.0%}: trained - buy-and-hold "
        f"- {s.target:g} x (reference - buy-and-hold) = {margin}: {verdict}"
    )


def _missing(bound: float | None) -> bool:
    """No interval: one seed (nan), or nan read back from JSON (None)."""
    return bound is None or math.isnan(bound)
