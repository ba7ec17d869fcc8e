"""`clstm-ppo data plant`: a forecast column planted at an exact IC on any prices (`envs.plant`, docs/data.md
"Planting a forecast"), the file's own rows kept as they were, and each refusal in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clstm_ppo.cli.main import main as cli_main
from envs.data import MarketData
from envs.plant import (
    MAD_TO_SIGMA,
    PlantRule,
    cross_sectional_ic,
    forward_average,
    plant_forecast,
    smooth_noise,
    winsorise,
)
from envs.predictor import fill_returns, information_coefficient
from envs.synthetic import generate_market

ROOT = Path(__file__).resolve().parents[1]
DAYS = 400


def plant(*args: str) -> int:
    return cli_main(["data", "plant", *args])


def close_only_frame(days: int = DAYS, step: int | None = None) -> pd.DataFrame:
    """Three tickers of random-walk closes, close only; with ``step``, ticker BBB's closes from that day on are a
    third of what they were (an unadjusted 3:1 split)."""
    rng = np.random.default_rng(7)
    close = 50.0 * np.exp(np.cumsum(0.02 * rng.standard_normal((days, 3)), axis=0))
    if step is not None:
        close[step:, 1] /= 3.0
    dates = pd.bdate_range("2001-01-02", periods=days).strftime("%Y-%m-%d")
    return pd.DataFrame(
        {
            "date": np.repeat(dates, 3),
            "tic": np.tile(["AAA", "BBB", "CCC"], days),
            "close": close.reshape(-1).round(4),
        }
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("plant")
    ohlcv = folder / "ohlcv.csv"
    generate_market(num_tickers=4, num_days=DAYS, seed=1).to_path(ohlcv)
    close = folder / "close.csv"
    close_only_frame().to_csv(close, index=False)
    return {"ohlcv": ohlcv, "close": close}


def column_of(path: Path, name: str) -> np.ndarray:
    """``[D, N]`` the planted column of a written long file, pivoted by its own date and tic text."""
    frame = pd.read_csv(path, dtype={"tic": str})
    return frame.pivot(index="date", columns="tic", values=name).sort_index().to_numpy()


def ahead_of(data: MarketData) -> np.ndarray:
    return fill_returns(None if data.close_only else data.open, data.close)


@pytest.mark.parametrize("kind", ["ohlcv", "close"])
@pytest.mark.parametrize("ic", [0.02, 0.2])
def test_planted_ic_is_exact(files, kind, ic, tmp_path, capsys):
    out = tmp_path / "planted.csv"
    assert plant(str(files[kind]), "--ic", str(ic), "--seed", "3", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    fills = "next-open" if kind == "ohlcv" else "next-close"
    assert f"IC {ic:g} with the {fills} fill returns, half-life 10 days, seed 3" in printed
    assert f"mean over tickers): all {ic:.4f} | train " in printed and "cross-sectional IC" in printed
    data = MarketData.from_path(files[kind])
    column = column_of(out, "forecast")
    assert np.isfinite(column).all()
    np.testing.assert_array_equal(MarketData.from_path(out).columns["forecast"], column)  # what col:forecast reads
    assert abs(information_coefficient(column, ahead_of(data)) - ic) < 1e-9
    rows = slice(0, DAYS - 2)  # unit variance per ticker where there is a fill return
    np.testing.assert_allclose((column[rows] ** 2).mean(axis=0), 1.0, rtol=1e-9)
    np.testing.assert_allclose(column[rows].mean(axis=0), 0.0, atol=1e-9)


def test_the_files_rows_come_back_as_they_were(tmp_path, capsys):
    """Unsorted rows and padded tickers: every line of the input comes back, as text, in its order, with the value of
    its (date, ticker) appended; Parquet keeps its frame (and a (date, tic) index) exactly."""
    frame = close_only_frame().sample(frac=1.0, random_state=0)
    frame["tic"] = " " + frame["tic"]  # the loader strips it; the file keeps it
    frame["note"] = "x,y"  # a text column, quoted in the CSV
    source = tmp_path / "shuffled.csv"
    frame.to_csv(source, index=False)
    out = tmp_path / "planted.csv"
    assert plant(str(source), "--ic", "0.05", "--name", "alpha", "--out", str(out)) == 0
    before = source.read_text().splitlines()
    after = out.read_text().splitlines()
    assert after[0] == before[0] + ",alpha" and len(after) == len(before)
    assert all(a.rsplit(",", 1)[0] == b for a, b in zip(after[1:], before[1:], strict=True))

    data = MarketData.from_path(source)
    planted = plant_forecast(data, PlantRule(0.05, 10.0, 0)).column
    written = pd.read_csv(out, dtype={"tic": str})
    day = np.searchsorted(data.dates, pd.to_datetime(written["date"]).to_numpy())
    ticker = written["tic"].str.strip().map({t: i for i, t in enumerate(data.tickers)}).to_numpy()
    np.testing.assert_array_equal(written["alpha"].to_numpy(), planted[day, ticker])

    indexed = frame.assign(date=pd.to_datetime(frame["date"])).set_index(["date", "tic"])
    source_pq, out_pq = tmp_path / "shuffled.parquet", tmp_path / "planted.parquet"
    indexed.to_parquet(source_pq)
    assert plant(str(source_pq), "--ic", "0.05", "--name", "alpha", "--out", str(out_pq)) == 0
    back = pd.read_parquet(out_pq)
    pd.testing.assert_frame_equal(back.drop(columns="alpha"), pd.read_parquet(source_pq))
    np.testing.assert_array_equal(back["alpha"].to_numpy(), planted[day, ticker])
    capsys.readouterr()


def test_seeds_replicate_and_differ(files, tmp_path, capsys):
    a, b, c = (tmp_path / f"{name}.csv" for name in "abc")
    for out, seed in ((a, "5"), (b, "5"), (c, "6")):
        assert plant(str(files["ohlcv"]), "--ic", "0.05", "--seed", seed, "--out", str(out)) == 0
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    first, other = column_of(a, "forecast"), column_of(c, "forecast")
    assert np.corrcoef(first.ravel(), other.ravel())[0, 1] < 0.95  # more than rounding apart
    ahead = ahead_of(MarketData.from_path(files["ohlcv"]))
    assert abs(information_coefficient(other, ahead) - 0.05) < 1e-9
    capsys.readouterr()


def test_last_rows_hold_noise_and_the_column_is_as_persistent_as_the_signal(files):
    data = MarketData.from_path(files["ohlcv"])
    rule = PlantRule(0.05, 10.0, 2)
    column = plant_forecast(data, rule).column
    assert np.isfinite(column[-2:]).all() and (column[-2:] != 0).all()
    phi = rule.persistence
    signal = forward_average(winsorise(ahead_of(data)[:-2]), phi)
    noise = smooth_noise(column.shape, phi, 2)
    persistence = lag1(column)  # mostly noise at IC 0.05: its sample autocorrelation, which is phi's up to chance
    assert abs(persistence - lag1(noise)) < 0.01 and abs(persistence - phi) < 0.05, (persistence, lag1(noise), phi)
    assert abs(lag1(signal) - phi) < 0.05
    quick = PlantRule(0.05, 2.0, 2)  # a shorter half-life plants a less persistent column
    faster = lag1(plant_forecast(data, quick).column)
    assert abs(faster - lag1(smooth_noise(column.shape, quick.persistence, 2))) < 0.01 and faster < persistence - 0.2


def lag1(x: np.ndarray) -> float:
    """The mean over tickers of the lag-1 autocorrelation of ``x`` ``[D, N]``."""
    return float(np.mean([np.corrcoef(v[:-1], v[1:])[0, 1] for v in x.T]))


def test_winsorising_keeps_an_unadjusted_split_out_of_the_signal(tmp_path, capsys):
    returns = np.array([[0.01], [-0.02], [0.0], [0.03], [-1.1], [0.02], [-0.01]])
    median = 0.0
    sigma = MAD_TO_SIGMA * 0.02  # the median of |r - 0| is 0.02
    expected = returns.copy()
    expected[4] = median - 5 * sigma
    np.testing.assert_allclose(winsorise(returns), expected, rtol=1e-15)

    source, out = tmp_path / "split.csv", tmp_path / "planted.csv"
    close_only_frame(step=200).to_csv(source, index=False)
    assert plant(str(source), "--ic", "0.15", "--out", str(out)) == 0
    column = column_of(out, "forecast")
    ahead = ahead_of(MarketData.from_path(source))
    assert abs(information_coefficient(column, ahead) - 0.15) < 1e-9  # on the realised returns, the step included
    # BBB's days before its step: 1.3 at most; unwinsorised, the step's -1.1 dominates its signal and they reach 3.6
    assert np.abs(column[180:200, 1]).max() < 2.5
    capsys.readouterr()


def test_forward_average_and_noise_as_the_rule_states():
    values = np.array([[1.0, 0.0], [2.0, 1.0], [4.0, -1.0]])
    phi = 0.5
    expected = np.array(
        [
            [(1 + 0.5 * 2 + 0.25 * 4) / 1.75, (0 + 0.5 * 1 - 0.25) / 1.75],
            [(2 + 0.5 * 4) / 1.5, (1 - 0.5) / 1.5],
            [4.0, -1.0],
        ]
    )
    np.testing.assert_allclose(forward_average(values, phi), expected, rtol=1e-15)
    eps = np.random.default_rng(9).standard_normal((50, 3))  # drawn [D, N] in C order
    noise = smooth_noise((50, 3), 0.8, 9)
    np.testing.assert_array_equal(noise[0], eps[0])
    np.testing.assert_allclose(noise[1:], 0.8 * noise[:-1] + 0.6 * eps[1:], rtol=1e-12)


def test_cross_sectional_ic():
    ahead = np.array([[0.01, -0.02, 0.03], [0.02, 0.0, -0.01], [np.nan, 0.01, 0.0]])
    assert cross_sectional_ic(ahead * 3 + 1, ahead) == pytest.approx(1.0)
    assert cross_sectional_ic(-ahead, ahead) == pytest.approx(-1.0)
    predictor = np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0], [9.0, 9.0, 1.0]])  # day 1 never moves, day 2 has a NaN
    assert cross_sectional_ic(predictor, ahead) == pytest.approx(np.corrcoef(predictor[0], ahead[0])[0, 1])
    assert np.isnan(cross_sectional_ic(ahead[:, :1], ahead[:, :1]))


def test_ffill_plants_every_row_of_a_gappy_file(tmp_path, capfd):
    frame = close_only_frame()
    gappy = frame.drop(index=frame.index[(frame["tic"] == "CCC") & frame["date"].isin(["2001-03-01", "2001-03-02"])])
    source, out = tmp_path / "gappy.csv", tmp_path / "planted.csv"
    gappy.to_csv(source, index=False)
    assert plant(str(source), "--ic", "0.05", "--out", str(out)) == 2
    assert "error: tickers do not cover the same dates: CCC misses 2 of" in capfd.readouterr().err
    assert plant(str(source), "--ic", "0.05", "--out", str(out), "--gap_policy", "ffill") == 0
    written = pd.read_csv(out)
    assert len(written) == len(gappy) and np.isfinite(written["forecast"]).all()
    capfd.readouterr()


def refusals(source: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    exists = tmp_path / "exists.csv"
    exists.write_text("keep me\n")
    out = str(tmp_path / "out.csv")
    file = str(source)
    return [
        ([file, "--ic", "0", "--out", out], "--ic must be in (0, 1)"),
        ([file, "--ic", "1", "--out", out], "--ic must be in (0, 1)"),
        ([file, "--ic", "-0.05", "--out", out], "--ic must be in (0, 1)"),
        ([file, "--ic", "0.05", "--halflife", "0", "--out", out], "--halflife must be a positive number of days"),
        ([file, "--ic", "0.05", "--halflife", "-3", "--out", out], "--halflife must be a positive number of days"),
        ([file, "--ic", "0.05", "--name", "close", "--out", out], "reads as the close column"),
        ([file, "--ic", "0.05", "--name", "Symbol", "--out", out], "reads as the tic column"),
        ([file, "--ic", "0.05", "--name", "Adjusted", "--out", out], "reads as the adj_close column"),
        ([file, "--ic", "0.05", "--name", "ALPHA", "--out", out], "the file already has a column 'alpha'"),
        ([file, "--ic", "0.05", "--name", " x", "--out", out], "without surrounding spaces"),
        ([file, "--ic", "0.05", "--out", file], "is the input file"),
        ([file, "--ic", "0.05", "--out", str(exists)], "exists; planting writes a new file"),
        ([file, "--ic", "0.05", "--out", str(tmp_path / "out.parquet")], "must be a .csv file, like"),
        ([file, "--ic", "0.05", "--out", str(tmp_path / "out.txt")], "must end in .csv or .parquet"),
        ([file, "--ic", "0.9", "--out", out], "--ic 0.9 is out of reach at half-life 10: "),
        ([file, "--ic", "0.05", "--train_end", "1999-01-01", "--out", out], "train_end 1999-01-01 is outside"),
        ([str(tmp_path / "missing.csv"), "--ic", "0.05", "--out", out], "data file not found"),
    ]


def test_each_refusal_is_one_line(tmp_path, capfd):
    source = tmp_path / "in.csv"
    close_only_frame().assign(alpha=1.0).to_csv(source, index=False)
    original = source.read_bytes()
    for args, expected in refusals(source, tmp_path):
        code = plant(*args)
        out, err = capfd.readouterr()
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (args, code, err)
        assert lines[0].startswith("error: ") and expected in lines[0], (args, lines[0])
        assert "Traceback" not in out + err
        assert not (tmp_path / "out.csv").exists()
    assert source.read_bytes() == original and (tmp_path / "exists.csv").read_text() == "keep me\n"


def test_out_of_reach_names_the_ticker_and_what_is_reachable_in_a_real_process(tmp_path):
    source = tmp_path / "in.csv"
    close_only_frame().to_csv(source, index=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "clstm_ppo.cli", "data", "plant", str(source), "--out", str(tmp_path / "o.csv")]
    done = subprocess.run([*command, "--ic", "0.9"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    reach = float(done.stderr.split("the largest IC this file takes at this half-life is ")[1].split()[0])
    assert "'s forward average of its winsorised fill returns correlates only" in done.stderr and 0.2 < reach < 0.5
    assert not (tmp_path / "o.csv").exists()
    assert plant(str(source), "--ic", str(reach), "--out", str(tmp_path / "o.csv")) == 0  # the largest is reachable


def replant(path: Path, ic: float, halflife: float, seed: int) -> np.ndarray:
    """The rule of docs/data.md, "Planting a forecast", written again from the text: ``[D, N]``."""
    frame = pd.read_csv(path, dtype={"tic": str})
    frame["tic"] = frame["tic"].str.strip()
    has_opens = "open" in frame.columns
    prices = frame.pivot(index="date", columns="tic", values="open" if has_opens else "close").sort_index().to_numpy()
    days, tickers = prices.shape
    steps = days - 2
    returns = np.log(prices[2:] / prices[1:-1])
    phi = 0.5 ** (1 / halflife)
    eps = np.random.default_rng(seed).standard_normal((days, tickers))
    out = np.empty((days, tickers))
    for i in range(tickers):
        r = returns[:, i]
        m = np.median(r)
        s = 1.4826 * np.median(np.abs(r - m))
        w = np.clip(r, m - 5 * s, m + 5 * s)
        y = np.array(
            [
                sum(phi**k * w[t + k] for k in range(steps - t)) / sum(phi**k for k in range(steps - t))
                for t in range(steps)
            ]
        )
        e = np.empty(days)
        e[0] = eps[0, i]
        for t in range(1, days):
            e[t] = phi * e[t - 1] + np.sqrt(1 - phi**2) * eps[t, i]
        basis = np.stack([r - r.mean(), y - y.mean()], axis=1)
        centred = e[:steps] - e[:steps].mean()
        perp = centred - basis @ np.linalg.lstsq(basis, centred, rcond=None)[0]
        rho = np.corrcoef(y, r)[0, 1]
        lam = np.linalg.norm(y - y.mean()) * np.sqrt(rho**2 / ic**2 - 1) / np.linalg.norm(perp)
        x = np.concatenate([y - y.mean() + lam * perp, lam * e[steps:]])
        out[:, i] = x / np.sqrt(np.mean(x[:steps] ** 2))
    return out


@pytest.mark.parametrize("kind", ["ohlcv", "close"])
def test_the_documented_rule_replants_the_column(files, kind, tmp_path, capsys):
    out = tmp_path / "planted.csv"
    assert plant(str(files[kind]), "--ic", "0.1", "--halflife", "5", "--seed", "4", "--out", str(out)) == 0
    np.testing.assert_allclose(column_of(out, "forecast"), replant(files[kind], 0.1, 5.0, 4), rtol=1e-7, atol=1e-9)
    capsys.readouterr()
