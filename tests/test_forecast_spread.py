"""`--forecast_threshold Ksd`: a no-trade threshold in spreads of a ``--forecast_only`` policy's own stock means over
its training days, resolved to logits at deploy time (clstm_ppo.evaluation.forecast_spread)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo import cli
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.evaluation import backtest as backtest_module
from clstm_ppo.evaluation.backtest import load_backtest_data, with_forecast_threshold
from clstm_ppo.evaluation.forecast_spread import DelegatingPolicy, ForecastThreshold, pooled_spread, stock_means
from clstm_ppo.training.checkpoint import open_checkpoint, restore_market, restore_policy
from envs.errors import UserError
from tests.conftest import QUICK, QUICK_DATA, SCRIPT, clean_env


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``latest.pt`` of a QUICK run long enough (8 episodes, 4 updates, a large step) that its policy follows its
    forecast: the forecaster and then the gain that follows it are fitted, so its stock means move from day to day."""
    root = tmp_path_factory.mktemp("followed")
    argv = [*QUICK_DATA, *QUICK, "--num_episodes", "8", "--learning_rate_actor_critic", "0.05"]
    argv += ["--checkpoint_dir", str(root / "ck"), "--run_name", "f"]
    result = subprocess.run(
        [sys.executable, SCRIPT, *argv], cwd=root, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return root / "ck" / "f" / "latest.pt"


def test_the_pooled_spread_is_the_root_mean_of_each_stocks_variance_over_days() -> None:
    assert pooled_spread(np.array([[0.0, 1.0], [2.0, 3.0]])) == pytest.approx(1.0)  # each stock: variance 1
    assert pooled_spread(np.array([[0.0, 5.0], [2.0, 5.0]])) == pytest.approx(np.sqrt(0.5))  # a flat stock adds 0


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("0.3", ForecastThreshold(0.3)), ("1.75sd", ForecastThreshold(1.75, True)), ("2sd", ForecastThreshold(2.0, True))],
)
def test_a_threshold_reads_as_logits_or_as_spreads(text: str, parsed: ForecastThreshold) -> None:
    assert ForecastThreshold.parse(text) == parsed and str(parsed) == text  # and says itself as it was given


@pytest.mark.parametrize("text", ["-1", "1.75x", "sd", "two"])
def test_a_threshold_that_is_neither_is_refused_naming_both_forms(text: str) -> None:
    with pytest.raises(UserError, match=r"not a number >= 0 in logits \(0.3\) or in spreads .* \(1.75sd\)"):
        ForecastThreshold.parse(text)


def test_k_spreads_deploy_k_times_the_spread_of_the_policys_means_over_its_own_training_days(followed: Path) -> None:
    ck = open_checkpoint(followed)
    market = restore_market(ck, load_backtest_data(ck))
    means = stock_means(restore_policy(ck, market), market, ck.cfg.env)  # one row per decision: each day but the last
    train = market.split_range("train")
    assert means.shape == (train.stop - train.start - 1, len(ck.tickers))
    spread = float(np.sqrt(means.var(axis=0).mean()))
    assert spread > 0
    for k in (0.5, 2.0):
        deployed = with_forecast_threshold(ck, ForecastThreshold(k, in_spreads=True))
        assert deployed.model_config["forecast_threshold"] == pytest.approx(k * spread, rel=1e-9)
        assert deployed.config["forecast_threshold"] == deployed.model_config["forecast_threshold"]
    assert with_forecast_threshold(ck, ForecastThreshold(0.3)).model_config["forecast_threshold"] == 0.3


def test_backtest_in_spreads_trades_what_the_same_threshold_in_logits_trades_and_records_both(
    followed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["backtest", "--checkpoint", str(followed), "--threads", "1", "--forecast_threshold"]
    assert cli.main([*argv, "1.5sd", "--out", str(tmp_path / "sd")]) == 0
    report = json.loads((tmp_path / "sd" / "report.json").read_text())["metadata"]
    logits = report["forecast_threshold"]
    assert report["forecast_threshold_given"] == "1.5sd" and logits > 0
    assert cli.main([*argv, repr(logits), "--out", str(tmp_path / "logits")]) == 0
    assert cli.main([*argv, "0", "--out", str(tmp_path / "zero")]) == 0
    capsys.readouterr()
    trades = {name: pd.read_csv(tmp_path / name / "trades.csv") for name in ("sd", "logits", "zero")}
    pd.testing.assert_frame_equal(trades["sd"], trades["logits"])
    assert not trades["sd"].equals(trades["zero"])  # the threshold did change what was traded
    assert "forecast_threshold_given" not in json.loads((tmp_path / "logits" / "report.json").read_text())["metadata"]


def test_a_bad_threshold_flag_is_one_line_and_nothing_is_written(
    quick_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["backtest", "--checkpoint", str(quick_checkpoint), "--forecast_threshold", "2 spreads"]
    assert cli.main([*argv, "--out", str(tmp_path / "bt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--forecast_threshold: '2 spreads' is not a number" in err
    assert not (tmp_path / "bt").exists()


def test_spreads_of_a_policy_whose_means_do_not_move_are_refused_in_one_line(
    quick_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One update fits the forecaster but not yet the gain that follows it: the means are the learned biases alone."""
    argv = ["backtest", "--checkpoint", str(quick_checkpoint), "--forecast_threshold", "1sd"]
    assert cli.main([*argv, "--out", str(tmp_path / "bt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "do not move over its training days (spread 0" in err and "in logits" in err
    assert not (tmp_path / "bt").exists()


@pytest.mark.parametrize("gain", [[], ["--forecast_gain", "0.5"]], ids=["plain", "gain"])
def test_compare_in_spreads_scores_what_backtest_in_spreads_scores(
    followed: Path, tmp_path: Path, capsys: pytest.CaptureFixture, gain: list[str]
) -> None:
    common = ["--forecast_threshold", "1.5sd", *gain, "--threads", "1"]
    assert cli.main(["backtest", "--checkpoint", str(followed), *common, "--out", str(tmp_path / "bt")]) == 0
    assert cli.main(["compare", str(followed), *common, "--out", str(tmp_path / "cmp")]) == 0
    capsys.readouterr()
    backtest = json.loads((tmp_path / "bt" / "report.json").read_text())["metrics"]["policy"]
    comparison = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    compared = comparison["metrics"][comparison["metadata"]["checkpoints"][0]["label"]]
    assert compared["sharpe"] == backtest["sharpe"] and compared["final_value"] == backtest["final_value"]


def test_an_ensemble_in_spreads_reads_its_market_once_for_every_members_spread_and_the_backtest(
    followed: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each member's spread is measured on its own training days; members of one market share one read of it."""
    twin = tmp_path / "twin.pt"
    shutil.copyfile(followed, twin)
    reads: list[str] = []
    real_load = backtest_module.load_data

    def counted(*args, **kwargs):  # the real loader, counted
        reads.append(str(kwargs.get("source")))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(backtest_module, "load_data", counted)
    argv = ["backtest", "--checkpoint", str(followed), str(twin), "--threads", "1", "--forecast_threshold", "1.5sd"]
    assert cli.main([*argv, "--out", str(tmp_path / "ens")]) == 0
    capsys.readouterr()
    assert len(reads) == 1  # not once per member and once more for the backtest
    metadata = json.loads((tmp_path / "ens" / "report.json").read_text())["metadata"]
    alone = with_forecast_threshold(open_checkpoint(followed), ForecastThreshold(1.5, in_spreads=True))
    assert metadata["forecast_threshold"] == [alone.model_config["forecast_threshold"]] * 2


def test_a_gain_deploys_g_times_each_stock_means_distance_from_its_usual_level_in_spreads(followed: Path) -> None:
    """``--forecast_threshold 1.5sd --forecast_gain 0.5``: the deployed stock means are 0.5 x ((m - mu_i) / s - 1.5),
    with s and mu_i measured here independently of the product's code path."""
    ck = open_checkpoint(followed)
    market = restore_market(ck, load_backtest_data(ck))
    means = stock_means(restore_policy(ck, market), market, ck.cfg.env)  # [days, N] on the training days
    spread, centre = float(np.sqrt(means.var(axis=0).mean())), means.mean(axis=0)
    deployed = with_forecast_threshold(ck, ForecastThreshold(1.5, in_spreads=True, gain=0.5))
    assert deployed.model_config["forecast_threshold"] == pytest.approx(0.75)
    assert deployed.model_config["forecast_scale"] == pytest.approx(0.5 / spread, rel=1e-9)
    np.testing.assert_allclose(deployed.model_config["forecast_centre"], centre, rtol=1e-9)
    policy = restore_policy(deployed, market)
    assert isinstance(policy.spec.forecast_centre, tuple) and hash(policy.spec)  # frozen, as every other spec
    n = len(ck.tickers)
    raw = torch.randn(3, policy.spec.action_dim, dtype=torch.float64)
    expected = 0.5 * ((raw[:, :n] - torch.as_tensor(centre)) / spread - 1.5)
    torch.testing.assert_close(policy.deployed_mean(raw)[:, :n], expected)
    torch.testing.assert_close(policy.deployed_mean(raw)[:, n:], raw[:, n:])  # any gate stays


def test_backtest_with_a_gain_trades_the_centred_means_and_records_them(
    followed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["backtest", "--checkpoint", str(followed), "--threads", "1", "--forecast_threshold", "1.5sd"]
    assert cli.main([*argv, "--forecast_gain", "0.5", "--out", str(tmp_path / "gain")]) == 0
    assert cli.main([*argv, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "gain" / "report.json").read_text())
    metadata = report["metadata"]
    assert metadata["forecast_gain"] == 0.5 and metadata["forecast_threshold"] == pytest.approx(0.75)
    assert len(metadata["forecast_centre"]) == len(metadata["tickers"]) and metadata["forecast_scale"] > 0

    class Centred(DelegatingPolicy):  # the same rule, written apart from the model's deployed_mean
        def adjust(self, means: torch.Tensor) -> torch.Tensor:
            centre = torch.as_tensor(metadata["forecast_centre"], dtype=means.dtype)
            return metadata["forecast_scale"] * (means - centre) - 0.75

    ck = open_checkpoint(followed)
    market = restore_market(ck, load_backtest_data(ck))
    run = evaluate_policy(Centred(restore_policy(ck, market)), market, "test", ck.cfg.env)
    assert run.values[-1] == pytest.approx(report["metrics"]["policy"]["final_value"], rel=1e-9)
    trades = {name: pd.read_csv(tmp_path / name / "trades.csv") for name in ("gain", "plain")}
    assert not trades["gain"].equals(trades["plain"])  # the gain did change what was traded


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--forecast_gain", "0.5"], "needs --forecast_threshold in spreads"),
        (["--forecast_threshold", "0.3", "--forecast_gain", "0.5"], "needs --forecast_threshold in spreads"),
        (["--forecast_threshold", "1sd", "--forecast_gain", "0"], "--forecast_gain must be a finite number > 0"),
    ],
)
def test_a_gain_without_a_threshold_in_spreads_is_one_line(
    followed: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], says: str
) -> None:
    argv = ["backtest", "--checkpoint", str(followed), *flags, "--out", str(tmp_path / "bt")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not (tmp_path / "bt").exists()
