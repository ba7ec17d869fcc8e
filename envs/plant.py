"""A planted forecast on any prices: a column whose information coefficient with the return the fills earn is exactly
the one asked for (``clstm-ppo data plant``; the rule from the user's side is docs/data.md, "Planting a forecast").

On D days x N tickers (the aligned panel `envs.data.MarketData` loads: days ascending, tickers sorted), with
``R = fill_returns(...)`` under ``--execution auto`` (`envs.predictor.fill_returns`: the log return from the next open
to the open after where the file has opens, from the next close to the close after where it has closes only), defined
on the first ``T = D - 2`` rows and NaN on the last two, and ``phi = 0.5 ** (1 / halflife)``:

1. Winsorise each ticker's R over rows 0..T-1: ``w = clip(R, m - 5 s, m + 5 s)``, m the median, ``s = 1.4826 x`` the
   median absolute deviation from m (the population standard deviation where that is 0).
2. The signal, a forward exponential average: ``y[t] = sum_k phi^k w[t+k] / sum_k phi^k`` over k = 0..T-1-t (the
   weights of the rows that exist, normalised to sum to 1), t = 0..T-1.
3. The noise, an AR(1) of unit variance started stationary: ``eps = default_rng(seed).standard_normal((D, N))`` (C
   order: row by row), ``e[0] = eps[0]``, ``e[t] = phi e[t-1] + sqrt(1 - phi^2) eps[t]``.
4. Per ticker over rows 0..T-1, with ``r, y', e'`` the demeaned R, y, e: ``u1 = r / |r|``, ``u2`` the unit vector of
   ``y' - (y'.u1) u1`` and ``e_perp = e' - (e'.u1) u1 - (e'.u2) u2`` (Gram-Schmidt: orthogonal to the return and the
   signal). With ``rho = corr(y, R)``, the largest IC reachable on the ticker, ``lambda = |y'| sqrt(rho^2 / ic^2 - 1)
   / |e_perp|`` and ``x = y' + lambda e_perp`` on rows 0..T-1, ``x = lambda e`` on the last two (noise only). Then
   ``corr(x, R) = (y'.r) / (|r| sqrt(|y'|^2 + lambda^2 |e_perp|^2)) = ic`` exactly.
5. The column is ``x / sqrt(mean(x[0..T-1]^2))``: mean 0 and variance 1 per ticker over the rows with a fill return.

The IC is Pearson's per ticker over the rows with a fill return, averaged over tickers (`information_coefficient`),
so each ticker at ``ic`` gives the file ``ic``. Both signal and noise are AR(1)-like with coefficient phi, so the
column's lag-1 autocorrelation is about phi: as persistent as the signal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from envs.data import MarketData, standardize_frame
from envs.errors import UserError, shown_list
from envs.execution import resolve_execution
from envs.predictor import fill_returns, information_coefficient

WINSOR_SIGMAS = 5.0
"""Robust standard deviations from the median beyond which a fill return is clipped before it shapes the signal."""
MAD_TO_SIGMA = 1.4826
"""A normal variable's standard deviation per median absolute deviation (1 / Phi^-1(3/4), rounded)."""
MIN_FILL_RETURNS = 10
"""Days with a fill return a ticker needs before a correlation on them means anything."""


@dataclass(frozen=True)
class PlantRule:
    """What to plant: the IC in (0, 1), the half-life in days (> 0) of the signal and of the noise, the noise's seed."""

    ic: float
    halflife: float
    seed: int

    def __post_init__(self) -> None:
        if not 0.0 < self.ic < 1.0:
            raise UserError(
                f"--ic must be in (0, 1), e.g. 0.05 (0.02-0.05 realistic for daily stocks); got {self.ic:g}"
            )
        if not 0.0 < self.halflife < math.inf:
            raise UserError(f"--halflife must be a positive number of days, got {self.halflife:g}")

    @property
    def persistence(self) -> float:
        """phi, the daily coefficient of the signal's average and of the noise."""
        return 0.5 ** (1.0 / self.halflife)

    def describe(self, target: str) -> str:
        """``IC 0.05 with the next-open fill returns, half-life 10 days, seed 3``; ``target`` a resolved execution."""
        fills = {"next_open": "next-open", "next_close": "next-close"}[target]
        return f"IC {self.ic:g} with the {fills} fill returns, half-life {self.halflife:g} days, seed {self.seed}"


class Planted(NamedTuple):
    """A planted column and what it was calibrated on; arrays ``[D, N]`` float64 in the panel's days x tickers."""

    column: np.ndarray  # the forecast, unit variance per ticker, finite everywhere
    ahead: np.ndarray  # the fill returns R (log), NaN in the last two rows
    target: str  # "next_open" or "next_close": the fills R is earned at


def winsorise(returns: np.ndarray) -> np.ndarray:
    """``[T, N]`` log returns clipped per ticker at `WINSOR_SIGMAS` robust sigmas from the median (module docstring,
    step 1). ``returns`` ``[T, N]`` finite."""
    median = np.median(returns, axis=0)
    sigma = MAD_TO_SIGMA * np.median(np.abs(returns - median), axis=0)
    sigma = np.where(sigma > 0, sigma, returns.std(axis=0))
    return np.clip(returns, median - WINSOR_SIGMAS * sigma, median + WINSOR_SIGMAS * sigma)


def forward_average(values: np.ndarray, phi: float) -> np.ndarray:
    """``[T, N]``: ``y[t] = sum_k phi^k values[t+k] / sum_k phi^k`` over the rows that exist (k = 0..T-1-t), by the
    backward recursion ``num[t] = values[t] + phi num[t+1]``, ``den[t] = 1 + phi den[t+1]``."""
    num = np.zeros(values.shape)
    den = np.zeros(values.shape[0])
    carry, weight = np.zeros(values.shape[1]), 0.0
    for t in range(values.shape[0] - 1, -1, -1):
        carry = values[t] + phi * carry
        weight = 1.0 + phi * weight
        num[t], den[t] = carry, weight
    return num / den[:, None]


def smooth_noise(shape: tuple[int, int], phi: float, seed: int) -> np.ndarray:
    """``[D, N]`` AR(1) noise of unit variance, started stationary (module docstring, step 3)."""
    eps = np.random.default_rng(seed).standard_normal(shape)
    gain = math.sqrt(1.0 - phi * phi)
    out = np.empty(shape)
    out[0] = eps[0]
    for t in range(1, shape[0]):
        out[t] = phi * out[t - 1] + gain * eps[t]
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.sqrt(v @ v))
    return v / norm if norm > 0 else np.zeros_like(v)


def reachable_ic(signal: np.ndarray, ahead: np.ndarray) -> np.ndarray:
    """``[N]``: each ticker's ``corr(y, R)`` over the rows with a fill return (``signal`` and ``ahead`` ``[T, N]``),
    by `information_coefficient` on that ticker alone: the largest IC that adding noise can leave it at."""
    return np.array([information_coefficient(signal[:, i : i + 1], ahead[:, i : i + 1]) for i in range(ahead.shape[1])])


def calibrate(signal: np.ndarray, ahead: np.ndarray, noise: np.ndarray, reach: float, ic: float) -> np.ndarray:
    """One ticker's column before scaling (module docstring, step 4): ``[D]`` from its signal ``y`` ``[T]``, fill
    returns ``ahead`` ``[T]``, noise ``e`` ``[D]`` and ``reach = corr(y, ahead) >= ic`` (`reachable_ic`), with
    ``corr(x[:T], ahead) == ic``."""
    steps = signal.shape[0]
    r = ahead - ahead.mean()
    y = signal - signal.mean()
    e = noise[:steps] - noise[:steps].mean()
    u1 = _unit(r)
    u2 = _unit(y - (y @ u1) * u1)
    perp = e - (e @ u1) * u1 - (e @ u2) * u2
    scale = math.sqrt(float(y @ y) * max(reach * reach / (ic * ic) - 1.0, 0.0) / float(perp @ perp))
    return np.concatenate([y + scale * perp, scale * noise[steps:]])


def plant_forecast(data: MarketData, rule: PlantRule) -> Planted:
    """The planted column of ``data`` (module docstring): ``[D, N]``, finite, of IC ``rule.ic`` on the fill returns.

    :raises UserError: too few days, a ticker whose fill returns never move, or an IC out of reach (naming the
        ticker and the largest IC the file can be planted at at this half-life).
    """
    target = resolve_execution("auto", data)
    ahead = fill_returns(None if data.close_only else data.open, data.close)
    steps = data.num_days - 2
    if steps < MIN_FILL_RETURNS:
        raise UserError(
            f"planting needs at least {MIN_FILL_RETURNS} days with a fill return ({MIN_FILL_RETURNS + 2} days of "
            f"prices); the data has {data.num_days} days"
        )
    realised = ahead[:steps]
    flat = [t for t, moves in zip(data.tickers, realised.std(axis=0) > 0, strict=True) if not moves]
    if flat:
        raise UserError(f"fill returns that never move: {shown_list(flat, 5, noun='tickers')}; drop them to plant")
    phi = rule.persistence
    signal = forward_average(winsorise(realised), phi)
    reach = reachable_ic(signal, realised)
    if not (reach >= rule.ic).all():  # a NaN (a signal that never moves) is out of reach too
        worst = int(np.argmin(np.where(np.isnan(reach), -np.inf, reach)))
        best = float(np.floor(reach[worst] * 1e4) / 1e4)  # NaN stays NaN
        largest = (
            f"the largest IC this file takes at this half-life is {best:.4f}"
            if best > 0
            else "no positive IC is reachable"
        )
        raise UserError(
            f"--ic {rule.ic:g} is out of reach at half-life {rule.halflife:g}: {data.tickers[worst]}'s forward "
            f"average of its winsorised fill returns correlates only {reach[worst]:.4f} with them, and noise only "
            f"lowers that; {largest} (a shorter --halflife reaches higher)"
        )
    noise = smooth_noise((data.num_days, data.num_tickers), phi, rule.seed)
    column = np.stack(
        [calibrate(signal[:, i], realised[:, i], noise[:, i], reach[i], rule.ic) for i in range(data.num_tickers)],
        axis=1,
    )
    column /= np.sqrt((column[:steps] ** 2).mean(axis=0))
    return Planted(column, ahead, target)


def cross_sectional_ic(predictor: np.ndarray, ahead: np.ndarray) -> float:
    """The mean over days t of Pearson's correlation across tickers of ``predictor[t]`` with ``ahead[t]`` (both
    ``[D, N]``); days where ``ahead`` has a NaN, or either row never moves across tickers, are left out. NaN with
    fewer than 2 tickers or no such day."""
    rows = ~np.isnan(ahead).any(axis=1)
    a = predictor[rows] - predictor[rows].mean(axis=1, keepdims=True)
    r = ahead[rows] - ahead[rows].mean(axis=1, keepdims=True)
    denominator = np.sqrt((a * a).sum(axis=1) * (r * r).sum(axis=1))
    moving = denominator > 0
    if predictor.shape[1] < 2 or not moving.any():
        return math.nan
    return float(((a * r).sum(axis=1)[moving] / denominator[moving]).mean())


def row_cells(frame: pd.DataFrame, data: MarketData) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``frame`` (a raw long frame, in its own order: the one ``data`` was loaded from), its day and
    ticker index into ``data``'s ``[D, N]`` arrays: ``([rows] int, [rows] int)``.

    The keys are normalised by the loader itself (`standardize_frame`: tickers stripped, dates parsed to the day),
    which carries each row's position through its sort as the close. A row whose day ``data`` dropped is refused.
    """
    names = standardize_frame(frame).attrs["source_columns"]
    flat = frame if names["date"] in frame.columns and names["tic"] in frame.columns else frame.reset_index()
    keys = standardize_frame(
        pd.DataFrame(
            {
                "date": flat[names["date"]].reset_index(drop=True),
                "tic": flat[names["tic"]].reset_index(drop=True),
                "close": np.arange(1, len(flat) + 1, dtype=np.float64),
            }
        )
    )
    position = keys["close"].to_numpy().astype(np.int64) - 1
    dates = keys["date"].to_numpy(dtype="datetime64[ns]")
    day = np.minimum(np.searchsorted(data.dates, dates), data.num_days - 1)
    lost = data.dates[day] != dates
    if lost.any():
        raise UserError(f"{int(lost.sum())} rows fall on days the loaded data dropped; planting writes every row")
    index = {t: i for i, t in enumerate(data.tickers)}
    ticker = np.array([index[t] for t in keys["tic"]], dtype=np.int64)
    days, tickers = np.empty(len(flat), np.int64), np.empty(len(flat), np.int64)
    days[position], tickers[position] = day, ticker
    return days, tickers
