"""Seeded synthetic markets that behave like daily US stocks (generator version 3, the default), with an optional
planted signal that a trader can compute from the market's prices, set by its information coefficient (docs/data.md,
"Synthetic markets").

The market is `envs.factor_market`'s factor stochastic-volatility model (its docstring has the equations) with
generator 3's parameters (`envs.factor_market.DEFAULT_MODEL`, calibrated to robust statistics of real daily stocks:
docs/data.md). One ``numpy.random.Generator(PCG64(seed))`` draws the market in a fixed order, so equal arguments
give the same market, and a market with a planted signal has the noise of the same market without one. The signal's
predictor is `envs.predictor`'s; `plant` says how the market is built around it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from envs.data import MarketData
from envs.errors import UserError
from envs.factor_market import (
    DEFAULT_MODEL,
    NO_SIGNAL,
    MarketModel,
    SignalSpec,
    SyntheticParts,
    bars_from_parts,
    business_days,
    checked_size,
    draw_factor_market,
    signal_coefficient,
)
from envs.predictor import PredictorFilter

GENERATOR_VERSION = 3
"""The generator a ``synthetic:...`` source without ``generator=`` means."""
GENERATOR_VERSIONS: tuple[int, ...] = (1, 2, 3)


Planting = Callable[[list[SyntheticParts], SignalSpec], list[SyntheticParts]]
"""How a generator plants its signal in markets of one size: generator 3's `plant`, generator 2's hidden one."""


def plant(drawn: list[SyntheticParts], signal: SignalSpec) -> list[SyntheticParts]:
    """Markets of the same size ``drawn`` with the signal planted, all at once, day by day (docs/data.md, "A planted
    signal"): the planted move ``P[t, i] = k_i a[t-1, i]`` is added to day t's return (a share ``signal.overnight`` of
    it in day t's overnight gap), then the predictor ``a[t]`` is computed from the day's closes with the filter a
    trader runs (`envs.predictor.PredictorFilter`). k_i = kappa sigma_i, kappa from
    `envs.factor_market.signal_coefficient`: the IC of ``a[t]`` with the return an order decided at day t's close
    earns at next-open fills, ``log(open[t+2] / open[t+1])``, is ``signal.ic`` (`tests/test_synthetic.py`)."""
    kappa = signal_coefficient(signal.ic, signal.overnight, signal.persistence)
    if kappa <= 0:
        return drawn
    returns = np.stack([p.returns for p in drawn], axis=1)  # [D, M, N]
    scale = kappa * np.stack([p.daily_vol for p in drawn])  # [M, N] k_i
    predictor, planted = np.zeros(returns.shape), np.zeros(returns.shape)
    trader = PredictorFilter(signal.rule, returns.shape[1:])
    for t in range(1, returns.shape[0]):  # day 0 has no return a file shows (no close before it): its predictor is 0
        planted[t] = scale * predictor[t - 1]
        predictor[t] = trader.step(returns[t] + planted[t])
    return [p.with_signal(predictor[:, m], planted[:, m], signal.overnight, scale[m]) for m, p in enumerate(drawn)]


def synthetic_parts_of_seeds(
    seeds: list[int],
    *,
    num_tickers: int = 30,
    num_days: int = 2520,
    signal: SignalSpec = NO_SIGNAL,
    model: MarketModel = DEFAULT_MODEL,
    planting: Planting = plant,
) -> list[SyntheticParts]:
    """The parts of the market `generate_market` draws from each seed with the same other arguments (its closes
    compound ``returns``), the signals planted together (one pass over the days for all of them: what a training
    pool of many draws costs about one draw's time)."""
    sizes = [checked_size(num_tickers, num_days, seed, model) for seed in seeds]
    if signal.lag >= num_days:
        raise UserError(f"synthetic lag {signal.lag} must be shorter than the {num_days} days")
    drawn = [draw_factor_market(np.random.Generator(np.random.PCG64(s)), d, n, model) for n, d, s in sizes]
    return planting(drawn, signal)


def markets_of_seeds(seeds: list[int], *, start: str = "2014-01-02", **options: object) -> list[MarketData]:
    """`generate_market` of each seed with the same other options (``num_tickers``, ``num_days``, ``signal_ic``, ...),
    drawn together (`synthetic_parts_of_seeds`)."""
    signal = SignalSpec(
        options.pop("signal_ic", 0.0),
        options.pop("signal_kind", "lead_lag"),
        options.pop("signal_halflife", 20.0),
        options.pop("signal_overnight", 0.3),
        options.pop("lag", 1),
    )
    drawn = synthetic_parts_of_seeds(seeds, signal=signal, **options)  # type: ignore[arg-type]
    return [bars_from_parts(p, business_days(start, p.returns.shape[0])) for p in drawn]


def market_and_parts(
    *,
    num_tickers: int = 30,
    num_days: int = 2520,
    start: str = "2014-01-02",
    seed: int = 0,
    signal_ic: float = 0.0,
    signal_kind: str = "lead_lag",
    signal_halflife: float = 20.0,
    signal_overnight: float = 0.3,
    lag: int = 1,
    model: MarketModel = DEFAULT_MODEL,
    planting: Planting = plant,
) -> tuple[MarketData, SyntheticParts]:
    """`generate_market`'s market and the parts it was built from (one draw), for the same arguments."""
    signal = SignalSpec(signal_ic, signal_kind, signal_halflife, signal_overnight, lag)
    (parts,) = synthetic_parts_of_seeds(
        [seed], num_tickers=num_tickers, num_days=num_days, signal=signal, model=model, planting=planting
    )
    return bars_from_parts(parts, business_days(start, parts.returns.shape[0])), parts


def generate_market(
    *,
    num_tickers: int = 30,
    num_days: int = 2520,
    start: str = "2014-01-02",
    seed: int = 0,
    signal_ic: float = 0.0,
    signal_kind: str = "lead_lag",
    signal_halflife: float = 20.0,
    signal_overnight: float = 0.3,
    lag: int = 1,
    model: MarketModel = DEFAULT_MODEL,
    planting: Planting = plant,
) -> MarketData:
    """A synthetic OHLCV market, deterministic in its arguments (see the module docstring for the model).

    :param num_tickers: N >= 1 (a fitted ``model`` fixes it).
    :param num_days: D >= 2 business days.
    :param start: first business day on or after this date.
    :param seed: seed of the PCG64 generator.
    :param signal_ic: IC in [0, 0.5) of the planted predictor with the next open-to-open return; 0 plants nothing.
    :param signal_kind: "momentum" | "lead_lag".
    :param signal_halflife: the predictor's half-life in days.
    :param signal_overnight: share in [0, 1) of the planted move in the overnight gap.
    :param lag: the driving return's age plus one, in days (1: the day's own return).
    :param model: the market's parameters (`MarketModel`; default: calibrated to real daily US stocks).
    :param planting: how the signal is planted (`plant`; generator 2 passes its own).
    :returns: MarketData with [D, N] float64 prices (dollars) and volumes (whole shares).
    """
    return market_and_parts(**locals())[0]
