"""The study's numbers: each record's metrics, their spread across seeds, and the comparisons a quant asks for
(docs/study.md, "Statistics"). The statistics themselves are `clstm_ppo.evaluation.statistics` (oracle-tested); this
module only arranges them.

Per record (a cell's stitched run, its untrained network, a baseline): the columns of `TABLE`; beta, alpha and the
information ratio are against equal-weight buy-and-hold, and "PSR vs B&H" tests the active returns over it, since on a
long-only book in a rising market "Sharpe > 0" mostly measures exposure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation import statistics as S
from clstm_ppo.evaluation.ledger import TrialCount

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
    ("psr", "PSR vs 0", "prob"),
    ("dsr", "DSR vs 0", "prob"),
    ("psr_active", "PSR vs B&H", "prob"),
    ("dsr_active", "DSR vs B&H", "prob"),
)
DEFLATED = ("dsr", "dsr_active")  # per cell only: a baseline or an untrained network is not a selected trial


def curve_metrics(
    values: np.ndarray,
    holdings_value: np.ndarray,
    benchmark_values: np.ndarray,
    *,
    trades: Any = None,
    costs: float | None = None,
    traded_value: float | None = None,
    risk_free: float = 0.0,
) -> dict[str, float]:
    """Every per-record metric (module docstring) of one value series ``[D]`` dollars (ratios on returns in excess of
    the annual ``risk_free``).

    :param holdings_value: ``[D]`` dollars held in stock (exposure = holdings / value).
    :param benchmark_values: ``[D]`` equal-weight buy-and-hold on the same days (beta, alpha, IR).
    :param trades: the trades table (or a trade count, with ``costs`` and ``traded_value`` in dollars).
    """
    r, b = M.excess_returns(values, risk_free), M.excess_returns(benchmark_values, risk_free)
    beta, alpha = S.beta_alpha(r, b)
    out = M.summarize(values, trades=trades, costs=costs, traded_value=traded_value, risk_free=risk_free)
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
    one seed; too narrow for very few seeds, as every percentile interval is). A metric undefined for some seeds
    (NaN: a win rate with no closed trade, of a policy that never traded) is summarised over the seeds that define
    it (``n`` of them; all NaN where none does)."""
    x = np.array([[row.get(k, math.nan) for k in keys] for row in rows], dtype=np.float64)  # [S, M]
    out = {}
    defined = np.isfinite(x)  # [S, M]
    full = defined.all(axis=0)  # [M] the metrics every seed defines: one bootstrap over them all
    if full.any():
        mean, lo, hi = S.bootstrap_mean_ci(x[:, full], confidence=confidence, n_boot=n_boot, seed=seed)
        std = x[:, full].std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(int(full.sum()))
        for j, i in enumerate(np.flatnonzero(full)):
            out[keys[i]] = {"mean": float(mean[j]), "std": float(std[j]), "lo": float(lo[j]), "hi": float(hi[j])}
            out[keys[i]]["n"] = len(rows)
    for i in np.flatnonzero(~full):
        column = x[defined[:, i], i]  # [n] the seeds that define it
        nan = {"mean": math.nan, "std": math.nan, "lo": math.nan, "hi": math.nan}
        if column.size:
            m, lo_i, hi_i = S.bootstrap_mean_ci(column, confidence=confidence, n_boot=n_boot, seed=seed)
            nan = {"mean": m, "std": float(column.std(ddof=1)) if column.size > 1 else 0.0, "lo": lo_i, "hi": hi_i}
        out[keys[i]] = {**nan, "n": int(column.size)}
    return {k: out[k] for k in keys}


def active_profile(values: np.ndarray, benchmark_values: np.ndarray) -> dict[str, float]:
    """``{psr_active}``: the PSR of the active daily returns of ``values`` ``[D]`` over ``benchmark_values`` ``[D]``
    (equal-weight buy-and-hold, dollars, same days): the probability that the true Sharpe of the excess over
    buy-and-hold is above 0."""
    a = S.active_returns(M.excess_returns(values), M.excess_returns(benchmark_values))
    return {"psr_active": S.probabilistic_sharpe_ratio(a) if a.size > 1 else 0.5}


def add_deflated_sharpe(cells: list[dict[str, Any]], trials: TrialCount, benchmark_returns: np.ndarray) -> None:
    """Put each cell's DSR vs 0 and DSR of active returns into its policy metrics (``dsr``, ``dsr_active``).

    :param cells: each with ``"returns"`` ``[D-1]`` and ``"policy"`` (its metrics dict, updated in place).
    :param trials: N and the variances of the trials' daily Sharpe ratios (and of their active Sharpe ratios) on
        these days of this data, from the trials ledger (which holds these cells too).
    :param benchmark_returns: ``[D-1]`` equal-weight buy-and-hold's daily returns on the same days.
    """
    n = max(trials.num_trials, 1)
    for c in cells:
        r = c["returns"]
        short = r.size < 2
        c["policy"]["dsr"] = 0.5 if short else float(S.deflated_sharpe_ratio(r, n, trials.sharpe_variance_daily))
        c["policy"]["dsr_active"] = (
            0.5
            if short
            else float(S.deflated_sharpe_ratio(S.active_returns(r, benchmark_returns), n, trials.active_variance_daily))
        )


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


def holm_family(comparisons: list[dict[str, Any]], confidence: float) -> None:
    """Holm's adjustment over a family of comparisons (each a `S.paired_sharpe_difference` result, updated in place
    with ``p_holm`` and ``survives_holm``: adjusted p below ``1 - confidence``) and ``family_size``."""
    adjusted = S.holm_adjust([c["p_value"] for c in comparisons])
    for c, p in zip(comparisons, adjusted, strict=True):
        c.update(p_holm=float(p), survives_holm=bool(p < 1.0 - confidence), family_size=len(comparisons))


def significance(d: dict[str, Any]) -> str:
    """The p-value and, where the unadjusted interval excludes 0, whether the claim survives Holm's correction:
    "p 0.004; survives Holm over the study's 9 comparisons (adjusted p 0.036)", or "p 0.41, Holm-adjusted 1.000"."""
    if "p_holm" not in d:
        return f"p {d['p_value']:.3f}"
    if d["lo"] <= 0 <= d["hi"]:
        return f"p {d['p_value']:.3f}, Holm-adjusted {d['p_holm']:.3f}"
    word = "survives" if d["survives_holm"] else "but does not survive"
    return (
        f"p {d['p_value']:.3f}; {word} Holm over the study's {d['family_size']} comparisons "
        f"(adjusted p {d['p_holm']:.3f})"
    )


def sharpe_words(interval: dict[str, Any], seeds_only: dict[str, float] | None = None) -> str:
    """A Sharpe ratio with its interval and what it resamples, e.g. "0.48 [0.02, 0.95] (days and seeds resampled;
    seeds only [0.34, 0.59])" (the seeds-only interval when ``seeds_only`` is given and there are 2+ seeds)."""
    text = f"{interval['sharpe']:.2f} [{interval['lo']:.2f}, {interval['hi']:.2f}] ({interval['resamples']} resampled"
    if seeds_only is not None and not math.isnan(seeds_only["lo"]):
        text += f"; seeds only [{seeds_only['lo']:.2f}, {seeds_only['hi']:.2f}]"
    return text + ")"


def verdict(
    group: str,
    summary: dict[str, dict[str, float]],
    interval: dict[str, Any],
    vs_buy_and_hold: dict[str, Any],
    baseline_interval: dict[str, Any],
    confidence: float,
) -> str:
    """One line in plain words, e.g. "clstm: Sharpe 0.97 [0.20, 1.71] (days and seeds resampled; seeds only [0.81,
    1.12]) vs buy-and-hold 1.08 [0.31, 1.80] (days resampled); does not beat it (difference +0.11 [-0.30, +0.52]
    includes 0; p 0.61; does not survive Holm ...); 3/8 seeds beat it; mean exposure 18%"."""
    d = vs_buy_and_hold
    diff = f"{d['difference']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]"
    if d["lo"] > 0:
        word = (
            f"beats buy-and-hold (the {confidence:.0%} interval of the Sharpe difference, {diff}, lies above 0; "
            f"{significance(d)})"
        )
    elif d["hi"] < 0:
        word = f"does worse than buy-and-hold (difference {diff} below 0; {significance(d)})"
    else:
        word = f"does not beat buy-and-hold (difference {diff} includes 0; {significance(d)})"
    return (
        f"{group}: Sharpe {sharpe_words(interval, summary['sharpe'])} vs buy-and-hold "
        f"{sharpe_words(baseline_interval)}; {word}; {d['seeds_beating']}/{d['num_seeds']} seeds beat it; "
        f"mean exposure {summary['exposure']['mean']:.0%}"
    )
