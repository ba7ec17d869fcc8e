"""How much a better forecast could buy on a synthetic lead-lag market: the bound behind issue 27's turnover target.

On ``signal_kind=lead_lag`` ticker i's idiosyncratic shock ``ze[t-k, i]`` moves ticker i+1 on day t (`envs.synthetic`).
A policy sees only returns, in which that shock is buried under the market and sector factors (and, in the
high-volatility regime, scaled by 2.2). Three forecasts of follower i+1's next-day move, each turned into the
z-score ``expected planted return / the follower's conditional daily vol`` known at the day's close:

- ``leader``: the leader's own return over its training-days std (what `signal_rule.py`'s ``sign>Z`` reads).
- ``best``: the best linear estimate of the shock from that day's cross-section of returns *given the true model*
  (the factor loadings, idiosyncratic vols and the day's regime, which no policy knows):
  ``ze_hat = diag(sigma) (B B' + diag(sigma^2))^-1 (r - drift - planted_hat) / v``, the conditional mean of a
  Gaussian factor model (B: the market and sector loadings), with the day's own planted term estimated from the
  previous estimate. No forecast from returns alone does better on average: it is the bound on "a better forecast".
- ``oracle``: the shock itself (unobservable): what knowing the signal exactly is worth.

Each is traded the way ``signal_rule.py``'s ``sign>Z`` trades (hold the followers whose z is above Z at equal
weight, cash for the rest; or, with ``--gain G``, weights that grow with z past Z) through the backtest's env on a finished study's traded days (the same costs, next-open
fills and band), at each Z of ``--threshold``. Also printed: each forecast's correlation with the follower's next-day
return (mean over followers). Compare the rows at a third of a policy's turnover with that policy's Sharpe.

Usage (a finished study on a ``synthetic:...signal_kind=lead_lag`` market, ``--retrain none``)::

    python benchmarks/forecast_bound.py STUDY_DIR [--threshold 0 0.5 1 1.5 2] [--gain inf 1 2] [--execution auto]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.signal_rule import HandRule, print_buy_and_hold, rule_cells  # noqa: E402
from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import RecurrentState  # noqa: E402
from clstm_ppo.study.markets import load_markets  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.features import PreparedMarket  # noqa: E402
from envs.sources import parse_synthetic_options  # noqa: E402
from envs.state import StateLayout  # noqa: E402
from envs.synthetic_v1 import SyntheticReturns, synthetic_returns  # noqa: E402

FORECASTS = ("leader", "best", "oracle")


def shock_estimates(parts: SyntheticReturns, lag: int) -> np.ndarray:
    """``[D, N]`` the best linear estimate of each day's idiosyncratic shocks from that day's returns, given the model.

    Day t's returns are ``drift + v (B f + sigma ze) + planted`` with f the N(0, I) factors; the planted term is
    taken from the estimate of ``lag`` days before (0 before that), so every estimate uses returns up to day t only.
    """
    d, n = parts.returns.shape
    loadings = np.zeros((n, 1 + int(parts.sector.max()) + 1))  # [N, F]: market, then one column per sector
    loadings[:, 0] = parts.market_loading
    loadings[np.arange(n), 1 + parts.sector] = parts.sector_loading
    cov = loadings @ loadings.T + np.diag(parts.idio_vol**2)  # [N, N] calm-regime covariance of the base
    gain = np.diag(parts.idio_vol) @ np.linalg.inv(cov)  # [N, N]: E[ze | r / v]
    coef = np.zeros(n)  # coef[i]: the planted term of ticker i per unit shock of its leader i - 1
    coef[1:] = np.sqrt(planted_share(parts) * parts.calm_var[1:])
    estimate = np.zeros((d, n))
    for t in range(d):
        planted_hat = np.zeros(n)
        if t >= lag:
            planted_hat[1:] = coef[1:] * estimate[t - lag, :-1]
        estimate[t] = gain @ ((parts.returns[t] - parts.drift[t] - planted_hat) / parts.vol_multiplier[t])
    return estimate


def planted_share(parts: SyntheticReturns) -> float:
    """The lead-lag term's variance as a share of its follower's calm-regime variance; SystemExit if none."""
    if not parts.planted[:, 1:].any():
        raise SystemExit("the study's market has no planted lead-lag signal")
    return parts.signal_share


def forecast_z(parts: SyntheticReturns, market: PreparedMarket, lag: int, kind: str) -> np.ndarray:
    """``[D, N]`` z[t, j]: follower j's expected planted return on day t + 1 over its daily vol, known at t's close.

    Ticker 0 follows nobody (z = -inf). ``kind``: "leader" | "best" | "oracle" (module docstring).
    """
    d, n = parts.returns.shape
    z = np.full((d, n), -np.inf)
    if kind == "leader":  # the leader's return of day t + 1 - lag over its training-days std
        train = market.splits.train
        std = parts.returns[train.start : train.stop].std(axis=0)
        source = parts.returns / std
        scale = np.ones(d)
    else:
        source = parts.shocks if kind == "oracle" else shock_estimates(parts, lag)
        scale = (
            np.sqrt(planted_share(parts)) / parts.vol_multiplier
        )  # coef / (v sqrt(q)): the follower's z per unit shock
    # the shock that moves day t + 1 happened on day t + 1 - lag, already seen at day t's close
    z[lag - 1 :, 1:] = source[: d - lag + 1, :-1] * scale[lag - 1 :, None]
    return z


class ForecastRule(HandRule):
    """Holds the followers whose forecast z is above ``threshold`` (action +1), the rest in cash (action -1); with a
    finite ``gain`` G, action ``clip(G (z - threshold), -1, 1)`` instead: weights that grow with the forecast past the
    threshold (the env's weights are ``softmax(5 x action, cash 0)``, so an action of 0 holds as much as cash).

    `evaluate_policy` hands it observations ``[1, T, F]`` only; the day is found by matching the observation's last
    price row to the market's normalised price rows (asserted exact), so the forecast table cannot drift off by a day.
    """

    def __init__(self, market: PreparedMarket, z: np.ndarray, threshold: float, gain: float = math.inf) -> None:
        layout = StateLayout(market.num_tickers, len(market.indicator_names))
        self.prices = layout.prices
        rows = market.normalization.market_rows(market.data.close, market.indicators)
        self.price_rows = torch.as_tensor(rows[:, : market.num_tickers], dtype=torch.float32)  # [D, N]
        self.z, self.threshold, self.gain = z, threshold, gain

    def act(self, obs: Tensor, state: RecurrentState, start: Tensor, **_: object) -> tuple[Tensor, None, None, Any]:
        """Actions ``[1, N]`` in {-1, +1} for the day whose state ``obs`` is."""
        today = obs[0, -1, self.prices].float()
        gaps = (self.price_rows - today).abs().amax(dim=1)
        day = int(gaps.argmin())
        if float(gaps[day]) > 1e-4:
            raise AssertionError(f"no day's prices match the observation (closest off by {float(gaps[day]):.2g})")
        if math.isinf(self.gain):
            action = np.where(self.z[day] > self.threshold, 1.0, -1.0)
        else:
            action = np.clip(self.gain * (self.z[day] - self.threshold), -1.0, 1.0)
        return torch.as_tensor(action, dtype=torch.float64).unsqueeze(0), None, None, state


def information_coefficient(z: np.ndarray, returns: np.ndarray, days: range) -> float:
    """Mean over followers of corr(z[t, j], returns[t + 1, j]) over ``days`` (t + 1 inside them)."""
    t = np.arange(days.start - 1, days.stop - 1)
    return float(np.mean([np.corrcoef(z[t, j], returns[t + 1, j])[0, 1] for j in range(1, z.shape[1])]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a finished study folder on a synthetic lead-lag market")
    parser.add_argument("--threshold", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0])
    parser.add_argument("--forecasts", nargs="+", choices=FORECASTS, default=list(FORECASTS))
    parser.add_argument(
        "--gain", type=float, nargs="+", default=[math.inf], help="inf: hold at equal weight; G: clip(G (z - Z))"
    )
    parser.add_argument("--execution", default="auto")
    args = parser.parse_args()
    spec = json.loads((args.study / "spec.json").read_text())
    source = spec["base"]["data"]
    scheme, _, options = source.partition(":")
    kwargs = parse_synthetic_options(options) if scheme == "synthetic" else {}
    if kwargs.get("signal") != "lead_lag":
        raise SystemExit(f"{args.study}: data {source!r} is not a synthetic lead-lag market")
    kwargs.pop("start", None)
    parts = synthetic_returns(**kwargs)
    market = load_markets(args.study / "prepared", sorted((args.study / "prepared").glob("*.json"))[0].stem)[0]
    if not np.allclose(np.diff(np.log(market.data.close), axis=0), parts.returns[1:], atol=1e-9):
        raise SystemExit(f"{args.study}: the prepared market is not the one {source!r} generates")
    lag = int(kwargs.get("lag", 1))
    test = market.splits.test
    config = EnvConfig(rebalance_band=spec["base"]["rebalance_band"], execution=args.execution)
    print(f"{args.study.name}: {source}, test days {test.stop - test.start}")
    print(
        f"{'forecast':<8} {'IC':>5} {'gain':>5} {'Z':>5} {'Sharpe':>7} {'return':>8} {'turnover/yr':>11} {'exposure':>8}"
    )
    for kind in args.forecasts:
        z = forecast_z(parts, market, lag, kind)
        ic = information_coefficient(z, parts.returns, range(test.start, test.stop))
        for gain, threshold in itertools.product(args.gain, args.threshold):
            run = evaluate_policy(ForecastRule(market, z, threshold, gain), market, "test", config)
            print(f"{kind:<8} {ic:>5.2f} {gain:>5g} {threshold:>5.2f} {rule_cells(run, config)}")
    print_buy_and_hold(args.study)


if __name__ == "__main__":
    main()
