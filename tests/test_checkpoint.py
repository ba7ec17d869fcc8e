"""Checkpoints written by earlier versions keep working: loading, backtesting to the same numbers, resuming; and a
checkpoint records the data it was trained on, so a synthetic market generated differently is refused.

``tests/fixtures/checkpoint_format1_pre_layout.pt`` was written before the package was arranged by stage
(see tests/fixtures/README.md for the command and the numbers its backtest gave then), and before generator versions
were recorded: its ``synthetic:...`` source means generator 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from clstm_ppo.cli.main import main as cli_main
from clstm_ppo.cli.train import parse_config
from clstm_ppo.market import load_data
from clstm_ppo.training.checkpoint import load_checkpoint, open_checkpoint, restore_market, restore_policy
from clstm_ppo.training.own_market import own_source
from clstm_ppo.training.resume import check_resume
from clstm_ppo.training.run_folder import resolve_run_dir
from envs.errors import UserError
from envs.fingerprint import data_fingerprint, market_witness
from envs.sources import load_market_data
from envs.synthetic import GENERATOR_VERSION
from tests.conftest import QUICK_DATA, ROOT, TINY, VALUE_RTOL, clean_env, read_metrics, run_here

FIXTURE = ROOT / "tests" / "fixtures" / "checkpoint_format1_pre_layout.pt"
# The flags it was trained with (tests/fixtures/README.md): TINY with 32 episodes.
# The settings the fixture was trained with, whose defaults have changed since (a resume must repeat them).
THEN = ["--action_mode", "shares", "--reward", "value", "--ent_coef", "0.01", "--execution", "close"]
THEN += ["--turnover_penalty", "0", "--use_turbulence"]
THEN_CONFIG = {"action_dist": "gaussian", "log_std_max": float("inf")}
"""The config-only knobs among those settings: a ``--config`` file sets them."""


def then_flags(folder) -> list[str]:
    """THEN, with THEN_CONFIG written to a ``--config`` file in ``folder``."""
    path = folder / "then.json"
    path.write_text(json.dumps(THEN_CONFIG))
    return ["--config", str(path), *THEN]


FINAL_VALUES_THEN = (998156.5636585176, 1000569.8560440058)  # its 2 sampled test-split episodes, seed 0


def test_an_old_checkpoint_opens_and_rebuilds_its_policy_and_market():
    ckpt = open_checkpoint(FIXTURE)
    assert ckpt.policy == "clstm" and ckpt.window == 5 and len(ckpt.tickers) == 4
    assert ckpt.counters["episodes"] == 32
    assert ckpt.market_spec["data"] == {"generator": 1}  # none recorded: generator 1, the only one then
    assert own_source(ckpt) == "synthetic:tickers=4,days=400,generator=1"
    market = restore_market(ckpt, load_data(ckpt.cfg.data, seed=ckpt.cfg.run.seed))
    policy = restore_policy(ckpt, market)
    assert policy.spec.window == market.window == 5 and policy.spec.num_tickers == 4


def test_an_old_checkpoint_backtests_to_the_numbers_it_gave_when_written(tmp_path):
    out = tmp_path / "bt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clstm_ppo.cli",
            "backtest",
            "--checkpoint",
            str(FIXTURE),
            "--out",
            str(out),
            "--stochastic",
            "--episodes",
            "2",
            "--seed",
            "0",
            "--threads",
            "1",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((out / "report.json").read_text())["stochastic"]["runs"]
    assert [r["final_value"] for r in runs] == pytest.approx(FINAL_VALUES_THEN, rel=VALUE_RTOL)


@pytest.mark.slow
def test_training_resumes_from_an_old_checkpoint(tmp_path):
    run = tmp_path / "ck" / "pre"
    run.mkdir(parents=True)
    shutil.copy(FIXTURE, run / "latest.pt")
    then = then_flags(tmp_path)
    from clstm_ppo.market import build_market

    args = [*TINY, *then, "--num_episodes", "32", "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "pre"]
    today = parse_config([*args, "--resume", "latest"])  # synthetic:... now means generator 3: another market
    with pytest.raises(
        UserError, match="trained on synthetic generator 1; give --data synthetic:tickers=4,days=400,generator=1 "
    ):
        check_resume(today, build_market(today.data, seed=today.run.seed), resolve_run_dir(today.run, "clstm"))
    then += ["--data", "synthetic:tickers=4,days=400,generator=1"]
    cfg = parse_config([*args, *then[-2:], "--resume", "latest"])
    market = build_market(cfg.data, seed=cfg.run.seed)
    assert check_resume(cfg, market, resolve_run_dir(cfg.run, cfg.model.policy)) == run / "latest.pt"
    pre = ["--num_episodes", "48", "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "pre", "--resume", "latest"]
    changed = run_here(["train", *TINY, *then[-2:], *pre, "--norm_obs"], tmp_path)
    assert changed.returncode != 0 and "Traceback" not in changed.stderr  # today's defaults: refused in one line
    assert (
        "--action_mode shares (now weights)" in changed.stderr and "--action_dist gaussian (now tanh)" in changed.stderr
    )
    assert "--execution close (now auto)" in changed.stderr
    assert "--norm_obs False (now True)" in changed.stderr  # a model field a flag decides: named by its flag
    proc = run_here(["train", *TINY, *then, *pre], tmp_path)
    assert proc.returncode == 0, proc.stderr
    episodes, _ = read_metrics(run)
    assert [e["episode"] for e in episodes][:1] == [33] and episodes[-1]["episode"] == 48
    assert load_checkpoint(run / "latest.pt").counters["episodes"] == 48


def test_a_resume_must_keep_what_gives_actions_and_rewards_meaning_but_not_what_both_runs_leave_inert():
    from clstm_ppo.training.resume import resume_must_match

    def must(then: list[str], now: list[str]) -> set[str]:
        return set(resume_must_match(parse_config(then), parse_config(now)))

    weights, shares = ["--action_mode", "weights"], ["--action_mode", "shares"]
    both_weights = must(weights, weights)
    assert {"rebalance_band", "buy_cost_pct", "reward", "turnover_penalty", "price_features"} <= both_weights
    assert not {"hmax", "reward_scaling", "episode_length"} & both_weights  # target weights, log-return reward
    both_shares = must(shares, shares)
    assert "hmax" in both_shares and "rebalance_band" not in both_shares  # 0.2.3's paper runs resume under 0.2.4
    assert {"hmax", "rebalance_band", "action_mode"} <= must(shares, weights)  # modes differ: nothing is inert in both
    assert "reward_scaling" in must(["--reward", "value"], ["--reward", "value"])


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch, capsys):
    """A shell loop that starts several seeds at once: each run claims its generated folder (NAME, NAME-2, ...),
    so no run writes into another's; the held-out line names each run's own checkpoint."""
    from clstm_ppo import cli
    from clstm_ppo.training import run_folder
    from tests.conftest import QUICK, QUICK_DATA

    monkeypatch.setattr(run_folder, "_timestamp", lambda: "20260101-000000")
    monkeypatch.chdir(tmp_path)
    for seed in (1, 2):
        assert cli.main(["train", *QUICK_DATA, *QUICK, "--seed", str(seed), "--checkpoint_dir", "ck"]) == 0
    out = capsys.readouterr().out
    first, second = tmp_path / "ck" / "clstm-20260101-000000", tmp_path / "ck" / "clstm-20260101-000000-2"
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [first.name, second.name]
    assert [load_checkpoint(d / "latest.pt").cfg.run.seed for d in (first, second)] == [1, 2]
    assert f"--checkpoint ck/{second.name}/best.pt" in out or f"{second.name}/latest.pt" in out
    assert run_folder.claim_run_dir(first) == first.with_name(first.name + "-3")  # the next free name, created
    assert first.with_name(first.name + "-3").is_dir()


def test_a_checkpoint_records_its_data_and_refuses_a_market_generated_otherwise(quick_checkpoint, tmp_path, capfd):
    """The record: the data's fingerprint, first and last day, generator and witness closes. A market generated again
    with other bits but the same closes to 1e-9 (numpy's exp rounds its last bit by CPU) is the same market; one whose
    closes differ is refused in one line."""
    ck = open_checkpoint(quick_checkpoint)
    record = ck.market_spec["data"]
    source = QUICK_DATA[1]
    data = load_market_data(source, seed=ck.cfg.run.seed)
    assert record == {
        "fingerprint": data_fingerprint(data),
        "first": data.date_str(0),
        "last": data.date_str(-1),
        "generator": GENERATOR_VERSION,
        "witness": market_witness(data),
    }
    assert own_source(ck) == f"{source},generator={GENERATOR_VERSION}"

    def backtest_with(record: dict, name: str) -> tuple[int, str, str]:
        raw = torch.load(quick_checkpoint, weights_only=True)
        raw["market_spec"]["data"] = record
        path = tmp_path / f"{name}.pt"
        torch.save(raw, path)
        code = cli_main(["backtest", "--checkpoint", str(path), "--out", str(tmp_path / name), "--threads", "1"])
        return code, *capfd.readouterr()

    other_cpu = {**record, "fingerprint": "0" * 20}  # other bits, the same closes: another CPU's rounding
    assert backtest_with(other_cpu, "other-cpu")[0] == 0
    moved = json.loads(json.dumps(record["witness"]))
    moved["close"][3][0] *= 1 + 1e-6  # a price changed: another market
    code, out, err = backtest_with({**other_cpu, "witness": moved}, "changed")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err
    changed = tmp_path / "changed.pt"
    assert f"{changed}: {source},generator={GENERATOR_VERSION} (seed {ck.cfg.run.seed}) no longer generates" in err
    assert not (tmp_path / "changed").exists()
    code, _, err = backtest_with({k: v for k, v in other_cpu.items() if k != "witness"}, "no-witness")
    assert code == 2 and "no longer generates" in err  # a record without a witness (0.2.x) needs the same bits


def test_resume_refuses_other_data_than_the_checkpoint_was_trained_on(quick_checkpoint, tmp_path):
    """The checkpoint records its data's fingerprint and witness: a resume on data that is not that data (here: the
    record changed, as if the generator or the file had) is refused in one line before any worker starts; the same
    closes with other last bits (another CPU) are the same data."""
    import torch

    from clstm_ppo.market import build_market
    from tests.conftest import QUICK, QUICK_DATA

    run = tmp_path / "ck" / "q"
    run.mkdir(parents=True)
    raw = torch.load(quick_checkpoint, weights_only=True)
    cfg = parse_config([*QUICK_DATA, *QUICK, "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "q"])
    cfg = cfg.with_settings(resume="latest")
    market = build_market(cfg.data, seed=cfg.run.seed)
    torch.save(raw, run / "latest.pt")
    assert check_resume(cfg, market, run) == run / "latest.pt"  # the same data: fine
    raw["market_spec"]["data"]["fingerprint"] = "0" * 20
    torch.save(raw, run / "latest.pt")
    assert check_resume(cfg, market, run) == run / "latest.pt"  # other bits, the same witness closes: fine
    raw["market_spec"]["data"]["witness"]["close"][0][0] *= 2
    torch.save(raw, run / "latest.pt")
    with pytest.raises(UserError, match="this run's data .* is not the data it was trained on"):
        check_resume(cfg, market, run)


def test_a_weights_only_checkpoint_backtests_alike_and_resume_refuses_it_in_one_line(quick_checkpoint, tmp_path):
    """`keep_weights_only` (what a study does to each window it has traded): the optimizer, scaler and worker states
    go, the weights and everything a reader needs stay bit for bit, a second call changes nothing, the backtest is
    the full file's, and ``--resume`` is refused before any worker starts, naming the way to start from it."""
    from clstm_ppo.market import build_market
    from clstm_ppo.training.checkpoint import keep_weights_only
    from tests.conftest import QUICK

    run = tmp_path / "ck" / "q"
    run.mkdir(parents=True)
    slim = shutil.copy(quick_checkpoint, run / "latest.pt")
    full = load_checkpoint(quick_checkpoint)
    assert full.optimizer_state is not None and full.worker_states is not None
    saved = keep_weights_only(slim)
    kept = load_checkpoint(slim)
    assert saved > 0 and slim.stat().st_size + saved == quick_checkpoint.stat().st_size
    assert kept.optimizer_state is None and kept.worker_states is None and kept.scaler_state is None
    assert kept.model_state.keys() == full.model_state.keys()
    assert all(torch.equal(kept.model_state[k], v) for k, v in full.model_state.items())
    assert (kept.config, kept.market_spec, kept.counters) == (full.config, full.market_spec, full.counters)
    assert keep_weights_only(slim) == 0  # already weights only: not rewritten

    for ck, out in ((quick_checkpoint, "bt_full"), (slim, "bt_slim")):
        code = cli_main(["backtest", "--checkpoint", str(ck), "--out", str(tmp_path / out), "--threads", "1"])
        assert code == 0
    reports = [json.loads((tmp_path / out / "report.json").read_text()) for out in ("bt_full", "bt_slim")]
    assert reports[0]["metrics"] == reports[1]["metrics"]

    cfg = parse_config([*QUICK_DATA, *QUICK, "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", "q"])
    cfg = cfg.with_settings(resume="latest")
    with pytest.raises(UserError, match=r"holds the network's weights only .* \{\"init_weights\": \""):
        check_resume(cfg, build_market(cfg.data, seed=cfg.run.seed), run)
