"""The stylized facts of daily stock returns, measured on a market: what `clstm-ppo data inspect --facts` prints, what
the synthetic generator is calibrated to (docs/data.md) and what ``data generate --like`` fits.

All on daily log returns r[t, i] = log(close[t] / close[t-1]); a fact of one ticker is averaged over the tickers
(`Facts` names them, `FACT_LABELS` in words): the excess kurtosis (`excess_kurtosis`), also its median over the tickers
(robust to one ticker's outlier, such as an unadjusted split) and that median after `winsorize` (the body of the
distribution, which a handful of extreme days cannot move); `abs_acf1` (volatility clustering); `leverage` (negative:
falls raise the next day's volatility); `mean_pair_corr`, over all days and over the `selloff_days` (correlations rise
in sell-offs on real markets); the median and max of `next_day_corr` (a lead-lag between stocks; on real daily data the
median is about 0.02, the size of sampling noise); the overnight share var(log(open[t] / close[t-1])) / var(r) (NaN on
close-only data); the drift (252 x the daily mean) and annual volatility (sqrt(252) x the daily std).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

from envs import libm
from envs.data import MarketData

SELLOFF_LOOKBACK = 20  # days of market return before a day that decide whether it is in a sell-off
SELLOFF_QUANTILE = 0.2  # the lowest fifth of those returns
WINSOR_LIMIT = 0.001  # share of each ticker's days winsorised per side for ``winsorized_kurtosis``


class Facts(NamedTuple):
    """One market's stylized facts (module docstring); each a mean over tickers unless it is over pairs or a median."""

    kurtosis: float
    median_kurtosis: float
    winsorized_kurtosis: float
    abs_acf1: float
    leverage: float
    pair_corr: float
    selloff_corr: float
    next_day_corr_median: float
    next_day_corr_max: float
    overnight_share: float
    drift: float
    annual_vol: float


FACT_LABELS: dict[str, str] = {
    "kurtosis": "excess kurtosis",
    "median_kurtosis": "median excess kurtosis",
    "winsorized_kurtosis": "median kurtosis, 0.1% winsorised",
    "abs_acf1": "ACF(1) of |r|",
    "leverage": "leverage corr(r, next |r|)",
    "pair_corr": "mean pair corr",
    "selloff_corr": "mean pair corr in sell-offs",
    "next_day_corr_median": "next-day cross corr, median |.|",
    "next_day_corr_max": "next-day cross corr, max |.|",
    "overnight_share": "overnight share of daily variance",
    "drift": "drift (mean log return a year)",
    "annual_vol": "annual vol",
}
"""Each fact's row label in `clstm-ppo data inspect --facts`."""


def log_returns(data: MarketData) -> np.ndarray:
    """[D - 1, N] daily log returns of the closes."""
    return np.diff(libm.log(np.asarray(data.close, dtype=np.float64)), axis=0)


def excess_kurtosis(r: np.ndarray) -> np.ndarray:
    """[N] unbiased excess kurtosis of each column of ``r`` [T, N] (`scipy.stats.kurtosis`, 0 for a normal law)."""
    return np.asarray(stats.kurtosis(r, axis=0, fisher=True, bias=False), dtype=np.float64)


def winsorize(r: np.ndarray, limit: float = WINSOR_LIMIT) -> np.ndarray:
    """``r`` [T, N] with, in each column, the k = floor(limit x T) smallest values replaced by the (k+1)-th smallest
    and the k largest by the (k+1)-th largest (`scipy.stats.mstats.winsorize` with ``limits=limit``)."""
    t = r.shape[0]
    k = int(math.floor(limit * t))
    if k == 0:
        return r.copy()
    ordered = np.sort(r, axis=0)
    return np.clip(r, ordered[k], ordered[t - 1 - k])


def mean_pair_corr(r: np.ndarray) -> float:
    """Mean correlation over the pairs of columns of ``r`` [T, N] (NaN for one column)."""
    n = r.shape[1]
    if n < 2:
        return float("nan")
    corr = np.corrcoef(r.T)
    return float(corr[~np.eye(n, dtype=bool)].mean())


def abs_acf1(r: np.ndarray) -> np.ndarray:
    """[N] lag-1 autocorrelation of |r| of each column of ``r`` [T, N]."""
    a = np.abs(r) - np.abs(r).mean(axis=0)
    return (a[1:] * a[:-1]).sum(axis=0) / (a * a).sum(axis=0)


def leverage(r: np.ndarray) -> np.ndarray:
    """[N] corr(r[t], |r[t+1]|) of each column of ``r`` [T, N]."""
    x = r[:-1] - r[:-1].mean(axis=0)
    y = np.abs(r[1:]) - np.abs(r[1:]).mean(axis=0)
    return (x * y).sum(axis=0) / np.sqrt((x * x).sum(axis=0) * (y * y).sum(axis=0))


def selloff_days(r: np.ndarray) -> np.ndarray:
    """[T] bool: the days whose equal-weight market return over the `SELLOFF_LOOKBACK` days before is in its lowest
    `SELLOFF_QUANTILE` (the first `SELLOFF_LOOKBACK` days are never sell-off days: no lookback)."""
    market = r.mean(axis=1)
    out = np.zeros(len(r), dtype=bool)
    if len(r) <= SELLOFF_LOOKBACK:
        return out
    trailing = np.convolve(market, np.ones(SELLOFF_LOOKBACK), "valid")[:-1]  # sum over t-L .. t-1, for t = L ..
    out[SELLOFF_LOOKBACK:] = trailing <= np.quantile(trailing, SELLOFF_QUANTILE)
    return out


def next_day_corr(r: np.ndarray) -> np.ndarray:
    """[N (N - 1)] |corr(r_i[t], r_j[t+1])| over the ordered pairs i != j of the columns of ``r`` [T, N]."""
    n = r.shape[1]
    cross = np.corrcoef(r[:-1].T, r[1:].T)[:n, n:]
    return np.abs(cross[~np.eye(n, dtype=bool)])


def market_facts(data: MarketData) -> Facts:
    """The stylized facts (module docstring) of ``data``: needs at least 3 days."""
    r = log_returns(data)
    cross = next_day_corr(r) if r.shape[1] > 1 else np.array([np.nan])
    if data.close_only:
        overnight = float("nan")
    else:
        gap = libm.log(np.asarray(data.open[1:], dtype=np.float64) / np.asarray(data.close[:-1], dtype=np.float64))
        overnight = float((gap.var(axis=0) / r.var(axis=0)).mean())
    kurt = excess_kurtosis(r)
    return Facts(
        kurtosis=float(kurt.mean()),
        median_kurtosis=float(np.median(kurt)),
        winsorized_kurtosis=float(np.median(excess_kurtosis(winsorize(r)))),
        abs_acf1=float(abs_acf1(r).mean()),
        leverage=float(leverage(r).mean()),
        pair_corr=mean_pair_corr(r),
        selloff_corr=mean_pair_corr(r[selloff_days(r)]),
        next_day_corr_median=float(np.median(cross)),
        next_day_corr_max=float(np.max(cross)),
        overnight_share=overnight,
        drift=float(r.mean(axis=0).mean() * 252),
        annual_vol=float((r.std(axis=0) * np.sqrt(252)).mean()),
    )
