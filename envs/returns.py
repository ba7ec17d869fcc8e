"""The one annualised Sharpe ratio, shared by the env's episode summary and every backtest metric, at the bottom of
the import graph (the env imports nothing above ``envs``); `clstm_ppo.evaluation.metrics` and the study's
statistics call it with sample moments of daily returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

TRADING_DAYS = 252
"""Trading days per year used for every annualisation."""

ZERO_STD = 1e-12
"""Below this the standard deviation of daily returns counts as exactly zero: a constant or constant-growth
series leaves float noise of ~1e-17, which would otherwise blow a ratio up to 1e15."""


def annualised_sharpe(mean: Any, std: Any, count: Any) -> Any:
    """``mean / std * sqrt(252)``, and 0 where ``count < 2`` or ``std <= ZERO_STD``.

    :param mean: mean daily (excess) return, a float or an array/tensor of them (fraction per day).
    :param std: sample standard deviation (ddof = 1) of the same returns, same shape.
    :param count: number of daily returns behind each pair, same shape or a scalar.
    :return: annualised Sharpe ratio, same type and shape as ``mean`` (floats, numpy arrays and torch
        tensors all work: only arithmetic and comparisons are used).
    """
    usable = (count >= 2) * (std > ZERO_STD)
    safe_std = std + (std <= ZERO_STD) * 1.0  # any nonzero divisor where the answer is masked to 0
    return mean / safe_std * math.sqrt(TRADING_DAYS) * usable


def daily_risk_free(risk_free: float) -> float:
    """Annual risk-free rate (fraction, e.g. 0.02) -> the equivalent daily rate, ``(1 + rf) ** (1/252) - 1``."""
    return (1.0 + float(risk_free)) ** (1.0 / TRADING_DAYS) - 1.0


def sharpe_from_returns(returns: Any, risk_free: float = 0.0) -> float:
    """Annualised Sharpe ratio of ``[K]`` daily simple returns (fractions): ``mean(e) / std(e, ddof=1) * sqrt(252)``.

    ``e_t = r_t - rf_d`` with ``rf_d = daily_risk_free(risk_free)`` (``risk_free`` is an annual rate).
    ``0.0`` when there are fewer than two returns or the excess returns do not vary (e.g. all cash).
    Matches ``empyrical.sharpe_ratio(r, risk_free=rf_d)`` otherwise.
    """
    e = np.asarray(returns, dtype=np.float64) - daily_risk_free(risk_free)
    if e.size < 2:
        return 0.0
    return float(annualised_sharpe(float(np.mean(e)), float(np.std(e, ddof=1)), e.size))
