"""The study's numbers: each record's metrics, their spread across seeds, and the comparisons a quant asks for.

- Per record (a cell's stitched run, its untrained network, a baseline): the paper's Table 6 metrics (CR, MER,
  MPB, APPT, SR), annual return and volatility, Sortino, Calmar, turnover, costs, mean gross exposure, beta and
  annualised alpha against equal-weight buy-and-hold, the information ratio against it, and the probabilistic
  Sharpe ratio (PSR, against 0).
- Per record, over the days the turbulence stop did not force to cash (`exposure_profile`): how much the
  chosen exposure moves from day to day and how it correlates with the market's next move.
- Per configuration (a policy and variant over its seeds): mean, std and a 95% percentile-bootstrap interval of
  each metric; the deflated Sharpe ratio (DSR) of each seed with the number of trials = every cell the study ran.
- Per configuration and baseline: the paired stationary block-bootstrap interval of the Sharpe difference on
  daily returns (days and seeds resampled; see `clstm_ppo.evaluation.statistics.paired_sharpe_difference`) and
  how many seeds beat the baseline.
- With 4 or more cells: the probability of backtest overfitting (CSCV) over the cells' daily returns.

The statistics themselves are `clstm_ppo.evaluation.statistics` (oracle-tested); this module only arranges them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation import statistics as S

EXTRA_METRICS = ("exposure", "beta", "alpha", "information_ratio", "psr")
TABLE = (  # (key, column, kind): the study's table, the paper's Table 6 first
    ("cumulative_return", "CR", "pct"),
    ("max_earning_rate", "MER", "pct"),
    ("max_drawdown", "MPB", "pct"),
    ("appt", "APPT", "dollars"),
    ("sharpe", "SR", "ratio"),
    ("annual_return", "ann. return", "pct"),
    ("annual_volatility", "ann. vol", "pct"),
    ("sortino", "Sortino", "ratio"),
    ("calmar", "Calmar", "ratio"),
    ("annual_turnover", "turnover/yr", "times"),
    ("total_costs", "costs", "dollars"),
    ("exposure", "exposure", "pct"),
    ("exposure_std", "exposure sd", "pct"),
    ("exposure_timing", "timing corr", "ratio"),
    ("beta", "beta", "ratio"),
    ("alpha", "alpha/yr", "pct"),
    ("information_ratio", "IR", "ratio"),
    ("psr", "PSR", "prob"),
    ("dsr", "DSR", "prob"),
)


def returns_of(values: np.ndarray) -> np.ndarray:
    """``[D-1]`` daily simple returns of ``[D]`` values (dollars)."""
    return M.daily_returns(values)


def curve_metrics(
    values: np.ndarray,
    holdings_value: np.ndarray,
    benchmark_values: np.ndarray,
    *,
    trades: Any = None,
    costs: float | None = None,
    traded_value: float | None = None,
) -> dict[str, float]:
    """Every per-record metric (module docstring) of one value series ``[D]`` dollars.

    :param holdings_value: ``[D]`` dollars held in stock (exposure = holdings / value).
    :param benchmark_values: ``[D]`` equal-weight buy-and-hold on the same days (beta, alpha, IR).
    :param trades: the trades table (or a trade count, with ``costs`` and ``traded_value`` in dollars).
    """
    r, b = returns_of(values), returns_of(benchmark_values)
    beta, alpha = S.beta_alpha(r, b)
    out = M.summarize(values, trades=trades, costs=costs, traded_value=traded_value)
    out.update(
        exposure=S.mean_exposure(values, holdings_value),
        beta=beta,
        alpha=alpha,
        information_ratio=S.information_ratio(r, b),
        psr=S.probabilistic_sharpe_ratio(r) if r.size > 1 else 0.5,
    )
    return {k: float(v) for k, v in out.items()}


def exposure_profile(
    values: np.ndarray, holdings_value: np.ndarray, benchmark_values: np.ndarray, forced: np.ndarray
) -> dict[str, float]:
    """``{exposure_std, exposure_timing}`` of one record (`S.exposure_timing`), leaving out the days ``forced``
    ``[D]`` bool (the turbulence stop's), whose exposure no policy chose."""
    std, timing = S.exposure_timing(values, holdings_value, benchmark_values, forced)
    return {"exposure_std": std, "exposure_timing": timing}


def seed_summary(
    rows: list[dict[str, float]], keys: list[str], *, confidence: float, n_boot: int, seed: int = 0
) -> dict[str, dict[str, float]]:
    """``{metric: {mean, std, lo, hi, n}}`` over seeds: percentile-bootstrap interval of the mean (NaN bounds for
    one seed; too narrow for very few seeds, as every percentile interval is)."""
    x = np.array([[row.get(k, math.nan) for k in keys] for row in rows], dtype=np.float64)  # [S, M]
    mean, lo, hi = S.bootstrap_mean_ci(x, confidence=confidence, n_boot=n_boot, seed=seed)
    std = x.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(len(keys))
    return {
        k: {"mean": float(mean[i]), "std": float(std[i]), "lo": float(lo[i]), "hi": float(hi[i]), "n": len(rows)}
        for i, k in enumerate(keys)
    }


def add_deflated_sharpe(cells: list[dict[str, Any]]) -> dict[str, float]:
    """Put each cell's DSR (trials = all cells, variance of their daily Sharpe ratios) into its policy metrics.

    :param cells: each with ``"returns"`` ``[D-1]`` and ``"policy"`` (its metrics dict, updated in place).
    :return: ``{"num_trials", "sharpe_variance"}`` (daily units) for the report.
    """
    daily = np.array([M.sharpe_from_returns(c["returns"]) / math.sqrt(M.TRADING_DAYS) for c in cells])
    variance = float(daily.var(ddof=1)) if len(cells) > 1 else 0.0
    for c in cells:
        c["policy"]["dsr"] = (
            float(S.deflated_sharpe_ratio(c["returns"], len(cells), variance)) if c["returns"].size > 1 else 0.5
        )
    return {"num_trials": len(cells), "sharpe_variance_daily": variance}


def compare(
    policy_returns: np.ndarray, baseline_returns: np.ndarray, *, confidence: float, n_boot: int, seed: int = 0
) -> dict[str, Any]:
    """Paired block-bootstrap interval of the Sharpe difference: ``[S, D-1]`` policy vs ``[D-1]`` or ``[S, D-1]``."""
    out = S.paired_sharpe_difference(policy_returns, baseline_returns, confidence=confidence, n_boot=n_boot, seed=seed)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out.items()}


def overfitting(cell_returns: np.ndarray) -> dict[str, Any] | None:
    """PBO by CSCV over the cells' daily returns ``[D-1, N]``; None with fewer than 4 cells or too few days."""
    days, n = cell_returns.shape
    if n < 4:
        return None
    splits = min(16, (days // 20) // 2 * 2)  # 16 blocks when there are >= 320 days, never blocks under 20 days
    if splits < 4:
        return None
    out = S.probability_of_backtest_overfitting(cell_returns, num_splits=splits)
    return {
        "pbo": float(out["pbo"]),
        "num_splits": int(out["num_splits"]),
        "num_combinations": int(out["num_combinations"]),
        "num_configurations": n,
    }


def verdict(
    group: str,
    summary: dict[str, dict[str, float]],
    vs_buy_and_hold: dict[str, Any],
    baseline_sharpe: float,
    confidence: float,
) -> str:
    """One line in plain words, e.g. "clstm: Sharpe 0.97 [0.81, 1.12] vs buy-and-hold 1.08; does not beat it
    (difference CI includes 0); 3/8 seeds beat it; mean exposure 18%"."""
    sr, exp = summary["sharpe"], summary["exposure"]
    lo, hi = vs_buy_and_hold["lo"], vs_buy_and_hold["hi"]
    if lo > 0:
        word = f"beats buy-and-hold (the {confidence:.0%} interval of the Sharpe difference, [{lo:+.2f}, {hi:+.2f}], lies above 0)"
    elif hi < 0:
        word = f"does worse than buy-and-hold (difference interval [{lo:+.2f}, {hi:+.2f}] below 0)"
    else:
        word = f"does not beat buy-and-hold (difference interval [{lo:+.2f}, {hi:+.2f}] includes 0)"
    interval = "" if math.isnan(sr["lo"]) else f" [{sr['lo']:.2f}, {sr['hi']:.2f}]"
    return (
        f"{group}: Sharpe {sr['mean']:.2f}{interval} vs buy-and-hold {baseline_sharpe:.2f}; {word}; "
        f"{vs_buy_and_hold['seeds_beating']}/{vs_buy_and_hold['num_seeds']} seeds beat it; "
        f"mean exposure {exp['mean']:.0%}"
    )
