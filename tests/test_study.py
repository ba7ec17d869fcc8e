"""The study: its schedule, grid and baselines; one real study end to end; no look-ahead; kill and resume;
shards and merge; failed cells; warm starts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo.config import TrainConfig, preset
from clstm_ppo.evaluation.baselines import buy_and_hold
from clstm_ppo.evaluation.oracle import REFERENCE
from clstm_ppo.study.analysis import seed_summary
from clstm_ppo.study.cell import read_status
from clstm_ppo.study.grid import Cell, build_grid, parse_seeds, parse_shard, parse_variants, shard
from clstm_ppo.study.markets import (
    load_markets,
    market_key,
    paper_stop_days,
    prepare_markets,
    same_market,
    save_markets,
    traded_window,
)
from clstm_ppo.study.schedule import walk_forward
from clstm_ppo.threads import torch_threads
from clstm_ppo.training.checkpoint import load_checkpoint, restore_policy
from envs.data import MarketData
from envs.errors import UserError
from envs.execution import Terms
from envs.synthetic import generate_market
from tests.conftest import TINY_MODEL, alive, clean_env, descendants, run_here

# 3 tickers, 5-day windows, tiny networks, 8 episodes of 16 days per window: a few seconds per cell.
TINY_STUDY = [*TINY_MODEL, "--num_episodes", "8", "--bootstrap", "500"]
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


def study(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``clstm-ppo study ARGS`` run to its end in ``cwd``: the study in this interpreter (`tests.conftest.run_here`),
    its cells in their processes as always. Tests that stop or kill a study start it as a process."""
    return run_here(["study", *args], cwd, env)


def study_in_background(cwd: Path, *args: str) -> subprocess.Popen:
    """``clstm-ppo study ARGS`` started in ``cwd``, its output discarded (a test that kills it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "clstm_ppo.cli", "study", *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_an_update(proc: subprocess.Popen, *metrics: Path, timeout: float = 240) -> None:
    """Wait until each of ``metrics`` (a window's metrics.jsonl) has logged an update, or ``proc`` has exited."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if all(m.is_file() and b'"kind": "update"' in m.read_bytes() for m in metrics):
            return
        time.sleep(0.05)


def studies_at_once(cwd: Path, *arg_lists: list[str], timeout: int = 300) -> list[subprocess.CompletedProcess]:
    """Several `study` commands run side by side (one worker each: the box has 2 cores), their results in order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "clstm_ppo.cli", "study", *args],
            cwd=cwd,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in arg_lists
    ]
    done = []
    for proc, args in zip(procs, arg_lists, strict=True):
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def ledger_lines(path: Path) -> list[dict]:
    """Every line of a ledger file, each of which must parse."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


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
        (dict(trade_start="nat", trade_end=None), "--trade_start 'nat' is not a date"),  # NaT: no day at all
        (dict(trade_start="2016-01-04", trade_end="NaT"), "--trade_end 'NaT' is not a date"),
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
    from tests.conftest import TINY, settings_file

    warm_start = settings_file(tmp_path, init_weights=str(tmp_path / "a" / "latest.pt"))
    cfg = parse_config([*TINY, "--num_episodes", "8", "--checkpoint_dir", str(tmp_path), "--run_name", "a"])
    market = build_market(cfg.data, seed=cfg.run.seed)
    Trainer([cfg], market, Comm(), [tmp_path / "a"]).train()
    source = load_checkpoint(tmp_path / "a" / "latest.pt").model_state
    warm = Trainer([parse_config([*TINY, "--seed", "9", *warm_start])], market, Comm(), [tmp_path / "b"])
    assert all(torch.equal(v, warm.seeds[0].model.state_dict()[k]) for k, v in source.items())
    cold = Trainer([parse_config([*TINY, "--seed", "9"])], market, Comm(), [tmp_path / "c"])
    assert not all(torch.equal(v, cold.seeds[0].model.state_dict()[k]) for k, v in source.items())
    with pytest.raises(UserError, match="another network: --stage2_hidden 16 \\(now 24\\)"):
        Trainer([parse_config([*TINY, "--stage2_hidden", "24", *warm_start])], market, Comm(), [tmp_path / "d"])


# ---------------------------------------------------------------------------------------------- end to end


FULL_GRID = ["--data", DATA, "--policies", "mlp,lstm", "--seeds", "1-2", *WINDOW_FLAGS, *TINY_STUDY]
# one thread a process: the same arithmetic as the other studies here; by default 2 batches (mlp, lstm) of 2 cells
FULL_STUDY = [*FULL_GRID, "--workers", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def full_study(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One study of 4 cells shared by the module's tests (those that write copy it first); its ledger is
    ``ledger.jsonl`` next to it."""
    cwd = tmp_path_factory.mktemp("study")
    proc = study(cwd, "--out", "full", *FULL_STUDY, "--ledger", str(cwd / "ledger.jsonl"))
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


def traded_buy_and_hold(data, dates: pd.DatetimeIndex, first: str, last: str) -> np.ndarray:
    """The study's buy-and-hold values on the traded days, with its default fills (the next open)."""
    days = np.flatnonzero((dates >= first) & (dates <= last))
    terms = Terms.of(data, "auto", 0.0).days(days[0], days[-1] + 1)
    return buy_and_hold(data.close[days], terms, 1_000_000.0, 1e-3).values


def test_a_study_runs_every_cell_and_reports_with_baselines_and_statistics(full_study):
    out, proc = full_study
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "4/4 done" in proc.stdout and "ETA" in proc.stdout
    assert "per cell" in proc.stdout and "for the 4 cell(s) on 2 worker(s)" in proc.stdout  # the estimated wall time
    report = json.loads((out / "study.json").read_text())
    assert report["cells"]["done"] == 4 and set(report["groups"]) == {"mlp", "lstm"}
    traded = report["traded"]
    assert (traded["first"], traded["last"]) == ("2016-03-01", "2016-08-31")
    # buy-and-hold on exactly the traded days, with the env's costs and fills
    data = generate_market(num_tickers=3, num_days=700, seed=1)
    dates = pd.DatetimeIndex(data.dates)
    bh = traded_buy_and_hold(data, dates, "2016-03-01", "2016-08-31")
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
        "psr_active",
        "dsr_active",
        "sortino",
        "calmar",
        "annual_turnover",
        "total_costs",
    ):
        stat = mlp["summary"][key]
        assert stat["n"] == 2 and (stat["lo"] <= stat["mean"] <= stat["hi"])
    assert mlp["verdict"].startswith("mlp: Sharpe ") and "seeds beat it" in mlp["verdict"]
    assert report["overfitting"]["num_configurations"] == 4 and 0 <= report["overfitting"]["pbo"] <= 1
    # the ledger: the study once and each cell once, as they finished; N counts them
    lines = ledger_lines(out.parent / "ledger.jsonl")
    assert [r["kind"] for r in lines] == ["study", *["trial"] * 4]
    assert sorted(r["cell"] for r in lines[1:]) == ["lstm-s1", "lstm-s2", "mlp-s1", "mlp-s2"]
    assert report["trials"] | {"num_trials": 4, "num_configurations": 2} == report["trials"]
    assert "These days have been traded by 2 configurations (4 trials" in (out / "study.md").read_text()
    # every Sharpe with an interval over days and seeds, wider than the seeds-only one kept beside it
    for g in report["groups"].values():
        iv, seeds_only = g["sharpe_interval"], g["summary"]["sharpe"]
        assert iv["resamples"] == "days and seeds" and iv["sharpe"] == pytest.approx(seeds_only["mean"])
        assert iv["hi"] - iv["lo"] > seeds_only["hi"] - seeds_only["lo"]
    assert report["baseline_sharpe_intervals"]["buy-and-hold"]["resamples"] == "days"
    assert "days and seeds resampled; seeds only [" in mlp["verdict"]
    # Holm over the study's 9 comparisons: 2 configurations x (3 baselines + untrained) and the pair
    family = [d for g in report["groups"].values() for d in g["vs"].values()] + report["between"]
    assert report["multiple_comparisons"]["family_size"] == len(family) == 9
    for d in family:
        assert d["p_value"] <= d["p_holm"] <= min(1.0, 9 * d["p_value"]) and d["family_size"] == 9
        assert d["survives_holm"] == (d["p_holm"] < 0.05)
    (pair,) = report["between"]  # mlp against lstm, paired by seed
    assert (pair["first"], pair["second"], pair["seeds"], pair["num_seeds"]) == ("mlp", "lstm", [1, 2], 2)
    mlp_sr = [c["policy"]["sharpe"] for c in sorted(group_cells(out, "mlp"), key=lambda c: c["seed"])]
    lstm_sr = [c["policy"]["sharpe"] for c in sorted(group_cells(out, "lstm"), key=lambda c: c["seed"])]
    assert pair["seeds_beating"] == sum(a > b for a, b in zip(mlp_sr, lstm_sr, strict=True))
    assert pair["lo"] <= pair["hi"] and "mlp vs lstm: Sharpe difference" in proc.stdout
    md = (out / "study.md").read_text()
    assert "## Configurations against each other" in md and "## What the intervals resample" in md
    assert "| PSR vs 0 | DSR vs 0 | PSR vs B&H | DSR vs B&H |" in md
    assert "| mlp (2 seeds) |" in md and "## Verdicts" in md and "Probability of backtest overfitting" in md
    # every bootstrap has the tests' 500 draws, each bound its Monte Carlo standard error, and each difference
    # against a baseline or the untrained network also its Bonferroni interval for the 2 configurations on these
    # days, from the same draws
    assert report["bootstrap"] == 500 and "intervals are 95%, each bootstrap of 500 draws" in md
    assert report["multiple_comparisons"]["bonferroni_m"] == 2
    for d in [*mlp["vs"].values(), pair]:
        assert d["n_boot"] == 500 and 0 <= d["lo_mcse"] < 0.2 and 0 <= d["hi_mcse"] < 0.2
    for d in mlp["vs"].values():
        assert (d["bonferroni_m"], d["bonferroni_confidence"]) == (2, pytest.approx(0.975))
        assert d["lo_bonferroni"] <= d["lo"] <= d["hi"] <= d["hi_bonferroni"]
        assert d["lo_bonferroni_mcse"] >= 0 and d["hi_bonferroni_mcse"] >= 0
    assert "bonferroni_m" not in pair  # a pair of configurations is not one configuration among m
    buy = mlp["vs"]["buy-and-hold"]
    assert buy["lo_mcse"] > 0 and buy["hi_bonferroni"] > buy["hi"]
    assert "| Bonferroni for m = 2 configurations on these days (97.5%) |" in md
    assert (
        f"| mlp | buy-and-hold | {buy['difference']:+.2f} [{buy['lo']:+.2f} ±{buy['lo_mcse']:.3f}, "
        f"{buy['hi']:+.2f} ±{buy['hi_mcse']:.3f}] | [{buy['lo_bonferroni']:+.2f} ±{buy['lo_bonferroni_mcse']:.3f}, "
        f"{buy['hi_bonferroni']:+.2f} ±{buy['hi_bonferroni_mcse']:.3f}] |"
    ) in md
    worst = max(max(iv["lo_mcse"], iv["hi_mcse"]) for iv in report["baseline_sharpe_intervals"].values())
    assert worst > 0 and "500 bootstrap draws; the Monte Carlo standard error of these bounds is at most" in md
    cells = pd.read_csv(out / "cells.csv")
    assert len(cells) == 4 and set(cells["status"]) == {"done"} and cells["sharpe"].notna().all()
    # how each cell's training ended: its windows' last KL and clip fraction, and a training episode's costs
    assert (cells["final_kl"] >= 0).all() and cells["final_clip_fraction"].between(0, 1).all()
    lasts = []
    for path in sorted((out / "cells" / "mlp-s1" / "periods").glob("*/metrics.jsonl")):
        lasts.append([m for m in map(json.loads, path.open()) if m["kind"] == "update"][-1])
    row = cells.set_index("cell").loc["mlp-s1"]
    assert len(lasts) >= 2 and row["final_kl"] == pytest.approx(np.mean([m["approx_kl"] for m in lasts]))
    assert row["final_clip_fraction"] == pytest.approx(np.mean([m["clip_fraction"] for m in lasts]))
    assert (cells["train_episode_costs"] > 0).all()
    # the ensemble of each configuration's seeds, next to the mean of its members
    ensemble = report["groups"]["mlp"]["ensemble"]
    assert ensemble["members"] == ["mlp-s1", "mlp-s2"] and "## Ensembles of the seeds" in md
    by_cell = cells.set_index("cell")
    assert ensemble["members_mean"]["sharpe"] == pytest.approx(by_cell.loc[["mlp-s1", "mlp-s2"], "sharpe"].mean())
    assert (
        math.isfinite(ensemble["metrics"]["sharpe"]) and len(list((out / "ensembles").glob("*.npz"))) == 2
    )  # one per configuration
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
    assert cfg["init_weights"].endswith("periods/000/latest.pt")  # warm start from the deployed (last) weights
    assert (
        load_checkpoint(folder / "periods" / "001" / "best.pt").market_spec["splits"]["test"]["start"] == "2016-04-01"
    )
    for window in sorted((folder / "periods").glob("*")):  # traded: each keeps its weights, not its optimizer state
        for name in ("latest.pt", "best.pt"):
            kept = load_checkpoint(window / name)
            assert kept.optimizer_state is None and kept.worker_states is None, window / name
            assert kept.counters["episodes"] > 0


@pytest.mark.slow
def test_no_day_of_a_traded_window_reaches_the_model_that_trades_it(full_study, tmp_path):
    """Changing every price from window 1's first traded day on leaves windows 0 and 1's models bit for bit the
    same as the full study's (and window 2's, which trains on those days, different)."""
    out, _ = full_study
    data = generate_market(num_tickers=3, num_days=700, seed=1)  # the full study's market
    frame = data.to_frame()
    cut = pd.Timestamp("2016-04-01")  # window 1 trades from here
    later = frame["date"] >= cut
    noise = np.exp(np.random.default_rng(0).normal(0, 0.02, later.sum()))
    for col in ("open", "high", "low", "close"):
        frame.loc[later, col] = frame.loc[later, col] * noise
    frame.loc[later, "high"] = frame.loc[later, ["open", "high", "low", "close"]].max(axis=1)
    frame.loc[later, "low"] = frame.loc[later, ["open", "high", "low", "close"]].min(axis=1)
    frame.to_csv(tmp_path / "changed.csv", index=False)
    # the full study's mlp batch (seeds 1 and 2 trained as one, on one worker): the same batch, bit for bit
    changed = ["--data", f"csv:{tmp_path / 'changed.csv'}", "--policies", "mlp", "--seeds", "1-2", *WINDOW_FLAGS]
    proc = study(tmp_path, "--out", "changed", *changed, *TINY_STUDY, "--workers", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stderr + proc.stdout

    def weights(folder: Path, k: int) -> dict:
        return load_checkpoint(folder / "cells" / "mlp-s1" / "periods" / f"{k:03d}" / "latest.pt").model_state

    real, other = out, tmp_path / "changed"
    for k in (0, 1):
        assert all(torch.equal(v, weights(other, k)[key]) for key, v in weights(real, k).items()), k
    assert not all(torch.equal(v, weights(other, 2)[key]) for key, v in weights(real, 2).items())


def test_a_study_written_before_deploy_existed_keeps_trading_best_pt(tmp_path):
    """--deploy last is the default now; a spec.json from before the setting existed meant best.pt (`LEGACY`), and
    loading it must not switch a half-finished study's later cells to other checkpoints."""
    from clstm_ppo.study.spec import SPEC_FILE, StudySpec

    base = TrainConfig().to_dict()
    assert base["deploy"] == "last"
    spec = StudySpec(base, ["mlp"], [1], [[]], "2021-01-04", "", "none", "warm", 63, 0)
    for name, stored in (("old", {k: v for k, v in base.items() if k != "deploy"}), ("new", base)):
        (tmp_path / name).mkdir()
        StudySpec(**{**spec.__dict__, "base": stored}).save(tmp_path / name)
        assert (tmp_path / name / SPEC_FILE).is_file()
    assert StudySpec.load(tmp_path / "old").base_config.run.deploy == "best"
    assert StudySpec.load(tmp_path / "new").base_config.run.deploy == "last"


def test_deploy_last_trades_each_windows_last_weights_where_best_trades_its_validation_choice(tmp_path):
    """Two studies of the same cell (--eval_every 1, so validation can pick an earlier update): under --deploy best
    each window trades its best.pt, under --deploy last its latest.pt, the portfolio carried across windows either
    way, and the records part where those checkpoints differ. The first window trains alike in both."""
    from clstm_ppo.agent.evaluate import evaluate_policy
    from clstm_ppo.study.cell import run_ensemble
    from clstm_ppo.study.markets import load_markets, market_key
    from clstm_ppo.study.spec import StudySpec

    flags = ["--data", DATA, "--policies", "mlp", "--seeds", "1", *WINDOW_FLAGS, *TINY_STUDY, "--num_episodes", "16"]
    flags += ["--eval_every", "1", "--workers", "1", "--threads", "1", "--rebalance_band", "0"]  # every move trades
    procs = studies_at_once(tmp_path, ["--out", "best", *flags, "--deploy", "best"], ["--out", "last", *flags])
    assert all(p.returncode == 0 for p in procs), [p.stderr + p.stdout for p in procs]
    best_study, last_study = tmp_path / "best", tmp_path / "last"
    cfg = Cell("mlp", 1).config(StudySpec.load(last_study).base_config)
    assert cfg.run.deploy == "last" and StudySpec.load(best_study).base_config.run.deploy == "best"
    markets = load_markets(last_study / "prepared", market_key(cfg))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the studies' arithmetic
    differing = 0
    try:
        for k, market in enumerate(markets):
            best_dir, last_dir = (s / "cells" / "mlp-s1" / "periods" / f"{k:03d}" for s in (best_study, last_study))
            trained = load_checkpoint(best_dir / "latest.pt").model_state
            if k == 0:  # later windows warm-start from the previous window's deployed weights, which differ
                again = load_checkpoint(last_dir / "latest.pt").model_state
                assert all(torch.equal(v, again[n]) for n, v in trained.items())
            traded = {}
            for name, folder, checkpoint in (("best", best_dir, "best.pt"), ("last", last_dir, "latest.pt")):
                start = None
                if k:  # the portfolio this study carried into the window
                    with np.load(folder.parent / f"{k - 1:03d}" / "trade.npz") as z:
                        start = (float(z["policy_cash"][-1]), z["policy_holdings"][-1].copy())
                model = restore_policy(load_checkpoint(folder / checkpoint), market)
                traded[name] = evaluate_policy(model, market, market.splits.test, cfg.env, start_portfolio=start).values
                with np.load(folder / "trade.npz") as z:
                    assert np.array_equal(z["policy_values"], traded[name]), (name, k)
            chosen = load_checkpoint(best_dir / "best.pt").model_state
            if not all(torch.equal(v, trained[n]) for n, v in chosen.items()):
                # weights that differ may still trade alike (the rebalance band and whole shares absorb small
                # moves), so the rules must part in at least one such window, not in each
                differing += not np.array_equal(traded["best"], traded["last"])
        # The seed's ensemble (of one) follows its study's rule too: it trades exactly as the cell did
        for study in (best_study, last_study):
            with np.load(study / "cells" / "mlp-s1" / "result.npz") as z:
                assert np.array_equal(run_ensemble(study, [Cell("mlp", 1)]).values, z["values"]), study
    finally:
        torch.set_num_threads(threads)
    assert differing, "no window's best.pt trades differently from its latest.pt: the test shows nothing"


@pytest.mark.slow
def test_shards_of_a_batched_study_merge_into_the_same_study(full_study, tmp_path):
    """The full study in two shards on one worker each, side by side: each shard takes whole batches (the full
    study's two, of two cells each), so every cell trains with the same batch mate in the same place, and the merged
    study is the unsharded one, number for number."""
    out, _ = full_study
    grid = [*FULL_GRID, "--workers", "1", "--threads", "1"]
    for proc in studies_at_once(tmp_path, *[["--out", f"part{i}", *grid, "--shard", f"{i}/2"] for i in (1, 2)]):
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "2 cell(s) (shard" in proc.stdout and "up to 2 cells trained as one batch" in proc.stdout
    merged = study(tmp_path, "merge", "--out", "merged", "part1", "part2", "--bootstrap", "500")
    assert merged.returncode == 0, merged.stderr + merged.stdout
    a = pd.read_csv(out / "cells.csv").set_index("cell")
    b = pd.read_csv(tmp_path / "merged" / "cells.csv").set_index("cell")
    assert sorted(b.index) == sorted(a.index) and set(b["status"]) == {"done"}
    pd.testing.assert_frame_equal(outcomes(a), outcomes(b))
    for cell in a.index:
        with (
            np.load(out / "cells" / cell / "result.npz") as x,
            np.load(tmp_path / "merged" / "cells" / cell / "result.npz") as y,
        ):
            assert np.array_equal(x["values"], y["values"]), cell
    other = study(tmp_path, "merge", "--out", "merged", "part1", str(out / "cells"))
    assert other.returncode == 2 and "error:" in other.stderr
    # a study of seed 1 merged with shards of seeds 1-2 grows to them
    fewer = json.loads((tmp_path / "merged" / "spec.json").read_text()) | {"seeds": [1]}
    (tmp_path / "merged" / "spec.json").write_text(json.dumps(fewer))
    grown = study(tmp_path, "merge", "--out", "merged", "part1", "part2", "--bootstrap", "500")
    assert grown.returncode == 0, grown.stderr + grown.stdout
    assert json.loads((tmp_path / "merged" / "spec.json").read_text())["seeds"] == [1, 2]


def outcomes(cells: pd.DataFrame) -> pd.DataFrame:
    """A cells.csv's results: all but the timings and the DSRs (which count the trials in each study's ledger)."""
    return cells.drop(columns=["seconds", "train_seconds", "dsr", "dsr_active"]).sort_index()


@pytest.mark.slow
def test_a_batched_study_killed_outright_keeps_its_finished_work_and_ends_as_an_uninterrupted_one(full_study, tmp_path):
    """SIGKILL of the study and of every process it started (a machine going down) while a batch trains its second
    walk-forward window; the same command again keeps what was finished and ends with the full study's numbers.

    One worker, so the mlp batch runs alone (the same two batches as the full study's two workers form) and the kill
    lands inside an update (after the window's first update is logged, before its last): no batch's checkpoints are
    being written, which a kill could leave written for one cell and not yet for the other."""
    out, _ = full_study
    args = ["--out", "run", *FULL_GRID, "--workers", "1", "--threads", "1", "--ledger", str(tmp_path / "ledger.jsonl")]
    proc = study_in_background(tmp_path, *args)
    cell = tmp_path / "run" / "cells" / "mlp-s1" / "periods"
    first_window = cell / "000" / "trade.npz"
    wait_for_an_update(proc, cell / "001" / "metrics.jsonl")
    victims = [proc.pid, *descendants(proc.pid)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    statuses = {
        c.name: read_status(tmp_path / "run" / "cells" / c.name)["status"]
        for c in (tmp_path / "run" / "cells").iterdir()
    }
    assert "running" in statuses.values(), statuses  # killed mid-study: some cells had not finished
    kept = first_window.read_bytes()
    again = study(tmp_path, *args)
    assert again.returncode == 0, again.stderr + again.stdout
    assert first_window.read_bytes() == kept  # the finished window was not trained again
    # the estimate times only what this run trains: windows 001 and 002's 16 episodes at most, the first of them
    # after the cell's process has started (the killed run's logged episodes, counted at once, read "in 0 s")
    estimate = re.search(r"\[study\] first batch of 2 cells: (\d+) episodes in (\d+) s", again.stdout)
    assert estimate or "[study] first batch of 2 cells done in" in again.stdout, again.stdout
    if estimate:
        assert int(estimate[1]) <= 16 and int(estimate[2]) >= 1, estimate[0]
    a = pd.read_csv(out / "cells.csv").set_index("cell")
    b = pd.read_csv(tmp_path / "run" / "cells.csv").set_index("cell")
    pd.testing.assert_frame_equal(outcomes(a), outcomes(b))
    for cell in a.index:
        with (
            np.load(out / "cells" / cell / "result.npz") as x,
            np.load(tmp_path / "run" / "cells" / cell / "result.npz") as y,
        ):
            assert np.array_equal(x["values"], y["values"]), cell


def test_cells_of_a_study_killed_outright_stop_themselves_and_save(tmp_path):
    """SIGKILL of the study's runner alone (its cells run in their own sessions, so nothing forwards it): each cell
    process sees its parent gone, stops as on SIGTERM (finishes its update, saves latest.pt) and is recorded
    interrupted, rather than training on unseen and racing a re-run for its folder."""
    args = ["--out", "run", "--data", DATA, "--policies", "mlp", "--seeds", "1-2", *WINDOW_FLAGS, *TINY_STUDY]
    args += ["--num_episodes", "100000", "--workers", "2", "--threads", "1", "--batch_cells", "1"]
    args += ["--ledger", str(tmp_path / "ledger.jsonl")]
    proc = study_in_background(tmp_path, *args)
    cells = [tmp_path / "run" / "cells" / f"mlp-s{s}" for s in (1, 2)]
    wait_for_an_update(proc, *(c / "periods" / "000" / "metrics.jsonl" for c in cells))
    orphans = descendants(proc.pid)
    assert len(orphans) == 2, "both cells should be training when the study is killed"
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.time() + 90
    while time.time() < deadline and alive(orphans):
        time.sleep(0.1)
    left = alive(orphans)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "a cell kept running after its study was killed"
    for cell in cells:
        assert read_status(cell)["status"] == "interrupted", cell.name
        assert (cell / "periods" / "000" / "latest.pt").is_file(), cell.name


@pytest.mark.slow
def test_a_diverging_cell_of_a_batch_is_recorded_failed_and_its_batch_mate_finishes(full_study, tmp_path):
    """One batch of the full study run again in this process, its second cell's rewards NaN from its first update
    (a fault hook on that cell alone) and ``max_bad_updates`` 1: that cell fails with the divergence error, the other
    finishes with the full study's numbers."""
    from clstm_ppo.study.spec import StudySpec
    from tests.faults import FaultHook

    out, _ = full_study
    shutil.copytree(out, tmp_path / "study", ignore=shutil.ignore_patterns("cells", "ensembles"))
    spec = StudySpec.load(tmp_path / "study")
    spec.base["max_bad_updates"] = 1
    spec.save(tmp_path / "study")
    mlp_s2_fails_and_mlp_s1_finishes_as_in(
        out, tmp_path / "study", "updates in a row had NaN/inf", callbacks={"mlp-s2": [FaultHook(kind="nan")]}
    )


@pytest.mark.slow
def test_a_batch_out_of_memory_says_to_run_smaller_batches_and_its_cells_then_finish(full_study, tmp_path, monkeypatch):
    """The full study's mlp batch again in this process, its update raising torch's out-of-memory error (as a GPU
    too small for the batch does): both cells are recorded failed with the error and a line saying to run again
    with a smaller --batch_cells; run so (each cell alone), both finish."""
    from clstm_ppo.study.batch import run_batch_guarded
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.training.trainer import Trainer

    out, _ = full_study
    shutil.copytree(out, tmp_path / "study", ignore=shutil.ignore_patterns("cells", "ensembles"))
    study_dir = tmp_path / "study"
    mlp = [c for c in StudySpec.load(study_dir).cells() if c.policy == "mlp"]

    def too_big(self, **_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with monkeypatch.context() as patch, torch_threads(1):
        patch.setattr(Trainer, "update", too_big)
        assert run_batch_guarded(study_dir, mlp) == 1
    for cell in mlp:
        status = read_status(study_dir / "cells" / cell.name)
        assert status["status"] == "failed", status
        assert status["error"].startswith("OutOfMemoryError: CUDA out of memory"), status["error"]
        assert "a batch of 2 cells: run the study again with --batch_cells 1 or fewer" in status["error"]
        assert status["started"] <= status["finished"], status  # a failed cell keeps when its process started
    with torch_threads(1):
        assert [run_batch_guarded(study_dir, [cell]) for cell in mlp] == [0, 0]
    for cell in mlp:  # a cell alone is a group of one, and its status names no batch
        status = read_status(study_dir / "cells" / cell.name)
        assert status["status"] == "done" and "batch" not in status, status


def test_a_cell_whose_checkpoint_cannot_be_traded_fails_alone_and_its_batch_mate_trades_on(full_study, tmp_path):
    """The full study's mlp batch again from its cells' folders, mlp-s2's window 0 not yet traded and the
    checkpoint it trades missing a weight (it reads as trained, and no network restores from it): the batch's joint
    trade fails, each cell then trades on its own, mlp-s2 fails with a line naming its checkpoint and mlp-s1
    finishes with the full study's numbers."""
    from clstm_ppo.study.cell import selected
    from clstm_ppo.study.spec import StudySpec

    out, _ = full_study
    shutil.copytree(out, tmp_path / "study", ignore=shutil.ignore_patterns("ensembles"))
    study_dir = tmp_path / "study"
    spec = StudySpec.load(study_dir)
    mlp = [c for c in spec.cells() if c.policy == "mlp"]
    cfg = mlp[1].config(spec.base_config)
    market = load_markets(study_dir / "prepared", market_key(cfg))[0]
    window = study_dir / "cells" / "mlp-s2" / "periods" / "000"
    (window / "trade.npz").unlink()
    damaged = selected(window, market, cfg)
    payload = torch.load(damaged, weights_only=True)
    payload["model_state"].pop(next(iter(payload["model_state"])))
    torch.save(payload, damaged)
    mlp_s2_fails_and_mlp_s1_finishes_as_in(out, study_dir, damaged.name)


def mlp_s2_fails_and_mlp_s1_finishes_as_in(out: Path, study_dir: Path, error: str, **run_options) -> None:
    """The full study's (``out``) mlp batch run again in this process on ``study_dir``: mlp-s2 is recorded failed
    with ``error`` in its line, and mlp-s1 finishes with the full study's numbers."""
    from clstm_ppo.study.batch import run_batch_guarded
    from clstm_ppo.study.spec import StudySpec

    mlp = [c for c in StudySpec.load(study_dir).cells() if c.policy == "mlp"]
    with torch_threads(1):  # the study's arithmetic
        code = run_batch_guarded(study_dir, mlp, **run_options)
    assert code == 1
    failed, done = (read_status(study_dir / "cells" / name) for name in ("mlp-s2", "mlp-s1"))
    assert failed["status"] == "failed" and error in failed["error"], failed["error"]
    assert failed["started"] <= failed["finished"], failed
    assert done["status"] == "done" and done["batch"] == [c.name for c in mlp], done
    mine = json.loads((study_dir / "cells" / "mlp-s1" / "result.json").read_text())
    theirs = json.loads((out / "cells" / "mlp-s1" / "result.json").read_text())
    assert mine["policy"] == theirs["policy"] and mine["untrained"] == theirs["untrained"]


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
        "--ledger",
        str(tmp_path / "ledger.jsonl"),
    ]
    args += ["--batch_cells", "1"]  # each cell in its own process, as the failure and the timing expect
    env = clean_env()
    # mlp-s2 fails for a real reason: a file stands where its run folders go (no switch in the product)
    (tmp_path / "run" / "cells" / "mlp-s2").mkdir(parents=True)
    (tmp_path / "run" / "cells" / "mlp-s2" / "periods").write_text("not a folder\n")
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
    # the ledger kept every cell that finished before the kill, and parses line by line
    finished = {c for c in ("mlp-s1", "mlp-s3") if read_status(tmp_path / "run" / "cells" / c)["status"] == "done"}
    killed = ledger_lines(tmp_path / "ledger.jsonl")
    assert killed[0]["kind"] == "study" and "mlp-s1" in finished
    assert {r["cell"] for r in killed if r["kind"] == "trial"} == finished  # not the failed mlp-s2
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
    assert "`mlp-s2`: failed: " in (tmp_path / "run" / "study.md").read_text()  # with the error, in its one line
    trials = [r["cell"] for r in ledger_lines(tmp_path / "ledger.jsonl") if r["kind"] == "trial"]
    assert sorted(trials) == ["mlp-s1", "mlp-s3"] and report["trials"]["num_trials"] == 2  # each once
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is_cell_of(p, tmp_path)]  # no cell left running


def test_a_study_grows_by_seeds_and_refuses_any_other_change_in_one_line(tmp_path):
    """More seeds on the same folder: the finished cells are kept and the report covers every seed; other settings,
    or seeds taken away, are another study: refused in one line, nothing written."""
    ledger = tmp_path / "ledger.jsonl"
    args = ["--out", "run", "--data", DATA, "--policies", "mlp", *WINDOW_FLAGS, *TINY_STUDY, "--workers", "1"]
    args += ["--retrain", "none", "--ledger", str(ledger)]
    first = study(tmp_path, *args, "--seeds", "1")
    assert first.returncode == 0, first.stderr + first.stdout
    run = tmp_path / "run"
    done_at = (run / "cells" / "mlp-s1" / "result.json").stat().st_mtime_ns
    spec_before = (run / "spec.json").read_text()
    for change, named in ((["--seeds", "1-2", "--gamma", "0.9"], "--gamma"), (["--seeds", "2"], "seeds")):
        line = one_error_line(study(tmp_path, *args, *change))
        assert "holds another study" in line and named in line, line
        assert (run / "spec.json").read_text() == spec_before and not (run / "cells" / "mlp-s2").exists()
    assert "(seeds may only be added)" in line
    grown = study(tmp_path, *args, "--seeds", "1-2")
    assert grown.returncode == 0, grown.stderr + grown.stdout
    assert "adds seeds 2 to the study" in grown.stdout and "1 of 2 cells already done (kept)" in grown.stdout
    assert (run / "cells" / "mlp-s1" / "result.json").stat().st_mtime_ns == done_at  # not recomputed
    report = json.loads((run / "study.json").read_text())
    assert report["cells"]["done"] == 2 and report["groups"]["mlp"]["seeds"] == [1, 2]
    assert json.loads((run / "spec.json").read_text())["seeds"] == [1, 2]
    trials = sorted(r["cell"] for r in ledger_lines(ledger) if r["kind"] == "trial")
    assert trials == ["mlp-s1", "mlp-s2"] and report["trials"]["num_trials"] == 2  # each once


def _is_cell_of(proc_dir: Path, tmp_path: Path) -> bool:
    try:
        return str(tmp_path) in (proc_dir / "cmdline").read_text().replace("\0", " ")
    except OSError:
        return False


def daily_moments(r: np.ndarray) -> tuple[float, float, float]:
    """Daily Sharpe (ddof 1), skewness and non-excess kurtosis (population moments), by hand."""
    dev = r - r.mean()
    m2 = np.mean(dev**2)
    return r.mean() / r.std(ddof=1), np.mean(dev**3) / m2**1.5, np.mean(dev**4) / m2**2


def dsr_by_hand(r: np.ndarray, n: int, variance: float) -> float:
    """Bailey & Lopez de Prado (2014): PSR against the expected maximum Sharpe of n unskilled trials."""
    gamma, phi = 0.5772156649015329, NormalDist()
    sr0 = math.sqrt(variance) * ((1 - gamma) * phi.inv_cdf(1 - 1 / n) + gamma * phi.inv_cdf(1 - 1 / (n * math.e)))
    sr, g3, g4 = daily_moments(r)
    return phi.cdf((sr - sr0) * math.sqrt(r.size - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr * sr))


@pytest.mark.slow
def test_the_deflated_sharpe_counts_every_trial_the_ledger_holds_on_these_days(full_study, tmp_path):
    from clstm_ppo.evaluation.ledger import Ledger, record
    from clstm_ppo.study.report import build_report

    out, _ = full_study
    shutil.copytree(out, tmp_path / "old")
    fingerprint = json.loads((out / "study.json").read_text())["data"]["fingerprint"]
    planted = {"x": (0.08, 0.01), "y": (-0.05, -0.03)}  # daily Sharpe vs 0 and vs buy-and-hold of other trials

    def trial(key: str, first: str, last: str, fp: str = fingerprint, sr: float = 0.5, active: float = 0.1) -> dict:
        return record(
            "trial",
            key,
            config=f"config-{key}",
            study="another study",
            fingerprint=fp,
            first=first,
            last=last,
            num_days=100,
            sharpe=sr * math.sqrt(252),
            sharpe_daily=sr,
            active_sharpe=active * math.sqrt(252),
            active_sharpe_daily=active,
        )

    # a ledger that never saw this study: two trials on overlapping days of its data, one on other days, one on
    # other data
    ledger = tmp_path / "ledger.jsonl"
    Ledger(ledger).append(
        [trial(k, "2016-06-01", "2016-12-30", sr=a, active=b) for k, (a, b) in planted.items()]
        + [trial("before", "2015-01-02", "2015-12-31"), trial("elsewhere", "2016-03-01", "2016-08-31", fp="other")]
    )
    proc = study(tmp_path, "report", "old", "--bootstrap", "500", "--ledger", str(ledger))
    assert proc.returncode == 0, proc.stderr
    assert "these days have been traded by 4 configurations (6 trials) so far" in proc.stdout
    report = json.loads((tmp_path / "old" / "study.json").read_text())
    assert report["trials"] | {"num_trials": 6, "num_configurations": 4} == report["trials"]
    # by hand: N = 4 cells + 2 planted trials, V = the variance of their daily Sharpe ratios
    data = generate_market(num_tickers=3, num_days=700, seed=1)
    dates = pd.DatetimeIndex(data.dates)
    bench = traded_buy_and_hold(data, dates, "2016-03-01", "2016-08-31")
    b = bench[1:] / bench[:-1] - 1
    returns = {}
    for cell in ("mlp-s1", "mlp-s2", "lstm-s1", "lstm-s2"):
        values = np.load(out / "cells" / cell / "result.npz")["values"]
        returns[cell] = values[1:] / values[:-1] - 1
    variance = np.var([daily_moments(r)[0] for r in returns.values()] + [a for a, _ in planted.values()], ddof=1)
    active = np.var([daily_moments(r - b)[0] for r in returns.values()] + [x for _, x in planted.values()], ddof=1)
    cells = pd.read_csv(tmp_path / "old" / "cells.csv").set_index("cell")
    for cell, r in returns.items():
        assert cells.loc[cell, "dsr"] == pytest.approx(dsr_by_hand(r, 6, variance), rel=1e-9, abs=1e-12)
        assert cells.loc[cell, "dsr_active"] == pytest.approx(dsr_by_hand(r - b, 6, active), rel=1e-9, abs=1e-12)
    # reporting the old study again adds nothing: its cells are in the ledger once
    before = ledger.read_text()
    assert build_report(tmp_path / "old", ledger=Ledger(ledger), n_boot=500)["trials"]["num_trials"] == 6
    assert ledger.read_text() == before and len(ledger_lines(ledger)) == 1 + 4 + 4


@pytest.mark.slow
def test_study_report_and_merge_carry_their_confidence_bootstrap_and_ledger_into_the_report(full_study, tmp_path):
    """Each sub-command's --confidence and --bootstrap reach study.json and study.md, and its --ledger gets the
    study and its cells."""
    out, _ = full_study
    shutil.copytree(out, tmp_path / "old")
    flags = ["--confidence", "0.9", "--bootstrap", "300"]
    for command, folders, written in (("report", ["old"], "old"), ("merge", ["--out", "merged", "old"], "merged")):
        ledger = tmp_path / f"{command}-ledger.jsonl"
        proc = study(tmp_path, command, *folders, *flags, "--ledger", str(ledger))
        assert proc.returncode == 0, proc.stderr + proc.stdout
        report = json.loads((tmp_path / written / "study.json").read_text())
        assert (report["confidence"], report["bootstrap"], report["trials"]["ledger"]) == (0.9, 300, str(ledger))
        assert "intervals are 90%, each bootstrap of 300 draws" in (tmp_path / written / "study.md").read_text()
        assert [r["kind"] for r in ledger_lines(ledger)] == ["study"] + ["trial"] * 4  # the study's 4 cells'


@pytest.mark.slow
def test_a_study_on_sealed_days_refuses_and_an_unseal_is_recorded_and_counted(full_study, tmp_path):
    from clstm_ppo.evaluation.backtest import backtest, compare
    from clstm_ppo.evaluation.holdout import make_seal
    from clstm_ppo.evaluation.ledger import Ledger
    from clstm_ppo.study.config import StudyConfig
    from clstm_ppo.study.report import build_report, verdict_lines
    from clstm_ppo.study.runner import Layout, run_study
    from clstm_ppo.study.spec import StudySpec

    out, _ = full_study
    shutil.copytree(out, tmp_path / "full")
    ledger = tmp_path / "ledger.jsonl"
    sealed = study(tmp_path, "seal", "--data", DATA, "--from", "2016-07-01", "--ledger", str(ledger))
    assert sealed.returncode == 0 and "sealed 2016-07-01 .. (no end" in sealed.stdout, sealed.stderr
    again = [*FULL_STUDY, "--out", "full", "--ledger", str(ledger)]
    written = (tmp_path / "full" / "study.json").stat().st_mtime_ns
    line = one_error_line(study(tmp_path, *again))
    assert "2016-07-01 .. 2016-08-31 of this data are sealed" in line and "--unseal" in line
    assert (tmp_path / "full" / "study.json").stat().st_mtime_ns == written  # refused before writing anything
    # days the study only trains on are as spent as the days it trades
    training = Ledger(tmp_path / "training-seal.jsonl")
    training.append([make_seal(generate_market(num_tickers=3, num_days=700, seed=1), DATA, "2015-06-01", "2015-06-30")])
    settings = StudyConfig(out=str(tmp_path / "full"), ledger=str(training.path))
    with pytest.raises(UserError, match="2015-06-01 .. 2015-06-30 of this data are sealed"):
        run_study(StudySpec.load(tmp_path / "full"), settings, layout=Layout(1, 0, 1))
    unsealed = study(tmp_path, *again, "--unseal")
    assert unsealed.returncode == 0, unsealed.stderr + unsealed.stdout
    assert "these days have been unsealed 1 time(s) so far" in unsealed.stdout
    (entry,) = json.loads((tmp_path / "full" / "study.json").read_text())["holdout"]
    assert (entry["first"], entry["last"], entry["from"], entry["to"], entry["unsealed"]) == (
        "2016-07-01",
        "2016-08-31",
        "2016-07-01",
        "",
        1,
    )
    assert [r["kind"] for r in ledger_lines(ledger)].count("unseal") == 1
    # a backtest of a cell's checkpoint on the sealed days refuses too; unsealed, it is a second look
    checkpoint = tmp_path / "full" / "cells" / "mlp-s1" / "periods" / "002" / "best.pt"
    with pytest.raises(UserError, match="of this data are sealed"):
        backtest(checkpoint, ledger=ledger, out=tmp_path / "bt")
    done = backtest(checkpoint, ledger=ledger, out=tmp_path / "bt", unseal=True)
    assert [h["unsealed"] for h in done.holdout] == [2]
    assert json.loads((tmp_path / "bt" / "report.json").read_text())["metadata"]["holdout"][0]["unsealed"] == 2
    early = tmp_path / "full" / "cells" / "mlp-s1" / "periods" / "000" / "best.pt"  # trades before the seal
    assert compare([early, early], ledger=ledger, out=tmp_path / "cmp").holdout == []
    # every later report on those days says how many times they were unsealed
    lines = verdict_lines(build_report(tmp_path / "full", ledger=Ledger(ledger), n_boot=500))
    assert "2016-07-01 .. 2016-08-31 are sealed" in lines[1] and "unsealed 2 time(s) so far" in lines[1]
    assert "Sealed hold-out: 2016-07-01 .. 2016-08-31 are sealed" in (tmp_path / "full" / "study.md").read_text()


def test_a_study_trains_400_episodes_per_cell_unless_told_otherwise(tmp_path):
    from clstm_ppo.cli.study import STUDY_NUM_EPISODES, build_parser, study_config

    def episodes(*flags: str) -> int:
        args = vars(build_parser().parse_args(["--out", "x", "--trade_start", "2016-01-04", *flags]))
        return study_config(args).ppo.num_episodes

    (tmp_path / "named.json").write_text('{"num_episodes": 77}')
    (tmp_path / "silent.json").write_text('{"window": 5}')
    assert STUDY_NUM_EPISODES == 400 and episodes() == 400 and episodes("--preset", "paper") == 400
    assert episodes("--num_episodes", "50") == 50
    assert episodes("--config", str(tmp_path / "named.json")) == 77
    assert episodes("--config", str(tmp_path / "silent.json")) == 400
    assert episodes("--config", str(tmp_path / "named.json"), "--num_episodes", "9") == 9


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
        "--batch_cells",
        "--shard",
        "--max_cells",
        "--index",
        "--num_episodes",
    ):
        assert flag in proc.stdout


def test_the_study_adds_at_most_22_flags_of_its_own():
    """`study --help` is train's flags plus at most 22 of its own: 20 before issue 49, which adds --batch_cells, and
    issue 72's --ray, which says where the jobs run (a cluster instead of this machine's cores) and no setting of the
    cells stands in for it; the study's other 21 each serve a workflow of their own."""
    from clstm_ppo.cli.study import build_parser
    from clstm_ppo.cli.train import build_parser as train_parser

    def flags(parser) -> set[str]:
        return {a.option_strings[0] for a in parser._actions if a.option_strings}

    own = flags(build_parser()) - flags(train_parser())
    assert len(own) <= 22 and {"--batch_cells", "--ray"} <= own, sorted(own)


def test_the_eta_counts_what_running_jobs_have_done_and_queues_the_rest_on_free_workers():
    """The ETA after a job ends: a running job goes on at its own pace once it has trained episodes (a choice screen's
    second batch, 545 s in when the first ended after 545 s, printed "ETA 0 min 00 s" and ran 98 s more), else it
    takes the mean job's time (the walk-forward yardstick's last batch, 947 s into a 947 s mean, printed "ETA 15 min
    47 s"); queued jobs go to the first free worker."""
    from clstm_ppo.study.runner import _eta, _job_seconds_left

    assert _job_seconds_left(545.0, 340, 400, 545.0) == pytest.approx(96.2, abs=0.1)  # its own pace, not the mean's
    # trained out: what is left is its trading and reports, as long as those of the jobs done (an example-data
    # study's second batch, trained out when the first ended, printed "ETA 0 min 00 s" and ran 28 s more)
    assert _job_seconds_left(944.0, 700, 700, 944.0, tail=34.0) == 34.0
    assert _job_seconds_left(946.0, 0, 400, 947.0) == 1.0  # no episode logged yet: the mean job's time
    assert _job_seconds_left(120.0, 0, 0, 100.0) == 0.0  # past the mean: now, at the earliest
    assert _eta([], [100.0, 100.0, 100.0], 2) == 200.0  # two waves on two idle workers
    assert _eta([50.0, 90.0], [100.0], 2) == 150.0  # the queued job waits for the worker free in 50 s
    assert _eta([96.2], [], 2) == 96.2
    assert math.isnan(_eta([math.nan], [100.0], 2))  # nothing measured yet: no ETA rather than a wrong one


def test_the_eta_times_each_job_by_its_familys_measured_rate(tmp_path):
    """A study of 4 paper-sized clstm cells and one batch of 4 mlp cells: once the mlp batch has run (45 s), a waiting
    clstm cell is timed by its work at the measured rate, then by the clstm rate once one clstm cell has finished.
    Issue 59: the first batch's time stood for every job, and the progress line said "ETA 0 min 00 s" for 56 minutes
    while a clstm batch ran."""
    from clstm_ppo.study.batch import cell_cost
    from clstm_ppo.study.runner import Layout, _CellPool

    base = TrainConfig()
    clstm, mlp = (build_grid([p], [1, 2, 3, 4], [()]) for p in ("clstm", "mlp"))
    costs = {c.name: cell_cost(c, base, 20) for c in clstm + mlp}
    jobs = [[c] for c in clstm] + [mlp]
    pool = _CellPool(
        tmp_path,
        Layout(workers=2, gpus=0, threads=1),
        jobs,
        total=8,
        log=print,
        on_done=None,
        cell_episodes=0,
        costs=costs,
    )
    assert math.isnan(pool.predicted(jobs[0]))
    pool.measure(mlp, 45.0)
    ratio = costs[clstm[0].name] / sum(costs[c.name] for c in mlp)
    assert pool.predicted(jobs[0]) == pytest.approx(45.0 * ratio) and ratio > 4  # the work, not the mlp job's time
    pool.measure(jobs[0], 750.0)
    assert pool.predicted(jobs[1]) == pytest.approx(750.0) and pool.predicted(mlp) == pytest.approx(45.0)
    assert pool.eta() == pytest.approx(750.0 + 750.0 + 45.0)  # 4 clstm cells on 2 workers, then the mlp batch


def test_batches_are_sized_by_the_cells_work():
    """On the CPU paper-sized clstm cells train alone (4 as one batch on one core took 56 min against 12.5 each alone)
    and the mlp cells share batches, the costliest jobs first; small cells share a job's overhead, one batch per
    worker; a set is split only where that shortens the busiest worker's work."""
    from clstm_ppo.study.batch import _cost, _work, batches, makespan

    def policies(groups):
        return [[c.policy for c in g] for g in groups]

    base = TrainConfig()  # the paper-sized network
    mixed = build_grid(["clstm", "mlp"], [1, 2, 3, 4], [()])
    assert policies(batches(mixed, base, 0, 2)) == [["clstm"]] * 4 + [["mlp"] * 2] * 2
    # groups of equal cost: splitting one alone does not shorten the busiest worker's work, splitting all does
    many = build_grid(["clstm"], list(range(1, 33)), [()])
    assert [len(g) for g in batches(many, base, 0, 16)] == [1] * 32
    clstm = mixed[:4]
    works = [_work(c.config(base), 20) for c in clstm]
    assert _cost(works, "cpu") > sum(_cost([w], "cpu") for w in works)  # a batch of them is slower
    assert makespan([3.0, 2.0, 2.0, 1.0], 2) == 4.0
    demo = preset("demo")
    eight = build_grid(["clstm"], list(range(1, 9)), [()])
    assert [len(g) for g in batches(eight, demo, 0, 2)] == [4, 4] and len(batches(eight, demo, 0, 1)) == 1
    few = build_grid(["clstm"], [1, 2], [()]) + build_grid(["mlp"], [1, 2, 3, 4], [()])
    assert policies(batches(few, demo, 0, 4)) == [["clstm"], ["clstm"], ["mlp"] * 4]  # splitting mlp gains nothing


def test_batches_group_compatible_cells_and_split_them_evenly():
    from clstm_ppo.study.batch import batches

    base = preset("demo")  # small cells: batches pay on the CPU
    seeds = build_grid(["clstm"], list(range(1, 9)), [()])
    assert [len(g) for g in batches(seeds, base, 0, 2)] == [4, 4]  # automatic: one batch per worker
    assert [len(g) for g in batches(seeds, base, 3, 2)] == [3, 3, 2]  # at most 3, as even as can be, costliest first
    assert [len(g) for g in batches(seeds, base, 1, 2)] == [1] * 8  # every cell alone
    assert [[c.name for c in g] for g in batches(seeds, base, 0, 1)] == [[c.name for c in seeds]]
    # a shape (another policy, another window) never shares a batch; a learning rate or an entropy weight may
    grid = build_grid(["clstm", "mlp"], [1, 2], parse_variants(["window=5,30", "ent_coef=0,0.01"]))
    groups = batches(grid, base, 0, 1)
    assert sorted(len(g) for g in groups) == [4, 4, 4, 4]
    for group in groups:
        assert len({(c.policy, dict(c.variant)["window"]) for c in group}) == 1
    assert len(batches(build_grid(["clstm"], list(range(1, 101)), [()]), base, 0, 1)) == 2  # at most 64 a batch


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


def test_the_reports_torch_threads_are_set_inside_and_restored_after_an_error():
    """`torch_threads` (the report trades ensembles on one thread): the count holds inside, the old one comes back."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with torch_threads(1):
                assert torch.get_num_threads() == 1
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_stop_baseline_holds_the_papers_stop_whether_the_policies_use_the_stop_or_not():
    """Buy-and-hold with the turbulence stop is read at the paper's threshold (each window's 90th percentile of its
    training days) in a study whose policies trade without the stop too, on the same days as in one with it."""
    data = generate_market(num_tickers=4, num_days=900, seed=3)
    periods = walk_forward(
        data.dates, window=5, trade_start="2016-06-01", trade_end=None, retrain="quarterly", validation_days=0
    )
    without = prepare_markets(data, TrainConfig.from_dict({"window": 5, "use_turbulence": False}), periods)
    with_stop = prepare_markets(data, TrainConfig.from_dict({"window": 5, "use_turbulence": True}), periods)
    assert not traded_window(without)[1].any()  # the policies' own stop days: none
    stopped = traded_window(with_stop)[1]
    assert 0 < stopped.sum() < stopped.size
    np.testing.assert_array_equal(paper_stop_days(without), stopped)
    np.testing.assert_array_equal(paper_stop_days(with_stop), stopped)


def test_a_market_prepared_on_another_machine_is_the_same_market_up_to_float_rounding(tmp_path):
    """A study continued elsewhere (`--shard` on a GPU machine, the rest here) re-prepares its market and compares it
    with the stored one: last-bit rounding (another numpy, another CPU) is the same market; a real change is not."""
    data = generate_market(num_tickers=3, num_days=700, seed=1)
    periods = walk_forward(
        data.dates, window=5, trade_start="2016-02-15", trade_end=None, retrain="none", validation_days=0
    )
    cfg = TrainConfig.from_dict({"window": 5})
    stored = prepare_markets(data, cfg, periods)
    save_markets(tmp_path, "key", stored)
    (market,) = load_markets(tmp_path, "key")
    assert same_market(market, stored[0])

    def moved(by: float) -> MarketData:
        return dataclasses.replace(data, **{c: getattr(data, c) * (1 + by) for c in ("open", "high", "low", "close")})

    rounded = prepare_markets(moved(4e-16), cfg, periods)[0]  # 2 ulp, as numpy 2.5 on the H200 machine left it
    assert not np.array_equal(rounded.data.close, data.close)
    assert same_market(market, rounded)
    assert not same_market(
        market, prepare_markets(moved(1e-6), cfg, periods)[0]
    )  # a price change of 1e-6 is other data
    assert not same_market(
        market, prepare_markets(generate_market(num_tickers=3, num_days=700, seed=2), cfg, periods)[0]
    )


def test_seed_summary_of_a_metric_some_seeds_leave_undefined():
    """A win rate with no closed trade is NaN (a policy that never trades: an untrained ``--forecast_threshold``
    network in cash). The summary covers the seeds that define each metric and leaves the others' numbers as a
    joint summary would give them; before, one NaN ended the whole study report."""
    nan = math.nan
    rows = [
        dict(sharpe=1.0, win_rate=0.5, never=nan),
        dict(sharpe=2.5, win_rate=nan, never=nan),
        dict(sharpe=3.0, win_rate=0.7, never=nan),
        dict(sharpe=4.5, win_rate=nan, never=nan),
    ]
    out = seed_summary(rows, ["sharpe", "win_rate", "never"], confidence=0.95, n_boot=2000)
    assert out["sharpe"] == seed_summary(rows, ["sharpe"], confidence=0.95, n_boot=2000)["sharpe"]
    assert out["sharpe"]["n"] == 4 and out["sharpe"]["lo"] < 2.75 < out["sharpe"]["hi"]
    assert out["win_rate"]["n"] == 2 and out["win_rate"]["mean"] == pytest.approx(0.6)
    assert 0.5 <= out["win_rate"]["lo"] <= out["win_rate"]["hi"] <= 0.7
    assert out["never"]["n"] == 0 and math.isnan(out["never"]["mean"])


@pytest.mark.slow
def test_a_study_on_a_planted_market_reports_the_reference_and_its_cells_backtest_on_their_own_market(tmp_path):
    """On a planted market the report sets the reference trader (the best of its family on the first window's
    training days) beside the baselines (a yardstick, kept out of the comparisons and Holm's family) with each
    configuration's share of its excess over buy-and-hold and the paired test of share >= 50%; the study pins its
    market's seed and generator in the cells' source, so a cell (seed 2) trained on the market drawn with the study's
    seed (1) backtests on that market, not on one drawn with its own seed."""
    planted = "synthetic:tickers=4,days=700,signal_ic=0.3,signal_halflife=1"
    args = ["--out", "p", "--data", planted, *TINY_STUDY, "--policies", "mlp", "--seeds", "2"]
    proc = study(tmp_path, *args, "--trade_start", "2016-03-01", "--retrain", "none", "--ledger", str(tmp_path / "l"))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads((tmp_path / "p" / "study.json").read_text())
    reference = report["baselines"][REFERENCE]
    held = report["baselines"]["buy-and-hold"]["sharpe"]
    assert reference["sharpe"] > held + 1.0  # IC 0.3: a toy, a strong one
    share = report["groups"]["mlp"]["reference_share"]
    mean = report["groups"]["mlp"]["summary"]["sharpe"]["mean"]
    assert share["share"] == pytest.approx((mean - held) / (reference["sharpe"] - held))
    assert share["margin"] == pytest.approx(mean - held - 0.5 * (reference["sharpe"] - held))
    assert share["lo"] is None and share["seeds"] == 1  # one seed: no interval
    assert REFERENCE not in report["groups"]["mlp"]["vs"]
    chosen = report["reference"]
    assert chosen["member"]["scale"] > 0 and chosen["described"] in proc.stdout
    assert (
        f"earns Sharpe {reference['sharpe']:.2f} after costs on the same days, {reference['sharpe'] - held:+.2f}"
        in proc.stdout
    )
    assert f"mlp: share of the reference's excess: {share['share']:.1%}; paired test of share >= 50%" in proc.stdout
    spec = json.loads((tmp_path / "p" / "spec.json").read_text())
    assert spec["base"]["data"] == f"{planted},seed=1,generator=3"
    ck = tmp_path / "p" / "cells" / "mlp-s2" / "periods" / "000" / "latest.pt"
    bt = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "backtest", "--checkpoint", str(ck), "--out", str(tmp_path / "bt")],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bt.returncode == 0, bt.stderr
    assert "on this planted market, the reference trader (" in bt.stdout and "of that excess" in bt.stdout


def test_training_diagnostics_count_each_update_once_after_a_resume_and_skip_a_torn_line(tmp_path):
    """A window killed and trained again logs its updates again (and a kill can cut a line short): the diagnostics
    are those of the uninterrupted log."""
    from clstm_ppo.study.cell import training_diagnostics

    def update(n: int, kl: float) -> str:
        return json.dumps({"kind": "update", "update": n, "approx_kl": kl, "clip_fraction": kl / 10})

    def episode(n: int, costs: float) -> str:
        return json.dumps({"kind": "episode", "episode": n, "costs": costs})

    clean = [episode(1, 10.0), episode(2, 20.0), update(1, 0.01), episode(3, 30.0), update(2, 0.02)]
    (tmp_path / "clean" / "000").mkdir(parents=True)
    (tmp_path / "clean" / "000" / "metrics.jsonl").write_text("\n".join(clean) + "\n")
    killed = [episode(1, 99.0), episode(2, 98.0), update(1, 0.9), '{"kind": "episo', *clean]
    (tmp_path / "killed" / "000").mkdir(parents=True)
    (tmp_path / "killed" / "000" / "metrics.jsonl").write_text("\n".join(killed) + "\n")
    expected = training_diagnostics(tmp_path / "clean")
    assert expected == {"final_kl": 0.02, "final_clip_fraction": 0.002, "train_episode_costs": 20.0}
    assert training_diagnostics(tmp_path / "killed") == expected


def test_report_settings_come_from_the_flags_of_study_merge_and_study_report_and_of_a_study():
    from clstm_ppo.cli.study import build_parser
    from clstm_ppo.evaluation.statistics import BOOTSTRAP_DRAWS
    from clstm_ppo.study.config import ReportSettings, StudyConfig

    flags = ["--confidence", "0.9", "--bootstrap", "300", "--ledger", "here.jsonl"]
    for command in (["report", "folder"], ["merge", "--out", "merged", "a", "b"]):
        args = vars(build_parser().parse_args([*command, *flags]))
        assert ReportSettings.from_args(args) == ReportSettings(confidence=0.9, bootstrap=300, ledger="here.jsonl")
        defaults = vars(build_parser().parse_args(command))
        assert ReportSettings.from_args(defaults) == ReportSettings(
            confidence=0.95, bootstrap=BOOTSTRAP_DRAWS, ledger=""
        )
    settings = StudyConfig.from_args(
        {"out": "s", "trade_start": "2016-03-01", "confidence": 0.8, "bootstrap": 200, "ledger": "l"}
    )
    assert settings.report_settings == ReportSettings(confidence=0.8, bootstrap=200, ledger="l")


def test_study_merge_and_study_report_refuse_a_bad_confidence_or_bootstrap_in_one_line(tmp_path, capfd, monkeypatch):
    """Before reading any folder: the same rule as a study's own flags (through the entry point the console script
    calls, in this process: tests/test_bad_inputs.py runs the same way)."""
    from clstm_ppo.cli.main import main as cli_main

    monkeypatch.chdir(tmp_path)
    ledger = ["--ledger", str(tmp_path / "ledger.jsonl")]
    for command in (["report", "nowhere"], ["merge", "--out", "merged", "nowhere"]):
        for bad in (["--confidence", "1.5"], ["--bootstrap", "50"]):
            code = cli_main(["study", *command, *bad, *ledger])
            err = capfd.readouterr().err
            line = one_error_line(subprocess.CompletedProcess([], code, "", err))
            assert "--confidence must be in (0, 1) and --bootstrap at least 100" in line, (command, bad)
    assert not (tmp_path / "merged").exists() and not (tmp_path / "ledger.jsonl").exists()


def test_the_study_settings_are_typed_and_how_it_ran_stays_out_of_its_identity(tmp_path):
    """`StudyConfig` validates every rule once, in one line; the spec keeps how the study ran (workers, threads,
    batches) beside its identity, so the same study run another way has the same identity and ledger key."""
    from clstm_ppo.study.config import StudyConfig
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.study.trials import study_key
    from envs.errors import UserError

    def settings(**given):
        return StudyConfig.from_args({"out": str(tmp_path / "s"), "trade_start": "2016-03-01", **given})

    for given, message in [
        ({"out": ""}, "--out is required"),
        ({"policies": "clstm,gru"}, "--policies clstm,gru: choose among"),
        ({"seeds": "4-2"}, "--seeds '4-2'"),
        ({"vary": ["window"]}, "window"),
        ({"shard": "3/2"}, "--shard"),
        ({"confidence": 1.5}, "--confidence must be in (0, 1)"),
        ({"batch_cells": -1}, "--batch_cells must be >= 0"),
        ({"index": str(tmp_path / "none.csv")}, "--index: file not found"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            settings(**given)
    base = TrainConfig().to_dict()
    one = StudySpec.of(settings(seeds="1-2", vary=["window=5,30"]), base)
    other = StudySpec.of(settings(seeds="1-2", vary=["window=5,30"], workers=3, threads=2, batch_cells=1), base)
    assert one.seeds == [1, 2] and [dict(v)["window"] for v in one.variants] == [5, 30]
    assert one.run_settings["workers"] == 0 and other.run_settings["workers"] == 3
    assert one.identity() == other.identity() and "run_settings" not in one.identity()
    assert study_key(one, "f") == study_key(other, "f")
    one.save(tmp_path)
    assert StudySpec.load(tmp_path).run_settings == one.run_settings
