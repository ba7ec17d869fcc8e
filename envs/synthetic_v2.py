"""Generator version 2 of the seeded synthetic markets (``synthetic:...,generator=2``), kept for the checkpoints and
studies trained on it (`tests/test_synthetic_v2.py` pins its markets; docs/data.md#versions).

The market is `envs.factor_market`'s with this version's parameters (`MODEL`). Its planted signal of information
coefficient IC (``signal_ic``; 0: none) is a unit-variance AR(1) ``a[t, i] = phi_a a[t-1, i] + sqrt(1 - phi_a^2)
d[t, i]`` (phi_a = 0.5^(1/``signal_halflife``)) driven by a *latent* shock: ``"momentum"``: ticker i's own
idiosyncratic normal shock n_i of day t - lag + 1; ``"lead_lag"``: that of ticker i - 1 (ticker 0 follows the last).
It moves the next day, ``P[t + 1, i] = k_i a[t, i]`` (a share ``signal_overnight`` in day t+1's overnight gap), with
k_i = kappa sigma_i from `envs.factor_market.signal_coefficient`. The shock is only part of what the day's prices show
(the leader's observable residual return correlates about 0.6 with it), so no trader can compute ``a`` from the
market's prices: generator 2's predictor is hidden, and its markets have no reference trader.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from envs import synthetic
from envs.factor_market import MarketModel, SignalSpec, SyntheticParts, ar1_filter, signal_coefficient

VERSION = 2

MODEL = MarketModel(
    annual_vol=(0.22, 0.45),
    annual_drift=(0.08, 0.18),
    market_share=0.30,
    sector_share=0.10,
    overnight_share=0.35,
    vol_persistence=0.985,
    market_vol_of_vol=0.22,
    vol_of_vol=0.22,
    market_leverage=-0.7,
    leverage=-0.5,
    common_vol=0.4,
    tail_dof=8.0,
    jump_rate=0.006,
    jump_size=4.2,
)
"""Generator 2's parameters (its excess kurtosis: a median over tickers of about 11, 6.3 after winsorising)."""


def plant_hidden(drawn: list[SyntheticParts], signal: SignalSpec) -> list[SyntheticParts]:
    """Markets ``drawn`` with generator 2's hidden-shock signal planted, each on its own (module docstring)."""
    kappa = signal_coefficient(signal.ic, signal.overnight, signal.persistence)
    return drawn if kappa <= 0 else [_plant(parts, signal, kappa) for parts in drawn]


def _plant(parts: SyntheticParts, signal: SignalSpec, kappa: float) -> SyntheticParts:
    d, n = parts.returns.shape
    own = parts.own_shocks  # [D, N] each ticker's idiosyncratic normal shock
    driver = own if signal.kind == "momentum" else np.roll(own, 1, axis=1)  # lead_lag: ticker i - 1's
    driver = np.vstack([np.zeros((signal.lag - 1, n)), driver[: d - signal.lag + 1]])  # the shock of t - lag + 1
    phi_a = signal.persistence
    driver[0] /= math.sqrt(1 - phi_a**2)  # a[0] = driver[0]: the stationary law
    predictor = ar1_filter([math.sqrt(1 - phi_a**2)], phi_a, driver)
    planted = np.zeros((d, n))
    planted[1:] = kappa * parts.daily_vol * predictor[:-1]
    return parts.with_signal(predictor, planted, signal.overnight, kappa * parts.daily_vol)


# generator 3's driver (`envs.synthetic`) with this version's parameters and planting: the same options
market_and_parts = functools.partial(synthetic.market_and_parts, model=MODEL, planting=plant_hidden)
generate_market = functools.partial(synthetic.generate_market, model=MODEL, planting=plant_hidden)
