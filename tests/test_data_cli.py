"""`clstm-ppo data generate | inspect`: in-process through the guarded entry point, and the real CLI in a subprocess;
``generate --like`` and ``inspect --facts`` on the example file, and their bad inputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clstm_ppo.cli.data import main
from clstm_ppo.cli.main import main as cli_main
from envs.data import MarketData
from envs.errors import UserError
from envs.facts import market_facts
from envs.sources import load_market_data
from envs.synthetic import generate_market
from envs.synthetic_v1 import generate_market as generate_market_v1

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "examples" / "data" / "stocks_daily_6_ohlcv.csv"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "data", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_generate_csv_is_deterministic_and_loads(tmp_path, capsys):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    flags = [
        "--tickers",
        "4",
        "--days",
        "60",
        "--signal_ic",
        "0.2",
        "--signal_kind",
        "momentum",
        "--start",
        "2020-01-01",
    ]
    assert main(["generate", "--out", str(a), "--seed", "5", *flags]) == 0
    assert (
        "wrote 240 rows (4 tickers x 60 days, 2020-01-01 .. 2020-03-24, generator 3, seed 5, signal momentum IC 0.2"
        in (capsys.readouterr().out)
    )
    assert main(["generate", "--out", str(b), "--seed", "5", *flags]) == 0
    assert main(["generate", "--out", str(c), "--seed", "6", *flags]) == 0
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    expected = generate_market(
        num_tickers=4, num_days=60, seed=5, signal_ic=0.2, signal_kind="momentum", start="2020-01-01"
    )
    assert MarketData.from_path(a).equals(expected)
    old = tmp_path / "old.csv"  # generator 1, with its signal strength
    assert (
        main(["generate", "--out", str(old), "--generator", "1", "--tickers", "4", "--days", "60", "--signal", "0.5"])
        == 0
    )
    assert MarketData.from_path(old).equals(generate_market_v1(num_tickers=4, num_days=60, signal_strength=0.5))


def test_generate_parquet_into_new_folder(tmp_path):
    out = tmp_path / "new" / "dir" / "m.parquet"
    assert main(["generate", "--out", str(out), "--tickers", "3", "--days", "20"]) == 0
    assert MarketData.from_path(out).equals(generate_market(num_tickers=3, num_days=20))


def test_generate_bad_flags_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="cannot tell the format"):
        main(["generate", "--out", str(tmp_path / "m.xlsx"), "--days", "5"])
    with pytest.raises(UserError, match=r"signal strength must be in \[0, 1\)"):
        main(["generate", "--out", str(tmp_path / "m.csv"), "--generator", "1", "--signal", "2"])
    with pytest.raises(UserError, match="--signal is generator 1's strength; give --signal_ic"):
        main(["generate", "--out", str(tmp_path / "m.csv"), "--signal", "0.5"])
    with pytest.raises(UserError, match="invalid int value"):
        main(["generate", "--out", str(tmp_path / "m.csv"), "--days", "many"])
    with pytest.raises(UserError, match="the following arguments are required: --out"):
        main(["generate"])


def test_inspect_fixture_summary(capsys):
    assert main(["inspect", str(FIXTURE)]) == 0
    out = capsys.readouterr().out
    assert "rows: 16194   tickers: 6   dates: 2013-01-02 .. 2023-09-21 (2699 trading days)" in out
    assert "symbol->tic" in out and "(dividends implied by adjusted)" in out
    assert "gaps: none" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    header = lines["ticker"]
    nvda = dict(zip(header, lines["NVDA"], strict=True))
    raw = pd.read_csv(FIXTURE)
    close = raw[raw.symbol == "NVDA"].sort_values("date")["close"].to_numpy()
    ret = close[1:] / close[:-1] - 1
    assert nvda["days"] == "2699" and nvda["missing"] == "0"
    assert float(nvda["mean_ret%"]) == pytest.approx(100 * ret.mean(), abs=1e-3)
    assert float(nvda["vol%"]) == pytest.approx(100 * ret.std(), abs=1e-2)
    assert float(nvda["min_price"]) == pytest.approx(close.min(), abs=0.01)
    assert float(nvda["max_price"]) == pytest.approx(close.max(), abs=0.01)


def test_inspect_use_adjusted(capsys):
    assert main(["inspect", str(FIXTURE), "--use_adjusted"]) == 0
    out = capsys.readouterr().out
    assert "(OHLC rescaled by adjusted)" in out
    nvda = next(line.split() for line in out.splitlines() if line.startswith("NVDA"))
    raw = pd.read_csv(FIXTURE)
    assert float(nvda[-2]) == pytest.approx(raw[raw.symbol == "NVDA"]["adjusted"].min(), abs=0.01)


def test_inspect_reports_gaps_and_policies(tmp_path, capsys):
    frame = pd.read_csv(FIXTURE)
    frame = frame[~((frame.symbol == "NFLX") & frame.date.isin(["2020-03-02", "2020-03-03"]))]
    path = tmp_path / "gappy.csv"
    frame.to_csv(path, index=False)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gaps: 1 of 6 tickers miss some of the 2699 dates" in out
    assert "NFLX: 2 missing (2020-03-02, 2020-03-03)" in out
    assert "refuses this file" in out
    assert main(["inspect", str(path), "--gap_policy", "intersect"]) == 0
    assert "gap_policy intersect: loads 2697 days x 6 tickers" in capsys.readouterr().out
    assert main(["inspect", str(path), "--gap_policy", "ffill"]) == 0
    assert "gap_policy ffill: loads 2699 days x 6 tickers" in capsys.readouterr().out


def test_help_exits_zero():
    with pytest.raises(SystemExit) as info:
        main(["inspect", "--help"])
    assert info.value.code == 0


# ---------------------------------------------------------------------- the real CLI on bad files
GOOD = "date,tic,open,high,low,close,volume\n" + "".join(
    f"2021-03-0{d},{t},10,11,9,10.5,100\n" for d in range(1, 6) for t in ("AAA", "BBB")
)


def _replace_line(text: str, line_no: int, new: str) -> str:
    lines = text.splitlines()
    lines[line_no] = new
    return "\n".join(lines) + "\n"


BAD_FILES: dict[str, tuple[str, str, list[str]]] = {
    # name: (file text, expected message fragment, extra flags)
    "empty.csv": ("", "data file is empty", []),
    "header_only.csv": ("date,tic,open,high,low,close,volume\n", "no rows of market data", []),
    "no_close.csv": ("date,tic,open\n2021-03-01,AAA,1\n", "missing columns close", []),
    "bad_date.csv": (
        _replace_line(GOOD, 3, "2021-13-45,BBB,10,11,9,10.5,100"),
        "unparseable dates in column 'date': BBB '2021-13-45'",
        [],
    ),
    "dup.csv": (GOOD + "2021-03-01,AAA,10,11,9,10.5,100\n", "duplicate (date, tic) rows: AAA 2021-03-01", []),
    "nan.csv": (
        _replace_line(GOOD, 4, "2021-03-02,BBB,10,11,9,,100"),
        "missing (NaN) close prices at BBB 2021-03-02",
        [],
    ),
    "inf.csv": (_replace_line(GOOD, 4, "2021-03-02,BBB,10,inf,9,10,100"), "infinite high prices at BBB 2021-03-02", []),
    "zero.csv": (
        _replace_line(GOOD, 5, "2021-03-03,AAA,0,11,9,10,100"),
        "non-positive open prices at AAA 2021-03-03",
        [],
    ),
    "high_low.csv": (_replace_line(GOOD, 5, "2021-03-03,AAA,10,9,11,10,100"), "high below low at AAA 2021-03-03", []),
    "text_price.csv": (
        _replace_line(GOOD, 6, "2021-03-03,BBB,10,11,9,$10.5,100"),
        "non-numeric values in column 'close': '$10.5' (BBB 2021-03-03)",
        [],
    ),
    "gaps.csv": (
        "\n".join(GOOD.splitlines()[:-1]) + "\n",
        "tickers do not cover the same dates: BBB misses 1 of 5 dates (2021-03-05)",
        ["--gap_policy", "fail"],
    ),
    "gaps_ffill.csv": (
        GOOD.replace("2021-03-02,BBB,10,11,9,10.5,100\n", "").replace("2021-03-03,BBB,10,11,9,10.5,100\n", ""),
        "cannot forward-fill: BBB misses 2 days in a row from 2021-03-02 (max_ffill_days=1)",
        ["--gap_policy", "ffill", "--max_ffill_days", "1"],
    ),
    "prices.txt": (GOOD, "cannot tell the format of", []),
}


def test_bad_files_are_one_line_and_exit_2(tmp_path, capfd):
    """Each bad file through `clstm-ppo data inspect`'s guarded entry point, in this interpreter (the real process
    path is `test_real_cli_generate_then_inspect`'s)."""
    cases = []
    for name, (text, expected, flags) in BAD_FILES.items():
        path = tmp_path / name
        path.write_text(text)
        cases.append((str(path), expected, flags))
    cases.append((str(tmp_path / "missing.csv"), f"data file not found: {tmp_path / 'missing.csv'}", []))
    for path, expected, flags in cases:
        code = cli_main(["data", "inspect", path, *flags])
        out, err = capfd.readouterr()
        assert code == 2, (path, code, out, err)
        stderr = err.strip().splitlines()
        assert len(stderr) == 1, (path, err)
        assert stderr[0].startswith("error: ") and expected in stderr[0], (path, stderr[0])
        assert "Traceback" not in err + out


def test_real_cli_generate_then_inspect(tmp_path):
    out = tmp_path / "syn.parquet"
    gen = run_cli("generate", "--out", str(out), "--tickers", "3", "--days", "30", "--seed", "2")
    assert gen.returncode == 0, gen.stderr
    ins = run_cli("inspect", str(out))
    assert ins.returncode == 0, ins.stderr
    assert "tickers: 3" in ins.stdout and "(30 trading days)" in ins.stdout and "SYN02" in ins.stdout
    bad = run_cli("generate", "--out", str(out), "--days", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: num_days must be a whole number >= 2")
    missing = run_cli("inspect", str(tmp_path / "missing.csv"))
    assert missing.returncode == 2 and missing.stderr == f"error: data file not found: {tmp_path / 'missing.csv'}\n"
    assert np.isfinite(MarketData.from_path(out).close).all()


# ---------------------------------------------------------------------- stylized facts and --like
def test_inspect_facts_of_a_file_and_a_synthetic_spec(capsys):
    assert main(["inspect", "--facts", f"csv:{FIXTURE}", "synthetic:tickers=20,seed=3"]) == 0
    out = capsys.readouterr().out
    rows = {line[:35].strip(): line[35:].split() for line in out.splitlines()[1:]}
    assert rows["tickers x days"] == ["6", "x", "2699", "20", "x", "2520"]
    # the file's facts, computed here from the raw CSV: excess kurtosis (unbiased) and the overnight share
    raw = pd.read_csv(FIXTURE).sort_values(["symbol", "date"])
    close = raw.pivot(index="date", columns="symbol", values="close").to_numpy()
    opens = raw.pivot(index="date", columns="symbol", values="open").to_numpy()
    r = np.diff(np.log(close), axis=0)
    from scipy import stats

    assert float(rows["excess kurtosis"][0]) == pytest.approx(stats.kurtosis(r, bias=False).mean(), abs=1e-3)
    assert float(rows["median excess kurtosis"][0]) == pytest.approx(np.median(stats.kurtosis(r, bias=False)), abs=1e-3)
    winsorized = [stats.kurtosis(np.asarray(stats.mstats.winsorize(c, limits=0.001)), bias=False) for c in r.T]
    assert float(rows["median kurtosis, 0.1% winsorised"][0]) == pytest.approx(np.median(winsorized), abs=1e-3)
    share = (np.log(opens[1:] / close[:-1]).var(axis=0) / r.var(axis=0)).mean()
    assert float(rows["overnight share of daily variance"][0]) == pytest.approx(share, abs=1e-3)
    expected = market_facts(generate_market(num_tickers=20, seed=3))
    assert float(rows["ACF(1) of |r|"][1]) == pytest.approx(expected.abs_acf1, abs=1e-3)


def test_like_fits_the_generator_to_a_file_and_reproduces_its_facts(tmp_path, capsys):
    """Tolerances: one 6 x 2699 draw of the fitted model, whose facts spread over seeds as the data's own would (over
    10 seeds of this fit: kurtosis 7.0-17.5 around the data's 14.4, winsorised 3.7-9.5 around 5.0, ACF(1) of |r|
    0.13-0.23 around 0.17, pair correlation 0.46-0.56 around 0.49, overnight share 0.42-0.46 around 0.44). The rise
    of correlations in sell-offs is held over ten seeds (`tests/test_synthetic_facts.py`): on one draw it can vanish."""
    out = tmp_path / "like.parquet"
    assert main(["generate", "--out", str(out), "--like", str(FIXTURE), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 16194 rows (6 tickers x 2699 days" in printed and f"fitted to {FIXTURE}: " in printed
    data, like = load_market_data(str(FIXTURE)), MarketData.from_path(out)
    assert like.tickers == tuple(f"SYN{i:02d}" for i in range(6))
    real, fake = market_facts(data), market_facts(like)
    assert real.kurtosis / 2 < fake.kurtosis < real.kurtosis * 2
    assert real.winsorized_kurtosis / 2 < fake.winsorized_kurtosis < real.winsorized_kurtosis * 2
    assert abs(fake.abs_acf1 - real.abs_acf1) < 0.08
    assert abs(fake.pair_corr - real.pair_corr) < 0.12
    assert abs(fake.overnight_share - real.overnight_share) < 0.08
    assert abs(fake.annual_vol - real.annual_vol) < 0.07
    assert fake.leverage < 0
    # the per-ticker volatilities are the file's, ticker by ticker
    vol = np.diff(np.log(like.close), axis=0).std(axis=0) / np.diff(np.log(data.close), axis=0).std(axis=0)
    assert ((vol > 0.7) & (vol < 1.3)).all(), vol
    # another count of tickers takes the fitted tickers in turn
    more = tmp_path / "more.csv"
    assert main(["generate", "--out", str(more), "--like", str(FIXTURE), "--tickers", "8", "--days", "300"]) == 0
    assert MarketData.from_path(more).close.shape == (300, 8)


def _fixture_frame() -> pd.DataFrame:
    return pd.read_csv(FIXTURE)


LIKE_BAD: dict[str, tuple[object, str]] = {
    # name: (how the file is made from the fixture, expected message fragment)
    "short.csv": (
        lambda f: f[f.date < "2013-12-01"],
        "has 231 trading days; fitting the generator needs at least 250 (a year)",
    ),
    "gaps.csv": (
        lambda f: f[~((f.symbol == "NFLX") & f.date.isin(["2020-03-02", "2020-03-03"]))],
        "tickers do not cover the same dates: NFLX misses 2 of 2699 dates (2020-03-02, 2020-03-03)",
    ),
    "zero.csv": (
        lambda f: f.assign(close=np.where((f.symbol == "AMZN") & (f.date == "2015-06-01"), 0.0, f.close)),
        "non-positive close prices at AMZN 2015-06-01",
    ),
    "one_ticker.csv": (lambda f: f[f.symbol == "AMZN"], "has 1 ticker; fitting the generator's correlations"),
}


def test_bad_like_files_and_signal_ics_are_one_line_exit_2_and_write_nothing(tmp_path, capfd):
    cases = []
    for name, (make, expected) in LIKE_BAD.items():
        path = tmp_path / name
        make(_fixture_frame()).to_csv(path, index=False)
        cases.append((["--like", str(path)], expected))
    cases += [
        (["--signal_ic", "0.5"], "signal_ic must be in [0, 0.5)"),
        (["--signal_ic", "-0.1"], "signal_ic must be in [0, 0.5)"),
        (["--signal_ic", "0.5", "--like", str(FIXTURE)], "signal_ic must be in [0, 0.5)"),
    ]
    out = tmp_path / "never.csv"
    for flags, expected in cases:
        code = cli_main(["data", "generate", "--out", str(out), *flags])
        stdout, err = capfd.readouterr()
        assert code == 2, (flags, stdout, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (flags, err)
        assert "Traceback" not in stdout + err and not out.exists()


def test_real_cli_facts_and_a_bad_like_file(tmp_path):
    facts = run_cli("inspect", "--facts", "synthetic:tickers=5,days=300")
    assert facts.returncode == 0, facts.stderr
    assert "excess kurtosis" in facts.stdout and "5 x 300" in facts.stdout
    short = tmp_path / "short.csv"
    frame = _fixture_frame()
    frame[frame.date < "2013-06-01"].to_csv(short, index=False)
    bad = run_cli("generate", "--out", str(tmp_path / "x.csv"), "--like", str(short))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
    assert "fitting the generator needs at least 250" in bad.stderr and not (tmp_path / "x.csv").exists()
