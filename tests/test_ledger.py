"""The trials ledger, data fingerprints and seals: appends that survive kills, damaged lines reported and skipped,
the same market recognised across reloads, seals refused or recorded; bad input answered in one line."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from clstm_ppo.evaluation.holdout import guard, make_seal, sealed_hits
from clstm_ppo.evaluation.ledger import Ledger, count_trials, record, same_data_trials, same_data_tried
from envs.errors import UserError
from envs.fingerprint import agreeing_tickers, data_fingerprint, market_witness
from envs.sources import load_market_data
from envs.synthetic import generate_market
from tests.conftest import run_here


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``clstm-ppo ARGS`` in ``cwd``, in this interpreter (`tests.conftest.run_here`)."""
    return run_here(list(args), cwd)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a refused command (and no traceback)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def trial(key: str, sharpe_daily: float, **fields) -> dict:
    values = dict(
        config=f"c-{key}",
        study="s",
        fingerprint="f",
        first="2020-01-01",
        last="2020-06-30",
        num_days=120,
        sharpe=sharpe_daily * 252**0.5,
        sharpe_daily=sharpe_daily,
        active_sharpe=0.0,
        active_sharpe_daily=0.0,
    )
    return record("trial", key, **{**values, **fields})


# ---------------------------------------------------------------------------------------------- the file


def test_appends_are_idempotent_and_a_torn_last_line_is_reported_skipped_and_never_glued_to(tmp_path, capsys):
    path = tmp_path / "deep" / "ledger.jsonl"
    ledger = Ledger(path)
    assert ledger.records() == [] and not path.exists()  # reading never creates the file
    assert ledger.append([trial("a", 0.1), trial("b", 0.2)]) == 2
    assert Ledger(path).append([trial("a", 0.1)]) == 0  # the same key again: not counted twice
    with open(path, "ab") as f:  # a process killed half-way through a record
        f.write(b'{"kind": "trial", "key": "c", "sharpe_da')
    again = Ledger(path)
    assert [r["key"] for r in again.records()] == ["a", "b"]
    assert capsys.readouterr().err == (
        f"warning: {path} line 3: the last line is cut short (a write interrupted, e.g. by a killed process); skipped\n"
    )
    assert again.append([trial("d", 0.3)]) == 1
    capsys.readouterr()
    assert [r["key"] for r in Ledger(path).records()] == ["a", "b", "d"]
    # still reported, now as a damaged middle line
    assert capsys.readouterr().err == f"warning: {path} line 3: not JSON; skipped\n"
    assert all(json.loads(line) for line in path.read_text().splitlines()[3:])


def test_a_ledger_sees_what_another_process_appended_and_reports_a_bad_line_once(tmp_path, capsys):
    path = tmp_path / "ledger.jsonl"
    path.write_text("garbage\n")
    mine, theirs = Ledger(path), Ledger(path)
    assert mine.records() == []
    theirs.append([trial("a", 0.1)])  # another study, appending at the same time
    assert capsys.readouterr().err == f"warning: {path} line 1: not JSON; skipped\n" * 2  # each ledger's own
    assert [r["key"] for r in mine.records()] == ["a"]
    mine.append([trial("b", 0.2)])
    theirs.append([trial("c", 0.3)])
    assert [r["key"] for r in mine.records("trial")] == ["a", "b", "c"]
    assert capsys.readouterr().err == ""  # once, however often the file is read again


@pytest.mark.parametrize(
    "line, problem",
    [
        ("not json at all", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"kind": "pizza", "key": "x"}', "unknown record kind 'pizza'"),
        ('{"kind": "trial", "key": "x", "config": "c"}', "a trial record without study, fingerprint"),
    ],
)
def test_a_corrupt_line_is_reported_with_its_number_and_skipped(tmp_path, capsys, line, problem):
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps(trial("a", 0.1)) + "\n" + line + "\n" + json.dumps(trial("b", 0.2)) + "\n")
    assert [r["key"] for r in Ledger(path).records()] == ["a", "b"]
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {path} line 2: {problem}")


@pytest.mark.slow
def test_a_corrupt_ledger_line_is_one_warning_through_the_command_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps(trial("a", 0.1)) + "\n{oops\n")
    proc = cli(
        tmp_path,
        "study",
        "seal",
        "--data",
        "synthetic:tickers=2,days=300",
        "--from",
        "2015-01-02",
        "--ledger",
        str(ledger),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: {ledger} line 2: not JSON; skipped"]
    assert "sealed 2015-01-02 .." in proc.stdout
    lines = ledger.read_text().splitlines()
    assert lines[1] == "{oops" and json.loads(lines[2])["kind"] == "seal"  # kept, and the seal after it


@pytest.mark.slow
@pytest.mark.parametrize("command", ["seal", "study"])
def test_a_ledger_that_cannot_be_written_is_one_clear_line(tmp_path, command):
    (tmp_path / "a_file").write_text("x")
    bad = str(tmp_path / "a_file" / "ledger.jsonl")  # its folder is a regular file
    args = {
        "seal": ["study", "seal", "--data", "synthetic:tickers=2,days=300", "--from", "2015-01-02"],
        "study": [
            "study",
            *("--out", "s", "--data", "synthetic:tickers=2,days=300", "--trade_start", "2014-09-01"),
            *("--window", "5", "--validation_days", "5", "--policies", "mlp", "--seeds", "1"),
        ],
    }[command]
    line = one_error_line(cli(tmp_path, *args, "--ledger", bad))
    assert f"cannot write the ledger {bad}" in line and "--ledger" in line
    assert not (tmp_path / "s" / "spec.json").exists()  # refused before anything was written
    assert "is a folder" in one_error_line(cli(tmp_path, *args, "--ledger", str(tmp_path)))


# -------------------------------------------------------------------------------------------- fingerprints


def test_the_fingerprint_is_the_datas_not_its_files_and_the_witness_spans_date_ranges(tmp_path):
    data = generate_market(num_tickers=3, num_days=300, seed=4)
    data.to_frame().to_csv(tmp_path / "m.csv", index=False)
    reloaded = load_market_data(f"csv:{tmp_path / 'm.csv'}")
    assert data_fingerprint(reloaded) == data_fingerprint(data)  # a CSV and the same data reloaded
    assert data_fingerprint(data.select_tickers(list(reversed(data.tickers)))) == data_fingerprint(data)
    changed = data.to_frame()
    changed.loc[5, "close"] *= 1.0001
    changed.loc[5, "high"] = max(changed.loc[5, "high"], changed.loc[5, "close"])
    changed.to_csv(tmp_path / "changed.csv", index=False)
    assert data_fingerprint(load_market_data(f"csv:{tmp_path / 'changed.csv'}")) != data_fingerprint(data)
    shorter = load_market_data(f"csv:{tmp_path / 'm.csv'}", end=str(data.dates[200])[:10])
    assert data_fingerprint(shorter) != data_fingerprint(data)
    # the same market over fewer days: the witness days they share agree, ticker by ticker
    assert agreeing_tickers(market_witness(shorter), market_witness(data)) == (list(data.tickers), [])
    other = generate_market(num_tickers=3, num_days=300, seed=5)  # same ticker names, other prices
    assert agreeing_tickers(market_witness(other), market_witness(data)) == ([], list(data.tickers))


def test_trials_count_on_the_same_data_and_overlapping_days_only(tmp_path):
    data = generate_market(num_tickers=3, num_days=300, seed=4)
    witness, fp = market_witness(data), data_fingerprint(data)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    other = generate_market(num_tickers=3, num_days=300, seed=5)
    ledger.append(
        [
            record(
                "study",
                "same-market",
                fingerprint="old",
                tickers=list(data.tickers),
                witness=witness,
                first="2014-06-02",
                last="2014-12-31",
                configurations=[],
            ),
            record(
                "study",
                "other-market",
                fingerprint="x",
                tickers=list(data.tickers),
                witness=market_witness(other),
                first="2014-06-02",
                last="2014-12-31",
                configurations=[],
            ),
            trial("t1", 0.10, fingerprint=fp, first="2014-06-02", last="2014-09-30", config="A"),
            trial("t2", 0.05, fingerprint=fp, first="2014-09-01", last="2014-12-31", config="A"),
            trial("t3", -0.02, fingerprint="old", study="same-market", first="2014-07-01", last="2014-08-29"),
            trial("t4", 0.30, fingerprint=fp, first="2013-01-01", last="2013-12-31"),  # other days
            trial("t5", 0.30, fingerprint="x", study="other-market", first="2014-07-01", last="2014-08-29"),
            trial("t6", 0.30, fingerprint="y", study="unknown", first="2014-07-01", last="2014-08-29"),
            # one cell recorded twice: on a machine whose numpy rounded the market's last bits otherwise (another
            # fingerprint, the same market by its witness), then here; and another seed of it, which is a trial
            *(
                trial(
                    key, 0.07, fingerprint=f, study=s, cell="mlp-s1", config="B", first="2014-07-01", last="2014-10-31"
                )
                for key, f, s in (("t7", "old", "same-market"), ("t8", fp, "s"))
            ),
            trial("t9", 0.07, fingerprint=fp, cell="mlp-s2", config="B", first="2014-07-01", last="2014-10-31"),
        ]
    )
    found = same_data_trials(
        ledger, fingerprint=fp, tickers=list(data.tickers), witness=witness, first="2014-08-01", last="2014-10-31"
    )
    assert sorted(t["key"] for t in found) == ["t1", "t2", "t3", "t7", "t9"]
    n = count_trials(found)
    assert (n.num_trials, n.num_configurations) == (5, 3)
    assert n.sharpe_variance_daily == pytest.approx(np.var([0.10, 0.05, -0.02, 0.07, 0.07], ddof=1))


def test_trials_tried_outside_the_ledger_count_on_their_days_of_their_market(tmp_path):
    data = generate_market(num_tickers=3, num_days=300, seed=4)
    path = tmp_path / "bars.csv"
    data.to_path(path)
    ledger_file = tmp_path / "ledger.jsonl"
    tried = ["study", "tried", "--data", f"csv:{path}", "--ledger", str(ledger_file)]
    days = ["--from", "2014-06-02", "--to", "2014-09-30"]
    what = ["--trials", "60", "--configurations", "15", "--what", "rounds 1-6, docs/changes.md"]
    proc = cli(tmp_path, *tried, *days, *what)
    assert proc.returncode == 0 and "recorded: 60 trials of 15 configurations" in proc.stdout, proc.stderr
    again = cli(tmp_path, *tried, *days, *what)
    assert again.returncode == 0 and "already recorded" in again.stdout
    ledger = Ledger(ledger_file)
    ledger.append([trial("t1", 0.10, fingerprint=data_fingerprint(data), first="2014-06-02", last="2014-09-30")])
    shorter = data.slice_days(0, 280)  # the same market to an earlier day: the same data, another fingerprint
    planted = dataclasses.replace(data, columns={"alpha": np.ones(data.close.shape)})

    def counted(market, first: str, last: str) -> tuple[int, int]:
        where = dict(fingerprint=data_fingerprint(market), tickers=list(market.tickers), witness=market_witness(market))
        found = same_data_trials(ledger, **where, first=first, last=last)
        n = count_trials(found, same_data_tried(ledger, **where, first=first, last=last))
        return n.num_trials, n.num_configurations

    assert counted(data, "2014-09-01", "2014-12-31") == (61, 16)
    assert counted(shorter, "2014-09-01", "2014-12-31") == (60, 15)  # t1's fingerprint is the whole data's
    assert counted(shorter, "2014-10-01", "2014-12-31") == (0, 0)  # other days
    assert counted(planted, "2014-09-01", "2014-12-31") == (0, 0)  # a planted column: another market
    bad = ["--trials", "3", "--configurations", "4", "--what", "x"]
    assert "no fewer trials" in one_error_line(cli(tmp_path, *tried, *days, *bad))
    later = ["--from", "2030-01-02", "--to", "2030-09-30", *what]
    assert "outside the data" in one_error_line(cli(tmp_path, *tried, *later))


# -------------------------------------------------------------------------------------------------- seals


def test_a_seal_covers_the_same_market_loaded_with_a_later_end_date_and_counts_its_looks(tmp_path):
    data = generate_market(num_tickers=3, num_days=400, seed=4)
    data.to_frame().to_csv(tmp_path / "m.csv", index=False)
    early = load_market_data(f"csv:{tmp_path / 'm.csv'}", end=str(data.dates[299])[:10])
    ledger = Ledger(tmp_path / "ledger.jsonl")
    sealed_from = str(data.dates[250])[:10]
    ledger.append([make_seal(early, "csv:m.csv", sealed_from)])
    last = str(data.dates[-1])[:10]
    later = load_market_data(f"csv:{tmp_path / 'm.csv'}")  # the file with more days than when it was sealed
    (hit,) = sealed_hits(ledger, market_witness(later), str(data.dates[200])[:10], last)
    assert (hit.first, hit.last, hit.tickers) == (sealed_from, last, list(data.tickers))
    assert sealed_hits(ledger, market_witness(later), str(data.dates[100])[:10], str(data.dates[249])[:10]) == []
    other = generate_market(num_tickers=3, num_days=400, seed=5)
    assert sealed_hits(ledger, market_witness(other), sealed_from, last) == []  # same names, another market
    with pytest.raises(UserError, match=f"{sealed_from} .. {last} of this data are sealed .*--unseal"):
        guard(ledger, later, sealed_from, last, unseal=False, command="backtest", look="a", what="a.pt")
    for look in ("a", "a", "b"):  # the same look twice is one unseal
        (summary,) = guard(ledger, later, sealed_from, last, unseal=True, command="backtest", look=look, what=look)
    assert summary["unsealed"] == 2 and len(ledger.records("unseal")) == 2


@pytest.mark.slow
def test_a_seal_outside_the_data_is_refused_in_one_line(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    proc = cli(
        tmp_path,
        "study",
        "seal",
        "--data",
        "synthetic:tickers=2,days=300",
        "--from",
        "2030-01-02",
        "--ledger",
        str(ledger),
    )
    assert "--from 2030-01-02 is outside the data (2014-01-02 .. " in one_error_line(proc)
    assert not ledger.exists()


@pytest.mark.parametrize(
    "start, end, message",
    [
        ("2000-01-03", "", "--from 2000-01-03 is outside the data"),
        ("2014-06-02", "2031-01-01", "--to 2031-01-01 is outside the data"),
        ("2014-06-02", "2014-03-03", "--to 2014-03-03 is before --from 2014-06-02"),
        ("2014-06-07", "2014-06-08", "no trading day of the data lies in 2014-06-07 .. 2014-06-08"),  # a weekend
        ("someday", "", "--from 'someday' is not a date"),
    ],
)
def test_seal_periods_the_data_does_not_hold_are_refused(start, end, message):
    data = generate_market(num_tickers=2, num_days=300, seed=1)
    with pytest.raises(UserError, match=re.escape(message)):
        make_seal(data, "synthetic", start, end)


def test_a_configurations_key_ignores_what_does_not_change_numbers_and_settings_a_release_adds(monkeypatch):
    """Two cells differ in their key exactly when a setting that changes numbers differs; a setting at the value an
    older file without it is read as (a new setting's legacy meaning) leaves the key as it was."""
    from clstm_ppo.config import TrainConfig
    from clstm_ppo.migrate import LEGACY
    from clstm_ppo.study.grid import Cell
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.study.trials import config_key

    def key(**base):
        spec = StudySpec(
            base=TrainConfig().with_settings(**base).to_dict(),
            policies=["clstm"],
            seeds=[1],
            variants=[],
            trade_start="2020-01-02",
            trade_end="",
            retrain="none",
            retrain_from="warm",
            validation_days=63,
            retrain_episodes=0,
        )
        return config_key(spec, Cell("clstm", 1))

    today = key()
    assert key(tensorboard=True, track="wandb", threads=3, log_every=7) == today  # numbers unchanged
    assert key(gamma=0.9) != today and key(execution="close") != key(execution="next_open")
    # A release before --execution existed had no such setting: its fills were the close (LEGACY), so the key of
    # a close-fill configuration is the key that release computed.
    closes = key(execution="close")
    assert LEGACY["execution"] == "close" != TrainConfig().env.execution and closes != today
    to_dict = TrainConfig.to_dict
    monkeypatch.setattr(
        TrainConfig, "to_dict", lambda self: {k: v for k, v in to_dict(self).items() if k != "execution"}
    )
    assert key() == closes


def test_a_configurations_key_does_not_move_when_a_default_changes():
    """The key the ledger gave 0.2.0's default configuration (its yardstick study's spec.json, written by 0.2.0) is
    the key today's code gives it, and 0.2.1's (the same spec but for its new default, ``init_log_std`` -2) has
    another. Before `LEGACY` held the old defaults, a key left out every setting at today's default: 0.2.1's
    study got 0.2.0's key and the ledger counted its trials as repeats (and 0.2.4's band those of 0.2.3)."""
    from clstm_ppo.study.spec import StudySpec
    from clstm_ppo.study.trials import config_key

    fixtures = Path(__file__).parent / "fixtures" / "ledger_keys"
    v020, v021 = StudySpec.load(fixtures / "v0.2.0"), StudySpec.load(fixtures / "v0.2.1")
    recorded_by_020 = "be072491a62eddb2"  # the "config" of that study's record in the team's ledger
    assert config_key(v020, v020.cells()[0]) == recorded_by_020
    assert config_key(v021, v021.cells()[0]) != recorded_by_020
