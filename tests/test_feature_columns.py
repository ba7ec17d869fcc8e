"""A data file's own numeric columns as features of each day's state (``--indicators col:NAME``, docs/data.md "Feature
columns"): loaded, refused in one line where missing or broken, normalised on the training days only, recorded in the
checkpoint, and read the same way by train, backtest, study and trade."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clstm_ppo.evaluation.ledger import same_market
from clstm_ppo.trading.decision import check_tradable
from clstm_ppo.training.checkpoint import load_checkpoint
from envs.data import MarketData, columns_from_file, split_days
from envs.errors import UserError
from envs.features import PreparedMarket, compute_indicators, feature_column
from envs.fingerprint import data_fingerprint, market_witness
from envs.synthetic import generate_market
from tests.conftest import QUICK, TINY_MODEL, run_here

pytestmark = pytest.mark.filterwarnings("ignore:market data has closes only")


def with_alpha(tmp_path: Path, name: str = "alpha.csv", seed: int = 0, days: int = 300) -> tuple[Path, pd.DataFrame]:
    """A CSV of 3 synthetic tickers' bars with a numeric column ``alpha`` (and a text column ``sector``)."""
    frame = generate_market(num_tickers=3, num_days=days, seed=1).to_frame()
    frame["alpha"] = np.random.default_rng(seed).normal(size=len(frame))
    frame["sector"] = "tech"
    path = tmp_path / name
    frame.assign(date=frame["date"].dt.strftime("%Y-%m-%d")).to_csv(path, index=False)
    return path, frame


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``clstm-ppo ARGS`` in ``cwd``, in this interpreter (`tests.conftest.run_here`)."""
    return run_here(list(args), cwd)


def train_quick(cwd: Path, path: Path, indicators: str, *flags: str) -> subprocess.CompletedProcess:
    """The QUICK run of the train command on the file ``path`` with ``--indicators indicators``."""
    return cli(cwd, "train", "--data", f"csv:{path}", "--indicators", indicators, *QUICK, *flags)


def one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    """A nonzero exit whose stderr is one line naming every word, and no traceback."""
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_a_column_enters_the_state_normalised_on_the_training_days_only(tmp_path):
    path, frame = with_alpha(tmp_path)
    data = MarketData.from_path(path)
    assert list(data.columns) == ["alpha"] and "sector" in data.unreadable_columns
    splits = split_days(data, window=5)
    market = PreparedMarket.prepare(data, splits, window=5, indicator_names=("macd", "col:alpha"), use_turbulence=False)
    alpha = frame.pivot(index="date", columns="tic", values="alpha").to_numpy()
    assert np.array_equal(market.indicators[:, :, 1], alpha)  # the value of date t on row t: known at t's close
    train = alpha[splits.train.start : splits.train.stop]
    norm = market.normalization
    assert np.allclose(norm.indicator_mean[1], train.mean(axis=0)) and np.allclose(
        norm.indicator_std[1], train.std(axis=0)
    )
    rows = norm.market_rows(np.asarray(data.close), market.indicators)  # [D, N + K N]: the last N are alpha's
    assert np.allclose(rows[:, -3:], (alpha - train.mean(axis=0)) / train.std(axis=0))

    later = frame.copy()  # other values after the training days change nothing fitted
    later.loc[later["date"] >= data.dates[splits.train.stop], "alpha"] = 99.0
    other = PreparedMarket.prepare(
        MarketData.from_frame(later), splits, window=5, indicator_names=("macd", "col:alpha"), use_turbulence=False
    )
    assert np.array_equal(other.normalization.indicator_mean, norm.indicator_mean)
    assert not np.array_equal(other.indicators, market.indicators)


def test_a_missing_or_broken_column_is_refused_in_one_line_naming_it(tmp_path):
    path, frame = with_alpha(tmp_path)
    data = MarketData.from_path(path)
    with pytest.raises(UserError, match=r"no column 'beta' \(its feature columns: alpha\)"):
        compute_indicators(data, ("col:beta",))
    with pytest.raises(UserError, match="col:sector: non-numeric values in column 'sector'"):
        compute_indicators(data, ("col:sector",))
    with pytest.raises(UserError, match="names no column"):
        compute_indicators(data, ("col:",))
    with pytest.raises(UserError, match="unknown indicator 'momentum'"):
        compute_indicators(data, ("momentum",))

    second = frame["tic"].unique()[1]
    day = frame["date"].unique()[40]
    gappy = frame.copy()
    gappy.loc[(gappy["tic"] == second) & (gappy["date"] == day), "alpha"] = np.nan
    data = MarketData.from_frame(gappy)
    when = pd.Timestamp(day).date()
    with pytest.raises(UserError, match=f"column 'alpha' has no value for {second} on {when} .*--gap_policy ffill"):
        feature_column(data, "alpha")
    assert data.equals(MarketData.from_frame(data.to_frame()))  # NaN kept, not dropped, until a run reads it

    with pytest.warns(UserWarning, match="filled 1 missing value"):
        filled = MarketData.from_frame(gappy, gap_policy="ffill")
    day_index = list(filled.dates).index(np.datetime64(day))
    assert feature_column(filled, "alpha")[day_index, 1] == feature_column(filled, "alpha")[day_index - 1, 1]

    long_gap = frame.copy()  # a run longer than max_ffill_days stays missing, and so is refused
    long_gap.loc[(long_gap["tic"] == second) & long_gap["date"].isin(frame["date"].unique()[40:47]), "alpha"] = np.nan
    with pytest.raises(UserError, match=f"no value for {second} on {when}"):
        feature_column(MarketData.from_frame(long_gap, gap_policy="ffill", max_ffill_days=5), "alpha")

    infinite = frame.copy()
    infinite.loc[(infinite["tic"] == second) & (infinite["date"] == day), "alpha"] = np.inf
    with pytest.raises(UserError, match=f"column 'alpha' is infinite for {second} on {when}"):
        feature_column(MarketData.from_frame(infinite, gap_policy="ffill"), "alpha")


def test_a_column_makes_other_data_for_the_fingerprint_and_the_ledger(tmp_path):
    bars = generate_market(num_tickers=3, num_days=300, seed=1)
    path, _ = with_alpha(tmp_path, seed=0)
    planted = MarketData.from_path(path)
    other_seed = MarketData.from_path(with_alpha(tmp_path, "other.csv", seed=1)[0])
    assert data_fingerprint(MarketData.from_frame(bars.to_frame())) == data_fingerprint(bars)  # no column: as before
    prints = {data_fingerprint(d) for d in (bars, planted, other_seed)}
    assert len(prints) == 3
    assert "columns" not in market_witness(bars)
    study = {"tickers": list(planted.tickers), "witness": market_witness(planted)}
    assert same_market(study, list(planted.tickers), market_witness(planted.slice_days(0, 200)))  # shorter: the same
    assert not same_market(study, list(bars.tickers), market_witness(bars))
    assert not same_market(study, list(other_seed.tickers), market_witness(other_seed))
    json.dumps(market_witness(MarketData.from_frame(pd.read_csv(path).assign(alpha=np.nan))))  # JSON without NaN


@pytest.mark.slow
def test_a_feature_column_round_trips_through_train_backtest_and_study(tmp_path):
    path, _ = with_alpha(tmp_path, days=700)
    bare = tmp_path / "bare.csv"
    pd.read_csv(path).drop(columns=["alpha"]).to_csv(bare, index=False)
    proc = train_quick(tmp_path, path, "rsi,col:alpha", "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "r")
    assert proc.returncode == 0, proc.stderr
    ck = load_checkpoint(tmp_path / "ck" / "r" / "latest.pt")
    assert ck.market_spec["indicator_names"] == ["rsi", "col:alpha"]
    assert np.shape(ck.market_spec["normalization"]["indicator_mean"]) == (2, 3)  # recorded: [K, N]

    proc = cli(tmp_path, "backtest", "--checkpoint", str(tmp_path / "ck" / "r" / "latest.pt"))
    assert proc.returncode == 0, proc.stderr
    one_line_error(
        cli(tmp_path, "backtest", "--checkpoint", str(tmp_path / "ck" / "r" / "latest.pt"), "--data", f"csv:{bare}"),
        "col:alpha",
        "no column 'alpha'",
    )
    grid = ["--policies", "mlp", "--seeds", "1", "--indicators", "rsi,col:alpha", *TINY_MODEL, "--num_episodes", "2"]
    grid += ["--trade_start", "2016-03-01", "--trade_end", "2016-05-31", "--retrain", "none", "--bootstrap", "200"]
    proc = cli(tmp_path, "study", "--data", f"csv:{path}", "--out", "s", *grid, "--workers", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    cell = json.loads((tmp_path / "s" / "spec.json").read_text())
    assert "col:alpha" in json.dumps(cell)
    one_line_error(cli(tmp_path, "study", "--data", f"csv:{bare}", "--out", "t", *grid), "no column 'alpha'")


def test_trade_needs_a_file_of_the_columns_and_reads_them_by_date_and_ticker(tmp_path):
    path, frame = with_alpha(tmp_path)
    proc = train_quick(tmp_path, path, "col:alpha", "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "r")
    assert proc.returncode == 0, proc.stderr
    ck = load_checkpoint(tmp_path / "ck" / "r" / "latest.pt")
    with pytest.raises(UserError, match="reads the column.* alpha .*pass --features FILE"):
        check_tradable(ck)
    with pytest.raises(UserError, match="--features nowhere.csv: no such file"):
        check_tradable(ck, features="nowhere.csv")

    bars = MarketData.from_frame(frame.drop(columns=["alpha", "sector"]))
    features = tmp_path / "features.csv"
    frame[["date", "tic", "alpha"]].iloc[::-1].to_csv(features, index=False)  # any order, no bars
    data = columns_from_file(features, ["alpha"], bars)
    assert np.array_equal(data.columns["alpha"], MarketData.from_frame(frame).columns["alpha"])
    frame[["date", "tic", "alpha"]].iloc[:-1].to_csv(features, index=False)  # the last day's last ticker lacks it
    with pytest.raises(UserError, match=f"no value for {bars.tickers[-1]} on {bars.date_str(-1)}"):
        feature_column(columns_from_file(features, ["alpha"], bars), "alpha")
    with pytest.raises(UserError, match="has no column 'beta'"):
        columns_from_file(features, ["beta"], bars)
    pd.concat([frame[["date", "tic", "alpha"]]] * 2).to_csv(features, index=False)  # two values of one day
    with pytest.raises(UserError, match=r"duplicate \(date, tic\) rows"):
        columns_from_file(features, ["alpha"], bars)


def test_training_on_a_column_with_a_missing_value_stops_in_one_line_naming_it(tmp_path):
    path, frame = with_alpha(tmp_path)
    second, day = frame["tic"].unique()[1], frame["date"].unique()[40]
    frame.loc[(frame["tic"] == second) & (frame["date"] == day), "alpha"] = np.nan
    frame.to_csv(path, index=False)
    one_line_error(train_quick(tmp_path, path, "col:alpha"), "'alpha'", second, str(pd.Timestamp(day).date()))
    assert not (tmp_path / "checkpoints").exists()  # nothing written before the refusal
