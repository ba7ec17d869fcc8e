"""Several seeds from one command (``--seed 1-2``): each seed's folder holds its run alone, the last line gives the
seeds' mean with its interval and their ensemble, and the folder backtests, compares and trades as one ensemble."""

from __future__ import annotations

import json
import re

import pytest

from clstm_ppo.cli.train import split_seed_flag
from clstm_ppo.evaluation.backtest import open_members
from envs.errors import UserError
from tests.conftest import assert_same_run, read_metrics, train

pytestmark = pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")

SHORT = ["--num_episodes", "8", "--log_every", "1000"]
SEEDS_LINE = re.compile(
    r"\[seeds\] held-out test .*: 2 seeds' latest\.pt Sharpe (-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\] \(mean, 95% over "
    r"seeds; each (-?[\d.]+), (-?[\d.]+)\) \| their ensemble Sharpe (-?[\d.]+) \[.*\] \(95% over days\), .* \| "
    r"buy-and-hold Sharpe .* \| the ensemble .* buy-and-hold .* \| full report: clstm-ppo backtest --checkpoint "
)


@pytest.mark.slow
def test_a_seed_range_trains_each_seed_as_its_run_alone_and_the_folder_is_an_ensemble(tmp_path):
    pair = train(tmp_path, *SHORT, "--seed", "1-2", "--run_name", "pair", here=True)
    assert pair.returncode == 0, pair.stderr
    out = pair.stdout
    # the source names no seed=: both seeds train on seed 1's market, and the command says so in one line
    assert (
        "[seeds] seeds 1-2 share the synthetic market of seed 1 (synthetic:tickers=4,days=400,seed=1,generator=3)"
        in out
    )
    assert "[seed 1] done: 8 episodes" in out and "[seed 2] done: 8 episodes" in out
    folder = tmp_path / "ck" / "pair"
    manifest = json.loads((folder / "seeds.json").read_text())
    assert manifest == {"seeds": [{"seed": s, "checkpoint": f"seed-{s}/latest.pt"} for s in (1, 2)]}
    # seed 2 of the batch is seed 2 trained alone on that market (up to the batch's float rounding)
    same_market = ["--data", "synthetic:tickers=4,days=400,seed=1,generator=3"]
    alone = train(tmp_path, *SHORT, "--seed", "2", *same_market, "--run_name", "alone", here=True)
    assert alone.returncode == 0, alone.stderr
    assert_same_run(tmp_path / "ck" / "alone", folder / "seed-2")
    # the last line: the seeds' mean inside their interval, and the ensemble
    match = SEEDS_LINE.search(out)
    assert match, out[-1500:]
    mean, lo, hi, first, second = (float(match.group(k)) for k in range(1, 6))
    assert lo <= mean <= hi and abs(mean - (first + second) / 2) < 0.006
    # the folder is the ensemble of its seeds' deployed checkpoints, wherever a checkpoint list is taken
    assert [c.path for c in open_members([folder])] == [
        folder / "seed-1" / "latest.pt",
        folder / "seed-2" / "latest.pt",
    ]
    from clstm_ppo.cli.backtest import main as backtest

    reports = []
    for name, given in [
        ("folder", [str(folder)]),
        ("files", [str(folder / f"seed-{s}" / "latest.pt") for s in (1, 2)]),
    ]:
        assert backtest(["--checkpoint", *given, "--out", str(tmp_path / name), "--threads", "1"]) == 0
        reports.append(json.loads((tmp_path / name / "report.json").read_text()))
    assert reports[0]["metrics"] == reports[1]["metrics"]
    assert len(reports[0]["metadata"]["ensemble"]) == 2
    # the ensemble's Sharpe in the last line is the backtest's
    assert abs(float(match.group(6)) - reports[0]["metrics"]["policy"]["sharpe"]) < 0.006


def test_seeds_on_two_ranks_train_each_seed_as_its_run_alone_on_two_ranks(tmp_path):
    """``--seed 1-2 --num_workers 2``: every rank holds both seeds and its own envs of each, and each seed's gradients
    are averaged over the ranks in the update, as DDP averages a run's: seed 2 of the batch is seed 2 trained alone on
    the same 2 ranks (DDP), its checkpoint holding both ranks' states, up to float rounding. Each seed anneals its
    learning rates by its own counters, on every rank alike (`Seed.anneal`)."""
    data = ["--data", "synthetic:tickers=4,days=400,seed=1,generator=3", "--anneal_lr", "--num_episodes", "16"]
    pair = train(tmp_path, *SHORT, *data, "--seed", "1-2", "--num_workers", "2", "--run_name", "pair")
    assert pair.returncode == 0, pair.stderr
    out = pair.stdout
    assert "[seed 2] replicas in sync: 2 ranks hold identical weights" in out, out[-1500:]
    assert "[seed 1] done: 16 episodes" in out and "world size 2" in out
    alone = train(tmp_path, *SHORT, *data, "--seed", "2", "--num_workers", "2", "--run_name", "alone")
    assert alone.returncode == 0, alone.stderr
    assert_same_run(tmp_path / "ck" / "alone", tmp_path / "ck" / "pair" / "seed-2")
    assert (tmp_path / "ck" / "pair" / "seeds.json").is_file()
    for seed in (1, 2):
        lrs = [u["lr_clstm"] for u in read_metrics(tmp_path / "ck" / "pair" / f"seed-{seed}")[1]]
        assert len(lrs) >= 2 and lrs == sorted(set(lrs), reverse=True), lrs


def test_a_folder_without_finished_seeds_is_named_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(UserError, match="is a folder, not a checkpoint, and holds no finished seeds"):
        open_members([tmp_path / "run"])
    (tmp_path / "run" / "seeds.json").write_text("{not json")
    with pytest.raises(UserError, match="is not a seeds manifest"):
        open_members([tmp_path / "run"])


def test_the_seed_flag_takes_the_studys_syntax():
    assert split_seed_flag(["--seed", "1-3", "--gamma", "0.9"]) == (["--seed", "1", "--gamma", "0.9"], [1, 2, 3])
    assert split_seed_flag(["--seed=4,6-7"]) == (["--seed=4"], [4, 6, 7])
    assert split_seed_flag(["--seed", "5"]) == (["--seed", "5"], None)
    assert split_seed_flag(["--num_episodes", "8"]) == (["--num_episodes", "8"], None)
    with pytest.raises(UserError, match="--seed '3-1': expected a number, or numbers and ranges"):
        split_seed_flag(["--seed", "3-1"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "1-2", "--resume", "latest"], "--resume needs --run_name"),
        (["--seed", "1-2", "--run_name", "x", "--resume", "a.pt"], "--resume takes latest or best"),
        (["--seed", "1,x"], "--seed '1,x': expected a number"),
    ],
    ids=["resume-name", "resume-path", "syntax"],
)
def test_what_several_seeds_cannot_do_is_one_line(tmp_path, args, message):
    result = train(tmp_path, *SHORT, *args, here=True)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
