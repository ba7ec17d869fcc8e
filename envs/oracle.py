"""The reference trader's family and its signal (docs/data.md, "The reference trader"; "oracle" is its short internal
name, as in ``clstm-ppo data oracle``).

The reference trader is the best member of a declared family of signal traders, chosen on a market's training days
and then run on the days asked for (`clstm_ppo.evaluation.oracle.reference_run`, which trades the members through the
backtest's env). A member holds target weights ``clip(scale x a, -1, 1)`` (``--action_mode weights``:
`envs.kernel.target_weights`) with a no-trade band (`envs.config.EnvConfig.rebalance_band`), over the grids
`REFERENCE_SCALES` x `REFERENCE_BANDS`. ``a [D, N]`` is the signal, row t known at day t's close (`signal_predictor`):

* a planted rule's predictor, recomputed from the market's closes (`envs.predictor.predictor_from_prices`; the rule of
  a generated market: `planted_rule`);
* a forecast column of a data file (``col:NAME``), standardised per ticker by its mean and standard deviation over the
  training days (`standardise_on`), so its scale means what the predictor's unit variance means.

The trader is a reference, not a bound: a policy may beat it (a share of its excess above 100%).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from envs.data import DayRange, MarketData
from envs.errors import UserError
from envs.features import feature_column
from envs.predictor import SignalRule, predictor_from_prices
from envs.sources import is_synthetic, parse_synthetic_options, synthetic_version
from envs.state import column_of

REFERENCE_SCALES: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
"""The family's tilt scales: a member's action is ``clip(scale x a, -1, 1)`` per ticker, so its target weights go as
``exp(5 x scale x a)`` (`envs.kernel.target_weights`). Scale 0 is the equal-weight book (every stock and cash at
1 / (N + 1), rebalanced as the band allows); 0.3 was the old fixed tilt; 3 bets nearly all-in on the strongest signal
(the action saturates at |a| >= 1/3)."""
REFERENCE_BANDS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05)
"""The family's no-trade bands, as fractions of the portfolio's value (`envs.config.EnvConfig.rebalance_band`: a stock
is traded only when its order is worth more than this): from trading every day to trading only large moves."""


class Member(NamedTuple):
    """One signal trader of the family: target weights from ``clip(scale x a, -1, 1)``, no-trade band ``band``."""

    scale: float
    band: float  # fraction of the portfolio's value

    def describe(self) -> str:
        """``tilt 1.5, no-trade band 1%`` (tilt 0: ``the equal-weight book, no-trade band 1%``)."""
        tilt = "the equal-weight book" if self.scale == 0 else f"tilt {self.scale:g}"
        return f"{tilt}, no-trade band {self.band:.0%}"


def family() -> list[Member]:
    """Every member, bands outer and scales inner (the order `describe_family` and a choice's table use)."""
    return [Member(scale, band) for band in REFERENCE_BANDS for scale in REFERENCE_SCALES]


def describe_family() -> str:
    """The family in one line, as the commands print it."""
    scales = ", ".join(f"{s:g}" for s in REFERENCE_SCALES)
    bands = ", ".join(f"{b:.0%}" for b in REFERENCE_BANDS)
    return (
        f"target weights from clip(scale x a, -1, 1), scale in {{{scales}}} (0: the equal-weight book) x no-trade "
        f"band in {{{bands}}}: {len(REFERENCE_SCALES) * len(REFERENCE_BANDS)} members"
    )


def member_actions(predictor: np.ndarray, scales: Sequence[float]) -> np.ndarray:
    """``[D, S, N]`` the actions (``--action_mode weights``) of S members on every day: ``clip(scales[s] x
    predictor, -1, 1)`` for ``predictor [D, N]`` (unit variance)."""
    a = np.asarray(predictor, dtype=np.float64)
    return np.clip(np.asarray(scales, dtype=np.float64)[None, :, None] * a[:, None, :], -1.0, 1.0)


class ColumnSignal(NamedTuple):
    """A forecast column of the data file, read as the signal ``a`` (``--signal col:NAME``)."""

    name: str

    def describe(self) -> str:
        return f"column {self.name!r} (standardised per ticker by its mean and standard deviation on the training days)"


Signal = SignalRule | ColumnSignal
"""Where a reference trader's signal comes from: a rule computed from prices, or a file's column."""


def parse_signal(text: str) -> Signal:
    """``"col:alpha"`` -> the column; ``"lead_lag,halflife=5"`` -> the rule (`SignalRule.parse`); one `UserError`
    naming what is wrong otherwise."""
    text = str(text).strip()
    name = column_of(text)  # ``--signal col:NAME``: the data file's column NAME, as ``--indicators`` names it
    if name is None:
        return SignalRule.parse(text)
    name = name.strip()
    if not name:
        raise UserError(f"--signal {text!r}: name the column, e.g. col:forecast")
    return ColumnSignal(name)


def signal_predictor(data: MarketData, signal: Signal, train: DayRange) -> np.ndarray:
    """``[D, N]`` float64 the signal ``a`` on every day of ``data`` (module docstring), row t known at day t's close.

    :param train: the training days: a column's mean and standard deviation per ticker are taken over them only.
    :raises UserError: a column the data lacks, or one holding NaN or inf (`envs.features.feature_column`).
    """
    if isinstance(signal, SignalRule):
        return predictor_from_prices(data.close, signal)
    return standardise_on(feature_column(data, signal.name), train)


def standardise_on(values: np.ndarray, train: DayRange) -> np.ndarray:
    """``[D, N]`` ``(values - m) / s`` per ticker, m and s (ddof 0) the mean and standard deviation of ``values [D, N]``
    over the ``train`` rows only, so no later day sets the scale; a ticker constant on those rows has no signal (0)."""
    x = np.asarray(values, dtype=np.float64)
    rows = x[train.start : train.stop]
    mean, sd = rows.mean(axis=0), rows.std(axis=0)
    moving = sd > 0
    out = np.zeros_like(x)
    out[:, moving] = (x[:, moving] - mean[moving]) / sd[moving]
    return out


def planted_rule(source: str) -> SignalRule | None:
    """The rule a ``synthetic:...`` source string plants its signal with, or None where it plants none that prices
    show: not synthetic, no ``signal_ic``, or generator 1 or 2 (whose predictors are hidden: `envs.synthetic_v2`)."""
    if not is_synthetic(source):
        return None
    options = source.strip().partition(":")[2]
    if synthetic_version(options) < 3:
        return None
    kwargs = parse_synthetic_options(options)
    if not float(kwargs.get("signal_ic", 0.0)) > 0:
        return None
    return SignalRule(kwargs.get("signal_kind", "lead_lag"), kwargs.get("signal_halflife", 20.0), kwargs.get("lag", 1))


def require_planted_rule(source: str) -> SignalRule:
    """`planted_rule`, or one `UserError` saying why ``source`` has no reference trader."""
    rule = planted_rule(source)
    if rule is not None:
        return rule
    if not is_synthetic(source):
        raise UserError(
            f"{source!r} is not a synthetic market: name the signal to trade (e.g. --signal lead_lag,halflife=5 or "
            "--signal col:NAME)"
        )
    if synthetic_version(source.strip().partition(":")[2]) < 3:
        raise UserError(
            f"{source!r} is generator 1 or 2, whose planted predictor no trader can compute: it has no reference trader"
        )
    raise UserError(f"{source!r} plants no signal (give signal_ic > 0)")
