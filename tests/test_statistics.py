"""The study's statistics against oracles: closed forms, hand-worked examples, the papers' numbers, and
plain slow re-implementations written here (never numbers printed by the functions themselves)."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest

from clstm_ppo.evaluation import statistics as st
from envs.returns import sharpe_from_returns

PHI = NormalDist().cdf
SQRT252 = math.sqrt(252)

# --------------------------------------------------------------------------------- beta, alpha, IR


def test_beta_alpha_recover_a_planted_exact_linear_model():
    bench = np.random.default_rng(0).normal(0.0005, 0.01, 300)
    returns = 0.0002 + 1.3 * bench  # no noise: OLS must return the planted numbers
    beta, alpha = st.beta_alpha(returns, bench)
    assert beta == pytest.approx(1.3, abs=1e-12)
    assert alpha == pytest.approx(0.0002 * 252, abs=1e-12)  # arithmetic annualisation of the intercept


def test_beta_alpha_with_noise_match_lstsq():
    rng = np.random.default_rng(1)
    bench = rng.normal(0.0004, 0.012, 500)
    returns = -0.0001 + 0.7 * bench + rng.normal(0, 0.005, 500)
    design = np.column_stack([np.ones_like(bench), bench])
    (a, b), *_ = np.linalg.lstsq(design, returns, rcond=None)
    beta, alpha = st.beta_alpha(returns, bench)
    assert beta == pytest.approx(b, rel=1e-10)
    assert alpha == pytest.approx(a * 252, rel=1e-8)


def test_beta_alpha_constant_benchmark_is_beta_zero():
    returns = np.array([0.01, -0.02, 0.03])
    beta, alpha = st.beta_alpha(returns, np.full(3, 0.001))
    assert beta == 0.0
    assert alpha == pytest.approx(np.mean(returns) * 252)


def test_information_ratio_by_hand():
    r = np.array([0.01, 0.02, -0.01, 0.03])
    b = np.array([0.0, 0.01, 0.0, 0.01])
    # active = [0.01, 0.01, -0.01, 0.02], mean 0.0075
    # deviations 0.0025, 0.0025, -0.0175, 0.0125 -> squares sum 4.75e-4 -> var (ddof 1) 4.75e-4 / 3
    expected = 0.0075 * 252 / (math.sqrt(4.75e-4 / 3) * SQRT252)
    assert st.information_ratio(r, b) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(9.4619, abs=1e-3)
    # a constant active return has no tracking error: 0 by the Sharpe's masking rule, not 1e15
    assert st.information_ratio(b + 0.001, b) == 0.0


def test_mean_exposure_by_hand_and_rejects_a_short_book():
    values = np.array([100.0, 200.0, 100.0])
    assert st.mean_exposure(values, [0.0, 100.0, 100.0]) == pytest.approx((0 + 0.5 + 1) / 3)
    with pytest.raises(ValueError, match="long-only"):
        st.mean_exposure(values, [0.0, -10.0, 100.0])


def simulate_exposures(market: np.ndarray, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and holdings of a portfolio that holds the fraction ``chosen[i]`` of its value in the market from day
    i-1's close to day i's (chosen[0] unused), rebalanced at each close without costs."""
    values, holdings = [1000.0], [0.0]
    for i in range(1, len(market)):
        invested = chosen[i] * values[-1]
        holdings.append(invested * market[i] / market[i - 1])
        values.append(values[-1] - invested + holdings[-1])
    return np.array(values), np.array(holdings)


def test_exposure_timing_recovers_the_chosen_exposures_and_their_foresight():
    rng = np.random.default_rng(3)
    market = 100 * np.cumprod(1 + rng.normal(0.0, 0.01, 400))
    up = np.r_[False, market[1:] > market[:-1]]  # what a clairvoyant knows at day i-1 about day i
    clairvoyant = np.where(up, 0.9, 0.5)
    values, holdings = simulate_exposures(market, clairvoyant)
    std, timing = st.exposure_timing(values, holdings, market)
    assert std == pytest.approx(np.std(clairvoyant[1:]), rel=1e-9)  # measured at the choice, not after the move
    r = market[1:] / market[:-1] - 1
    assert timing == pytest.approx(np.corrcoef(clairvoyant[1:], r)[0, 1], rel=1e-9) and timing > 0.5
    blind = rng.uniform(0.5, 0.9, 400)
    assert abs(st.exposure_timing(*simulate_exposures(market, blind), market)[1]) < 0.15
    assert math.isnan(st.exposure_timing(*simulate_exposures(market, np.full(400, 0.7)), market)[1])  # fixed mix
    # days a rule forced are left out: with the clairvoyant's down-days all "forced", the rest never moves
    std, timing = st.exposure_timing(values, holdings, market, forced=np.r_[~up[1:], False])
    assert std == pytest.approx(0.0, abs=1e-12) and math.isnan(timing)


# ------------------------------------------------------------------------------- bootstrap of a mean


def test_bootstrap_mean_ci_coverage_and_width_on_normal_samples():
    # 2,000 replications of S = 30 normal draws, all bootstrapped at once as the M columns of one call.
    rng = np.random.default_rng(2)
    true_mean, s = 0.7, 30
    samples = rng.normal(true_mean, 1.0, size=(s, 2000))
    mean, lo, hi = st.bootstrap_mean_ci(samples, n_boot=2000, seed=3)
    np.testing.assert_allclose(mean, samples.mean(axis=0))
    assert np.all((lo <= mean) & (mean <= hi))
    coverage = np.mean((lo <= true_mean) & (true_mean <= hi))
    # percentile interval ~ mean +- 1.96 std(ddof=0) / sqrt(S): P(|t_29| < 1.96 sqrt(29/30)) = 0.936
    assert 0.91 <= coverage <= 0.96
    # closed form of the bootstrap distribution: sd of a resampled mean = std(ddof=0) / sqrt(S)
    expected_width = 2 * NormalDist().inv_cdf(0.975) * samples.std(axis=0) / math.sqrt(s)
    assert np.median((hi - lo) / expected_width) == pytest.approx(1.0, abs=0.03)


def test_bootstrap_mean_ci_one_seed_and_1d_input():
    mean1, lo1, hi1 = st.bootstrap_mean_ci([0.4])
    assert mean1 == 0.4 and math.isnan(lo1) and math.isnan(hi1)
    mean, lo, hi = st.bootstrap_mean_ci(np.array([[0.4, 1.0]]))
    assert np.all(np.isnan(lo)) and np.all(np.isnan(hi)) and list(mean) == [0.4, 1.0]
    x = np.array([0.1, 0.5, -0.2, 0.9, 0.3])
    m, lo, hi = st.bootstrap_mean_ci(x, n_boot=500, seed=4)
    assert m == pytest.approx(0.32) and lo < 0.32 < hi
    assert min(x) <= lo and hi <= max(x)  # a resampled mean cannot leave the data's range


# ------------------------------------------------------------------------------ stationary bootstrap


def test_stationary_bootstrap_block_length_range_uniformity_and_determinism():
    d, draws, block = 200, 3000, 5.0
    idx = st.stationary_bootstrap_indices(d, draws, block, np.random.default_rng(5))
    assert idx.shape == (draws, d) and idx.dtype.kind == "i"
    assert idx.min() >= 0 and idx.max() < d
    # a position continues the previous block with prob 1 - p, or starts a new block that happens to
    # begin on the next day with prob p / D
    p = 1 / block
    cont = idx[:, 1:] == (idx[:, :-1] + 1) % d
    assert cont.mean() == pytest.approx((1 - p) + p / d, abs=0.005)
    blocks_per_draw = d - cont.sum(axis=1)
    assert np.mean(d / blocks_per_draw) == pytest.approx(block, rel=0.05)  # mean block length
    # wrapping: from the last day a block continues to day 0
    from_last = idx[:, :-1] == d - 1
    assert np.mean(idx[:, 1:][from_last] == 0) == pytest.approx(1 - p, abs=0.03)
    # every day equally likely (marginal uniform): draws x D picks over D days, block-correlated
    counts = np.bincount(idx.ravel(), minlength=d)
    assert np.max(np.abs(counts / draws - 1)) < 0.15
    assert np.array_equal(idx, st.stationary_bootstrap_indices(d, draws, block, np.random.default_rng(5)))
    assert not np.array_equal(idx, st.stationary_bootstrap_indices(d, draws, block, np.random.default_rng(6)))
    # mean_block = 1 is the i.i.d. bootstrap: continuations only by chance
    iid = st.stationary_bootstrap_indices(d, draws, 1.0, np.random.default_rng(5))
    assert np.mean(iid[:, 1:] == (iid[:, :-1] + 1) % d) == pytest.approx(1 / d, abs=0.002)


def test_default_block_length_is_cube_root():
    assert st.default_block_length(1000) == 10
    assert st.default_block_length(252) == 6
    assert st.default_block_length(1) == 1


# ----------------------------------------------------------------------------- paired Sharpe difference


def _coverage(num_seeds: int, seed_spread: float, resample_seeds: bool, reps: int = 200) -> float:
    """Share of `reps` simulated studies whose interval covers the true Sharpe difference.

    Baseline ~ N(mu_b, sb^2) iid per day; seed s of the policy = baseline + alpha_s with
    alpha_s ~ N(mu_s, sa^2) iid per day and mu_s ~ N(mu_a, seed_spread^2) per seed. A policy seed's true
    Sharpe is (mu_b + mu_s) / sqrt(sb^2 + sa^2), linear in mu_s, so the population's mean difference is
    sqrt(252) ((mu_b + mu_a) / sqrt(sb^2 + sa^2) - mu_b / sb).
    """
    mu_b, sb, mu_a, sa, days = 0.0004, 0.01, 0.0004, 0.005, 250
    true = SQRT252 * ((mu_b + mu_a) / math.hypot(sb, sa) - mu_b / sb)
    rng = np.random.default_rng(7)
    hits = 0
    for rep in range(reps):
        base = rng.normal(mu_b, sb, days)
        mu_s = rng.normal(mu_a, seed_spread, (num_seeds, 1))
        policy = base + mu_s + rng.normal(0.0, sa, (num_seeds, days))
        res = st.paired_sharpe_difference(policy, base, n_boot=200, seed=rep, resample_seeds=resample_seeds)
        hits += res["lo"] <= true <= res["hi"]
    return hits / reps


def test_paired_sharpe_ci_covers_the_true_difference():
    # seeds with different true Sharpe ratios (sd ~0.85 annualised): the realistic case for RL runs
    assert 0.88 <= _coverage(4, seed_spread=0.0006, resample_seeds=True) <= 0.995
    # fixing the seeds ignores that spread and the interval under-covers: why seeds are resampled
    assert _coverage(4, seed_spread=0.0006, resample_seeds=False) < 0.85


def test_paired_sharpe_ci_with_noise_only_seeds_is_conservative_not_anticonservative():
    # seeds differing only by noise on the same days: days alone give ~nominal coverage, days + seeds
    # count each seed's noise twice (Owen 2007) and over-cover, as documented
    assert 0.85 <= _coverage(4, seed_spread=0.0, resample_seeds=False) <= 0.99
    assert _coverage(4, seed_spread=0.0, resample_seeds=True) >= 0.97


def test_paired_sharpe_point_estimate_matches_per_seed_metrics():
    rng = np.random.default_rng(8)
    base = rng.normal(0.0003, 0.01, (3, 300))
    policy = base + rng.normal(0.0, 0.004, (3, 300)) + np.array([[0.001], [-0.002], [0.0005]])
    res = st.paired_sharpe_difference(policy, base, n_boot=100)
    sr_p = [sharpe_from_returns(x) for x in policy]
    sr_b = [sharpe_from_returns(x) for x in base]
    assert res["difference"] == pytest.approx(np.mean(np.subtract(sr_p, sr_b)), rel=1e-12)
    assert res["seeds_beating"] == int(np.sum(np.greater(sr_p, sr_b))) == 2
    assert res["num_seeds"] == 3 and res["n_boot"] == 100 and res["mean_block"] == 7.0  # 300^(1/3) = 6.7
    assert res["lo"] <= res["hi"]


def test_paired_sharpe_identical_policy_gives_exact_zero_interval():
    base = np.random.default_rng(9).normal(0.0004, 0.01, 250)
    res = st.paired_sharpe_difference(np.tile(base, (5, 1)), base, n_boot=300, family=4)
    assert (res["difference"], res["lo"], res["hi"], res["seeds_beating"]) == (0.0, 0.0, 0.0, 0)
    assert (res["lo_mcse"], res["hi_mcse"], res["lo_bonferroni"], res["hi_bonferroni_mcse"]) == (0.0, 0.0, 0.0, 0.0)


def test_paired_sharpe_constant_extra_return_is_significantly_better():
    # SR(b + c) - SR(b) = c / std(b) sqrt(252) > 0 on every resample: the whole interval is above 0
    base = np.random.default_rng(10).normal(0.0, 0.01, 250)
    res = st.paired_sharpe_difference(np.tile(base + 0.0005, (3, 1)), base, n_boot=300)
    assert res["difference"] == pytest.approx(0.0005 / np.std(base, ddof=1) * SQRT252, rel=1e-10)
    assert 0.0 < res["lo"] <= res["hi"]
    assert res["seeds_beating"] == 3


def test_pairing_narrows_the_interval_against_an_unpaired_oracle():
    rng = np.random.default_rng(11)
    days, n_boot, block = 250, 300, 6.0
    base = rng.normal(0.0004, 0.01, days)
    policy = base + rng.normal(0.0002, 0.002, days)  # correlation ~0.98 with the baseline
    paired = st.paired_sharpe_difference(policy[None, :], base, n_boot=n_boot, mean_block=block, seed=1)
    # unpaired oracle: policy and baseline days resampled independently, plain loop over draws
    draw = np.random.default_rng(12)
    idx_p = st.stationary_bootstrap_indices(days, n_boot, block, draw)
    idx_b = st.stationary_bootstrap_indices(days, n_boot, block, draw)
    diffs = [sharpe_from_returns(policy[i]) - sharpe_from_returns(base[j]) for i, j in zip(idx_p, idx_b, strict=True)]
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    assert paired["hi"] - paired["lo"] < (hi - lo) / 4


def test_paired_sharpe_p_value_inverts_its_interval():
    rng = np.random.default_rng(14)
    base = rng.normal(0.0003, 0.01, 300)
    clear = st.paired_sharpe_difference(np.tile(base + 0.0006, (3, 1)), base, n_boot=400)
    assert clear["lo"] > 0 and clear["p_value"] == pytest.approx(2 / 401)  # every draw above 0: the smallest p
    same = st.paired_sharpe_difference(np.tile(base, (2, 1)), base, n_boot=400)
    assert same["p_value"] == 1.0  # every draw exactly 0
    # in between, "0 outside the 95% interval" and "p < 0.05" agree but for draws right at the boundary
    for rep in range(20):
        policy = base + 0.0004 * rep / 10 + rng.normal(0, 0.004, (3, 300))
        res = st.paired_sharpe_difference(policy, base, n_boot=400, seed=rep)
        assert (res["lo"] > 0 or res["hi"] < 0) == (res["p_value"] < 0.05) or abs(res["p_value"] - 0.05) < 0.01


def test_bootstrap_p_value_by_hand():
    # 1 draw <= 0 and 4 >= 0 of 5: p = 2 (1 + 1) / (5 + 1)
    assert st.bootstrap_p_value([-1.0, 0.5, 1.0, 2.0, 3.0]) == pytest.approx(4 / 6)
    # a draw equal to the null counts on both sides: 2 <= 0, 3 >= 0 -> 2 (2 + 1) / 5 > 1 -> 1
    assert st.bootstrap_p_value([-1.0, 0.0, 1.0, 2.0]) == 1.0
    assert st.bootstrap_p_value(np.arange(1.0, 100.0)) == pytest.approx(2 / 100)
    assert st.bootstrap_p_value([1.0, 2.0, 3.0], null=2.5) == pytest.approx(2 * 2 / 4)
    with pytest.raises(ValueError):
        st.bootstrap_p_value([])


# ------------------------------------------------------------------ Sharpe interval over days (and seeds)


def test_sharpe_interval_over_days_covers_the_true_sharpe():
    # iid normal days with a known Sharpe: the days-only interval covers it at about the nominal rate
    mu, sd, days, reps = 0.0005, 0.01, 400, 150
    true = mu / sd * SQRT252
    rng = np.random.default_rng(15)
    hits = 0
    for rep in range(reps):
        res = st.sharpe_interval(rng.normal(mu, sd, days), n_boot=300, seed=rep)
        hits += res["lo"] <= true <= res["hi"]
        assert res["resamples"] == "days"
    assert 0.88 <= hits / reps <= 0.99
    # its width is the market's noise: about 2 x 1.96 x sqrt(252 / days) annualised, whatever the seeds do
    width = res["hi"] - res["lo"]
    assert 0.7 * 3.92 * math.sqrt(252 / days) < width < 1.3 * 3.92 * math.sqrt(252 / days)


def test_sharpe_interval_of_seeds_is_wider_than_the_seeds_only_interval():
    rng = np.random.default_rng(16)
    market = rng.normal(0.0004, 0.01, 500)
    seeds = market + rng.normal(0.0001, 0.002, (6, 500))  # seeds close to each other on the same days
    res = st.sharpe_interval(seeds, n_boot=500)
    per_seed = [sharpe_from_returns(x) for x in seeds]
    assert res["sharpe"] == pytest.approx(np.mean(per_seed), rel=1e-12)
    assert res["num_seeds"] == 6 and res["resamples"] == "days and seeds"
    _, lo, hi = st.bootstrap_mean_ci(per_seed, n_boot=2000)
    assert res["lo"] < lo and res["hi"] > hi and (res["hi"] - res["lo"]) > 5 * (hi - lo)
    # the same draws as the difference against a baseline of zeros (Sharpe 0): one resampling implementation
    diff = st.paired_sharpe_difference(seeds, np.zeros(500), n_boot=500)
    assert (res["lo"], res["hi"], res["lo_mcse"], res["hi_mcse"]) == (
        diff["lo"],
        diff["hi"],
        diff["lo_mcse"],
        diff["hi_mcse"],
    )


# ----------------------------------------------------- Monte Carlo error of the bounds; Bonferroni widening


def test_quantile_mcse_by_hand():
    # B = 100 draws 1..100, q = 0.5: d = sqrt(0.25 / 100) = 0.05; numpy's linear rule puts level 0.55 at rank
    # 0.55 x 99 = 54.45 (value 55.45) and 0.45 at 44.55 (value 45.55): SE = (55.45 - 45.55) / 2
    draws = np.arange(1.0, 101.0)
    assert st.quantile_mcse(draws, 0.5) == pytest.approx(4.95, rel=1e-12)
    # near an end the lower level is clipped to the smallest draw: q = 0.01, d = sqrt(0.0099) / 10
    d = math.sqrt(0.01 * 0.99 / 100)
    assert st.quantile_mcse(draws, [0.01])[0] == pytest.approx((1 + (0.01 + d) * 99 - 1 - max(0.01 - d, 0) * 99) / 2)
    assert st.quantile_mcse(np.full(50, 3.0), [0.025, 0.975]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        st.quantile_mcse(draws, 1.5)


def test_quantile_mcse_matches_the_standard_error_of_a_normal_quantile():
    # B draws of N(0, sigma^2): the q-quantile's estimate has SE sigma sqrt(q (1 - q) / B) / pdf(z_q)
    # (Kendall and Stuart); the order-statistic estimate must find it from each sample alone, and the spread
    # of the estimated quantiles over 200 independent samples must be that SE too
    sigma, draws, reps = 2.0, 10_000, 200
    levels = np.array([0.005, 0.025, 0.5, 0.975])
    z = np.array([NormalDist().inv_cdf(q) for q in levels])
    truth = sigma * np.sqrt(levels * (1 - levels) / draws) / (np.exp(-z * z / 2) / math.sqrt(2 * math.pi))
    rng = np.random.default_rng(30)
    samples = rng.normal(0.0, sigma, (reps, draws))
    mcse = np.stack([st.quantile_mcse(x, levels) for x in samples])  # [reps, 4]
    quantiles = np.quantile(samples, levels, axis=1).T  # [reps, 4]
    assert np.allclose(mcse.mean(axis=0), truth, rtol=0.08), (mcse.mean(axis=0), truth)
    assert np.allclose(quantiles.std(axis=0, ddof=1), truth, rtol=0.2), (quantiles.std(axis=0, ddof=1), truth)
    # a wrong scale (the SE of the mean, sigma / sqrt(B), or a spacing not halved) is far outside these bounds
    assert not np.allclose(truth, sigma / math.sqrt(draws), rtol=0.2)


def test_the_bounds_mcse_is_how_far_another_set_of_draws_moves_them():
    # the same data bootstrapped with 20 generator seeds: the bounds move by about their reported MCSE
    rng = np.random.default_rng(31)
    base = rng.normal(0.0004, 0.01, 250)
    policy = base + rng.normal(0.0002, 0.004, (3, 250))
    runs = [st.paired_sharpe_difference(policy, base, n_boot=2000, seed=k) for k in range(20)]
    for bound in ("lo", "hi"):
        spread = np.std([r[bound] for r in runs], ddof=1)
        reported = np.mean([r[f"{bound}_mcse"] for r in runs])
        assert 0.6 < spread / reported < 1.6, (bound, spread, reported)
    # and it falls as 1 / sqrt(B): 4x the draws, half the error
    more = np.mean([st.paired_sharpe_difference(policy, base, n_boot=8000, seed=k)["lo_mcse"] for k in range(3)])
    assert 0.35 < more / np.mean([r["lo_mcse"] for r in runs]) < 0.65


def test_bonferroni_interval_is_the_same_draws_at_the_widened_level():
    assert st.bonferroni_confidence(0.95, 1) == 0.95
    assert st.bonferroni_confidence(0.95, 6) == pytest.approx(1 - 0.05 / 6)
    with pytest.raises(ValueError):
        st.bonferroni_confidence(0.95, 0)
    rng = np.random.default_rng(32)
    base = rng.normal(0.0004, 0.01, 300)
    policy = base + rng.normal(0.0003, 0.004, (4, 300))
    res = st.paired_sharpe_difference(policy, base, n_boot=3000, seed=5, family=6)
    # the same draws, drawn again here by the one resampling, at levels 0.05 / 12 and 1 - 0.05 / 12
    draws = st.block_bootstrap_sharpe(policy, base, n_boot=3000, mean_block=res["mean_block"], seed=5)
    lo, hi = np.quantile(draws, [0.025, 0.975])
    wide_lo, wide_hi = np.quantile(draws, [0.05 / 12, 1 - 0.05 / 12])
    assert (res["lo"], res["hi"]) == pytest.approx((lo, hi), rel=1e-12)
    assert (res["lo_bonferroni"], res["hi_bonferroni"]) == pytest.approx((wide_lo, wide_hi), rel=1e-12)
    assert res["lo_bonferroni"] < res["lo"] and res["hi_bonferroni"] > res["hi"]
    assert res["bonferroni_m"] == 6 and res["bonferroni_confidence"] == pytest.approx(1 - 0.05 / 6)
    assert res["lo_bonferroni_mcse"] == pytest.approx(st.quantile_mcse(draws, 0.05 / 12), rel=1e-12)
    assert res["lo_bonferroni_mcse"] > res["lo_mcse"] > 0  # a bound further out rests on fewer draws
    one = st.paired_sharpe_difference(policy, base, n_boot=3000, seed=5, family=1)
    assert (one["lo_bonferroni"], one["hi_bonferroni"]) == (one["lo"], one["hi"])
    assert "lo_bonferroni" not in st.paired_sharpe_difference(policy, base, n_boot=300, seed=5)


# ------------------------------------------------------------------------------------- Holm


def test_holm_adjustment_on_a_hand_made_family():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    np.testing.assert_allclose(st.holm_adjust(p), [0.03, 0.06, 0.06, 0.02])
    assert [a < 0.05 for a in st.holm_adjust(p)] == [True, False, False, True]  # unadjusted, all four pass
    # the step-down never lets a larger p-value overtake: 0.021 x 2 = 0.042 < 0.06 is raised to 0.06
    np.testing.assert_allclose(st.holm_adjust([0.5, 0.02, 0.021]), [0.5, 0.06, 0.06])
    np.testing.assert_allclose(st.holm_adjust([0.6, 0.7]), [1.0, 1.0])  # capped at 1
    np.testing.assert_allclose(st.holm_adjust([0.03]), [0.03])  # a family of one is not adjusted
    assert st.holm_adjust([]).shape == (0,)
    with pytest.raises(ValueError):
        st.holm_adjust([0.5, 1.5])


# ------------------------------------------------------------------------------------------------ PSR


def test_psr_normal_closed_form():
    # g3 = 0, g4 = 3: PSR = Phi((SR - SR*) sqrt(n - 1) / sqrt(1 + SR^2 / 2))
    for sr, bench, n in [(0.1, 0.0, 250), (0.05, 0.08, 1000), (-0.02, 0.0, 30)]:
        expected = PHI((sr - bench) * math.sqrt(n - 1) / math.sqrt(1 + sr * sr / 2))
        assert st.probabilistic_sharpe_from_moments(sr, 0.0, 3.0, n, bench) == pytest.approx(expected, rel=1e-12)


def test_psr_of_returns_uses_sample_moments_by_hand():
    r = np.random.default_rng(13).standard_t(df=5, size=400) * 0.01 + 0.0008
    mean, sd = r.mean(), r.std(ddof=1)
    dev = r - mean
    m2 = np.mean(dev**2)
    skew, kurt = np.mean(dev**3) / m2**1.5, np.mean(dev**4) / m2**2
    sr = mean / sd  # daily
    bench = st.to_daily_sharpe(0.5)
    assert bench == pytest.approx(0.5 / SQRT252)
    z = (sr - bench) * math.sqrt(399) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)
    assert st.probabilistic_sharpe_ratio(r, bench) == pytest.approx(PHI(z), rel=1e-10)


def test_psr_increases_with_sharpe_and_falls_with_benchmark():
    r = np.random.default_rng(14).normal(0.0, 0.01, 250)
    # shifting every return up raises SR and leaves skewness and kurtosis unchanged
    psr = [st.probabilistic_sharpe_ratio(r + shift) for shift in (-0.001, 0.0, 0.0005, 0.001, 0.002)]
    assert all(a < b for a, b in itertools.pairwise(psr))
    psr_b = [st.probabilistic_sharpe_ratio(r + 0.001, b) for b in (-0.05, 0.0, 0.05, 0.1)]
    assert all(a > b for a, b in itertools.pairwise(psr_b))


# ------------------------------------------------------------------------------------------------ DSR


def test_psr_on_active_returns_tests_beating_the_market_not_exposure():
    # half invested in a rising market: a Sharpe above 0 (exposure alone), but behind the market every day it rises
    market = np.random.default_rng(17).normal(0.0015, 0.01, 500)
    half = 0.5 * market
    assert st.probabilistic_sharpe_ratio(half) > 0.95
    active = st.active_returns(half, market)
    np.testing.assert_allclose(active, -0.5 * market)
    assert st.probabilistic_sharpe_ratio(active) < 0.05
    with pytest.raises(ValueError, match="same days"):
        st.active_returns(half[:-1], market)


def test_dsr_numerical_example_of_bailey_lopez_de_prado_2014():
    # "The Deflated Sharpe Ratio" (JPM 2014), numerical example: N = 100 trials, variance of the trials'
    # ANNUALISED Sharpe 1/2, the selected strategy's annualised SR 2.5 over T = 1,250 daily returns with
    # skewness -3 and kurtosis 10, years of 250 days. The paper reports SR0 = 0.1132 (per day) and
    # DSR = 0.9004.
    per_year = 250
    sr0 = st.expected_max_sharpe(100, 0.5 / per_year)  # the variance of daily Sharpe ratios
    assert sr0 == pytest.approx(0.1132, abs=1e-4)
    sr = st.to_daily_sharpe(2.5, per_year)
    assert sr == pytest.approx(0.1581, abs=1e-4)
    dsr = st.probabilistic_sharpe_from_moments(sr, -3.0, 10.0, 1250, sr0)
    assert dsr == pytest.approx(0.9004, abs=2e-4)


def test_expected_max_sharpe_approximates_monte_carlo_maximum():
    # E[max of N iid N(0, V)] by simulation; the paper's formula is an approximation (~1 % high at N=100)
    sims = np.random.default_rng(15).standard_normal((20_000, 100)) * math.sqrt(0.25)
    assert st.expected_max_sharpe(100, 0.25) == pytest.approx(sims.max(axis=1).mean(), rel=0.02)
    assert st.expected_max_sharpe(1, 0.25) == 0.0


def test_dsr_equals_psr_for_one_trial_and_falls_with_more_trials():
    r = np.random.default_rng(16).normal(0.001, 0.01, 500)
    assert st.deflated_sharpe_ratio(r, 1, 0.01) == st.probabilistic_sharpe_ratio(r, 0.0)
    dsr = [st.deflated_sharpe_ratio(r, n, 0.002) for n in (1, 2, 10, 100, 1000)]
    assert all(a > b for a, b in itertools.pairwise(dsr))


def test_deflated_sharpe_ratio_by_hand():
    rng = np.random.default_rng(17)
    trials = rng.normal(0.0005, 0.01, (8, 400)) + rng.normal(0, 0.0005, (8, 1))
    chosen = trials[int(np.argmax(trials.mean(axis=1) / trials.std(axis=1, ddof=1)))]
    srs = trials.mean(axis=1) / trials.std(axis=1, ddof=1)  # daily Sharpe ratios
    v = np.var(srs, ddof=1)
    g = 0.5772156649
    inv = NormalDist().inv_cdf
    sr0 = math.sqrt(v) * ((1 - g) * inv(1 - 1 / 8) + g * inv(1 - 1 / (8 * math.e)))
    dev = chosen - chosen.mean()
    m2 = np.mean(dev**2)
    skew, kurt = np.mean(dev**3) / m2**1.5, np.mean(dev**4) / m2**2
    sr = chosen.mean() / chosen.std(ddof=1)
    expected = PHI((sr - sr0) * math.sqrt(399) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2))
    assert st.deflated_sharpe_ratio(chosen, 8, v) == pytest.approx(expected, rel=1e-8)


# ------------------------------------------------------------------------------------------------ PBO


def _slow_pbo(returns: np.ndarray, num_splits: int, metric) -> tuple[float, np.ndarray]:
    """CSCV written plainly: every combination, every configuration, ranks counted one by one."""
    d, n = returns.shape
    blocks = np.array_split(np.arange(d), num_splits)
    logits = []
    for combo in itertools.combinations(range(num_splits), num_splits // 2):
        rows_is = np.concatenate([blocks[k] for k in combo])
        rows_oos = np.concatenate([blocks[k] for k in range(num_splits) if k not in combo])
        perf_is = [metric(returns[rows_is, j]) for j in range(n)]
        perf_oos = [metric(returns[rows_oos, j]) for j in range(n)]
        best = perf_is.index(max(perf_is))  # first on ties
        v = perf_oos[best]
        rank = sum(x < v for x in perf_oos) + (sum(x == v for x in perf_oos) + 1) / 2
        w = rank / (n + 1)
        logits.append(math.log(w / (1 - w)))
    logits = np.array(logits)
    return float(np.mean(logits <= 0)), logits


def test_the_plain_pbo_on_a_hand_example():
    # the reference the product is checked against (below), on a metric simple enough to rank by hand
    # S = 4 blocks of one day, N = 3 configurations A, B, C; metric: the mean (ranks as the block sums)
    #        A  B  C
    # day 0: 3  0  1
    # day 1: 2  1  0
    # day 2: 0  3  1
    # day 3: 1  0  2
    # IS {0,1}: sums A5 B1 C1 -> A; OOS {2,3}: A1 B3 C3 -> A rank 1, w 1/4, logit ln(1/3)
    # IS {0,2}: A3 B3 C2 -> tie, first: A; OOS {1,3}: A3 B1 C2 -> rank 3, w 3/4, logit ln 3
    # IS {0,3}: A4 B0 C3 -> A; OOS {1,2}: A2 B4 C1 -> rank 2, w 1/2, logit 0 (counts as overfit)
    # IS {1,2}: A2 B4 C1 -> B; OOS {0,3}: A4 B0 C3 -> rank 1, logit ln(1/3)
    # IS {1,3}: A3 B1 C2 -> A; OOS {0,2}: A3 B3 C2 -> A ties B at the top, ranks 2, 3 -> 2.5, w 5/8,
    #           logit ln(5/3)
    # IS {2,3}: A1 B3 C3 -> tie, first: B; OOS {0,1}: A5 B1 C1 -> B ties C at the bottom -> 1.5,
    #           w 3/8, logit ln(3/5)
    # logit <= 0 in 4 of 6 combinations: PBO = 2/3
    hand = np.array([[3, 0, 1], [2, 1, 0], [0, 3, 1], [1, 0, 2]], dtype=float)
    pbo, logits = _slow_pbo(hand, 4, np.mean)
    np.testing.assert_allclose(logits, np.log([1 / 3, 3, 1, 1 / 3, 5 / 3, 3 / 5]), rtol=0, atol=1e-15)
    assert pbo == pytest.approx(2 / 3)


@pytest.mark.parametrize("days,n,splits", [(203, 5, 8), (160, 4, 6), (64, 12, 4)])
@pytest.mark.parametrize("twin", [False, True])
def test_pbo_vectorised_sharpe_matches_the_plain_loop(days, n, splits, twin):
    rng = np.random.default_rng(days)
    r = rng.normal(0.0003, 0.01, (days, n)) + rng.normal(0, 0.0003, n)
    if twin:  # two equal configurations: ties in and out of sample
        r[:, 1] = r[:, 0]
    pbo, logits = _slow_pbo(r, splits, sharpe_from_returns)
    res = st.probability_of_backtest_overfitting(r, num_splits=splits)
    np.testing.assert_allclose(res["logits"], logits, rtol=0, atol=1e-12)
    assert res["pbo"] == pbo
    assert res["num_combinations"] == math.comb(splits, splits // 2) and res["num_splits"] == splits


def test_pbo_of_identical_noise_configurations_is_one_half_on_average():
    # one data set's PBO is very noisy (sd ~0.2 here); by symmetry its mean over data sets is 1/2
    rng = np.random.default_rng(18)
    pbos = [st.probability_of_backtest_overfitting(rng.normal(0, 0.01, (400, 12)), 8)["pbo"] for _ in range(50)]
    assert np.mean(pbos) == pytest.approx(0.5, abs=0.08)


def test_pbo_dominant_configuration_is_zero():
    rng = np.random.default_rng(19)
    r = rng.normal(0, 0.01, (1000, 12))
    r[:, 5] += 0.01  # Sharpe ~16 a year against ~0: best in and out of sample in every combination
    res = st.probability_of_backtest_overfitting(r)  # S = 16
    assert res["num_combinations"] == 12870
    assert res["pbo"] == 0.0
    assert np.allclose(res["logits"], math.log(12 / 1))  # rank N: w = N / (N + 1)


def test_pbo_overfit_by_construction_is_nearly_one():
    # every configuration's returns sum to zero over the full sample and the blocks are equal, so the
    # in-sample mean is minus the out-of-sample mean: the IS winner is always the OOS loser
    r = np.random.default_rng(20).normal(0, 0.01, (480, 6))
    r -= r.mean(axis=0)
    assert st.probability_of_backtest_overfitting(r, 16)["pbo"] > 0.95  # Sharpe (not exactly the mean): nearly always


def test_pbo_rejects_bad_shapes():
    with pytest.raises(ValueError, match="at least 2 configurations"):
        st.probability_of_backtest_overfitting(np.zeros((100, 1)))
    with pytest.raises(ValueError, match="fewer days"):
        st.probability_of_backtest_overfitting(np.zeros((10, 4)), num_splits=16)
    with pytest.raises(ValueError, match="even"):
        st.probability_of_backtest_overfitting(np.zeros((100, 4)), num_splits=5)


def test_a_ratio_of_means_interval_scales_the_t_interval_and_covers_the_ratio():
    """With a fixed denominator it is the numerators' t-interval over it; over 8 seeds drawn from a model whose
    ratio of means is 0.5 it covers 0.5 in about 95% of 4,000 draws (a percentile bootstrap over the seeds covers
    less)."""
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 0.7, 8)
    lo, hi, _ = st.t_interval(a)
    assert st.ratio_t_interval(a, np.full(8, 2.0)) == pytest.approx((lo / 2.0, hi / 2.0))
    covered = 0
    for _ in range(4000):
        b = rng.normal(3.0, 0.8, 8)
        lo, hi = st.ratio_t_interval(0.5 * b + rng.normal(0.0, 0.9, 8), b)
        covered += lo <= 0.5 <= hi
    assert 0.93 <= covered / 4000 <= 0.97
    with pytest.raises(ValueError, match="pair by seed"):
        st.ratio_t_interval(a, np.ones(7))
