"""Fit the synthetic generator (`envs.factor_market.MarketModel`) to a user's market: ``data generate --like``
(docs/data.md says it from the user's side). Two kinds of estimate, both on daily log returns (`envs.facts`):

* Read off the data: each ticker's annual volatility and expected simple return a year (mean log return + variance /
  2, annualised), its share of variance from the market factor (`market_loadings`), and, where the data has opens,
  the overnight share (the jumps' share taken out, since they all fall overnight).
* Matched by simulation (indirect inference), in this order, twice round: each parameter the value whose generated
  market, with the data's tickers and length, shows one of the data's facts:

  1. the ACF(1) of |r| (volatility clustering) through the persistence of log variance, its stationary variance
     v^2 / (1 - phi^2) held (so the body stays where it was);
  2. the winsorised kurtosis (the body) through that stationary variance (the vol of vol at the persistence);
  3. the median excess kurtosis (the extreme tail) through the jump size;
  4. the leverage correlation through the leverage (the market's kept at `MARKET_LEVERAGE_RATIO` times it).

The robust kurtoses, since one day (an unadjusted split, a crash) moves a few tickers' mean kurtosis by tens. Sample
kurtosis and clustering of heavy-tailed returns sit far below their population values over a few thousand days, so
matching sample facts on samples of the data's own length is what reproduces them; the simulations reuse fixed seeds
(common random numbers), so the facts move smoothly with the parameters and `scipy.optimize.brentq` finds each in
turn. A fact beyond the generator's reach leaves its parameter at the end of its range nearest to it, and the others
are still matched. The other parameters keep their defaults; sectors are not fitted (the market factor carries all
the correlation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.optimize import brentq

from envs.data import MarketData
from envs.errors import UserError
from envs.factor_market import DEFAULT_MODEL, MarketModel
from envs.facts import Facts, abs_acf1, excess_kurtosis, leverage, log_returns, market_facts, winsorize
from envs.returns import TRADING_DAYS
from envs.synthetic import generate_market

MIN_FIT_DAYS = 250
"""Fewer trading days than this (a year) are too few to estimate tails and volatility clustering from."""
FIT_SEEDS = 8
"""Simulated markets per evaluation of the facts, for 6 tickers or fewer (fewer for more tickers, whose mean facts
vary less); their median is matched, since the sample kurtosis of a few thousand heavy-tailed days is skewed."""
MARKET_LEVERAGE_RATIO = DEFAULT_MODEL.market_leverage / DEFAULT_MODEL.leverage
"""The market factor's leverage over the tickers' own, kept from the defaults when the leverage is fitted."""
PERSISTENCE_RANGE = (0.5, 0.995)
"""The fitted persistence of log variance: from a half-life of a day to one of 140 days (beyond it ten years hold a
few volatility regimes and the sample facts of one draw scatter widely)."""
MAX_LOG_VARIANCE_VAR = 4.0
"""The largest fitted stationary variance of log variance (generator 3: 0.97)."""
SOLVE_XTOL = 0.003
"""Each solve stops within this share of its parameter's range: far inside the facts' sampling noise."""


def check_fittable(data: MarketData, what: str) -> None:
    """`UserError` naming why ``data`` cannot be fitted: fewer than `MIN_FIT_DAYS` days or fewer than 2 tickers.
    (Gaps and non-positive prices are refused by the loader before, in one line each.)"""
    if data.num_days < MIN_FIT_DAYS:
        raise UserError(
            f"{what} has {data.num_days} trading days; fitting the generator needs at least {MIN_FIT_DAYS} (a year)"
        )
    if data.num_tickers < 2:
        raise UserError(f"{what} has 1 ticker; fitting the generator's correlations needs at least 2")


def market_loadings(r: np.ndarray) -> np.ndarray:
    """[N] each ticker's share of variance from a single market factor, in [0, 0.9]: ticker i's loading is its mean
    correlation with the others over the square root of the mean pair correlation, so pair correlations come back as
    the products of loadings."""
    corr = np.corrcoef(r.T)
    n = corr.shape[0]
    off = corr[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    mean_pair = max(float(off.mean()), 1e-6)
    return np.clip(off.mean(axis=1) ** 2 / mean_pair, 0.0, 0.9)


def _solve(f: Callable[[float], float], lo: float, hi: float, near: float | None = None) -> float:
    """The root of ``f`` in [lo, hi], or the end where |f| is smaller when ``f`` keeps its sign (the data's fact is
    beyond what the generator reaches in that range). With ``near`` (the parameter's current value), a root within a
    tenth of the range of it is looked for first: fewer simulations."""
    xtol = SOLVE_XTOL * (hi - lo)
    if near is not None:
        a, b = max(lo, near - 0.1 * (hi - lo)), min(hi, near + 0.1 * (hi - lo))
        if f(a) * f(b) <= 0:
            return float(brentq(f, a, b, xtol=xtol, rtol=1e-3, maxiter=30))
    f_lo, f_hi = f(lo), f(hi)
    if f_lo * f_hi > 0:
        return lo if abs(f_lo) < abs(f_hi) else hi
    return float(brentq(f, lo, hi, xtol=xtol, rtol=1e-3, maxiter=30))


def fit_market(data: MarketData, *, what: str = "the data") -> tuple[MarketModel, Facts]:
    """The `MarketModel` whose markets look like ``data`` (module docstring), and ``data``'s facts.

    :param data: at least `MIN_FIT_DAYS` days of at least 2 tickers (else `UserError` naming ``what``).
    """
    check_fittable(data, what)
    facts = market_facts(data)
    r = log_returns(data)
    var = r.var(axis=0)
    vol = np.sqrt(var * TRADING_DAYS)
    drift = (r.mean(axis=0) + var / 2) * TRADING_DAYS
    model = replace(
        DEFAULT_MODEL,
        ticker_vol=tuple(float(v) for v in vol),
        ticker_drift=tuple(float(v) for v in drift),
        ticker_market_share=tuple(float(v) for v in market_loadings(r)),
    )
    n, d = data.num_tickers, data.num_days
    seeds = range(max(2, math.ceil(FIT_SEEDS * 6 / max(n, 6))))

    def simulated(m: MarketModel) -> np.ndarray:
        """[4] ACF(1) of |r|, median and winsorised kurtosis, leverage (`envs.facts`), medians over the markets."""
        out = []
        for seed in seeds:
            sim = log_returns(generate_market(num_tickers=n, num_days=d, seed=seed, model=m))
            kurt = np.median(excess_kurtosis(sim))
            out.append([abs_acf1(sim).mean(), kurt, np.median(excess_kurtosis(winsorize(sim))), leverage(sim).mean()])
        return np.median(out, axis=0)

    # (fact index, the data's value, how the parameter enters the model, its value there, its range there)
    Step = tuple[int, float, Callable[[MarketModel, float], MarketModel], Callable[[MarketModel], float], Callable]
    steps: list[Step] = [
        (0, facts.abs_acf1, _with_persistence, lambda m: m.vol_persistence, lambda m: PERSISTENCE_RANGE),
        (2, facts.winsorized_kurtosis, _with_log_variance_var, log_variance_var, lambda m: (0, MAX_LOG_VARIANCE_VAR)),
        (1, facts.median_kurtosis, _with_jump_size, lambda m: m.jump_size, lambda m: (0, _max_jump_size(m))),
        (3, facts.leverage, _with_leverage, lambda m: m.leverage, lambda m: (-0.9, 0.5)),
    ]
    for _ in range(2):
        for k, target, setter, value, bounds in steps:
            base = model
            x = _solve(
                lambda x, base=base, k=k, target=target, setter=setter: simulated(setter(base, x))[k] - target,
                *bounds(base),
                near=value(base),
            )
            model = setter(base, x)
    if not math.isnan(facts.overnight_share):  # the jumps (all overnight) taken out; the closes do not depend on it
        jump_share = model.jump_rate * model.jump_size**2
        share = (facts.overnight_share - jump_share) / (1 - jump_share)
        model = replace(model, overnight_share=float(np.clip(share, 0.0, 0.95)))
    return model, facts


def log_variance_var(model: MarketModel) -> float:
    """v^2 / (1 - phi^2): the stationary variance of a component's own log variance (the body's weight)."""
    return model.vol_of_vol**2 / (1 - model.vol_persistence**2)


def _with_log_variance_var(model: MarketModel, var: float, persistence: float | None = None) -> MarketModel:
    """``model`` with the market's and the tickers' vol of vol set so that `log_variance_var` is ``var`` at its
    persistence (or at ``persistence``, which replaces it)."""
    phi = model.vol_persistence if persistence is None else persistence
    v = math.sqrt(var * (1 - phi**2))
    return replace(model, vol_persistence=phi, vol_of_vol=v, market_vol_of_vol=v)


def _with_persistence(model: MarketModel, phi: float) -> MarketModel:
    """``model`` with persistence ``phi`` and the same `log_variance_var`."""
    return _with_log_variance_var(model, log_variance_var(model), phi)


def _with_jump_size(model: MarketModel, size: float) -> MarketModel:
    return replace(model, jump_size=size)


def _max_jump_size(model: MarketModel) -> float:
    """The jump size at which the jumps hold half a ticker's variance."""
    return math.sqrt(0.5 / model.jump_rate) if model.jump_rate > 0 else 0.0


def _with_leverage(model: MarketModel, rho: float) -> MarketModel:
    """``model`` with the tickers' leverage ``rho`` and the market's `MARKET_LEVERAGE_RATIO` times it."""
    return replace(model, leverage=rho, market_leverage=float(np.clip(rho * MARKET_LEVERAGE_RATIO, -0.95, 0.95)))
