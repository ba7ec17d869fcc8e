"""Fit the synthetic generator (`envs.synthetic.MarketModel`) to a user's market: ``clstm-ppo data generate --like``.

Two kinds of estimate, both on daily log returns (`envs.facts`):

* Read off the data: each ticker's annual volatility and expected simple return a year (mean log return + variance /
  2, annualised), its share of variance from the market factor (a one-factor model of the correlation matrix:
  ticker i's loading is its mean correlation with the others over the square root of the mean pair correlation, so
  pair correlations come back as the products of loadings), and, where the data has opens, the overnight share (the
  jumps' share taken out, since they all fall overnight).
* Matched by simulation (indirect inference): the volatility of volatility, the jump size and the leverage are the
  values whose generated market, with the data's tickers and length, shows the data's ACF(1) of |r|, excess kurtosis
  and leverage correlation (`envs.facts`). Sample kurtosis and clustering of heavy-tailed returns sit far below their
  population values over a few thousand days, so matching the data's sample facts on samples of the data's own
  length is what reproduces them; the simulations reuse fixed seeds (common random numbers), so the facts move
  smoothly with the parameters and `scipy.optimize.brentq` finds each in turn, twice round.

The generator's other parameters (persistence of volatility, the t shocks' degrees of freedom, the jump rate, the
common volatility) keep their defaults; sectors are not fitted (the market factor carries all the correlation).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq

from envs.data import MarketData
from envs.errors import UserError
from envs.facts import Facts, abs_acf1, leverage, log_returns, market_facts
from envs.synthetic import DEFAULT_MODEL, TRADING_DAYS, MarketModel, generate_market

MIN_FIT_DAYS = 250
"""Fewer trading days than this (a year) are too few to estimate tails and volatility clustering from."""
FIT_SEEDS = 8
"""Simulated markets per evaluation of the facts, for 6 tickers or fewer (fewer for more tickers, whose mean facts
vary less); their median is matched, since the sample kurtosis of a few thousand heavy-tailed days is skewed."""
MARKET_LEVERAGE_RATIO = DEFAULT_MODEL.market_leverage / DEFAULT_MODEL.leverage
"""The market factor's leverage over the tickers' own, kept from the defaults when the leverage is fitted."""


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
    """[N] each ticker's share of variance from a single market factor (module docstring), in [0, 0.9]."""
    corr = np.corrcoef(r.T)
    n = corr.shape[0]
    off = corr[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    mean_pair = max(float(off.mean()), 1e-6)
    return np.clip(off.mean(axis=1) ** 2 / mean_pair, 0.0, 0.9)


def _solve(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of ``f`` in [lo, hi], or the end where |f| is smaller when ``f`` keeps its sign (the data's fact is
    beyond what the generator reaches in that range)."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo * f_hi > 0:
        return lo if abs(f_lo) < abs(f_hi) else hi
    return float(brentq(f, lo, hi, xtol=1e-3, rtol=1e-3, maxiter=30))


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
    model = DEFAULT_MODEL.with_values(
        ticker_vol=tuple(float(v) for v in vol),
        ticker_drift=tuple(float(v) for v in drift),
        ticker_market_share=tuple(float(v) for v in market_loadings(r)),
    )
    if not math.isnan(facts.overnight_share):
        jump_share = model.jump_rate * model.jump_size**2
        share = (facts.overnight_share - jump_share) / (1 - jump_share)
        model = model.with_values(overnight_share=float(np.clip(share, 0.0, 0.95)))

    n, d = data.num_tickers, data.num_days
    seeds = range(max(2, math.ceil(FIT_SEEDS * 6 / max(n, 6))))

    def simulated(m: MarketModel) -> np.ndarray:
        """[3] ACF(1) of |r|, excess kurtosis and leverage (means over tickers), medians over the simulated markets."""
        from scipy import stats

        out = []
        for seed in seeds:
            sim = log_returns(generate_market(num_tickers=n, num_days=d, seed=seed, model=m))
            out.append([abs_acf1(sim).mean(), stats.kurtosis(sim, axis=0, bias=False).mean(), leverage(sim).mean()])
        return np.median(out, axis=0)

    # (fact index, the data's value, how the parameter enters the model, its range)
    steps: list[tuple[int, float, Callable[[MarketModel, float], MarketModel], tuple[float, float]]] = [
        (0, facts.abs_acf1, lambda m, x: m.with_values(vol_of_vol=x, market_vol_of_vol=x), (0.0, 0.5)),
        (1, facts.kurtosis, lambda m, x: m.with_values(jump_size=x), (0.0, math.sqrt(0.5 / model.jump_rate))),
        (2, facts.leverage, _with_leverage, (-0.9, 0.5)),
    ]
    for _ in range(2):
        for k, target, setter, (lo, hi) in steps:
            base = model
            x = _solve(
                lambda x, base=base, k=k, target=target, setter=setter: simulated(setter(base, x))[k] - target, lo, hi
            )
            model = setter(base, x)
    return model, facts


def _with_leverage(model: MarketModel, rho: float) -> MarketModel:
    """``model`` with the tickers' leverage ``rho`` and the market's `MARKET_LEVERAGE_RATIO` times it."""
    return model.with_values(leverage=rho, market_leverage=float(np.clip(rho * MARKET_LEVERAGE_RATIO, -0.95, 0.95)))
