"""Statistics for the study: comparing trading policies over seeds against baselines (numpy; scipy for t).

Conventions shared by every function here:

* Inputs are daily simple returns as fractions (``0.01`` = +1 % in a day), or daily portfolio values in
  dollars where a function says so (`clstm_ppo.evaluation.metrics.daily_returns` turns values into returns).
* ``D`` days, ``S`` seeds (independent training runs of one policy), ``N`` trials/configurations, ``M`` metrics.
* Annualised figures use ``TRADING_DAYS = 252`` and the project's one Sharpe formula,
  `envs.returns.annualised_sharpe` (``mean / std(ddof=1) * sqrt(252)``, 0 where the std is ~0 or there
  are fewer than two returns). Means are annualised arithmetically (``x 252``).
* The Sharpe-inference formulas of Bailey & López de Prado (PSR, DSR) are stated in PER-PERIOD (daily)
  units: ``SR_daily = SR_annual / sqrt(252)`` (`to_daily_sharpe` converts an annualised Sharpe ratio, with the
  periods per year as an argument, since papers differ) and a variance of Sharpe ratios divides by 252.
* Randomised functions take a ``seed`` (or a ``numpy.random.Generator``) and are deterministic given it.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist
from typing import Any

import numpy as np

from envs.returns import TRADING_DAYS, ZERO_STD, annualised_sharpe, sharpe_from_returns

EULER_GAMMA = 0.5772156649015329
"""Euler–Mascheroni constant, used by `expected_max_sharpe`."""

_NORMAL = NormalDist()

_CHUNK_ELEMENTS = 1 << 21
"""Resampled floats held at once by `paired_sharpe_difference` (x 8 bytes, plus temporaries)."""

BOOTSTRAP_DRAWS = 10_000
"""Default number of bootstrap draws of every Sharpe interval and paired Sharpe difference in the product
(`paired_sharpe_difference`, `sharpe_interval`, the study's report, the line after training). At 10,000 draws the
Monte Carlo standard error of a 2.5% percentile bound (`quantile_mcse`) is ``sqrt(0.025 * 0.975 / 10,000) /
pdf(1.96) = 0.027`` of the draws' standard deviation (at 2,000 draws: 0.060). Cost: 10,000 draws of a 4-seed x
2,000-day pair take about 1.3 s on one CPU core."""


# ------------------------------------------------------------------------------------------------ helpers


def _returns_1d(returns: Any, name: str = "returns") -> np.ndarray:
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D series of daily returns, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"{name} contain NaN or inf")
    return r


def _paired_1d(returns: Any, benchmark: Any) -> tuple[np.ndarray, np.ndarray]:
    r = _returns_1d(returns)
    b = _returns_1d(benchmark, "benchmark")
    if r.shape != b.shape:
        raise ValueError(f"returns and benchmark must cover the same days, got {r.shape} and {b.shape}")
    return r, b


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _sharpe(returns: np.ndarray, axis: int = -1) -> np.ndarray:
    """Annualised Sharpe (the project's formula) of every series along ``axis`` of ``returns``."""
    n = returns.shape[axis]
    mean = np.mean(returns, axis=axis)
    std = np.std(returns, axis=axis, ddof=1) if n >= 2 else np.zeros_like(mean)
    return annualised_sharpe(mean, std, n)


def to_daily_sharpe(annual_sharpe: float, periods_per_year: float = TRADING_DAYS) -> float:
    """Annualised Sharpe ratio -> per-period Sharpe: ``SR_annual / sqrt(periods_per_year)``.

    Use it for the ``benchmark_sharpe`` of `probabilistic_sharpe_ratio` when the benchmark is quoted annualised.
    ``periods_per_year`` defaults to the project's 252 trading days (Bailey & López de Prado's DSR example uses 250).
    """
    return float(annual_sharpe) / math.sqrt(periods_per_year)


# --------------------------------------------------------------------------------- benchmark-relative


def beta_alpha(returns: Any, benchmark: Any) -> tuple[float, float]:
    """OLS regression of daily returns on the benchmark's: ``r_t = a + beta * b_t + e_t``.

    :param returns: ``[D]`` daily simple returns of the portfolio (fractions).
    :param benchmark: ``[D]`` daily simple returns of the benchmark on the same days (fractions).
    :return: ``(beta, alpha)``: ``beta = cov(r, b) / var(b)`` (dimensionless) and the annualised alpha
        ``alpha = (mean(r) - beta * mean(b)) * 252`` (fraction per year; Jensen's alpha with a zero risk-free rate).

    A benchmark that does not vary (std ``<= ZERO_STD``, or a single day) explains nothing: ``beta = 0``
    and ``alpha = mean(r) * 252``.
    """
    r, b = _paired_1d(returns, benchmark)
    if r.size < 2 or np.std(b, ddof=1) <= ZERO_STD:
        return 0.0, float(np.mean(r) * TRADING_DAYS)
    db = b - np.mean(b)
    beta = float(np.sum(db * (r - np.mean(r))) / np.sum(db * db))
    return beta, float((np.mean(r) - beta * np.mean(b)) * TRADING_DAYS)


def information_ratio(returns: Any, benchmark: Any) -> float:
    """Annualised information ratio: ``mean(a) * 252 / (std(a, ddof=1) * sqrt(252))`` with ``a = r - b``.

    :param returns: ``[D]`` daily simple returns of the portfolio (fractions).
    :param benchmark: ``[D]`` daily simple returns of the benchmark on the same days.
    :return: dimensionless, per sqrt(year): the Sharpe ratio of the active returns, computed by the project's one Sharpe
        formula, so it is 0 when the tracking error is ~0 (``std <= ZERO_STD``) or there are fewer than two days.
    """
    r, b = _paired_1d(returns, benchmark)
    return sharpe_from_returns(r - b)


def mean_exposure(values: Any, holdings_value: Any) -> float:
    """Mean gross invested fraction of a long-only portfolio: ``mean_t(holdings_value[t] / values[t])``.

    :param values: ``[D]`` total portfolio value per day, dollars (cash + holdings), > 0.
    :param holdings_value: ``[D]`` dollars held in stocks on the same days (shares x close), >= 0.
    :return: fraction in [0, 1]: 0 = always all cash, 1 = always fully invested. Float rounding above 1
        (up to 1e-9) is clipped; anything further outside [0, 1] raises ``ValueError`` (a short book or
        negative cash is not a long-only portfolio).
    """
    v = _returns_1d(values, "values")
    h = _returns_1d(holdings_value, "holdings_value")
    if v.shape != h.shape:
        raise ValueError(f"values and holdings_value must cover the same days, got {v.shape} and {h.shape}")
    if np.any(v <= 0):
        raise ValueError("values must be > 0 dollars")
    frac = h / v
    if np.any(frac < -1e-9) or np.any(frac > 1.0 + 1e-9):
        raise ValueError("holdings_value / values outside [0, 1]: not a long-only portfolio")
    return float(np.mean(np.clip(frac, 0.0, 1.0)))


def exposure_timing(values: Any, holdings_value: Any, benchmark_values: Any, forced: Any = None) -> tuple[float, float]:
    """How much, and how well, a long-only portfolio moves its exposure from day to day.

    Row i's holdings were bought at row i-1's close (`clstm_ppo.agent.evaluate.PolicyRun`) and its cash is what
    that trade left, so the exposure chosen at day i-1, with what was known then, is
    ``e[i] = 1 - cash[i] / values[i-1]`` with ``cash = values - holdings_value`` (valued at i-1's close, before
    that trade's costs; measured at row i's close instead it would rise with the very move it is compared to).

    :param values: ``[D]`` dollars; :param holdings_value: ``[D]`` dollars in stock; :param benchmark_values:
        ``[D]`` dollars of the market (equal-weight buy-and-hold) on the same days.
    :param forced: optional ``[D]`` bool, days whose exposure a rule forced (the turbulence stop sells everything
        at day i-1's close when ``forced[i-1]``): those choices are left out.
    :return: ``(std, timing)`` over the days left: the standard deviation of ``e`` (a fraction: 0 = the exposure
        never changes), and the Pearson correlation of ``e`` with the benchmark's return from day i-1 to day i
        (> 0: more invested on the days the market then rises; NaN when the exposure never changes).
    """
    v = _returns_1d(values, "values")
    h = _returns_1d(holdings_value, "holdings_value")
    b = _returns_1d(benchmark_values, "benchmark_values")
    if not v.shape == h.shape == b.shape:
        raise ValueError(
            f"values, holdings_value and benchmark_values must cover the same days, got {v.shape}, "
            f"{h.shape} and {b.shape}"
        )
    if v.size < 3:
        return 0.0, math.nan
    e = np.clip(1.0 - (v[1:] - h[1:]) / v[:-1], 0.0, 1.0)
    r = b[1:] / b[:-1] - 1.0
    if forced is not None:
        keep = ~np.asarray(forced, dtype=bool)[:-1]
        e, r = e[keep], r[keep]
    if e.size < 2:
        return 0.0, math.nan
    std = float(e.std())
    if std < 1e-3 or float(r.std()) < 1e-15:  # under 0.1 point: cash rounding, not a choice
        return std, math.nan
    return std, float(np.corrcoef(e, r)[0, 1])


# ---------------------------------------------------------------------------------------- bootstraps


def bootstrap_mean_ci(
    samples: Any, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> tuple[Any, Any, Any]:
    """Percentile-bootstrap confidence interval of a mean across seeds (Efron & Tibshirani 1993, ch. 13).

    Each of ``n_boot`` draws resamples the ``S`` rows with replacement (as multinomial counts, so the
    work is one ``[n_boot, S] @ [S, M]`` product); the interval is the ``(1 - c) / 2`` and
    ``(1 + c) / 2`` quantiles of the draws' means (numpy's default linear interpolation).

    :param samples: ``[S]`` one number per seed (e.g. a Sharpe ratio), or ``[S, M]`` M metrics at once.
    :return: ``(mean, lo, hi)``: floats for ``[S]`` input, ``[M]`` arrays for ``[S, M]``; ``mean`` is the
        plain sample mean. ``S == 1``: ``(x, nan, nan)`` -- one seed says nothing about spread.

    Caveat: the percentile interval of a mean is about as wide as ``mean +- z * std(ddof=0) / sqrt(S)``, so for small S
    it is too narrow (S = 5: ~0.84 coverage at 0.95 nominal, S = 30: ~0.93). Read it as a description of seed-to-seed
    spread, not an exact 95 % interval, when S is small. No BCa or Student-t correction is applied.
    """
    _check_confidence(confidence)
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"samples must be [S] or [S, M] with S >= 1, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contain NaN or inf")
    one_d = x.ndim == 1
    x2 = x[:, None] if one_d else x
    s = x2.shape[0]
    mean = np.mean(x2, axis=0)
    if s == 1:
        lo = hi = np.full(x2.shape[1], np.nan)
    else:
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(s, np.full(s, 1.0 / s), size=int(n_boot)).astype(np.float64)
        means = counts @ x2 / s  # [n_boot, M]
        alpha = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(means, [alpha, 1.0 - alpha], axis=0)
    if one_d:
        return float(mean[0]), float(lo[0]), float(hi[0])
    return mean, lo, hi


def t_interval(samples: Any, confidence: float = 0.95) -> tuple[float, float, float]:
    """Student-t interval of a mean over ``S`` seeds: ``(lo, hi, one-sided lower bound)``, the two-sided
    ``confidence`` interval ``mean -+ t_{(1+c)/2, S-1} * std(ddof=1) / sqrt(S)`` and the one-sided bound at
    ``confidence``, ``mean - t_{c, S-1} * std(ddof=1) / sqrt(S)``. For a handful of seeds it is the honest width
    (`bootstrap_mean_ci` is too narrow there). ``S == 1``: ``(nan, nan, nan)``.

    :param samples: ``[S]`` one number per seed (e.g. a Sharpe ratio, or a paired difference).
    """
    from scipy import stats  # the only t quantile here: scipy is imported when it is asked for

    _check_confidence(confidence)
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"samples must be a non-empty finite [S] array, got shape {x.shape}")
    if x.size == 1:
        return math.nan, math.nan, math.nan
    se = float(x.std(ddof=1)) / math.sqrt(x.size)
    two = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1)) * se
    one = float(stats.t.ppf(confidence, x.size - 1)) * se
    return float(x.mean() - two), float(x.mean() + two), float(x.mean() - one)


def ratio_t_interval(numerators: Any, denominators: Any, confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of a ratio of means over ``S`` seeds, ``mean(a) / mean(b)`` (a share of the reference
    trader's excess: a = trained - buy-and-hold, b = reference - buy-and-hold, paired by seed), by the delta method:
    the ratio r -+ ``t_{(1+c)/2, S-1} * std(a - r b, ddof=1) / (sqrt(S) * mean(b))``. For a handful of seeds it is
    wider and more honest than resampling the seeds. ``S == 1``: ``(nan, nan)``.

    :param numerators: ``[S]``; :param denominators: ``[S]``, with a mean far from 0.
    """
    a, b = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"numerators {a.shape} and denominators {b.shape} must pair by seed")
    ratio = float(a.mean() / b.mean())
    lo, hi, _ = t_interval(a - ratio * b, confidence)
    return ratio + lo / float(b.mean()), ratio + hi / float(b.mean())


def default_block_length(num_days: int) -> int:
    """Mean block length for the stationary bootstrap: ``max(1, round(num_days ** (1/3)))`` days.

    The n^(1/3) rule: the block length that minimises the mean squared error of block-bootstrap variance estimates grows
    as ``n^(1/3)`` (Hall, Horowitz & Jing 1995, "On blocking rules for the bootstrap with dependent data", Biometrika
    82; the same rate for the stationary bootstrap in Politis & White 2004, "Automatic block-length selection for the
    dependent bootstrap"), and the constant 1 is the common rule of thumb. 252 days -> 6, 1,000 days -> 10.
    """
    if num_days < 1:
        raise ValueError(f"num_days must be >= 1, got {num_days}")
    return max(1, round(num_days ** (1.0 / 3.0)))


def stationary_bootstrap_indices(
    num_days: int, num_draws: int, mean_block: float, rng: np.random.Generator
) -> np.ndarray:
    """Day indices of the stationary bootstrap of Politis & Romano (1994), "The Stationary Bootstrap", JASA.

    Each draw is a series of ``num_days`` indices built from blocks of consecutive days: a block starts at a uniformly
    random day and continues ``i -> (i + 1) mod num_days`` (wrapping past the end) until a new block starts, which
    happens before each day with probability ``p = 1 / mean_block``; block lengths are geometric with mean
    ``mean_block``. Every day is equally likely at every position, and the resampled series is stationary.
    ``mean_block = 1`` is the ordinary i.i.d. bootstrap. Memory: a few ``[num_draws, num_days]`` arrays.

    :param num_days: D, the length of the original (and of every resampled) series.
    :param num_draws: B, the number of bootstrap series.
    :param mean_block: expected block length in days, >= 1.
    :param rng: the generator to draw from (consumed: two arrays of ``[B, D]`` draws).
    :return: ``[num_draws, num_days] int64`` indices into the original days.
    """
    if num_days < 1 or num_draws < 0:
        raise ValueError(f"need num_days >= 1 and num_draws >= 0, got {num_days} and {num_draws}")
    if not mean_block >= 1.0:
        raise ValueError(f"mean_block must be >= 1 day, got {mean_block}")
    shape = (int(num_draws), int(num_days))
    new_block = rng.random(shape) < 1.0 / mean_block
    new_block[:, 0] = True
    starts = rng.integers(0, num_days, size=shape)
    day = np.arange(num_days)
    last_start = np.maximum.accumulate(np.where(new_block, day, 0), axis=1)
    first_day = np.take_along_axis(starts, last_start, axis=1)
    return (first_day + (day - last_start)) % num_days


def block_bootstrap_sharpe(
    policy: np.ndarray,
    baseline: np.ndarray | None,
    *,
    n_boot: int,
    mean_block: float,
    seed: int,
    resample_seeds: bool = True,
) -> np.ndarray:
    """``[n_boot]`` draws of ``mean_s (SR(policy_s) - SR(baseline_s))`` on resampled days (and seeds).

    The one resampling behind `paired_sharpe_difference` (whose docstring explains it) and `sharpe_interval`; the
    seeds are weighted by multinomial counts (S of S with replacement) only when ``resample_seeds``.

    :param policy: ``[S, D]`` float64 daily returns, finite, D >= 2 (checked by the callers).
    :param baseline: ``[D]`` or ``[S, D]`` daily returns on the same days, or None: the draws are then of
        ``mean_s SR(policy_s)`` itself.
    :param mean_block: mean block length in days (>= 1).
    :return: ``[n_boot] float64`` annualised Sharpe ratios (or differences of them).
    """
    s, d = policy.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    chunk = max(1, min(n_boot, _CHUNK_ELEMENTS // (s * d)))
    uniform = np.full(s, 1.0 / s)
    for start in range(0, n_boot, chunk):
        c = min(chunk, n_boot - start)
        days = stationary_bootstrap_indices(d, c, mean_block, rng)  # [c, D]
        # [c, S]: how often each seed is drawn
        seed_counts = rng.multinomial(s, uniform, size=c) if resample_seeds else np.ones((c, s))
        # np.take gathers into C-contiguous rows, so every series is summed in the same (pairwise) order
        # whatever its batch shape: an identical policy and baseline give an exactly zero difference
        sharpe = _sharpe(np.take(policy, days, axis=1))  # [S, c]
        if baseline is not None:
            sharpe = sharpe - _sharpe(np.take(baseline, days, axis=-1))  # - [c] or [S, c]
        stats[start : start + c] = np.sum(seed_counts * sharpe.T, axis=1) / s
    return stats


def bootstrap_p_value(draws: Any, null: float = 0.0) -> float:
    """Two-sided p-value of ``statistic == null`` from bootstrap draws of the statistic.

    ``p = min(1, 2 * min(#{draws <= null} + 1, #{draws >= null} + 1) / (B + 1))``: twice the smaller tail of the draws
    beyond the null, the inversion of the percentile interval (0 lies outside the level-c percentile interval about when
    p < 1 - c). The +1s count the observed sample as one draw (Davison & Hinkley 1997, "Bootstrap Methods and their
    Application", eq. 4.11), so p is never 0: the smallest p that B draws can show is ``2 / (B + 1)``.

    :param draws: ``[B]`` bootstrap draws (e.g. of a Sharpe difference), finite.
    :param null: the value tested.
    :return: p in ``(0, 1]``.
    """
    x = np.asarray(draws, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"draws must be a non-empty finite 1-D array, got shape {x.shape}")
    below, above = int(np.sum(x <= null)) + 1, int(np.sum(x >= null)) + 1
    return float(min(1.0, 2.0 * min(below, above) / (x.size + 1)))


def quantile_mcse(draws: Any, levels: Any, z: float = 1.0) -> np.ndarray:
    """Monte Carlo standard error of sample quantiles of ``B`` draws, by the order-statistic (binomial) method.

    The number of draws below the true q-quantile is Binomial(B, q), so the order statistics of ranks
    ``B q -+ z sqrt(B q (1 - q))`` bracket it with the normal probability of ``[-z, z]`` (Conover 1999, "Practical
    Nonparametric Statistics", 3rd ed., sec. 3.2); with ``z = 1`` their half-distance estimates one standard error
    of the estimated quantile without assuming any shape of the draws' distribution:

        ``SE(q) = (Q(q + d) - Q(q - d)) / 2``,  ``d = z sqrt(q (1 - q) / B)``,

    where ``Q`` is the same quantile rule as the bounds themselves (numpy's linear interpolation, rank ``q (B - 1)``
    counted from 0) and ``q -+ d`` are clipped to ``[0, 1]`` (near the ends the estimate then uses the smallest or
    largest draw, and it is only rough: a bound a few draws from the end is poorly determined, and says so by a
    large SE). For draws from a normal distribution of scale sigma it tends to the asymptotic
    ``sigma sqrt(q (1 - q) / B) / pdf(z_q)`` (Kendall and Stuart), which the tests check.

    :param draws: ``[B]`` finite bootstrap draws (any units; the SE comes out in the same units).
    :param levels: a level q in [0, 1] or ``[K]`` of them.
    :param z: the half-width of the bracketing ranks in binomial standard deviations (1: one standard error).
    :return: ``[K]`` float64 standard errors, >= 0 (a float array of the shape of ``levels``); 0 where every draw is
        equal.
    """
    x = np.asarray(draws, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"draws must be a non-empty finite 1-D array, got shape {x.shape}")
    q = np.asarray(levels, dtype=np.float64)
    if not np.all((q >= 0.0) & (q <= 1.0)):
        raise ValueError("levels must lie in [0, 1]")
    d = z * np.sqrt(q * (1.0 - q) / x.size)
    upper = np.quantile(x, np.clip(q + d, 0.0, 1.0))
    lower = np.quantile(x, np.clip(q - d, 0.0, 1.0))
    return np.asarray((upper - lower) / 2.0)


def bonferroni_confidence(confidence: float, family: int) -> float:
    """The level of each of ``family`` simultaneous intervals by Bonferroni's inequality: ``1 - (1 - c) / m``.

    If each of m intervals misses its true value with probability at most ``(1 - c) / m``, the chance that any of
    them misses is at most ``1 - c`` whatever their dependence. ``m = 1`` gives ``c`` back.

    :param confidence: c in (0, 1), the family-wise level wanted.
    :param family: m >= 1, the number of intervals (of configurations tried) the family holds.
    :return: the level in ``[c, 1)`` of each interval.
    """
    _check_confidence(confidence)
    if family < 1:
        raise ValueError(f"family must be >= 1, got {family}")
    return 1.0 - (1.0 - confidence) / family


def percentile_interval(draws: np.ndarray, confidence: float, family: int | None = None) -> dict[str, float]:
    """The percentile interval of bootstrap ``draws`` ``[B]`` with each bound's Monte Carlo standard error.

    :return: ``lo``, ``hi``: the ``(1 -+ c) / 2`` quantiles of the draws (numpy's linear interpolation); ``lo_mcse``,
        ``hi_mcse``: their standard errors (`quantile_mcse`, order-statistic method); with ``family`` m (>= 1) also
        ``bonferroni_m`` m, ``bonferroni_confidence`` ``1 - (1 - c) / m`` and ``lo_bonferroni``, ``hi_bonferroni``,
        ``lo_bonferroni_mcse``, ``hi_bonferroni_mcse``: the same draws' interval at that level (no second bootstrap).
    """
    alpha = (1.0 - confidence) / 2.0
    levels = [alpha, 1.0 - alpha]
    if family is not None:
        wide = bonferroni_confidence(confidence, family)
        levels += [alpha / family, 1.0 - alpha / family]
    bounds, errors = np.quantile(draws, levels), quantile_mcse(draws, levels)
    out = {"lo": float(bounds[0]), "hi": float(bounds[1]), "lo_mcse": float(errors[0]), "hi_mcse": float(errors[1])}
    if family is not None:
        out.update(
            bonferroni_m=int(family),
            bonferroni_confidence=wide,
            lo_bonferroni=float(bounds[2]),
            hi_bonferroni=float(bounds[3]),
            lo_bonferroni_mcse=float(errors[2]),
            hi_bonferroni_mcse=float(errors[3]),
        )
    return out


def _check_returns_matrix(p: np.ndarray, name: str) -> None:
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 2:
        raise ValueError(f"{name} must be [S, D] with S >= 1 and D >= 2, got shape {p.shape}")


def paired_sharpe_difference(
    policy: Any,
    baseline: Any,
    confidence: float = 0.95,
    n_boot: int = BOOTSTRAP_DRAWS,
    mean_block: float | None = None,
    seed: int = 0,
    resample_seeds: bool = True,
    family: int | None = None,
) -> dict[str, Any]:
    """How much better a policy's annualised Sharpe is than a baseline's, with a bootstrap interval.

    :param policy: ``[S, D]`` daily simple returns of S seeds of the policy on the same D days.
    :param baseline: ``[D]`` daily returns of one baseline (e.g. buy-and-hold) on those days, or
        ``[S, D]`` one per seed (paired row by row).
    :param confidence: two-sided level of the interval.
    :param n_boot: number of bootstrap draws (default `BOOTSTRAP_DRAWS`, 10,000).
    :param mean_block: mean block length in days for the stationary bootstrap; None:
        `default_block_length` (D^(1/3)).
    :param seed: seeds the generator; the result is a function of the inputs and the seed.
    :param resample_seeds: resample seeds as well as days (default, see below); False keeps the S seeds
        fixed, giving an interval for these particular seeds rather than for a freshly trained one.
    :param family: m >= 1, the number of configurations this one was chosen among (the study passes the trials
        ledger's count of configurations on these days): adds the Bonferroni-widened interval of the same draws at
        level ``1 - (1 - confidence) / m`` (`bonferroni_confidence`). None: no such interval.
    :return: dict with
        ``difference``: ``mean_s (SR(policy_s) - SR(baseline_s))`` on the original days (annualised);
        ``lo``, ``hi``: percentile interval of the same statistic over the draws;
        ``lo_mcse``, ``hi_mcse``: the Monte Carlo standard error of each bound (`quantile_mcse`: how far another
        ``n_boot`` draws could move it, in the same Sharpe units);
        with ``family``: ``bonferroni_m``, ``bonferroni_confidence``, ``lo_bonferroni``, ``hi_bonferroni`` and their
        ``lo_bonferroni_mcse``, ``hi_bonferroni_mcse`` (`percentile_interval`);
        ``p_value``: two-sided bootstrap p-value of "no difference" (`bootstrap_p_value` of the draws);
        ``seeds_beating``: number of seeds with ``SR(policy_s) > SR(baseline_s)`` (strictly);
        ``num_seeds`` S, ``mean_block``, ``n_boot``;
        ``policy_sharpe``, ``baseline_sharpe``: ``[S]`` the per-seed annualised Sharpe ratios.

    Design. One draw does two resamplings at once:

    * DAYS, with the stationary bootstrap (`stationary_bootstrap_indices`, Politis & Romano 1994), which
      keeps volatility clustering and autocorrelation within blocks. The SAME day indices are applied to
      every policy seed and to the baseline (a paired bootstrap), so market moves common to both cancel
      in the difference and the interval measures the difference, not the market's luck.
    * SEEDS, with replacement (S of S), so the seed-to-seed variation of training also widens the interval.

    The draw's statistic is the mean over the drawn seeds of ``SR(policy_s) - SR(baseline_s)`` on the drawn days, and
    ``lo``/``hi`` are its ``(1 -+ c) / 2`` quantiles (percentile interval, no bias correction). Identical policy and
    baseline give exactly ``[0, 0]``; with ``S == 1`` only the day resampling is left.

    Resampling both factors of a crossed seeds x days design is conservative (Owen 2007, "The pigeonhole
    bootstrap", Ann. Appl. Stat. 1(2)): each seed's own day-to-day noise enters twice, once through the
    days and once as apparent seed-to-seed spread. With seeds whose true Sharpe ratios differ (the
    realistic case for RL training runs) coverage is close to nominal; with seeds that differ only by
    noise on the same days it over-covers (~0.99 at 0.95 nominal when that noise dominates; see the
    tests). It never under-covers because of the seeds, which ignoring seed variation would.

    Cost: ``n_boot x S x D`` gathered floats, processed in chunks of about ``_CHUNK_ELEMENTS``
    (`block_bootstrap_sharpe` draws them; `sharpe_interval` is the same draw without a baseline).
    """
    _check_confidence(confidence)
    p, b = np.asarray(policy, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    _check_returns_matrix(p, "policy")
    if b.shape not in ((p.shape[1],), p.shape):
        raise ValueError(f"baseline must be [D] or [S, D] matching policy {p.shape}, got {b.shape}")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(b))):
        raise ValueError("policy or baseline returns contain NaN or inf")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    s, d = p.shape
    block = float(default_block_length(d) if mean_block is None else mean_block)

    sr_policy = _sharpe(p)
    sr_base = np.broadcast_to(_sharpe(b), (s,))
    stats = block_bootstrap_sharpe(p, b, n_boot=n_boot, mean_block=block, seed=seed, resample_seeds=resample_seeds)
    return {
        "difference": float(np.mean(sr_policy - sr_base)),
        **percentile_interval(stats, confidence, family),
        "p_value": bootstrap_p_value(stats),
        "seeds_beating": int(np.sum(sr_policy > sr_base)),
        "num_seeds": s,
        "mean_block": block,
        "n_boot": int(n_boot),
        "policy_sharpe": sr_policy,
        "baseline_sharpe": np.array(sr_base),
    }


def sharpe_interval(
    returns: Any, confidence: float = 0.95, n_boot: int = BOOTSTRAP_DRAWS, *, seed: int = 0
) -> dict[str, Any]:
    """An annualised Sharpe ratio with an interval that includes the market's noise, not only the seeds'.

    :param returns: ``[D]`` daily simple returns of one series (a baseline: only days are resampled), or
        ``[S, D]`` S seeds of one policy on the same D days (days and seeds), in blocks of the default mean length
        (`default_block_length`).
    :param confidence: / :param n_boot: / :param seed: as in `paired_sharpe_difference` (the same default
        `BOOTSTRAP_DRAWS`: one curve costs about what a pair does, so it keeps the same count).
    :return: dict with ``sharpe`` (``mean_s SR(returns_s)`` on the original days), ``lo``, ``hi`` (percentile
        interval of the same statistic over `block_bootstrap_sharpe` draws), ``lo_mcse``, ``hi_mcse`` (each bound's
        Monte Carlo standard error, `quantile_mcse`), ``num_seeds``, ``mean_block``, ``n_boot`` and ``resamples``
        ("days" or "days and seeds", for the report's words).

    What it answers: how much the Sharpe ratio could differ on another draw of market days like these (the
    stationary block bootstrap keeps their volatility clustering), from a freshly trained seed. Over ~680 days
    the market's noise alone gives an annualised Sharpe a standard error of about ``sqrt(252 / 680) = 0.6``,
    which an interval over seeds on fixed days (`bootstrap_mean_ci`) leaves out.
    """
    _check_confidence(confidence)
    x = np.asarray(returns, dtype=np.float64)
    p = x[None, :] if x.ndim == 1 else x
    _check_returns_matrix(p, "returns")
    if not np.all(np.isfinite(p)):
        raise ValueError("returns contain NaN or inf")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    block = float(default_block_length(p.shape[1]))
    stats = block_bootstrap_sharpe(p, None, n_boot=n_boot, mean_block=block, seed=seed)
    return {
        "sharpe": float(np.mean(_sharpe(p))),
        **percentile_interval(stats, confidence),
        "num_seeds": int(p.shape[0]),
        "mean_block": block,
        "n_boot": int(n_boot),
        "resamples": "days and seeds" if p.shape[0] > 1 else "days",
    }


# ------------------------------------------------------------------------------------ multiple comparisons


def holm_adjust(p_values: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 6(2)): family-wise error control under any dependence between the tests.

    With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``: ``adj_(i) = max_{j <= i} min(1, (m - j + 1)
    p_(j))``, returned in the input's order. Rejecting every hypothesis whose adjusted p is ``< alpha`` keeps the
    probability of any false rejection in the family at most alpha.

    :param p_values: ``[m]`` p-values in [0, 1] (m >= 0).
    :return: ``[m] float64`` adjusted p-values, each ``>=`` its raw p-value and ``<= 1``.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values must be 1-D, got shape {p.shape}")
    if not np.all((p >= 0.0) & (p <= 1.0)):
        raise ValueError("p_values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def active_returns(returns: Any, benchmark: Any) -> np.ndarray:
    """``[D]`` active daily returns ``r_t - b_t`` of a portfolio over a benchmark on the same days (fractions).

    PSR and DSR of these test "beats the benchmark" rather than "Sharpe > 0", which on a long-only book in a
    rising market mostly measures exposure.
    """
    r, b = _paired_1d(returns, benchmark)
    return r - b


# ------------------------------------------------------------------------------ PSR and deflated Sharpe


def probabilistic_sharpe_from_moments(
    sharpe: float, skewness: float, kurtosis: float, num_returns: int, benchmark_sharpe: float = 0.0
) -> float:
    """PSR from the moments, all in PER-PERIOD units (Bailey & López de Prado 2012, eq. for PSR).

    ``PSR = Phi( (SR - SR*) sqrt(n - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2) )``

    :param sharpe: SR, the observed per-period (daily, NOT annualised) Sharpe ratio.
    :param skewness: g3 of the returns.
    :param kurtosis: g4 of the returns, non-excess (normal = 3).
    :param num_returns: n, the number of returns behind SR (>= 2).
    :param benchmark_sharpe: SR*, per period (`to_daily_sharpe` converts an annualised one).
    :return: probability in [0, 1] that the true Sharpe exceeds SR*.

    The variance term is ``>= 0`` for any distribution (``g4 >= 1 + g3^2``); if rounding makes it ``<= 0``
    the PSR is 1, 0 or 0.5 by the sign of ``SR - SR*``.
    """
    if num_returns < 2:
        raise ValueError(f"PSR needs at least 2 returns, got {num_returns}")
    diff = (sharpe - benchmark_sharpe) * math.sqrt(num_returns - 1)
    var = 1.0 - skewness * sharpe + (kurtosis - 1.0) / 4.0 * sharpe * sharpe
    if var <= 0.0:
        return 0.5 if diff == 0.0 else float(diff > 0.0)
    return _NORMAL.cdf(diff / math.sqrt(var))


def _daily_sharpe_skew_kurtosis(r: np.ndarray) -> tuple[float, float, float]:
    """Per-period Sharpe (the project's formula / sqrt(252)), skewness and non-excess kurtosis.

    Skewness ``m3 / m2^1.5`` and kurtosis ``m4 / m2^2`` use the biased (population) central moments ``m_k`` as in the
    papers; a series whose std is ~0 counts as normal (0, 3), its Sharpe being 0 by the project's convention.
    """
    sr = sharpe_from_returns(r) / math.sqrt(TRADING_DAYS)
    dev = r - np.mean(r)
    m2 = float(np.mean(dev**2))
    if r.size < 2 or math.sqrt(m2) <= ZERO_STD:
        return sr, 0.0, 3.0
    return sr, float(np.mean(dev**3)) / m2**1.5, float(np.mean(dev**4)) / m2**2


def probabilistic_sharpe_ratio(returns: Any, benchmark_sharpe: float = 0.0) -> float:
    """Probabilistic Sharpe ratio of a daily return series (Bailey & López de Prado 2012, "The Sharpe
    Ratio Efficient Frontier", Journal of Risk 15(2)).

    :param returns: ``[D]`` daily simple returns (fractions), D >= 2.
    :param benchmark_sharpe: SR*, a DAILY Sharpe ratio; for an annualised one pass ``to_daily_sharpe(sr_annual)``.
    :return: ``Phi((SR - SR*) sqrt(D - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2))`` with SR the daily Sharpe
        (`envs.returns.annualised_sharpe` / sqrt(252)), g3 the skewness and g4 the (non-excess) kurtosis
        of the returns: the probability that the true Sharpe exceeds SR* given the track record.
    """
    r = _returns_1d(returns)
    sr, skew, kurt = _daily_sharpe_skew_kurtosis(r)
    return probabilistic_sharpe_from_moments(sr, skew, kurt, r.size, benchmark_sharpe)


def expected_max_sharpe(num_trials: float, sharpe_variance: float) -> float:
    """Expected maximum Sharpe of N unskilled trials (Bailey & López de Prado 2014, "The Deflated Sharpe
    Ratio", Journal of Portfolio Management 40(5); from the false strategy theorem).

    ``SR0 = sqrt(V) ((1 - gamma) Phi^-1(1 - 1/N) + gamma Phi^-1(1 - 1/(N e)))``, gamma = Euler–Mascheroni.

    :param num_trials: N >= 1, the number of (independent) configurations tried.
    :param sharpe_variance: V >= 0, the variance across the trials of their Sharpe estimates; SR0 comes
        out in the same units (pass a per-period variance to get a per-period SR0: a variance of annualised
        Sharpe ratios divided by the periods per year).
    :return: SR0. ``N == 1``: 0 (nothing was selected, so nothing to deflate).
    """
    if num_trials < 1:
        raise ValueError(f"num_trials must be >= 1, got {num_trials}")
    if sharpe_variance < 0:
        raise ValueError(f"sharpe_variance must be >= 0, got {sharpe_variance}")
    if num_trials == 1:
        return 0.0
    z1 = _NORMAL.inv_cdf(1.0 - 1.0 / num_trials)
    z2 = _NORMAL.inv_cdf(1.0 - 1.0 / (num_trials * math.e))
    return math.sqrt(sharpe_variance) * ((1.0 - EULER_GAMMA) * z1 + EULER_GAMMA * z2)


def deflated_sharpe_ratio(returns: Any, num_trials: float, sharpe_variance: float) -> float:
    """Deflated Sharpe ratio (Bailey & López de Prado 2014): ``DSR = PSR(SR* = SR0)``.

    :param returns: ``[D]`` daily simple returns of the selected strategy (fractions).
    :param num_trials: N, how many configurations were tried before selecting this one (>= 1).
    :param sharpe_variance: V, the variance across those trials of their DAILY Sharpe ratios (one of annualised
        Sharpe ratios divided by 252).
    :return: probability in [0, 1] that the true Sharpe exceeds the expected maximum of N unskilled trials
        `expected_max_sharpe(N, V)`. ``N == 1``: SR0 = 0, so DSR = PSR(0).
    """
    return probabilistic_sharpe_ratio(returns, expected_max_sharpe(num_trials, sharpe_variance))


# ------------------------------------------------------------------------------------------------- PBO


def _cscv_sharpe(r: np.ndarray, blocks: list[np.ndarray], masks: np.ndarray) -> np.ndarray:
    """Annualised Sharpe of every configuration on the union of the blocks selected by each mask row.

    Uses per-block sums of the series centred on their full-sample mean (the centring keeps the
    sum-of-squares variance accurate, and a constant series exactly constant): ``[C, N]``.
    """
    mu = np.mean(r, axis=0)
    x = r - mu
    n_b = np.array([len(i) for i in blocks], dtype=np.float64)  # [K]
    s_b = np.stack([x[i].sum(axis=0) for i in blocks])  # [K, N]
    q_b = np.stack([(x[i] ** 2).sum(axis=0) for i in blocks])  # [K, N]
    m = masks.astype(np.float64)
    n = (m @ n_b)[:, None]  # [C, 1]
    s, q = m @ s_b, m @ q_b
    var = np.maximum(q - s * s / n, 0.0) / (n - 1.0)
    return annualised_sharpe(mu + s / n, np.sqrt(var), n)


def probability_of_backtest_overfitting(returns: Any, num_splits: int = 16) -> dict[str, Any]:
    """Probability of backtest overfitting by combinatorially symmetric cross-validation (CSCV) of Bailey, Borwein,
    López de Prado & Zhu (2015/2017), "The Probability of Backtest Overfitting", Journal of Computational Finance 20(4).

    :param returns: ``[D, N]`` daily returns (fractions) of N configurations on the same D days.
    :param num_splits: S, even, >= 2: the rows are cut into S contiguous blocks (``numpy.array_split``:
        sizes differ by at most one day when S does not divide D).
    :return: dict with ``pbo`` (fraction of combinations with logit <= 0), ``logits`` (``[C]``, in the
        order of ``itertools.combinations(range(S), S/2)`` for the in-sample blocks),
        ``num_combinations`` C = C(S, S/2) (12,870 for S = 16) and ``num_splits`` S.

    The metric is the annualised Sharpe ratio (the project's formula), computed for all combinations at once from
    per-block sums. For every choice of S/2 blocks as in-sample (IS), the rest out-of-sample (OOS): pick the
    configuration ``n*`` with the best IS Sharpe (ties: the lowest index), rank its OOS Sharpe among the
    N OOS Sharpe ratios (1 = worst ... N = best; tied values share their average rank), ``w = rank / (N + 1)``,
    ``logit = ln(w / (1 - w))``. PBO is the fraction of combinations where the IS winner is at or below
    the OOS median (logit <= 0). ~0: selection carries to OOS; ~0.5: the IS ranking is noise; ~1: the IS
    winner is systematically an OOS loser.

    The study calls it only with 4 or more configurations (with 2 or 3 the ranks are too coarse to mean
    much); fewer than 2 configurations, an odd S, or fewer days than blocks raise ``ValueError``.
    """
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"returns must be [D, N] (days x configurations), got shape {r.shape}")
    d, n_cfg = r.shape
    if n_cfg < 2:
        raise ValueError(f"PBO needs at least 2 configurations to select from, got N = {n_cfg}")
    if num_splits < 2 or num_splits % 2:
        raise ValueError(f"num_splits must be even and >= 2, got {num_splits}")
    if d < num_splits:
        raise ValueError(f"fewer days ({d}) than blocks (num_splits = {num_splits})")
    if not np.all(np.isfinite(r)):
        raise ValueError("returns contain NaN or inf")

    blocks = np.array_split(np.arange(d), num_splits)
    combos = np.array(list(itertools.combinations(range(num_splits), num_splits // 2)))
    in_sample = np.zeros((len(combos), num_splits), dtype=bool)
    in_sample[np.arange(len(combos))[:, None], combos] = True

    is_metric, oos_metric = _cscv_sharpe(r, blocks, in_sample), _cscv_sharpe(r, blocks, ~in_sample)
    best = np.argmax(is_metric, axis=1)  # first index on ties
    chosen = oos_metric[np.arange(len(combos)), best][:, None]
    below = np.sum(oos_metric < chosen, axis=1)
    tied = np.sum(oos_metric == chosen, axis=1)  # includes the chosen one
    rank = below + (tied + 1) / 2.0  # average of ranks below+1 .. below+tied
    omega = rank / (n_cfg + 1.0)
    logits = np.log(omega / (1.0 - omega))
    return {
        "pbo": float(np.mean(logits <= 0.0)),
        "logits": logits,
        "num_combinations": len(combos),
        "num_splits": num_splits,
    }
