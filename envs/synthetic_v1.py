"""Generator version 1 of the seeded synthetic markets (``synthetic:...,generator=1``), kept for the checkpoints
trained on it (``tests/test_synthetic_v1.py`` pins checksums of its markets; docs/data.md#versions has what sets it
apart from generator 3, `envs.synthetic`). One ``numpy.random.Generator(PCG64(seed))`` draws everything in a fixed
order, so equal arguments give byte-identical arrays. All returns are daily log returns.

Factor model -- a regime path (`_regime_path`: bull, bear, high_vol) sets each day's market drift and volatility
multiplier ``v[t]``; ticker i in sector s(i) (tickers dealt round-robin into ``max(1, min(5, N // 4))`` sectors)::

    base[t, i] = drift[t] + v[t] * (beta_i * 1.0% * zm[t] + gamma_i * 0.7% * zs[t, s(i)] + sigma_i * ze[t, i])

with beta_i ~ U(0.7, 1.3), gamma_i ~ U(0.4, 1.0), idiosyncratic daily vol sigma_i ~ U(1.0%, 2.0%) and zm, zs, ze
independent standard normals. Pairwise return correlation is therefore about 0.2-0.4 inside the market and higher
inside a sector.

Planted signal of strength ``s`` in [0, 1) (``s = 0``: none). It adds a component ``x`` to ``base`` whose
variance is ``share = 0.5 * s`` of the ticker's calm-regime (v = 1) return variance ``q_i``:

* ``"momentum"``: ``x[t, i] = m[t-1, i]`` where ``m`` is a per-ticker AR(1) latent trend,
  ``m[t] = 0.9 m[t-1] + sqrt(1 - 0.9^2) * sqrt(share * q_i) * eta[t]`` (half-life about 6.6 days).
  Past 5-20 day returns reveal ``m``, so next-day returns are autocorrelated with past returns
  (lag-k autocorrelation about ``share * 0.9^k``). The trend is persistent, so a strong momentum
  signal also makes prices wander far (a ticker can end at 100x its start over 10 years).
* ``"lead_lag"``: ticker i's idiosyncratic shock of day t-k moves ticker i+1 on day t (k = ``lag``, default 1):
  ``x[t, i+1] = c_i * sigma_i * ze[t-k, i]`` with ``c_i`` scaled so the term's variance is ``share * q_{i+1}``
  (ticker 0 has no leader, the last ticker leads none). A one-day effect on prices, so they stay in range.
  With k = 1 the leader's move is today's return, in today's state. With k >= 2 (a *memory* market) the move that
  predicts tomorrow happened k - 1 days before today: today's state does not show it (the 30-day indicators blur
  one day's shock into noise), an observation window of more than k - 1 days does.

Bars -- ``close[t] = close[t-1] * exp(r[t])`` from a start price ~ exp(U(log 20, log 200)) dollars. The open
gaps from the previous close, ``open[t] = close[t-1] * exp(g[t])`` with ``g ~ N(0, (0.3 * daily vol)^2)``;
``high = max(open, close) * exp(|N(0, (0.5 * daily vol)^2)|)`` and ``low = min(open, close) * exp(-|...|)``,
so low > 0 and high >= max(open, close), low <= min(open, close). Volume (whole shares) is lognormal around a
per-ticker median ~ exp(U(log 3e5, log 3e7)), times ``exp(0.25 * |r| / daily vol)`` (heavier on big moves)
and ``exp(N(0, 0.3^2))`` noise. Dates: `envs.factor_market.business_days`; tickers: `ticker_names`.
"""

from __future__ import annotations

import numpy as np

from envs import libm
from envs.data import MarketData
from envs.errors import UserError
from envs.factor_market import DEFAULT_MODEL, business_days, checked_size, ticker_names, whole_number
from envs.predictor import SIGNALS
from envs.returns import TRADING_DAYS

VERSION = 1

# the regimes bull, bear, high_vol: daily stay probability p (a mean stay of 1 / (1 - p) days), the market's drift
# a year, the volatility multiplier v
REGIME_STAY = np.array([0.990, 0.980, 0.960])
REGIME_DRIFT_ANNUAL = np.array([0.15, -0.20, -0.05])
REGIME_VOL_MULT = np.array([0.8, 1.2, 2.2])
MARKET_VOL = 0.010  # daily
SECTOR_VOL = 0.007  # daily
SIGNAL_SHARE_AT_FULL = 0.5  # share of return variance carried by the signal at strength 1 (0.1: subtle, 0.5: strong)
MOMENTUM_PHI = 0.90


def _regime_path(rng: np.random.Generator, num_days: int) -> np.ndarray:
    """[D] int regime index per day (`REGIME_STAY`'s order): a Markov chain started in bull that, leaving a regime,
    moves to either other one with equal probability."""
    u = rng.random(num_days)
    side = rng.random(num_days) < 0.5
    path = np.empty(num_days, dtype=np.int64)
    state = 0
    for t in range(num_days):
        if t > 0 and u[t] >= REGIME_STAY[state]:
            others = [k for k in range(3) if k != state]
            state = others[0] if side[t] else others[1]
        path[t] = state
    return path


def _draw_returns(
    rng: np.random.Generator, d: int, n: int, strength: float, signal: str, lag: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(returns, daily_vol)``, both [D, N]: the close-to-close log returns drawn from ``rng`` (advancing it by the
    same draws in the same order, always) and each day's volatility without the signal, ``sqrt(q_i) v[t]``."""
    num_sectors = max(1, min(5, n // 4))
    sector = np.arange(n) % num_sectors

    regime = _regime_path(rng, d)
    drift = (REGIME_DRIFT_ANNUAL / TRADING_DAYS)[regime]  # [D]
    vmult = REGIME_VOL_MULT[regime]  # [D]

    beta = rng.uniform(0.7, 1.3, n)
    gamma = rng.uniform(0.4, 1.0, n)
    sigma = rng.uniform(0.010, 0.020, n)
    zm = rng.standard_normal(d)
    zs = rng.standard_normal((d, num_sectors))
    ze = rng.standard_normal((d, n))
    eta = rng.standard_normal((d, n))
    calm_var = (beta * MARKET_VOL) ** 2 + (gamma * SECTOR_VOL) ** 2 + sigma**2  # [N] q_i

    idio = sigma[None, :] * ze
    base = drift[:, None] + vmult[:, None] * (
        (beta * MARKET_VOL)[None, :] * zm[:, None] + (gamma * SECTOR_VOL)[None, :] * zs[:, sector] + idio
    )
    share = SIGNAL_SHARE_AT_FULL * strength
    planted = np.zeros((d, n))
    if share > 0 and signal == "momentum":
        trend = np.empty((d, n))
        innov = np.sqrt(1 - MOMENTUM_PHI**2) * np.sqrt(share * calm_var)[None, :] * eta
        trend[0] = np.sqrt(share * calm_var) * eta[0]  # stationary start
        for t in range(1, d):
            trend[t] = MOMENTUM_PHI * trend[t - 1] + innov[t]
        planted[1:] = trend[:-1]
    elif share > 0 and signal == "lead_lag" and n > 1:
        # ze has unit variance, so the coefficient sets the term's variance to share * q_{i+1}
        coef = np.sqrt(share * calm_var[1:])
        planted[lag:, 1:] = coef[None, :] * ze[:-lag, :-1]
    return base + planted, np.sqrt(calm_var)[None, :] * vmult[:, None]


def generate_market(
    *,
    num_tickers: int = 30,
    num_days: int = 2520,
    start: str = "2014-01-02",
    seed: int = 0,
    signal_strength: float = 0.0,
    signal: str = "momentum",
    lag: int = 1,
) -> MarketData:
    """A synthetic OHLCV market, deterministic in its arguments (see the module docstring for the model).

    :param num_tickers: N >= 1.
    :param num_days: D >= 2 business days.
    :param start: first business day on or after this date.
    :param seed: seed of the PCG64 generator.
    :param signal_strength: s in [0, 1); 0 plants nothing.
    :param signal: "momentum" | "lead_lag".
    :param lag: k, the days by which a leader's shock precedes its follower's move ("lead_lag" only).
    :returns: MarketData with [D, N] float64 prices (dollars) and volumes (whole shares).
    """
    n, d, seed = checked_size(num_tickers, num_days, seed, DEFAULT_MODEL)  # a model that fixes no N
    lag = whole_number(lag, "lag", 1)
    if lag >= d:
        raise UserError(f"synthetic lag {lag} must be shorter than the {d} days")
    strength = float(signal_strength)  # type: ignore[arg-type]
    if not (0.0 <= strength < 1.0):
        raise UserError(f"signal strength must be in [0, 1), got {signal_strength!r}")
    if signal not in SIGNALS:
        raise UserError(f"unknown synthetic signal {signal!r}; choose one of {', '.join(SIGNALS)}")
    dates = business_days(start, d)

    rng = np.random.Generator(np.random.PCG64(seed))
    ret, daily_vol = _draw_returns(rng, d, n, strength, signal, lag)

    start_price = libm.exp(rng.uniform(libm.log(20.0), libm.log(200.0), n))
    close = start_price[None, :] * libm.exp(np.cumsum(ret, axis=0))
    prev_close = np.vstack([start_price[None, :], close[:-1]])
    open_ = prev_close * libm.exp(0.3 * daily_vol * rng.standard_normal((d, n)))
    high = np.maximum(open_, close) * libm.exp(np.abs(0.5 * daily_vol * rng.standard_normal((d, n))))
    low = np.minimum(open_, close) * libm.exp(-np.abs(0.5 * daily_vol * rng.standard_normal((d, n))))

    median_volume = libm.exp(rng.uniform(libm.log(3e5), libm.log(3e7), n))
    volume = np.round(
        median_volume[None, :] * libm.exp(0.25 * np.abs(ret) / daily_vol + 0.3 * rng.standard_normal((d, n)))
    )
    return MarketData(dates, ticker_names(n), open_, high, low, close, volume)
