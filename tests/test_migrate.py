"""The one place for the past (`clstm_ppo.migrate`): settings, networks, checkpoints and study specs of earlier
releases read as this release reads them, step by step, and refused in one line where they hold a removed setting
in effect."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from clstm_ppo import __version__, migrate
from clstm_ppo.agent.spec import ModelSpec
from clstm_ppo.cli.main import main as cli_main
from clstm_ppo.cli.train import parse_config
from clstm_ppo.config import PAPER_BEHAVIOUR, TrainConfig, preset
from clstm_ppo.market import build_market
from clstm_ppo.migrate import LEGACY
from clstm_ppo.training.checkpoint import load_checkpoint, open_checkpoint
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.own_market import regenerated, trained_on
from clstm_ppo.training.resume import check_resume
from clstm_ppo.training.trainer import Trainer
from envs.errors import UserError
from envs.fingerprint import data_fingerprint
from envs.libm import reference_rounding
from tests.conftest import ROOT, SHARPE_ATOL, TINY, VALUE_RTOL, small_model


def recorded(values: dict, source: str = "checkpoint") -> TrainConfig:
    """The settings of a checkpoint or a study spec that stored ``values``."""
    return TrainConfig.from_dict(migrate.recorded_settings(values, source), source=source)


def test_a_checkpoint_without_newer_settings_keeps_the_meaning_they_had():
    old = recorded({"gamma": 0.98})
    for flag, value in LEGACY.items():
        assert old.to_dict()[flag] == value, flag
    assert {k: old.to_dict()[k] for k in PAPER_BEHAVIOUR} == {k: preset("paper").to_dict()[k] for k in PAPER_BEHAVIOUR}
    assert recorded({"action_mode": "weights"}).env.action_mode == "weights"  # stored wins


@pytest.mark.parametrize(
    "old, now",
    [
        ({"skip": False, "aux_coef": 0.0, "forecast_skip": False, "forecaster": "head", "forecast_only": False}, {}),
        (
            {"policy": "shared", "forecast_skip": None, "forecaster": "auto", "forecast_only": None},
            {"policy": "shared"},
        ),
        ({"ema_decay": 0.0, "permute_tickers": False, "turbulence_exit_days": 1, "stage1": "lstm"}, {}),
        ({"trade_rate": 1.0, "trade_gate": False}, {}),
        ({"forecast_days": 5, "aux_coef": 0.0, "forecast_skip": False}, {}),  # the days fed nothing: no effect
        ({"cross_section": "attention", "policy": "clstm"}, {"policy": "clstm"}),  # shared's only
    ],
)
def test_removed_settings_at_the_value_now_always_used_load_as_before(old, now):
    assert recorded(old) == recorded(now)


@pytest.mark.parametrize(
    "old, flag",
    [
        ({"skip": True}, "skip"),
        ({"aux_coef": 1.0}, "aux_coef"),
        ({"forecast_skip": None, "policy": "clstm"}, "forecast_skip"),  # 0.1.0's default: on for clstm
        ({"ema_decay": 0.98}, "ema_decay"),
        ({"turbulence_exit_days": 3}, "turbulence_exit_days"),
        ({"permute_tickers": True}, "permute_tickers"),
        ({"price_features": "vol_return"}, "price_features"),
        ({"stage1": "conv"}, "stage1"),
        ({"trade_rate": 0.25}, "trade_rate"),
    ],
)
def test_removed_settings_that_would_change_the_result_are_refused_in_one_line(old, flag):
    with pytest.raises(UserError) as err:
        recorded(old, source="checkpoint ck.pt")
    text = str(err.value)
    assert text.startswith(f"checkpoint ck.pt: --{flag} ") and "removed in clstm-ppo 0.2.0" in text
    assert "0.1.0" in text and "\n" not in text


def test_folded_settings_fold_into_track_and_the_alpaca_data_spec():
    old = {"track": "wandb", "wandb_project": "p", "wandb_entity": "team", "data": "alpaca", "alpaca_feed": "sip"}
    cfg = recorded({**old, "alpaca_adjustment": "all", "alpaca_timeframe": "1Day"})
    assert cfg.run.track == "wandb:team/p" and cfg.data.source == "alpaca:feed=sip"
    assert cfg.data.alpaca_options == {"feed": "sip", "adjustment": "all", "timeframe": "1Day"}
    assert recorded({"track": "none", "wandb_project": "p"}).run.track == "none"
    for bad in ("wandb:a/b/c", "mlflow", "none:x"):
        with pytest.raises(UserError, match="--track"):
            TrainConfig.from_dict({"track": bad}).validate()
    with pytest.raises(UserError, match="unknown alpaca option 'fee'"):
        TrainConfig.from_dict({"data": "alpaca:fee=sip"}).validate()
    with pytest.raises(UserError, match="feed must be one of iex, sip"):
        TrainConfig.from_dict({"data": "alpaca:feed=x"}).validate()


def test_old_network_specs_load_at_the_values_now_built_and_are_refused_otherwise():
    """A 0.1.0 checkpoint's network fields removed in 0.2.0 load where they hold what every network is now (no
    shortcuts, no next-day head, no forecast) and are refused in one line naming the flag where they do not; a spec
    from before ``action_dist`` existed meant the paper's Gaussian."""
    model = small_model("clstm")
    old = {
        **model.spec.to_dict(),
        "stage1": "lstm",
        "skip": False,
        "next_day_head": False,
        "cross_section": "mean",
        "forecast_skip": False,
        "forecaster": "head",
        "forecast_only": False,
        "forecast_threshold": 0.0,
    }
    assert ModelSpec.from_dict(migrate.network(old, "ck.pt")) == model.spec
    for field, value, flag in (
        ("skip", True, "skip"),
        ("next_day_head", True, "aux_coef"),
        ("forecast_skip", True, "forecast_skip"),
    ):
        with pytest.raises(UserError, match=f"built with --{flag}, removed in clstm-ppo 0.2.0"):
            migrate.network({**old, field: value}, "ck.pt")
    then = ModelSpec.from_dict(
        migrate.network({k: v for k, v in old.items() if k not in ("action_dist", "log_std_max")}, "ck.pt")
    )
    assert then.action_dist == "gaussian" and then.log_std_max is None


def old_raw(**overrides) -> dict:
    """A checkpoint as 0.1.0 stored it, in miniature: no release, the reward normaliser's moments in the counters and
    each env's discounted return in the state, an mlp's recurrent state as nothing, no price column, no data record."""
    raw = {
        "format_version": 1,
        "config": {"data": "synthetic:tickers=2", "policy": "mlp", "norm_reward": True, "forecast_skip": False},
        "model_config": {"policy": "mlp", "forecast_skip": False},
        "market_spec": {"normalization": {"mean": [0.0]}, "tickers": ["A", "B"], "window": 5},
        "counters": {"update": 3, "reward_moments": [12.0, 0.5, 2.0]},
        "worker_states": [
            {"next_obs": torch.zeros(4, 5, 3), "discounted": torch.arange(4.0).double(), "recurrent": []}
        ],
    }
    return {**raw, **overrides}


def test_a_0_1_0_checkpoint_is_upgraded_step_by_step_into_this_release_s_shape():
    up = migrate.checkpoint(old_raw(), "ck.pt")
    assert up["version"] == "0.1.0"  # the release that wrote it, kept
    assert "forecast_skip" not in up["config"] and up["config"]["deploy"] == LEGACY["deploy"] == "best"
    assert up["model_config"] == {"policy": "mlp", **migrate.NETWORK_LEGACY}
    assert up["market_spec"]["normalization"]["price_mode"] == "level"
    assert up["market_spec"]["data"] == {"generator": 1}  # a synthetic market before versions were recorded
    state = up["worker_states"][0]
    assert state["reward_norm"]["moments"] == [12.0, 0.5, 2.0] and "reward_moments" not in up["counters"]
    assert torch.equal(state["reward_norm"]["discounted"], torch.arange(4.0).double()) and "discounted" not in state
    assert [tuple(t.shape) for t in state["recurrent"]] == [(1, 4, 0)] * 4
    assert up["counters"]["update"] == 3
    # a state that never normalised rewards starts the normaliser afresh, as the loaders did
    bare = migrate.checkpoint(old_raw(counters={}, worker_states=[{"next_obs": torch.zeros(2, 5, 3)}]), "ck.pt")
    assert bare["worker_states"][0]["reward_norm"]["moments"] == list(migrate.START_MOMENTS)


def test_steps_run_only_for_files_written_before_their_release():
    """A 0.2.x file keeps what 0.2.0's step would rewrite (it cannot hold 0.1.0's shapes), and gets the settings
    added since; a file of this release is returned as it is."""
    raw = old_raw(version="0.2.7", worker_states=None)
    up = migrate.checkpoint(raw, "ck.pt")
    assert up["counters"] == raw["counters"] and "price_mode" not in up["market_spec"]["normalization"]
    assert up["config"]["rebalance_band"] == LEGACY["rebalance_band"] and up["config"]["forecast_skip"] is False
    now = old_raw(version=__version__, worker_states=None)
    assert migrate.checkpoint(now, "ck.pt") == now
    assert migrate.release("0.2.10") > migrate.release("0.2.9") > migrate.release("0.1.0")


def test_a_removed_setting_in_effect_refuses_the_checkpoint_in_one_line():
    config = {**old_raw()["config"], "forecast_skip": None, "policy": "clstm"}  # 0.1.0's default: the linear forecast
    with pytest.raises(UserError) as err:
        migrate.checkpoint(old_raw(config=config), "ck.pt")
    assert str(err.value).startswith("checkpoint ck.pt: --forecast_skip ") and "\n" not in str(err.value)


def test_the_legacy_values_are_the_paper_s_behaviour_and_the_old_defaults():
    assert {k: LEGACY[k] for k in PAPER_BEHAVIOUR} == PAPER_BEHAVIOUR
    default = TrainConfig().to_dict()
    assert all(flag in default for flag in LEGACY)


def test_an_old_study_spec_and_trading_record_read_as_this_release_writes_them():
    spec = migrate.study_spec({"base": {"gamma": 0.9, "skip": False}, "seeds": [1]})
    assert spec["base"]["deploy"] == "best" and "skip" not in spec["base"] and spec["seeds"] == [1]
    dates = np.array(["2020-01-02", "2020-01-03", "2020-01-06"], dtype="datetime64[ns]")
    prices = np.array([[1.0], [2.0], [3.0]])
    record = migrate.traded_record({"prices": prices}, dates)
    assert record["fill_prices"].tolist() == [[1.0], [1.0], [2.0]] and record["fill_dates"][2] == dates[1]
    assert migrate.traded_record(record, dates) is record


# ------------------------------------------------------------------ checkpoints written by released versions
OLD = ROOT / "tests" / "fixtures" / "old_versions"  # its README.md: the commands; made.json: what each code gave
MADE = json.loads((OLD / "made.json").read_text())
RELEASED = ("v010", "v020", "v027")  # 8bcb3cf (0.1.0, every removed setting at the value now used), 0.2.0, 10fadb1
RESUME_WITH = {  # the settings they were trained with whose defaults have changed since (a resume repeats them)
    "v010": ["--rebalance_band", "0.01", "--turnover_penalty", "0", "--use_turbulence"],
    "v020": ["--rebalance_band", "0.01", "--use_turbulence"],
    "v027": ["--use_turbulence"],
}


def released_backtest(name: str, out: Path) -> tuple[list[float], float]:
    """The fixture ``name``'s sampled backtest (two episodes, seed 0): its final values; and its deterministic
    backtest's Sharpe ratio."""
    common = ["backtest", "--checkpoint", str(OLD / f"{name}.pt"), "--threads", "1"]
    assert cli_main([*common, "--out", str(out / "s"), "--stochastic", "--episodes", "2", "--seed", "0"]) == 0
    runs = json.loads((out / "s" / "report.json").read_text())["stochastic"]["runs"]
    assert cli_main([*common, "--out", str(out / "d")]) == 0
    sharpe = json.loads((out / "d" / "report.json").read_text())["metrics"]["policy"]["sharpe"]
    return [r["final_value"] for r in runs], sharpe


@pytest.mark.parametrize("name", RELEASED)
def test_a_released_version_s_checkpoint_backtests_to_the_numbers_that_version_gave(name, tmp_path, capsys):
    """Its sampled backtest ends its two episodes at the values its own release computed and its deterministic
    backtest has that release's Sharpe ratio, to the tolerances of figures made on another machine (`VALUE_RTOL`,
    `SHARPE_ATOL`)."""
    made = MADE[name]
    assert load_checkpoint(OLD / f"{name}.pt").version == made["version"]
    values, sharpe = released_backtest(name, tmp_path)
    assert values == pytest.approx(made["old_final_values"], rel=VALUE_RTOL)
    assert sharpe == pytest.approx(float(made["old_deterministic_sharpe"]), abs=SHARPE_ATOL)


@pytest.mark.parametrize("name", ("v020", "v027"))
def test_a_0_2_checkpoint_without_a_witness_travels_to_a_cpu_that_rounds_otherwise(
    name, tmp_path, capsys, another_cpus_rounding
):
    """0.2.x recorded only its synthetic market's fingerprint. On a CPU whose numpy rounds exp and log otherwise
    (`tests.conftest.nudged`) the same seed gives other bits, and migrate's rule (`unwitnessed_market_matches`)
    finds the market by generating it again in the C library's rounding: the checkpoint backtests to its release's
    figures (`VALUE_RTOL`), compares and resumes. A market with one price changed by 1e-6 of itself is refused."""
    made = MADE[name]
    ck = open_checkpoint(OLD / f"{name}.pt")
    record = ck.market_spec["data"]
    assert "witness" not in record  # what the rule is for
    here = regenerated(ck)
    assert data_fingerprint(here) != record["fingerprint"]  # this CPU's bits are not the recorded ones
    with reference_rounding():
        assert data_fingerprint(regenerated(ck)) == record["fingerprint"]
    values, sharpe = released_backtest(name, tmp_path)
    assert values == pytest.approx(made["old_final_values"], rel=VALUE_RTOL)
    assert sharpe == pytest.approx(float(made["old_deterministic_sharpe"]), abs=SHARPE_ATOL)
    assert cli_main(["compare", str(OLD / f"{name}.pt"), str(OLD / f"{name}.pt"), "--out", str(tmp_path / "c")]) == 0
    assert trained_on(ck, here)
    changed = dataclasses.replace(here, close=here.close.copy())
    changed.close[17, 1] *= 1 + 1e-6  # not a witness day: every price counts
    assert not trained_on(ck, changed)
    run = tmp_path / "ck" / name
    run.mkdir(parents=True)
    shutil.copy(OLD / f"{name}.pt", run / "latest.pt")
    generator = made["synthetic_generator"]
    args = [*TINY, *RESUME_WITH[name], "--data", f"synthetic:tickers=4,days=400,generator={generator}"]
    args += ["--checkpoint_dir", str(tmp_path / "ck"), "--run_name", name, "--resume", "latest"]
    cfg = parse_config(args)
    assert check_resume(cfg, build_market(cfg.data, seed=cfg.run.seed), run) == run / "latest.pt"


def test_a_default_0_1_0_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    """0.1.0's default network (the linear-forecast actor, skip connections, the next-day head) is not today's."""
    code = cli_main(["backtest", "--checkpoint", str(OLD / "v010_default.pt"), "--out", str(tmp_path / "bt")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert "--skip True was removed in clstm-ppo 0.2.0" in err and "8bcb3cf" in err


@pytest.mark.slow
@pytest.mark.parametrize("name", RELEASED)
def test_a_released_version_s_checkpoint_resumes_with_the_settings_it_was_trained_with(name, tmp_path):
    """It resumes on the market it was trained on (its generator named) with its settings repeated; the 0.1.0 one
    trains on, and its next checkpoint is written in this release's shape."""
    run = tmp_path / "ck" / name
    run.mkdir(parents=True)
    shutil.copy(OLD / f"{name}.pt", run / "latest.pt")
    generator = MADE[name]["synthetic_generator"]
    args = [*TINY, *RESUME_WITH[name], "--data", f"synthetic:tickers=4,days=400,generator={generator}"]
    args += ["--num_episodes", "48", "--checkpoint_dir", str(tmp_path / "ck"), "--run_name", name, "--resume", "latest"]
    cfg = parse_config(args)
    market = build_market(cfg.data, seed=cfg.run.seed)
    assert check_resume(cfg, market, run) == run / "latest.pt"
    today = parse_config([*args, "--data", "synthetic:tickers=4,days=400"])  # today's generator: another market
    with pytest.raises(UserError, match=f"trained on synthetic generator {generator}; give --data .*generator="):
        check_resume(today, build_market(today.data, seed=today.run.seed), run)
    if name != "v010":
        return
    (counters,) = Trainer([cfg], market, Comm(), [run]).train()
    assert counters.episodes >= 48 and counters.update > load_checkpoint(OLD / "v010.pt").counters["update"]
    assert load_checkpoint(run / "latest.pt").version == __version__
