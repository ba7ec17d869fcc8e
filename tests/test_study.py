"""The study: its schedule, grid and baselines; one real study end to end; no look-ahead; kill and resume;
shards and merge; failed cells; warm starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo.config import TrainConfig
from clstm_ppo.evaluation.baselines import buy_and_hold
from clstm_ppo.study.grid import Cell, build_grid, parse_seeds, parse_shard, parse_variants, shard
from clstm_ppo.study.schedule import walk_forward
from clstm_ppo.training.checkpoint import load_checkpoint
from envs.errors import UserError
from envs.execution import Terms
from envs.synthetic import generate_market
from tests.conftest import clean_env

# 3 tickers, 5-day windows, tiny networks, 8 episodes of 16 days per window: a few seconds per cell.
TINY_STUDY = [
    "--window",
    "5",
    "--num_envs",
    "4",
    "--n_steps",
    "16",
    "--batch_size",
    "32",
    "--epochs",
    "2",
    "--episode_length",
    "16",
    "--stage1_hidden",
    "8",
    "--feature_dim",
    "8",
    "--stage2_hidden",
    "16",
    "--num_episodes",
    "8",
    "--bootstrap",
    "500",
]
DATA = "synthetic:tickers=3,days=700"
WINDOW_FLAGS = [
    "--trade_start",
    "2016-03-01",
    "--trade_end",
    "2016-08-31",
    "--retrain",
    "quarterly",
    "--validation_days",
    "20",
]


def study(cwd: Path, *args: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------------- units


def test_quarterly_walk_forward_windows_expand_and_never_reach_their_trade_days():
    dates = pd.bdate_range("2015-01-01", "2016-12-30").to_numpy()
    periods = walk_forward(
        dates, window=5, trade_start="2016-02-15", trade_end="2016-08-31", retrain="quarterly", validation_days=10
    )
    index = pd.DatetimeIndex(dates)
    starts = [str(index[p.trade.start].date()) for p in periods]
    assert starts == ["2016-02-15", "2016-04-01", "2016-07-01"]  # trade start, then each new quarter
    for p, nxt in zip(periods, periods[1:], strict=False):
        assert p.trade.stop - 1 == nxt.trade.start  # a window's last day is the next one's first
    assert str(index[periods[-1].trade.stop - 1].date()) == "2016-08-31"
    for p in periods:
        assert p.train.start == 4 and p.validation.stop == p.trade.start and p.validation.num_days == 10
        assert p.train.stop == p.validation.start  # validation is the end of the training window
    assert periods[1].train.stop > periods[0].train.stop  # expanding
    single = walk_forward(dates, window=5, trade_start="2016-02-15", trade_end=None, retrain="none", validation_days=0)
    assert len(single) == 1 and single[0].validation is None and single[0].trade.stop == len(dates)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(trade_start="2030-01-01", trade_end=None), "after the data's last day"),
        (dict(trade_start="2014-01-01", trade_end="2014-06-30"), "outside the data"),
        (dict(trade_start="2015-02-01", trade_end=None), "first training window is too short"),
        (dict(trade_start="2016-05-01", trade_end="2016-03-01"), "before --trade_start"),
        (dict(trade_start="sometime", trade_end=None), "not a date"),
    ],
)
def test_walk_forward_refuses_bad_windows_in_one_line(kwargs, message):
    dates = pd.bdate_range("2015-01-01", "2016-12-30").to_numpy()
    with pytest.raises(UserError, match=message):
        walk_forward(dates, window=30, retrain="quarterly", validation_days=63, **kwargs)


def test_grid_seeds_variants_and_shards():
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    variants = parse_variants(["window=5,30", "ent_coef=0,0.01"])
    assert variants == [
        (("window", 5), ("ent_coef", 0.0)),
        (("window", 5), ("ent_coef", 0.01)),
        (("window", 30), ("ent_coef", 0.0)),
        (("window", 30), ("ent_coef", 0.01)),
    ]
    cells = build_grid(["clstm", "mlp"], [1, 2], variants)
    assert len(cells) == 16 and len({c.name for c in cells}) == 16
    assert cells[0].name == "clstm-window=5-ent_coef=0.0-s1" and cells[0].group == "clstm window=5 ent_coef=0.0"
    parts = [shard(cells, i, 3) for i in (1, 2, 3)]
    assert sorted(c.name for p in parts for c in p) == sorted(c.name for c in cells)  # a partition
    assert parse_shard("2/3") == (2, 3)
    for bad in ("5/4", "0/3", "x"):
        with pytest.raises(UserError, match="--shard"):
            parse_shard(bad)
    for bad, message in (
        (["data=x"], "the study sets data"),
        (["nope=1"], "not a training setting"),
        (["window=5", "window=6"], "given twice"),
        (["window=big"], "not a valid int"),
    ):
        with pytest.raises(UserError, match=message):
            parse_variants(bad)
    cfg = Cell("mlp", 3, (("window", 5),)).config(TrainConfig())
    assert (cfg.model.policy, cfg.run.seed, cfg.data.window) == ("mlp", 3, 5)


def test_warm_start_loads_the_previous_windows_weights(tmp_path):
    from clstm_ppo.cli.train import parse_config
    from clstm_ppo.market import build_market
    from clstm_ppo.training.distributed import Comm
    from clstm_ppo.training.trainer import Trainer
    from tests.conftest import TINY

    cfg = parse_config([*TINY, "--num_episodes", "8", "--checkpoint_dir", str(tmp_path), "--run_name", "a"])
    market = build_market(cfg.data, seed=cfg.run.seed)
    Trainer(cfg, market, Comm(), tmp_path / "a").train()
    source = load_checkpoint(tmp_path / "a" / "latest.pt").model_state
    warm = Trainer(
        parse_config([*TINY, "--seed", "9", "--init_weights", str(tmp_path / "a" / "latest.pt")]),
        market,
        Comm(),
        tmp_path / "b",
    )
    assert all(torch.equal(v, warm.model.state_dict()[k]) for k, v in source.items())
    cold = Trainer(parse_config([*TINY, "--seed", "9"]), market, Comm(), tmp_path / "c")
    assert not all(torch.equal(v, cold.model.state_dict()[k]) for k, v in source.items())
    with pytest.raises(UserError, match="another network: --stage2_hidden 16 \\(now 24\\)"):
        Trainer(
            parse_config([*TINY, "--stage2_hidden", "24", "--init_weights", str(tmp_path / "a" / "latest.pt")]),
            market,
            Comm(),
            tmp_path / "d",
        )


# ---------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def full_study(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    cwd = tmp_path_factory.mktemp("study")
    proc = study(
        cwd,
        "--out",
        "full",
        "--data",
        DATA,
        "--policies",
        "mlp,lstm",
        "--seeds",
        "1-2",
        *WINDOW_FLAGS,
        *TINY_STUDY,
        "--workers",
        "2",
    )
    return cwd / "full", proc


@pytest.mark.slow
def group_cells(out: Path, group: str) -> list[dict]:
    """The result.json of each finished cell of one configuration, with its seed."""
    found = []
    for folder in sorted((out / "cells").iterdir()):
        result = folder / "result.json"
        if folder.name.startswith(f"{group}-") and result.is_file():
            found.append({"seed": int(folder.name.rsplit("-s", 1)[1]), **json.loads(result.read_text())})
    return found


def test_a_study_runs_every_cell_and_reports_with_baselines_and_statistics(full_study):
    out, proc = full_study
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "4/4 done" in proc.stdout and "ETA" in proc.stdout
    report = json.loads((out / "study.json").read_text())
    assert report["cells"]["done"] == 4 and set(report["groups"]) == {"mlp", "lstm"}
    traded = report["traded"]
    assert (traded["first"], traded["last"]) == ("2016-03-01", "2016-08-31")
    # buy-and-hold on exactly the traded days, with the env's costs and fills
    data = generate_market(num_tickers=3, num_days=700, seed=1)
    dates = pd.DatetimeIndex(data.dates)
    days = (dates >= "2016-03-01") & (dates <= "2016-08-31")
    first, last = np.flatnonzero(days)[[0, -1]]
    terms = Terms.of(data, "auto", 0.0).days(first, last + 1)  # the study's default: orders fill at the next open
    bh = buy_and_hold(data.close[days], terms, 1_000_000.0, 1e-3).values
    assert report["baselines"]["buy-and-hold"]["cumulative_return"] == pytest.approx(bh[-1] / bh[0] - 1)
    assert set(report["baselines"]) == {"buy-and-hold", "buy-and-hold + turbulence stop", "1/N monthly"}
    mlp = report["groups"]["mlp"]
    assert mlp["seeds"] == [1, 2] and set(mlp["vs"]) >= {"buy-and-hold", "untrained mlp"}
    for key in (
        "cumulative_return",
        "max_earning_rate",
        "max_drawdown",
        "appt",
        "sharpe",
        "exposure",
        "beta",
        "alpha",
        "information_ratio",
        "psr",
        "dsr",
        "sortino",
        "calmar",
        "annual_turnover",
        "total_costs",
    ):
        stat = mlp["summary"][key]
        assert stat["n"] == 2 and (stat["lo"] <= stat["mean"] <= stat["hi"])
    assert mlp["verdict"].startswith("mlp: Sharpe ") and "seeds beat it" in mlp["verdict"]
    assert report["overfitting"]["num_configurations"] == 4 and 0 <= report["overfitting"]["pbo"] <= 1
    assert report["trials"]["num_trials"] == 4
    (pair,) = report["between"]  # mlp against lstm, paired by seed
    assert (pair["first"], pair["second"], pair["seeds"], pair["num_seeds"]) == ("mlp", "lstm", [1, 2], 2)
    mlp_sr = [c["policy"]["sharpe"] for c in sorted(group_cells(out, "mlp"), key=lambda c: c["seed"])]
    lstm_sr = [c["policy"]["sharpe"] for c in sorted(group_cells(out, "lstm"), key=lambda c: c["seed"])]
    assert pair["seeds_beating"] == sum(a > b for a, b in zip(mlp_sr, lstm_sr, strict=True))
    assert pair["lo"] <= pair["hi"] and "mlp vs lstm: Sharpe difference" in proc.stdout
    md = (out / "study.md").read_text()
    assert "## Configurations against each other" in md
    assert "| mlp (2 seeds) |" in md and "## Verdicts" in md and "Probability of backtest overfitting" in md
    cells = pd.read_csv(out / "cells.csv")
    assert len(cells) == 4 and set(cells["status"]) == {"done"} and cells["sharpe"].notna().all()
    assert (out / "study.png").stat().st_size > 10_000


@pytest.mark.slow
def test_each_cell_trades_every_traded_day_carrying_its_portfolio_across_windows(full_study):
    out, _ = full_study
    folder = out / "cells" / "mlp-s1"
    equity = pd.read_csv(folder / "report" / "equity.csv")
    assert equity["date"].iloc[0] == "2016-03-01" and equity["date"].iloc[-1] == "2016-08-31"
    periods = sorted((folder / "periods").glob("*/trade.npz"))
    assert len(periods) == 3
    runs = [np.load(p) for p in periods]
    for a, b in zip(runs, runs[1:], strict=False):  # the next window starts with what this one ended with
        assert a["dates"][-1] == b["dates"][0] and a["policy_values"][-1] == b["policy_values"][0]
        np.testing.assert_array_equal(a["policy_holdings"][-1], b["policy_holdings"][0])
    stitched = np.concatenate([runs[0]["policy_values"], *[r["policy_values"][1:] for r in runs[1:]]])
    np.testing.assert_allclose(equity["value"].to_numpy(), stitched)
    cfg = json.loads((folder / "periods" / "001" / "config.json").read_text())
    assert cfg["init_weights"].endswith("periods/000/best.pt")  # warm start from the selected weights
    assert (
        load_checkpoint(folder / "periods" / "001" / "best.pt").market_spec["splits"]["test"]["start"] == "2016-04-01"
    )


@pytest.mark.slow
def test_no_day_of_a_traded_window_reaches_the_model_that_trades_it(tmp_path):
    """Changing every price from window 1's first traded day on leaves windows 0 and 1's models bit for bit the
    same (and window 2's, which trains on those days, different)."""
    data = generate_market(num_tickers=3, num_days=700, seed=1)
    frame = data.to_frame()
    cut = pd.Timestamp("2016-04-01")  # window 1 trades from here
    later = frame["date"] >= cut
    noise = np.exp(np.random.default_rng(0).normal(0, 0.02, later.sum()))
    for col in ("open", "high", "low", "close"):
        frame.loc[later, col] = frame.loc[later, col] * noise
    frame.loc[later, "high"] = frame.loc[later, ["open", "high", "low", "close"]].max(axis=1)
    frame.loc[later, "low"] = frame.loc[later, ["open", "high", "low", "close"]].min(axis=1)
    data.to_frame().to_csv(tmp_path / "real.csv", index=False)
    frame.to_csv(tmp_path / "changed.csv", index=False)
    for name in ("real", "changed"):
        proc = study(
            tmp_path,
            "--out",
            name,
            "--data",
            f"csv:{tmp_path / name}.csv",
            "--policies",
            "mlp",
            "--seeds",
            "1",
            *WINDOW_FLAGS,
            *TINY_STUDY,
            "--workers",
            "1",
        )
        assert proc.returncode == 0, proc.stderr + proc.stdout

    def weights(name: str, k: int) -> dict:
        return load_checkpoint(tmp_path / name / "cells" / "mlp-s1" / "periods" / f"{k:03d}" / "latest.pt").model_state

    for k in (0, 1):
        assert all(torch.equal(v, weights("changed", k)[key]) for key, v in weights("real", k).items()), k
    assert not all(torch.equal(v, weights("changed", 2)[key]) for key, v in weights("real", 2).items())


@pytest.mark.slow
def test_shards_merge_into_the_same_study(full_study, tmp_path):
    out, _ = full_study
    for i in (1, 2):
        proc = study(
            tmp_path,
            "--out",
            f"part{i}",
            "--data",
            DATA,
            "--policies",
            "mlp,lstm",
            "--seeds",
            "1-2",
            *WINDOW_FLAGS,
            *TINY_STUDY,
            "--workers",
            "2",
            "--shard",
            f"{i}/2",
        )
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "2 cell(s) (shard" in proc.stdout
    merged = study(tmp_path, "merge", "--out", "merged", "part1", "part2", "--bootstrap", "500")
    assert merged.returncode == 0, merged.stderr + merged.stdout
    a, b = (pd.read_csv(p / "cells.csv").set_index("cell") for p in (out, tmp_path / "merged"))
    pd.testing.assert_series_equal(a["sharpe"].sort_index(), b["sharpe"].sort_index())  # same cells, same numbers
    other = study(tmp_path, "merge", "--out", "merged", "part1", str(out / "cells"))
    assert other.returncode == 2 and "error:" in other.stderr


@pytest.mark.slow
def test_a_failed_cell_is_recorded_and_a_killed_study_continues_where_it_stopped(tmp_path):
    args = [
        "--out",
        "run",
        "--data",
        DATA,
        "--policies",
        "mlp",
        "--seeds",
        "1-3",
        *TINY_STUDY,
        "--workers",
        "1",
        "--num_episodes",
        "24",
        "--trade_start",
        "2016-03-01",
        "--trade_end",
        "2016-08-31",
        "--retrain",
        "none",
    ]
    env = clean_env() | {"CLSTM_PPO_STUDY_FAIL_CELL": "mlp-s2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = tmp_path / "run" / "cells" / "mlp-s1" / "status.json"
    deadline = time.time() + 240
    while time.time() < deadline and not (first.is_file() and json.loads(first.read_text())["status"] == "done"):
        time.sleep(0.5)
    time.sleep(1.5)  # mlp-s2 fails at once; mlp-s3 is training now
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err + out
    assert "run the same command again to continue" in out
    done_at = (tmp_path / "run" / "cells" / "mlp-s1" / "result.json").stat().st_mtime_ns
    again = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 1, again.stderr + again.stdout  # a cell failed: nonzero, but the study finished
    assert "already done (kept)" in again.stdout
    assert (tmp_path / "run" / "cells" / "mlp-s1" / "result.json").stat().st_mtime_ns == done_at  # not recomputed
    report = json.loads((tmp_path / "run" / "study.json").read_text())
    assert report["cells"] | {"total": 3} == report["cells"] and report["cells"]["done"] == 2
    assert report["cells"]["failed"] == 1 and report["groups"]["mlp"]["seeds"] == [1, 3]  # never averaged in
    assert "`mlp-s2`: failed: RuntimeError: injected failure" in (tmp_path / "run" / "study.md").read_text()
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is_cell_of(p, tmp_path)]  # no cell left running


def _is_cell_of(proc_dir: Path, tmp_path: Path) -> bool:
    try:
        return str(tmp_path) in (proc_dir / "cmdline").read_text().replace("\0", " ")
    except OSError:
        return False


def test_study_help_explains_every_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "study", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == 0
    for flag in (
        "--policies",
        "--seeds",
        "--vary",
        "--trade_start",
        "--retrain",
        "--retrain_from",
        "--validation_days",
        "--workers",
        "--shard",
        "--max_cells",
        "--index",
        "--num_episodes",
    ):
        assert flag in proc.stdout


def test_a_damaged_study_spec_is_refused_in_one_line(tmp_path):
    from clstm_ppo.study.spec import SPEC_FILE, StudySpec
    from envs.errors import UserError

    for text, message in (
        ("[1, 2]", "must hold a JSON object"),
        ("{", "not readable JSON"),
        ('{"format": 99}', "study format 99"),
    ):
        (tmp_path / SPEC_FILE).write_text(text, encoding="utf-8")
        with pytest.raises(UserError, match=message):
            StudySpec.load(tmp_path)
