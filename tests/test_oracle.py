"""The reference trader (`envs.predictor`, `envs.oracle`, `clstm_ppo.evaluation.oracle`, ``clstm-ppo data oracle``):
the best of a declared family of signal traders, chosen on the training days only (a held-out day changed, the choice
is the same; the choice is the training days' best, not the held-out days'), its family holding the equal-weight book;
it reads nothing but prices or the named column (the same Sharpe from the written file as from the market in memory;
a later day never moves an earlier day's weights), it beats buy-and-hold after costs where a signal is planted and
not where none is, a share of it is a share of its excess over buy-and-hold with a t interval over seeds, and what has
no reference trader is refused in one line."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from clstm_ppo.agent.evaluate import evaluate_actions, evaluate_policy
from clstm_ppo.cli.data import main as data_main
from clstm_ppo.config import TrainConfig
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.oracle import (
    MIN_ORACLE_EXCESS,
    ReferencePolicy,
    excess_share,
    member_env,
    reference_run,
    reference_words,
    seed_share_words,
    share_over_seeds,
    share_words,
)
from clstm_ppo.evaluation.report import BacktestResult, compute_metrics
from clstm_ppo.evaluation.statistics import ratio_t_interval, t_interval
from clstm_ppo.market import build_market
from envs.data import DayRange, MarketData
from envs.errors import UserError
from envs.execution import Terms
from envs.kernel import target_weights
from envs.oracle import (
    REFERENCE_BANDS,
    REFERENCE_SCALES,
    ColumnSignal,
    Member,
    family,
    member_actions,
    parse_signal,
    planted_rule,
    require_planted_rule,
    signal_predictor,
    standardise_on,
)
from envs.predictor import SignalRule, predictor_from_prices
from envs.sources import load_market_data
from envs.synthetic import market_and_parts

PLANTED = "synthetic:tickers=10,days=1500,signal_ic=0.15"
NULL = "synthetic:tickers=10,days=1500"  # the same market's noise, nothing planted
SMALL = "synthetic:tickers=4,days=600,signal_ic=0.3,signal_halflife=5"


def _market(source: str, seed: int, data: MarketData | None = None, splits=None):
    cfg = TrainConfig.from_dict({"data": source, "seed": seed, "use_turbulence": False})
    return cfg, build_market(cfg.data, seed=seed, data=data, splits=splits)


def test_the_predictor_a_trader_computes_from_the_prices_is_the_one_the_market_was_planted_with():
    m, parts = market_and_parts(num_tickers=6, num_days=800, seed=4, signal_ic=0.2, signal_halflife=5)
    rule = planted_rule("synthetic:signal_ic=0.2,signal_halflife=5")
    np.testing.assert_allclose(predictor_from_prices(m.close, rule), parts.predictor, atol=1e-9)
    assert parts.predictor[:, 0::2].std() == 0 and parts.predictor[:, 1::2].std() > 0.5  # leaders, followers


def test_the_family_holds_the_equal_weight_book_and_tilts_well_beyond_the_old_one():
    assert 0.0 in REFERENCE_SCALES and max(REFERENCE_SCALES) >= 2.0 and 0.0 in REFERENCE_BANDS
    assert len(family()) == len(REFERENCE_SCALES) * len(REFERENCE_BANDS) == len(set(family()))
    predictor = np.random.default_rng(0).normal(size=(5, 4))
    actions = member_actions(predictor, REFERENCE_SCALES)  # [D, S, N]
    assert actions.shape == (5, len(REFERENCE_SCALES), 4) and np.abs(actions).max() <= 1.0
    book = target_weights(torch.as_tensor(actions[:, 0])).numpy()
    np.testing.assert_allclose(book, np.full((5, 5), 1 / 5))  # scale 0: every stock and cash at 1 / (N + 1)
    np.testing.assert_allclose(actions[:, REFERENCE_SCALES.index(0.5)], np.clip(0.5 * predictor, -1, 1))
    assert Member(0.0, 0.01).describe() == "the equal-weight book, no-trade band 1%"
    assert Member(1.5, 0.0).describe() == "tilt 1.5, no-trade band 0%"


def test_a_pass_of_the_family_trades_each_member_as_its_own_run_would(one_torch_thread):
    """One env pass with every member as a column, each with its own no-trade band (band-major, the scales within,
    as `choose_member` runs them), gives each member the run `evaluate_policy` gives it alone under its band."""
    cfg, market = _market(SMALL, 3)
    predictor = predictor_from_prices(market.data.close, require_planted_rule(SMALL))
    actions = member_actions(predictor, REFERENCE_SCALES)
    scales = len(REFERENCE_SCALES)
    bands = [band for band in REFERENCE_BANDS for _ in range(scales)]
    runs = evaluate_actions(np.tile(actions, (1, len(REFERENCE_BANDS), 1)), market, "train", cfg.env, bands)
    for b, s in [(0, 0), (1, 4), (2, 9), (3, 6)]:
        env = member_env(cfg.env, REFERENCE_BANDS[b])
        alone = evaluate_policy(ReferencePolicy(actions[:, s], market.splits.train.start), market, "train", env)
        np.testing.assert_array_equal(runs[b * scales + s].values, alone.values)
        np.testing.assert_array_equal(runs[b * scales + s].holdings, alone.holdings)
    assert not np.array_equal(runs[6].holdings, runs[3 * scales + 6].holdings)  # the 5% band trades otherwise


def _spliced(planted: MarketData, null: MarketData, first: int) -> MarketData:
    """``planted``'s days before ``first``, then ``null``'s moves (every price relative to its day ``first - 1``)."""
    out = {}
    for name in ("open", "high", "low", "close"):
        a, b = getattr(planted, name), getattr(null, name)
        later = planted.close[first - 1] * b[first:] / null.close[first - 1]
        out[name] = np.concatenate([a[:first], later])
    return dataclasses.replace(planted, **out)


def test_the_member_is_chosen_on_the_training_days_and_no_held_out_day_moves_the_choice(one_torch_thread):
    """The choice is the training days' argmax, though this market's held-out days favour another member by far; with
    the held-out days replaced by a market with no signal, the choice (every member's training-days Sharpe) is the
    same bit for bit."""
    cfg, market = _market(SMALL, 3)
    _, null = _market("synthetic:tickers=4,days=600", 3)
    rule = require_planted_rule(SMALL)
    first = market.splits.train.stop
    spliced = _spliced(market.data, null.data, first)
    assert np.array_equal(spliced.close[:first], market.data.close[:first])
    assert not np.allclose(spliced.close[first:], market.data.close[first:])
    cfg2, other = _market(SMALL, 3, data=spliced, splits=market.splits)
    a = reference_run(market, "test", cfg.env, rule)
    b = reference_run(other, "test", cfg2.env, rule)
    np.testing.assert_array_equal(a.choice.sharpe, b.choice.sharpe)
    assert a.member == b.member
    assert a.sharpe != b.sharpe  # the held-out days did change
    best = np.unravel_index(np.argmax(a.choice.sharpe), a.choice.sharpe.shape)
    assert a.member == Member(REFERENCE_SCALES[best[1]], REFERENCE_BANDS[best[0]])
    actions = member_actions(predictor_from_prices(market.data.close, rule), [a.member.scale])[:, 0]
    policy = ReferencePolicy(actions, market.splits.train.start)
    one = evaluate_policy(policy, market, "train", member_env(cfg.env, a.member.band))
    assert a.choice.figures.sharpe == pytest.approx(M.sharpe_ratio(one.values, cfg.env.risk_free), abs=1e-12)
    # this market's held-out days favour another member (the family's table there): the choice stays the training days'
    predictor = predictor_from_prices(market.data.close, rule)
    held = [
        M.sharpe_ratio(r.values, cfg.env.risk_free)
        for band in REFERENCE_BANDS
        for r in evaluate_actions(
            member_actions(predictor, REFERENCE_SCALES), market, "test", member_env(cfg.env, band)
        )
    ]
    assert max(held) > held[family().index(a.member)] + 0.5, (held, a.member)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_reference_beats_buy_and_hold_where_a_signal_is_planted_and_not_where_none_is(seed, one_torch_thread):
    """Test split: 225 days, where one Sharpe ratio has a standard error of about 1.1; but the reference and
    buy-and-hold trade the same days of the same market, so their difference varies far less. The same member's
    actions on the market without the signal (same noise, same days) have no edge, only costs. The turbulence stop
    is off."""
    cfg, market = _market(PLANTED, seed)
    rule = require_planted_rule(PLANTED)
    result = reference_run(market, "test", cfg.env, rule)
    assert result.sharpe > result.buy_and_hold_sharpe + 1.0, result.figures
    assert result.member.scale > 0 and result.figures.annual_turnover > 1 and 0.5 < result.figures.exposure <= 1.0
    assert len(result.figures.run.dates) == market.splits.test.num_days

    cfg0, null = _market(NULL, seed)
    test = null.splits.test
    actions = member_actions(predictor_from_prices(market.data.close, rule), [result.member.scale])[:, 0]
    env0 = member_env(cfg0.env, result.member.band)
    run = evaluate_policy(ReferencePolicy(actions, test.start), null, test, env0)
    terms = Terms.of(null.data, cfg0.env.execution, 0.0).days(test.start, test.stop)
    metrics = compute_metrics(BacktestResult.from_run(run, env0, terms))
    null_edge = metrics["policy"]["sharpe"] - metrics["baseline"]["sharpe"]
    assert null_edge < 1.0
    assert result.sharpe - result.buy_and_hold_sharpe > null_edge + 1.0


def test_the_reference_from_the_written_file_equals_the_reference_in_memory(tmp_path, one_torch_thread):
    source = "synthetic:tickers=6,days=900,signal_ic=0.3,signal_halflife=5"
    cfg, in_memory = _market(source, 7)
    path = load_market_data(source, seed=7).to_path(tmp_path / "market.csv")
    file_cfg, from_file = _market(f"csv:{path}", 0)
    assert from_file.data.equals(in_memory.data, rtol=1e-15)
    rule = require_planted_rule(source)
    a = reference_run(in_memory, "test", cfg.env, rule)
    b = reference_run(from_file, "test", file_cfg.env, rule)
    assert a.member == b.member
    assert abs(a.sharpe - b.sharpe) < 1e-9 and abs(a.buy_and_hold_sharpe - b.buy_and_hold_sharpe) < 1e-9
    assert a.sharpe > a.buy_and_hold_sharpe + 1.0  # a planted market: there is something to trade


@pytest.mark.parametrize("kind", ["lead_lag", "momentum"])
def test_the_reference_never_reads_a_later_day(kind):
    """Perturb every price of day t+1 on: the predictor, the actions and the target weights of days 0..t stay bit for
    bit the same, and those of day t+1 move."""
    m = load_market_data(f"synthetic:tickers=5,days=300,signal_ic=0.3,signal_halflife=5,signal_kind={kind}", seed=2)
    rule = SignalRule(kind, 5.0)
    weights = target_weights_of(m, rule)
    rng = np.random.default_rng(0)
    for t in (30, 150, 297):
        scale = np.ones_like(m.close)
        scale[t + 1 :] = np.exp(rng.normal(0.0, 0.05, scale[t + 1 :].shape))
        later = MarketData(
            dates=m.dates,
            tickers=m.tickers,
            open=m.open * scale,
            high=m.high * scale,
            low=m.low * scale,
            close=m.close * scale,
            volume=m.volume,
        )
        moved = target_weights_of(later, rule)
        assert np.array_equal(moved[: t + 1], weights[: t + 1]), t
        assert not np.allclose(moved[t + 1], weights[t + 1]), t


def target_weights_of(data: MarketData, rule: SignalRule) -> np.ndarray:
    """``[D, N + 1]`` a tilt-0.3 member's target portfolio on each day of ``data`` (a mild tilt: its actions stay off
    the clip, so a moved price moves them)."""
    actions = member_actions(predictor_from_prices(data.close, rule), [0.3])[:, 0]
    return target_weights(torch.as_tensor(actions)).numpy()


def test_a_column_signal_is_standardised_on_the_training_days_only():
    rng = np.random.default_rng(1)
    values = rng.normal(3.0, 2.0, size=(50, 3))
    values[:, 2] = 7.0  # a ticker whose column never moves: no signal
    train = DayRange(5, 30)
    a = standardise_on(values, train)
    np.testing.assert_allclose(a[5:30, :2].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(a[5:30, :2].std(axis=0), 1.0)
    assert (a[:, 2] == 0).all()
    later = values.copy()
    later[30:] *= 100.0  # the held-out rows never set the scale
    np.testing.assert_array_equal(standardise_on(later, train)[:30], a[:30])
    assert parse_signal("col:alpha") == ColumnSignal("alpha") and parse_signal("momentum") == SignalRule("momentum")
    with pytest.raises(UserError, match="name the column"):
        parse_signal("col: ")


def test_the_reference_trades_a_forecast_column_of_a_file(tmp_path, capsys, one_torch_thread):
    """A file's column that is an affine map of the planted predictor: standardised on the training days, it gives
    the family back the predictor's choice and the same held-out figures up to that standardisation, from the file
    alone; a missing column and a NaN in one are refused in one line."""
    m = load_market_data(SMALL, seed=3)
    predictor = predictor_from_prices(m.close, require_planted_rule(SMALL))
    with_column = dataclasses.replace(m, columns={"forecast": 2.0 * predictor + 7.0})
    path = with_column.to_path(tmp_path / "m.csv")
    cfg, market = _market(f"csv:{path}", 0)
    train = market.splits.train
    a = signal_predictor(market.data, ColumnSignal("forecast"), train)
    np.testing.assert_allclose(a, standardise_on(predictor, train), atol=1e-9)
    result = reference_run(market, "test", cfg.env, ColumnSignal("forecast"))
    assert result.sharpe > result.buy_and_hold_sharpe + 1.0
    assert data_main(["oracle", str(path), "--signal", "col:forecast"]) == 0
    out = capsys.readouterr().out
    assert (
        "signal: column 'forecast' (standardised per ticker by its mean and standard deviation on the training" in out
    )
    assert f"chosen on the training days: {result.member.describe()}" in out
    assert f"reference trader: Sharpe {result.sharpe:.2f} after costs" in out
    with pytest.raises(UserError, match="no column 'alpha'"):
        reference_run(market, "test", cfg.env, ColumnSignal("alpha"))
    holed = with_column.columns["forecast"].copy()
    holed[100, 1] = np.nan
    bad = dataclasses.replace(m, columns={"forecast": holed}).to_path(tmp_path / "holed.csv")
    with pytest.raises(UserError, match="column 'forecast' has no value for SYN01"):
        data_main(["oracle", str(bad), "--signal", "col:forecast"])


def test_a_share_of_the_reference_is_a_share_of_its_excess_over_buy_and_hold():
    assert excess_share(2.69, 0.69, 4.69) == pytest.approx(0.5)
    assert excess_share(0.28, 0.69, 4.64) == pytest.approx(-0.41 / 3.95)
    assert excess_share(6.0, 1.0, 4.0) == pytest.approx(5 / 3)  # a reference, not a bound: above 100%
    assert excess_share(1.0, 0.69, 1.1) is None  # the reference's excess under 0.5: no share
    member = Member(1.0, 0.01)
    words = share_words(2.69, 0.69, 4.69, member)
    assert "(tilt 1, no-trade band 1%, chosen on the training days) Sharpe 4.69 after costs, +4.00" in words
    assert words.endswith("learned 50% of that excess")
    assert "share n/a" in share_words(1.0, 0.69, 1.1, member)


def test_a_share_over_seeds_has_a_t_interval_and_a_paired_test_of_its_target():
    trained = np.array([2.9, 1.1, 2.6, 4.8, 2.9, 2.7, 4.2, 3.5])
    held = np.array([0.6, -0.8, 1.5, 1.6, 2.1, 2.3, 1.0, 1.4])
    reference = held + np.array([3.2, 4.1, 3.9, 4.4, 3.6, 4.5, 4.6, 3.3])
    s = share_over_seeds(trained, held, reference, target=0.5)
    assert s.share == pytest.approx((trained.mean() - held.mean()) / (reference.mean() - held.mean()))
    assert (s.lo, s.hi) == pytest.approx(ratio_t_interval(trained - held, reference - held))
    margin = trained - held - 0.5 * (reference - held)
    assert s.margin == pytest.approx(margin.mean())
    assert (s.margin_lo, s.margin_hi, s.margin_lower) == pytest.approx(t_interval(margin))
    assert (s.margin > 0) == (s.share > 0.5) and s.seeds == 8
    words = seed_share_words(s)
    assert f"{s.share:.1%} [{s.lo:.0%}, {s.hi:.0%}] (95% t over 8 seeds, delta method)" in words
    assert (
        f"paired test of share >= 50%: trained - buy-and-hold - 0.5 x (reference - buy-and-hold) = {s.margin:+.2f}"
        in words
    )
    # no room to share: the share is n/a, the paired differences are still given
    small = share_over_seeds(trained, held, held + MIN_ORACLE_EXCESS / 2, target=0.5)
    assert small.share is None and math.isnan(small.lo) and not math.isnan(small.margin_lo)
    assert "share of the reference's excess: n/a" in seed_share_words(
        small
    ) and "one-sided lower bound" in seed_share_words(small)
    one = share_over_seeds([2.0], [1.0], [4.0])
    assert one.share == pytest.approx(1 / 3) and math.isnan(one.margin_lo) and "one seed" in seed_share_words(one)


def test_what_has_no_reference_trader_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(UserError, match="plants no signal"):
        require_planted_rule("synthetic:tickers=3,days=300")
    with pytest.raises(UserError, match="generator 1 or 2"):
        require_planted_rule("synthetic:generator=1,signal=0.5")
    with pytest.raises(UserError, match="generator 1 or 2"):
        require_planted_rule("synthetic:generator=2,signal_ic=0.3")
    with pytest.raises(UserError, match="not a synthetic market: name the signal"):
        require_planted_rule("csv:prices.csv")
    with pytest.raises(UserError, match="unknown signal 'noise'"):
        parse_signal("noise")
    with pytest.raises(UserError, match="signal option 'speed=3'"):
        parse_signal("lead_lag,speed=3")
    cfg, market = _market("synthetic:tickers=3,days=300,signal_ic=0.2", 1)
    with pytest.raises(UserError, match="--action_mode weights"):
        reference_run(market, "test", TrainConfig.from_dict({"action_mode": "shares"}).env, SignalRule())


def test_the_oracle_command_prints_the_family_the_member_and_buy_and_hold(tmp_path, capsys, one_torch_thread):
    source = "synthetic:tickers=4,days=600,signal_ic=0.3,signal_halflife=5"
    assert data_main(["oracle", source, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    cfg = TrainConfig.from_dict({"data": source, "seed": 3})
    result = reference_run(build_market(cfg.data, seed=3), "test", cfg.env, require_planted_rule(source))
    assert "lead_lag (half-life 5 days)" in out and "2 of 4 tickers have one" in out
    assert "scale in {0, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3} (0: the equal-weight book)" in out
    assert "no-trade band in {0%, 1%, 2%, 5%}: 40 members" in out
    header = next(line for line in out.splitlines() if line.startswith("band \\ scale"))
    assert header.split()[3:] == [f"{s:g}" for s in REFERENCE_SCALES]
    assert f"chosen on the training days: {result.member.describe()} (Sharpe {result.choice.figures.sharpe:.2f}" in out
    assert f"reference trader: Sharpe {result.sharpe:.2f} after costs" in out
    assert f"buy-and-hold Sharpe {result.buy_and_hold_sharpe:.2f}" in out
    # any file, with the rule named: the same figures as the market it was written from
    path = load_market_data(source, seed=3).to_path(tmp_path / "m.csv")
    assert data_main(["oracle", str(path), "--signal", "lead_lag,halflife=5"]) == 0
    assert f"reference trader: Sharpe {result.sharpe:.2f} after costs" in capsys.readouterr().out
    assert reference_words(result, result.buy_and_hold_sharpe).endswith("learned 0% of that excess")
