"""Backtest and compare end to end: tiny real checkpoints -> `clstm-ppo backtest` / `compare` -> files.

Two tiny checkpoints are trained once per module by the real train script (4 tickers and 3 tickers).
``--hmax 5000`` makes the barely trained policy's small mean actions whole shares, so the
deterministic backtest really trades. CLI runs go through real subprocesses where the process
boundary matters (exit status, one stderr line, ``python -m``); the rest call `clstm_ppo.cli.main`
in-process, which is the same guarded entry point without the interpreter start-up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo import cli
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.backtest import Period, load_backtest_data, open_members
from clstm_ppo.threads import torch_threads
from clstm_ppo.training.checkpoint import load_checkpoint, open_checkpoint, restore_market, restore_policy
from envs.errors import UserError
from envs.synthetic import generate_market
from tests.conftest import TINY_RUN, run_here

ROOT = Path(__file__).resolve().parents[1]
TINY = [*TINY_RUN, "--num_episodes", "8", "--hmax", "5000"]


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"a": run a (4 tickers), "b": run b (3 tickers)} run folders with latest.pt and best.pt."""
    root = tmp_path_factory.mktemp("bt")
    runs = {"a": "synthetic:tickers=4,days=400", "b": "synthetic:tickers=3,days=400"}
    for name, data in runs.items():  # in this interpreter (`tests.conftest.run_here`)
        run = run_here(["train", "--data", data, *TINY, "--checkpoint_dir", str(root / "ck"), "--run_name", name], root)
        assert run.returncode == 0, run.stderr
        assert (root / "ck" / name / "latest.pt").is_file(), run.stdout
        (root / f"{name}.log").write_text(run.stdout + run.stderr)  # what the run printed
    return {name: root / "ck" / name for name in runs}


@pytest.fixture
def one_thread():
    """In-process runs: one torch thread (tiny LSTMs are much slower with contention), restored after."""
    with torch_threads(1):
        yield


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)


def in_process(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_report_consistent(out: Path) -> dict:
    """report.json's metrics are exactly what metrics.summarize gives on equity.csv and trades.csv."""
    report = json.loads((out / "report.json").read_text())
    equity = pd.read_csv(out / "equity.csv")
    trades = pd.read_csv(out / "trades.csv")
    policy = M.summarize(equity["value"].to_numpy(), trades=trades, risk_free=report["risk_free"])
    for key, want in policy.items():
        got = report["metrics"]["policy"][key]
        if np.isnan(want):
            assert got is None, key
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), key
    baseline = M.summarize(equity["baseline_value"].to_numpy(), risk_free=report["risk_free"])
    for key in ("cumulative_return", "sharpe", "max_drawdown", "final_value"):
        assert report["metrics"]["baseline"][key] == pytest.approx(baseline[key], rel=1e-9, abs=1e-12), key
    assert np.allclose(equity["cash"] + equity["holdings_value"], equity["value"], rtol=1e-9)
    assert report["period"]["start"] == equity["date"].iloc[0]
    assert report["period"]["end"] == equity["date"].iloc[-1]
    assert report["period"]["num_days"] == len(equity)
    return report


# ------------------------------------------------------------------------------------ backtest


def test_a_training_run_ends_with_its_held_out_line_which_the_backtest_confirms(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    """The train command's last line names the data, scores the deployed checkpoint (by default latest.pt) on the test
    split with its interval over days and on its training days, against buy-and-hold, with a verdict; the backtest of
    the same checkpoint reports the same Sharpe ratios, return, turnover and days, on both splits."""
    last = (ckpts["a"].parent.parent / "a.log").read_text().strip().splitlines()[-1]
    pattern = (
        r"held-out test (\S+) \.\. (\S+) \((\d+) days\) on synthetic market, no planted signal, orders fill at the "
        r"next day's open: latest\.pt Sharpe (-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\] \(95% over days; (-?[\d.]+) on its "
        r"last (\d+) training days\), "
        r"return ([+-][\d.]+)%, exposure \d+%, turnover ([\d.]+)x a year \| buy-and-hold Sharpe (-?[\d.]+), "
        r"return ([+-][\d.]+)% \| (beats|trails|not distinguishable from) buy-and-hold"
    )
    match = re.search(pattern, last)
    assert match, last
    code, _, _ = in_process(
        capsys,
        "backtest",
        "--checkpoint",
        str(ckpts["a"] / "latest.pt"),
        "--out",
        str(tmp_path / "bt"),
        "--threads",
        "2",
    )
    assert code == 0
    assert torch.get_num_threads() == 1  # --threads holds for the command only: the caller's count comes back
    report = json.loads((tmp_path / "bt" / "report.json").read_text())
    first, end, days, sharpe, lo, hi, on_training_days, last, ret, turnover, bh_sharpe, bh_ret, verdict = match.groups()
    assert float(lo) < float(sharpe) < float(hi)
    assert (report["period"]["start"], report["period"]["end"], report["period"]["num_days"]) == (first, end, int(days))
    assert report["metrics"]["policy"]["sharpe"] == pytest.approx(float(sharpe), abs=0.005)
    assert report["metrics"]["policy"]["annual_turnover"] == pytest.approx(float(turnover), abs=0.05)
    assert report["metrics"]["policy"]["cumulative_return"] == pytest.approx(float(ret) / 100, abs=0.00005)
    assert report["metrics"]["baseline"]["sharpe"] == pytest.approx(float(bh_sharpe), abs=0.005)
    assert report["metrics"]["baseline"]["cumulative_return"] == pytest.approx(float(bh_ret) / 100, abs=0.00005)
    assert int(last) == int(days)  # as many training days as test days: the last before validation
    ck = open_checkpoint(ckpts["a"] / "latest.pt")
    train_days = ck.market_spec["splits"]["train"]
    start = str(pd.bdate_range(end=train_days["end"], periods=int(last))[0].date())
    args = ["--start", start, "--end", train_days["end"], "--out", str(tmp_path / "t")]
    assert in_process(capsys, "backtest", "--checkpoint", str(ckpts["a"] / "latest.pt"), *args)[0] == 0
    report = json.loads((tmp_path / "t" / "report.json").read_text())
    assert report["period"]["num_days"] == int(last)
    assert report["metrics"]["policy"]["sharpe"] == pytest.approx(float(on_training_days), abs=0.005)


def test_the_last_line_scores_the_checkpoint_deploy_names(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    """--deploy best ends the run with best.pt, --deploy last with latest.pt; without a validation split (or without
    a best.pt) best means the last weights, as a study trades them."""
    from clstm_ppo.evaluation.backtest import report_held_out
    from clstm_ppo.market import build_market
    from clstm_ppo.training.checkpoint import load_checkpoint
    from clstm_ppo.training.run_folder import deployed_checkpoint
    from clstm_ppo.training.seeds import RunPlan

    cfg = load_checkpoint(ckpts["a"] / "latest.pt").cfg
    market = build_market(cfg.data, seed=cfg.run.seed)
    for deploy, name in (("best", "best.pt"), ("last", "latest.pt")):
        report_held_out(RunPlan(cfg.with_settings(deploy=deploy), (cfg.run.seed,), ckpts["a"]), market)
        assert f"open: {name} Sharpe" in capsys.readouterr().out, deploy
    assert deployed_checkpoint(ckpts["a"], False, "best").name == "latest.pt"
    assert deployed_checkpoint(tmp_path, True, "best") == tmp_path / "latest.pt"  # no best.pt written
    with pytest.raises(ValueError, match="deploy must be one of"):
        deployed_checkpoint(ckpts["a"], True, "mean")


@pytest.mark.slow  # two backtests through the real CLI in subprocesses
def test_backtest_cli_end_to_end_and_deterministic(ckpts: dict[str, Path], tmp_path: Path) -> None:
    ck = ckpts["a"] / "latest.pt"
    first = run_cli(
        "-m",
        "clstm_ppo.cli",
        "backtest",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "one"),
        "--threads",
        "1",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert "Cumulative return (CR)" in first.stdout and "baseline" in first.stdout
    for name in ("report.json", "equity.csv", "trades.csv", "equity.png"):
        assert (tmp_path / "one" / name).stat().st_size > 0, name
    report = assert_report_consistent(tmp_path / "one")

    # Default period: the checkpoint's test split, by its stored dates; capital as trained.
    spec = load_checkpoint(ck).market_spec
    assert report["period"]["start"] == spec["splits"]["test"]["start"]
    assert report["period"]["end"] == spec["splits"]["test"]["end"]
    equity = pd.read_csv(tmp_path / "one" / "equity.csv")
    assert equity["value"].iloc[0] == 1_000_000.0 and equity["baseline_value"].iloc[0] == 1_000_000.0
    assert report["metrics"]["policy"]["num_trades"] > 0  # the policy really trades (hmax 5000)
    assert report["metrics"]["baseline"]["num_trades"] == 4  # one equal-weight buy per ticker
    assert report["metadata"]["tickers"] == spec["tickers"]

    # Same checkpoint again through the console entry point: byte-identical outputs.
    second = run_cli(
        "-m",
        "clstm_ppo.cli",
        "backtest",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "two"),
        "--threads",
        "1",
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr
    for name in ("equity.csv", "trades.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_default_out_folder_next_to_checkpoint(ckpts, capsys, one_thread) -> None:
    code, out, err = in_process(
        capsys, "backtest", "--checkpoint", str(ckpts["a"] / "best.pt"), "--split", "validation"
    )
    assert code == 0, err
    folder = ckpts["a"] / "backtest-best-validation"
    assert (folder / "report.json").is_file() and str(folder) in out
    report = assert_report_consistent(folder)
    spec = load_checkpoint(ckpts["a"] / "best.pt").market_spec
    assert report["period"]["start"] == spec["splits"]["validation"]["start"]


def test_custom_period_uses_lookback_and_exact_dates(ckpts, tmp_path, capsys, one_thread) -> None:
    ck = ckpts["a"] / "latest.pt"
    dates = pd.DatetimeIndex(generate_market(num_tickers=4, num_days=400, seed=1).dates)
    # Dates between trading days (a weekend) resolve to the next trading day (start) / the last one (end).
    gaps = [i for i in range(40, 120) if dates[i + 1] - dates[i] > pd.Timedelta(days=1)]
    lo, hi = gaps[0] + 1, gaps[-1]
    start, end = dates[lo - 1] + pd.Timedelta(days=1), dates[hi] + pd.Timedelta(days=1)
    assert start not in dates and end not in dates
    code, _, err = in_process(
        capsys,
        "backtest",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "c"),
        "--start",
        start.strftime("%Y-%m-%d"),
        "--end",
        end.strftime("%Y-%m-%d"),
    )
    assert code == 0, err
    report = assert_report_consistent(tmp_path / "c")
    assert report["period"] == {
        "start": dates[lo].strftime("%Y-%m-%d"),
        "end": dates[hi].strftime("%Y-%m-%d"),
        "num_days": hi - lo + 1,
    }
    assert report["metadata"]["period_source"] == "--start/--end"

    # The window (5 days) needs 4 earlier trading days in the data: day index 4 is the earliest start.
    code, out, err = in_process(
        capsys,
        "backtest",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "d"),
        "--start",
        dates[2].strftime("%Y-%m-%d"),
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --start")
    assert f"earliest --start is {dates[4].strftime('%Y-%m-%d')}" in err
    code, _, err = in_process(
        capsys,
        "backtest",
        "--checkpoint",
        str(ck),
        "--out",
        str(tmp_path / "e"),
        "--start",
        dates[4].strftime("%Y-%m-%d"),
        "--end",
        dates[20].strftime("%Y-%m-%d"),
    )
    assert code == 0, err


def test_stochastic_episodes_are_seeded_and_reported(ckpts, tmp_path, capsys, one_thread) -> None:
    ck = str(ckpts["a"] / "latest.pt")
    args = ("backtest", "--checkpoint", ck, "--stochastic", "--episodes", "3", "--seed", "7")
    code, out, err = in_process(capsys, *args, "--out", str(tmp_path / "s1"))
    assert code == 0, err
    assert "over 3 sampled episodes" in out and "median cumulative return" in out
    report = assert_report_consistent(tmp_path / "s1")
    sto = report["stochastic"]
    assert [r["episode"] for r in sto["runs"]] == [1, 2, 3] and sto["seed"] == 7
    crs = [r["cumulative_return"] for r in sto["runs"]]
    assert len(set(crs)) == 3  # sampled actions: three different paths
    assert sto["summary"]["cumulative_return"]["mean"] == pytest.approx(np.mean(crs))
    assert sto["summary"]["cumulative_return"]["std"] == pytest.approx(np.std(crs, ddof=1))
    assert sto["summary"]["max_drawdown"]["max"] == max(r["max_drawdown"] for r in sto["runs"])
    assert sorted(crs)[1] == report["metrics"]["policy"]["cumulative_return"]  # the median episode is shown
    episodes = pd.read_csv(tmp_path / "s1" / "equity_episodes.csv")
    assert list(episodes.columns) == ["date", "episode_1", "episode_2", "episode_3"]
    for k, row in enumerate(sto["runs"]):
        assert episodes[f"episode_{k + 1}"].iloc[-1] == pytest.approx(row["final_value"])

    code, _, err = in_process(capsys, *args, "--out", str(tmp_path / "s2"))
    assert code == 0, err
    assert (tmp_path / "s1" / "equity_episodes.csv").read_bytes() == (
        tmp_path / "s2" / "equity_episodes.csv"
    ).read_bytes()

    # at another rate, each episode's Sharpe and Sortino are in excess of it, as the report's are
    code, _, err = in_process(capsys, *args, "--risk_free", "0.05", "--out", str(tmp_path / "s3"))
    assert code == 0, err
    report = assert_report_consistent(tmp_path / "s3")
    shown = report["stochastic"]["runs"][report["stochastic"]["episode_shown"] - 1]
    for key in ("cumulative_return", "sharpe", "sortino"):
        assert shown[key] == pytest.approx(report["metrics"]["policy"][key], rel=1e-12), key

    code, _, err = in_process(capsys, "backtest", "--checkpoint", ck, "--episodes", "3")
    assert code == 2 and "needs --stochastic" in err


def test_index_csv_is_aligned_scored_and_written(ckpts, tmp_path, capsys, one_thread) -> None:
    dates = pd.DatetimeIndex(generate_market(num_tickers=4, num_days=400, seed=1).dates)
    levels = pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "value": np.linspace(100.0, 140.0, len(dates))})
    levels = levels.drop(index=[300, 301])  # days missing from the index take the last earlier level
    levels.to_csv(tmp_path / "index.csv", index=False)
    code, _, err = in_process(
        capsys,
        "backtest",
        "--checkpoint",
        str(ckpts["a"] / "latest.pt"),
        "--out",
        str(tmp_path / "i"),
        "--index",
        str(tmp_path / "index.csv"),
        "--risk_free",
        "0.02",
    )
    assert code == 0, err
    report = json.loads((tmp_path / "i" / "report.json").read_text())
    equity = pd.read_csv(tmp_path / "i" / "equity.csv")
    assert "index" in report["metrics"] and report["risk_free"] == 0.02
    got = equity.set_index("date")["index_value"]
    lookup = levels.set_index("date")["value"]
    for day, value in got.items():
        want = lookup.get(day, lookup[lookup.index < day].iloc[-1])
        assert value == pytest.approx(want)
    assert report["metrics"]["index"]["sharpe"] == pytest.approx(M.sharpe_ratio(got.to_numpy(), 0.02))


# ------------------------------------------------------------------------------- refused inputs


def test_other_universe_is_refused_naming_the_difference(ckpts, tmp_path, capsys, one_thread) -> None:
    # Checkpoint of 4 tickers on data of 3: one line naming the missing ticker (real subprocess).
    proc = run_cli(
        "-m",
        "clstm_ppo.cli",
        "backtest",
        "--checkpoint",
        str(ckpts["a"] / "latest.pt"),
        "--data",
        "synthetic:tickers=3,days=400",
        "--out",
        str(tmp_path / "x"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "missing SYN03" in proc.stderr
    assert not (tmp_path / "x").exists()

    # A CSV of other names: missing and unexpected tickers both named.
    frame = generate_market(num_tickers=3, num_days=60, seed=3).to_frame()
    frame["tic"] = frame["tic"].astype(str).str.replace("SYN", "ZZZ")
    frame.to_csv(tmp_path / "other.csv", index=False)
    code, _, err = in_process(
        capsys, "backtest", "--checkpoint", str(ckpts["b"] / "latest.pt"), "--data", f"csv:{tmp_path / 'other.csv'}"
    )
    assert code == 2 and err.count("\n") == 1
    assert "missing SYN00, SYN01, SYN02" in err and "unexpected ZZZ00, ZZZ01, ZZZ02" in err

    # compare across universes: refused before any backtest runs.
    code, _, err = in_process(
        capsys, "compare", str(ckpts["a"] / "latest.pt"), str(ckpts["b"] / "latest.pt"), "--out", str(tmp_path / "cmp")
    )
    assert code == 2 and err.count("\n") == 1 and "missing SYN03" in err
    assert not (tmp_path / "cmp").exists()


def _corrupt_files(ckpts: dict[str, Path], folder: Path) -> dict[str, Path]:
    raw = (ckpts["a"] / "latest.pt").read_bytes()
    files = {
        "truncated": folder / "truncated.pt",
        "random": folder / "random.pt",
        "plain_dict": folder / "plain.pt",
        "wrong_sizes": folder / "sizes.pt",
    }
    files["truncated"].write_bytes(raw[: len(raw) // 2])
    files["random"].write_bytes(np.random.default_rng(0).bytes(4096))
    torch.save({"weights": torch.zeros(3), "step": 5}, files["plain_dict"])
    payload = torch.load(ckpts["a"] / "latest.pt", weights_only=True)
    payload["model_config"]["stage2_hidden"] = 32  # the stored weights are for 16
    torch.save(payload, files["wrong_sizes"])
    return files


def test_corrupt_checkpoints_give_one_error_line(ckpts, tmp_path, capsys, one_thread) -> None:
    files = _corrupt_files(ckpts, tmp_path)
    proc = run_cli("-m", "clstm_ppo.cli", "backtest", "--checkpoint", str(files["truncated"]), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {files['truncated']} is not a readable clstm-ppo checkpoint")

    expect = {
        "random": "is not a readable clstm-ppo checkpoint",
        "plain_dict": "is not a clstm-ppo checkpoint",
        "wrong_sizes": "stored weights do not match its model config",
    }
    for name, phrase in expect.items():
        code, out, err = in_process(capsys, "backtest", "--checkpoint", str(files[name]), "--out", str(tmp_path / name))
        assert code == 2 and out == "", name
        assert err.count("\n") == 1 and err.startswith(f"error: {files[name]}") and phrase in err, err
    code, _, err = in_process(capsys, "backtest", "--checkpoint", str(tmp_path / "nope.pt"))
    assert code == 2 and err == f"error: checkpoint not found: {tmp_path / 'nope.pt'}\n"


# ------------------------------------------------------------------------------------- compare


def test_compare_two_checkpoints_writes_table_and_png(ckpts, tmp_path, capsys, one_thread) -> None:
    a_latest, a_best = ckpts["a"] / "latest.pt", ckpts["a"] / "best.pt"
    code, out, err = in_process(
        capsys, "compare", str(a_latest), str(a_best), "--labels", "last,best", "--out", str(tmp_path / "cmp")
    )
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "last", "best", "buy-and-hold"]
    for name in ("compare.json", "compare.csv", "compare.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(table.columns) == ["date", "last", "best", "buy-and-hold"]

    # Each column is the same run a single backtest gives on that period.
    code, _, err = in_process(capsys, "backtest", "--checkpoint", str(a_best), "--out", str(tmp_path / "single"))
    assert code == 0, err
    single = pd.read_csv(tmp_path / "single" / "equity.csv")
    assert list(table["date"]) == list(single["date"])
    assert np.array_equal(table["best"].to_numpy(), single["value"].to_numpy())
    assert np.array_equal(table["buy-and-hold"].to_numpy(), single["baseline_value"].to_numpy())
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert set(report["metrics"]) == {"last", "best", "buy-and-hold"}
    assert report["metrics"]["best"]["num_trades"] == pytest.approx(
        len(pd.read_csv(tmp_path / "single" / "trades.csv"))
    )

    code, _, err = in_process(capsys, "compare", str(a_latest), str(a_best), "--labels", "only-one")
    assert code == 2 and "--labels needs 2" in err


# ------------------------------------------------------------------------------------ ensembles


def test_an_ensemble_acts_on_the_mean_of_its_members_target_weights(ckpts: dict[str, Path], one_thread: None) -> None:
    """Members keep their own recurrent states; the ensemble's target portfolio is the mean of theirs (members of one
    shape in one stacked forward, so to float rounding), and an ensemble of one policy with itself trades exactly as
    the policy does."""
    from clstm_ppo.agent.ensemble import Ensemble
    from clstm_ppo.evaluation.backtest import open_members, restore_acting, run_policy
    from envs.kernel import target_weights

    cks = open_members([ckpts["a"] / "latest.pt", ckpts["a"] / "best.pt"])
    market = restore_market(cks[0], load_backtest_data(cks[0]))
    assert isinstance(restore_acting(cks, market, "cpu"), Ensemble) and cks[0].cfg.env.action_mode == "weights"
    a, b = (restore_policy(ck, market) for ck in cks)
    with torch.no_grad():  # a second member that disagrees (this tiny run's best.pt is its latest.pt)
        torch.manual_seed(0)
        b.actor_mean.weight.add_(torch.randn_like(b.actor_mean.weight))
    ensemble = Ensemble([a, b], "weights")
    obs = torch.randn(3, market.window, market.num_features)
    starts = torch.ones(3, dtype=torch.bool)
    state = ensemble.initial_state(3)
    out = ensemble.act(obs, state, starts)
    wa = target_weights(a.env_action(a.act(obs, a.initial_state(3), starts, deterministic=True).action))
    wb = target_weights(b.env_action(b.act(obs, b.initial_state(3), starts, deterministic=True).action))
    torch.testing.assert_close(target_weights(out.action), (wa + wb) / 2, rtol=1e-5, atol=1e-6)
    own = [m.act(obs, m.initial_state(3), starts, deterministic=True).state for m in (a, b)]
    assert len(out.state) == 2  # each member's own state, from the stacked forward: the same up to float rounding
    for o, e in zip(own, out.state, strict=True):
        torch.testing.assert_close(e.critic_c, o.critic_c, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(e.actor_h, o.actor_h, rtol=1e-5, atol=1e-6)
    period = Period(days=market.splits.test, label="test", source="test split")
    single = run_policy(cks[0], a, market, period, torch.device("cpu"))
    twice = run_policy(cks[0], Ensemble([a, a], "weights"), market, period, torch.device("cpu"))
    np.testing.assert_allclose(twice.values, single.values, rtol=1e-9)


def test_an_ensemble_backtest_reports_its_members_and_refuses_another_market(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    code, out, err = in_process(
        capsys, "backtest", "--checkpoint", str(ckpts["a"] / "latest.pt"), str(ckpts["a"] / "best.pt"),
        "--out", str(tmp_path / "ens"),
    )  # fmt: skip
    assert code == 0, err
    assert "ensemble of 2 (mean target)" in out
    report = assert_report_consistent(tmp_path / "ens")
    assert report["metadata"]["ensemble"] == [str(ckpts["a"] / "latest.pt"), str(ckpts["a"] / "best.pt")]
    code, _, err = in_process(
        capsys, "backtest", "--checkpoint", str(ckpts["a"] / "best.pt"), str(ckpts["b"] / "best.pt")
    )
    assert code == 2 and err.count("\n") == 1 and "cannot join" in err and "its market's tickers" in err


def test_ensemble_members_must_trade_alike_but_may_have_trained_on_other_rewards(
    ckpts: dict[str, Path], tmp_path: Path
):
    """Members join when they differ only in what training alone reads (the turnover penalty) or in what their
    action mode ignores (hmax with target weights); a cost that the trades pay is named, in one line."""

    def edited(name: str, **settings: object) -> Path:
        raw = torch.load(ckpts["a"] / "best.pt", map_location="cpu", weights_only=True)
        raw["config"] = {**raw["config"], **settings}
        torch.save(raw, tmp_path / name)
        return tmp_path / name

    first = ckpts["a"] / "best.pt"
    assert open_checkpoint(first).cfg.env.action_mode == "weights"
    joined = open_members([first, edited("penalty.pt", turnover_penalty=0.02), edited("hmax.pt", hmax=7)])
    assert [ck.cfg.env.turnover_penalty for ck in joined][1:] == [0.02, open_checkpoint(first).cfg.env.turnover_penalty]
    with pytest.raises(UserError, match=r"cannot join .* they differ in --buy_cost_pct$"):
        open_members([first, edited("costs.pt", buy_cost_pct=0.002)])


def test_compare_takes_an_ensemble_as_one_entry(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    """``A+B`` is one entry: an ensemble of A and B next to A alone (here the same tiny run's best and latest)."""
    a, b = ckpts["a"] / "best.pt", ckpts["a"] / "latest.pt"
    code, out, err = in_process(capsys, "compare", str(a), f"{a}+{b}", "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    entries = [c["checkpoint"] for c in report["metadata"]["checkpoints"]]
    assert entries == [str(a), f"{a}+{b}"] and "(ensemble of 2)" in out


def test_the_verdict_against_buy_and_hold_follows_the_paired_interval() -> None:
    """Ahead only when the whole interval is above 0, behind only when it is below, otherwise not distinguishable."""
    from clstm_ppo.evaluation.backtest import versus_buy_and_hold

    assert (
        versus_buy_and_hold({"difference": 0.9, "lo": 0.1, "hi": 1.7}) == "beats buy-and-hold by +0.90 [+0.10, +1.70]"
    )
    assert versus_buy_and_hold({"difference": -0.9, "lo": -1.7, "hi": -0.1}).startswith("trails buy-and-hold by -0.90")
    assert versus_buy_and_hold({"difference": 0.9, "lo": -0.1, "hi": 1.7}) == (
        "not distinguishable from buy-and-hold (+0.90 [-0.10, +1.70])"
    )
