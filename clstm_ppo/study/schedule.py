"""The walk-forward schedule (the paper's protocol): train on an expanding window, trade the next period, retrain.

Day indices index the study's market data. With trading days ``s_0 .. e`` (``--trade_start`` .. ``--trade_end``)
and retraining boundaries ``b_0 = s_0 < b_1 < ... < b_{K-1}`` (the first trading day of each new month, quarter
or year after ``s_0``; none for ``--retrain none``), period k's model

- trains on days ``[lookback, b_k - V)`` and selects its checkpoint on the validation slice ``[b_k - V, b_k)``
  (``V = --validation_days``; with V = 0 there is no selection: the last weights trade);
- trades at the closes of days ``b_k .. b_{k+1} - 1`` (the last period: ``b_{K-1} .. e - 1``), valued each
  following day, so its run covers days ``[b_k, b_{k+1}]`` (the last: ``[b_{K-1}, e]``) and the next period
  starts on the day this one ends, with the portfolio this one left.

No day at or after ``b_k`` is in period k's training or validation split (``tests/test_study.py`` checks that
changing those days leaves the period's model bit for bit the same). Stitched, the periods give one
out-of-sample value series on days ``s_0 .. e``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from clstm_ppo.evaluation.holdout import parse_day
from envs.data import DayRange, Splits
from envs.errors import UserError
from envs.features import INDICATOR_WINDOW

RETRAIN = ("none", "monthly", "quarterly", "yearly")
MIN_TRAIN_DAYS = 2 * INDICATOR_WINDOW
"""The fewest training days (after the window's lookback) a period may have: the 30-day indicators need as many
days to warm up again."""


@dataclass(frozen=True)
class WalkPeriod:
    """One retraining window and the days its model trades (day indices into the study's data)."""

    index: int  # k, 0-based
    train: DayRange  # [lookback, b_k - V)
    validation: DayRange | None  # [b_k - V, b_k), or None when V = 0
    trade: DayRange  # [b_k, next b + 1): decisions at every day but the last, which only values the portfolio

    @property
    def splits(self) -> Splits:
        """The period's splits for a `PreparedMarket`: its trade days are the test split."""
        return Splits(train=self.train, validation=self.validation, test=self.trade)


def _boundaries(dates: pd.DatetimeIndex, first: int, last: int, retrain: str) -> list[int]:
    """Day indices b_0 = first < b_1 < ... <= last where a new month / quarter / year begins."""
    if retrain == "none":
        return [first]
    span = dates[first : last + 1]
    key = {
        "monthly": span.year * 12 + span.month,
        "quarterly": span.year * 4 + (span.month - 1) // 3,
        "yearly": span.year,
    }[retrain]
    starts = np.flatnonzero(np.diff(np.asarray(key)) != 0) + 1  # first day of each new calendar period inside the span
    return [first, *[first + int(i) for i in starts if first + int(i) < last]]


def walk_forward(
    dates: np.ndarray, *, window: int, trade_start: str, trade_end: str | None, retrain: str, validation_days: int
) -> list[WalkPeriod]:
    """The periods of a walk-forward over ``dates [D]`` (see the module docstring); UserError when the trade window
    is outside the data or the first training window is too short.

    :param window: T, the observation window: the first ``T - 1`` days only serve as lookback.
    :param trade_start: / :param trade_end: inclusive dates (YYYY-MM-DD); ``trade_end`` None: the data's last day.
    """
    if retrain not in RETRAIN:
        raise UserError(f"--retrain must be one of {', '.join(RETRAIN)}, got {retrain!r}")
    if validation_days < 0:
        raise UserError(f"--validation_days must be >= 0, got {validation_days}")
    index = pd.DatetimeIndex(pd.to_datetime(np.asarray(dates))).normalize()
    first_day, last_day = index[0].date(), index[-1].date()
    start = parse_day(trade_start, "--trade_start")
    end = parse_day(trade_end, "--trade_end") if trade_end else index[-1]
    if start > index[-1]:
        raise UserError(f"--trade_start {start.date()} is after the data's last day {last_day}")
    if end < start:
        raise UserError(f"--trade_end {end.date()} is before --trade_start {start.date()}")
    if end < index[0]:
        raise UserError(
            f"the trade window {start.date()} .. {end.date()} is outside the data ({first_day} .. {last_day})"
        )
    if end > index[-1]:
        raise UserError(f"--trade_end {end.date()} is after the data's last day {last_day}")
    first = int(np.searchsorted(index, start, side="left"))
    last = int(np.searchsorted(index, end, side="right")) - 1
    if last - first < 1:
        raise UserError(
            f"the trade window {start.date()} .. {end.date()} holds {last - first + 1} trading day(s); "
            f"a study needs at least 2"
        )
    lookback = window - 1
    train_days = first - validation_days - lookback
    if train_days < MIN_TRAIN_DAYS:
        raise UserError(
            f"the first training window is too short: {max(train_days, 0)} trading days before --trade_start "
            f"{start.date()} after the window's {lookback}-day lookback and {validation_days} validation days "
            f"(the data starts {first_day}); it needs at least {MIN_TRAIN_DAYS}: move --trade_start later, or "
            f"shorten --window or --validation_days"
        )
    bounds = _boundaries(index, first, last, retrain)
    return [
        WalkPeriod(
            index=k,
            train=DayRange(lookback, b - validation_days),
            validation=DayRange(b - validation_days, b) if validation_days else None,
            trade=DayRange(b, stop + 1),
        )
        for k, (b, stop) in enumerate(zip(bounds, [*bounds[1:], last], strict=True))
    ]
