"""Bad input through the commands' own entry points: each case must fail with exit status 2, exactly one
``error:`` line on stderr naming the problem, no traceback, and nothing the user had changed.

The cases run in this interpreter, through the functions the console scripts call (`clstm_ppo.cli.main.main` for
``clstm-ppo``, `run_guarded` over `clstm_ppo.cli.train.main` for the train script), each in a clean working
directory without Alpaca keys, with the process state a command may touch (environment, torch threads, signal
handlers) restored after it. A few cases also run as real subprocesses, so the console path itself (the script,
``python -m clstm_ppo.cli``, exit status and stderr of a real process) stays covered.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from clstm_ppo.cli.main import main as cli_main
from clstm_ppo.cli.main import run_guarded
from clstm_ppo.cli.train import main as train_main
from envs.synthetic import generate_market
from tests.conftest import QUICK, QUICK_DATA, SCRIPT

TINY = QUICK  # the quick run's flags: "--resume" cases compare against the quick checkpoint's settings
SYN = QUICK_DATA
STUDY = (
    "study",
    "--out",
    "{d}/study",
    "--data",
    "synthetic:tickers=3,days=200",
    "--policies",
    "mlp",
    "--seeds",
    "1",
    "--window",
    "5",
    "--validation_days",
    "5",
)
SECRET_ENV = ("ALPACA_API_KEY", "ALPACA_SECRET_KEY", "APCA_API_KEY_ID", "APCA_API_SECRET_KEY")


@dataclass(frozen=True)
class Case:
    name: str
    command: str  # "train" (the train script), "cli" (clstm-ppo ...)
    args: tuple[str, ...]  # "{d}" is replaced by the folder of prepared files
    expect: str  # must appear in the error line (case-insensitive)


CASES = [
    # --- market data files
    Case("empty csv", "train", ("--data", "csv:{d}/empty.csv", *TINY), "empty"),
    Case("header only", "cli", ("data", "inspect", "{d}/header_only.csv"), "no rows"),
    Case("wrong column names", "train", ("--data", "csv:{d}/wrong_columns.csv", *TINY), "column"),
    Case("ragged csv rows", "cli", ("data", "inspect", "{d}/ragged.csv"), "ragged.csv"),
    Case("binary garbage as csv", "cli", ("data", "inspect", "{d}/garbage.csv"), "garbage.csv"),
    Case("nan prices", "train", ("--data", "csv:{d}/nan_prices.csv", *TINY), "nan"),
    Case("text in a price column", "train", ("--data", "csv:{d}/text_price.csv", *TINY), "close"),
    Case("negative prices", "cli", ("data", "inspect", "{d}/negative.csv"), "positive"),
    Case("duplicate rows", "train", ("--data", "csv:{d}/duplicates.csv", *TINY), "duplicate"),
    Case("ticker with gaps", "train", ("--data", "csv:{d}/gaps.csv", *TINY), "gap"),
    Case(
        "one bad tick (a close of 1e300)",
        "train",
        ("--data", "csv:{d}/bad_tick.csv", *TINY),
        "implausible price jump: SYN01 closed at 1e+300 on",
    ),
    Case(
        "max_price_ratio of 1 (a --config knob)",
        "train",
        (*SYN, *TINY, "--config", "{d}/ratio.json"),
        "--max_price_ratio must be > 1, or 0 to allow any jump; got 1",
    ),
    Case(
        "a flag removed in 0.2.0",
        "train",
        (*SYN, *TINY, "--forecast_skip"),
        "--forecast_skip was removed in clstm-ppo 0.2.0 (docs/training.md lists the removed settings)",
    ),
    Case(
        "a --config file holding a removed setting that would change the run",
        "train",
        (*SYN, *TINY, "--config", "{d}/removed.json"),
        "--aux_coef 1.0 was removed in clstm-ppo 0.2.0",
    ),
    Case(
        "negative weight_decay (a --config knob)",
        "train",
        (*SYN, *TINY, "--config", "{d}/decay.json"),
        "--weight_decay must be 0 or more",
    ),
    Case("bad date format", "cli", ("data", "inspect", "{d}/bad_dates.csv"), "date"),
    Case("missing data file", "train", ("--data", "csv:{d}/nope.csv", *TINY), "nope.csv"),
    Case("unknown --data scheme", "train", ("--data", "ftp://example.com/prices", *TINY), "ftp"),
    Case("unknown synthetic option", "train", ("--data", "synthetic:colour=red", *TINY), "colour"),
    Case("unknown --tickers", "train", (*SYN, "--tickers", "NOPE", *TINY), "NOPE"),
    Case("bad --train_end date", "train", (*SYN, "--train_end", "not-a-date", *TINY), "not-a-date"),
    Case(
        "missing alpaca keys",
        "train",
        ("--data", "alpaca", "--tickers", "AAPL", "--start", "2020-01-01", "--end", "2020-06-30", *TINY),
        "ALPACA_API_KEY",
    ),
    # --- flags and config
    Case("zero --num_episodes", "train", (*SYN, *TINY, "--num_episodes", "0"), "--num_episodes"),
    Case("negative --num_episodes", "train", (*SYN, *TINY, "--num_episodes", "-5"), "--num_episodes"),
    Case("--num_gpus above what exists", "train", (*SYN, *TINY, "--num_gpus", "1"), "--num_gpus 1"),
    Case("--batch_size not dividing the rollout", "train", (*SYN, *TINY, "--batch_size", "24"), "--batch_size 24"),
    Case("zero --window", "train", (*SYN, *TINY, "--window", "0"), "--window"),
    Case("--episode_length not a number", "train", (*SYN, *TINY, "--episode_length", "long"), "--episode_length"),
    Case("a float flag given text", "train", (*SYN, *TINY, "--learning_rate_clstm", "fast"), "learning_rate_clstm"),
    Case("unknown flag", "train", (*SYN, *TINY, "--nope", "1"), "--nope"),
    Case("unknown --track", "train", (*SYN, *TINY, "--track", "tensorboard"), "--track"),
    Case("bad --config json", "train", ("--config", "{d}/bad.json", *SYN, *TINY), "bad.json"),
    Case("--config with an unknown key", "train", ("--config", "{d}/unknown_key.json", *SYN, *TINY), "learning_rat"),
    Case("missing --config file", "train", ("--config", "{d}/none.json", *SYN, *TINY), "none.json"),
    Case("unknown sub-command", "cli", ("trian",), "trian"),
    # every command answers a flag it does not know in one line, not with its usage text
    Case("backtest unknown flag", "cli", ("backtest", "--checkpoint", "{d}/ck/good/latest.pt", "--bogus"), "--bogus"),
    Case("compare unknown flag", "cli", ("compare", "{d}/ck/good/latest.pt", "--bogus"), "--bogus"),
    Case("trade unknown flag", "cli", ("trade", "--checkpoint", "{d}/ck/good/latest.pt", "--bogus"), "--bogus"),
    Case("trade report unknown flag", "cli", ("trade", "report", "--journal", "{d}/journal", "--bogus"), "--bogus"),
    Case("plot unknown flag", "cli", ("plot", "{d}/ck/good", "--bogus"), "--bogus"),
    Case("doctor unknown flag", "cli", ("doctor", "--bogus"), "--bogus"),
    Case("data unknown flag", "cli", ("data", "inspect", "{d}/bad_dates.csv", "--bogus"), "--bogus"),
    # --- studies
    Case(
        "study trade window after the data", "cli", (*STUDY, "--trade_start", "2031-01-01"), "after the data's last day"
    ),
    Case(
        "study training window too short",
        "cli",
        (*STUDY, "--trade_start", "2014-01-20"),
        "first training window is too short",
    ),
    Case(
        "study grid above --max_cells",
        "cli",
        (*STUDY, "--trade_start", "2014-06-02", "--seeds", "1-6", "--max_cells", "5"),
        "more than --max_cells",
    ),
    Case(
        "study folder under a regular file",
        "cli",
        (*STUDY, "--trade_start", "2014-06-02", "--out", "{d}/a_file/s"),
        "a_file",
    ),
    Case("study shard 5/4", "cli", (*STUDY, "--trade_start", "2014-06-02", "--shard", "5/4"), "--shard 5/4"),
    Case(
        "study varying the data",
        "cli",
        (*STUDY, "--trade_start", "2014-06-02", "--vary", "tickers=A,B"),
        "the study sets tickers",
    ),
    Case("study unknown policy", "cli", (*STUDY, "--trade_start", "2014-06-02", "--policies", "cnn"), "--policies"),
    # --- checkpoints and run folders
    Case(
        "--resume latest with no run",
        "train",
        (*SYN, *TINY, "--checkpoint_dir", "{d}/empty_ck", "--resume", "latest"),
        "no run",
    ),
    Case("--resume missing path", "train", (*SYN, *TINY, "--resume", "{d}/missing.pt"), "missing.pt"),
    Case(
        "--resume another universe",
        "train",
        (
            "--data",
            "synthetic:tickers=5,days=200",
            *TINY,
            "--checkpoint_dir",
            "{d}/ck2",
            "--resume",
            "{d}/ck/good/latest.pt",
        ),
        "trained on 3 tickers",
    ),
    Case(
        "--resume another model size",
        "train",
        (*SYN, *TINY, "--stage2_hidden", "32", "--checkpoint_dir", "{d}/ck2", "--resume", "{d}/ck/good/latest.pt"),
        "--stage2_hidden 16 (now 32)",
    ),
    Case(
        "--resume truncated checkpoint",
        "train",
        (*SYN, *TINY, "--checkpoint_dir", "{d}/ck2", "--resume", "{d}/truncated.pt"),
        "truncated.pt",
    ),
    Case(
        "backtest another universe",
        "cli",
        (
            "backtest",
            "--checkpoint",
            "{d}/ck/good/latest.pt",
            "--data",
            "synthetic:tickers=5,days=200",
            "--out",
            "{d}/bt",
        ),
        "ticker",
    ),
    Case(
        "backtest truncated checkpoint",
        "cli",
        ("backtest", "--checkpoint", "{d}/truncated.pt", "--out", "{d}/bt"),
        "truncated.pt",
    ),
    Case(
        "backtest file that is not a checkpoint",
        "cli",
        ("backtest", "--checkpoint", "{d}/not_a_checkpoint.pt", "--out", "{d}/bt"),
        "not_a_checkpoint.pt is not a readable clstm-ppo checkpoint",
    ),
    Case(
        "backtest torch file of another kind",
        "cli",
        ("backtest", "--checkpoint", "{d}/other_torch.pt", "--out", "{d}/bt"),
        "other_torch.pt",
    ),
    Case("backtest missing checkpoint", "cli", ("backtest", "--checkpoint", "{d}/missing.pt"), "missing.pt"),
    Case(
        "backtest a 0.1.0 checkpoint trained with a removed setting",
        "cli",
        ("backtest", "--checkpoint", "{d}/old/latest.pt", "--out", "{d}/bt"),
        "--skip True was removed in clstm-ppo 0.2.0 (the last version with it: 0.1.0",
    ),
    Case(
        "backtest bad --start date",
        "cli",
        ("backtest", "--checkpoint", "{d}/ck/good/latest.pt", "--start", "someday", "--out", "{d}/bt"),
        "someday",
    ),
    Case(
        "checkpoint folder under a regular file", "train", (*SYN, *TINY, "--checkpoint_dir", "{d}/a_file/ck"), "a_file"
    ),
    Case(
        "backtest --out under a regular file",
        "cli",
        ("backtest", "--checkpoint", "{d}/ck/good/latest.pt", "--out", "{d}/a_file/report"),
        "a_file",
    ),
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV and not k.startswith("CLSTM_PPO_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, quick_checkpoint: Path) -> Path:
    d = tmp_path_factory.mktemp("bad_inputs")
    frame = generate_market(num_tickers=2, num_days=120, seed=3).to_frame()
    good = frame.to_csv(index=False)
    lines = good.splitlines()
    _write(d / "empty.csv", "")
    _write(d / "header_only.csv", lines[0] + "\n")
    _write(d / "wrong_columns.csv", good.replace("date,tic,", "day,symbol_name,", 1))
    _write(d / "ragged.csv", "\n".join(lines[:5] + ['2015-01-01,"SYN00,1,2', "1,2,3,4,5,6,7,8,9,10"] + lines[5:]))
    (d / "garbage.csv").write_bytes(bytes(range(256)) * 40)
    nan = frame.copy()
    nan.loc[10:12, "close"] = float("nan")
    _write(d / "nan_prices.csv", nan.to_csv(index=False))
    text = frame.astype({"close": object})
    text.loc[7, "close"] = "abc"
    _write(d / "text_price.csv", text.to_csv(index=False))
    negative = frame.copy()
    negative.loc[20, ["open", "high", "low", "close"]] = -5.0
    _write(d / "negative.csv", negative.to_csv(index=False))
    _write(d / "duplicates.csv", "\n".join(lines + lines[1:4]) + "\n")
    tick = frame.copy()
    tick.loc[(tick["tic"] == "SYN01").to_numpy().nonzero()[0][50], ["open", "high", "close"]] = 1e300
    _write(d / "bad_tick.csv", tick.to_csv(index=False))
    gaps = frame[~((frame["tic"] == "SYN01") & frame.index.isin(range(40, 60)))]
    _write(d / "gaps.csv", gaps.to_csv(index=False))
    dates = frame.copy()
    dates["date"] = dates["date"].dt.strftime("%Y-%m-%d").astype(object)
    dates.loc[15, "date"] = "2015-13-45"
    _write(d / "bad_dates.csv", dates.to_csv(index=False))
    _write(d / "bad.json", '{"num_envs": 4,,}')
    _write(d / "unknown_key.json", '{"learning_rat": 0.1}')
    _write(d / "not_a_checkpoint.pt", "hello, I am text\n")
    torch.save({"weights": torch.zeros(3)}, d / "other_torch.pt")
    _write(d / "a_file", "a regular file where a folder should be\n")
    (d / "empty_ck").mkdir()
    # one real checkpoint (3 tickers, tiny model) for the universe / size / truncation cases
    (d / "ck" / "good").mkdir(parents=True)
    blob = quick_checkpoint.read_bytes()
    (d / "ck" / "good" / "latest.pt").write_bytes(blob)
    (d / "truncated.pt").write_bytes(blob[: len(blob) // 2])
    (d / "old").mkdir()  # 0.1.0's default network: shortcuts around the LSTMs (--skip), removed since
    old = torch.load(quick_checkpoint, weights_only=True)
    old["config"]["skip"] = True
    old["model_config"]["skip"] = True
    del old["version"]
    torch.save(old, d / "old" / "latest.pt")
    _write(d / "removed.json", '{"aux_coef": 1.0}')
    _write(d / "ratio.json", '{"max_price_ratio": 1}')
    _write(d / "decay.json", '{"weight_decay": -0.1}')
    return d


@dataclass
class Outcome:
    code: int
    out: str
    err: str


def _args(case: Case, d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in case.args]


def _in_process(case: Case, d: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    """Run one case through the entry point its console script calls; restore what a command may change."""
    cwd = d / "cwd"
    cwd.mkdir(exist_ok=True)  # no .env here: the Alpaca case must see no keys
    environ, threads = dict(os.environ), torch.get_num_threads()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with monkeypatch.context() as mp:
        mp.chdir(cwd)
        for name in [*SECRET_ENV, *(n for n in os.environ if n.startswith("CLSTM_PPO_"))]:
            mp.delenv(name, raising=False)
        try:
            args = _args(case, d)
            code = run_guarded(train_main, args) if case.command == "train" else cli_main(args)
        finally:
            os.environ.clear()
            os.environ.update(environ)
            torch.set_num_threads(threads)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    cap = capfd.readouterr()
    return Outcome(code, cap.out, cap.err)


def _subprocess(case: Case, d: Path) -> Outcome:
    """Run one case as the user does: a new Python process, the console script or ``python -m clstm_ppo.cli``."""
    args = _args(case, d)
    cmd = [sys.executable, SCRIPT, *args] if case.command == "train" else [sys.executable, "-m", "clstm_ppo.cli", *args]
    cwd = d / "cwd"
    cwd.mkdir(exist_ok=True)
    result = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)
    return Outcome(result.returncode, result.stdout, result.stderr)


def _problem(case: Case, outcome: Outcome) -> str | None:
    """Why ``outcome`` is not one clear line for ``case`` (None when it is)."""
    errors = [line for line in outcome.err.splitlines() if line.startswith("error:")]
    ok = (
        outcome.code == 2
        and "Traceback" not in outcome.err + outcome.out
        and len(errors) == 1
        and case.expect.lower() in errors[0].lower()
    )
    return None if ok else f"{case.name}: exit {outcome.code}, stderr:\n{outcome.err[-1500:]}"


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


SUBPROCESS_CASES = ("unknown flag", "backtest missing checkpoint", "unknown sub-command")
"""Also run as real processes: the train script, and ``python -m clstm_ppo.cli`` twice."""


def test_bad_inputs_fail_with_one_clear_line(
    files: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _digests(files)
    problems = [p for case in CASES if (p := _problem(case, _in_process(case, files, capfd, monkeypatch)))]
    assert len(CASES) >= 20
    assert not problems, "\n\n".join(problems)
    after = _digests(files)
    assert {k: after.get(k) for k in before} == before  # every prepared file is still there, unchanged


def test_bad_inputs_through_real_processes(files: Path) -> None:
    cases = [c for c in CASES if c.name in SUBPROCESS_CASES]
    assert len(cases) == len(SUBPROCESS_CASES)
    with ThreadPoolExecutor(2) as pool:  # the box has 2 cores
        outcomes = list(pool.map(lambda c: _subprocess(c, files), cases))
    problems = [p for case, outcome in zip(cases, outcomes, strict=True) if (p := _problem(case, outcome))]
    assert not problems, "\n\n".join(problems)
