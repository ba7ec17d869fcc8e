"""``--policy shared``: one encoder for every ticker and a cross-sectional stage (`clstm_ppo.agent.shared`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo import cli
from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.shared import ticker_windows
from clstm_ppo.market import build_market
from clstm_ppo.training.checkpoint import open_checkpoint, refit_market, restore_policy
from envs.data import MarketData
from envs.errors import UserError
from envs.sources import load_market_data
from tests.conftest import QUICK, fake_rollout, net_spec, small_model

K = 3  # indicators in these tests' states: F = 1 + (2 + K) N


def shared_model(tickers: int = 4, **fields) -> ActorCritic:
    torch.manual_seed(0)
    spec = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14)
    return make_policy(net_spec("shared", 1 + (2 + K) * tickers, tickers, 5, **{**spec, **fields}))


def permute_tickers(obs: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Observations ``[..., F]`` with the tickers of every block of N in the order ``perm``."""
    n = perm.numel()
    blocks = obs[..., 1:].reshape(*obs.shape[:-1], 2 + K, n)[..., perm]
    return torch.cat([obs[..., :1], blocks.reshape(*obs.shape[:-1], -1)], dim=-1)


def test_each_ticker_sees_its_own_columns_and_the_cash():
    n = 4
    obs = torch.arange(3 * 5 * (1 + (2 + K) * n), dtype=torch.float32).reshape(3, 5, -1)
    tickers = ticker_windows(obs, K)
    assert tickers.shape == (3, n, 5, 3 + K)
    layout_cols = [1 + b * n + 2 for b in range(2 + K)]  # ticker 2's price, holding and indicator columns
    torch.testing.assert_close(tickers[:, 2, :, :-1], obs[..., layout_cols])
    torch.testing.assert_close(tickers[:, 2, :, -1], obs[..., 0])


def test_permuting_the_tickers_permutes_the_actions_and_keeps_the_value():
    model = shared_model()
    obs = torch.randn(2, 3, 5, 1 + (2 + K) * 4)  # [L, B, T, F]
    state, starts = model.initial_state(3), torch.zeros(2, 3, dtype=torch.bool)
    perm = torch.tensor([2, 0, 3, 1])
    base = model(obs, state, starts)
    moved = model(permute_tickers(obs, perm), state, starts)
    torch.testing.assert_close(moved.mean, base.mean[..., perm], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(moved.value, base.value, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(base.mean[..., 0], base.mean[..., 1])  # the tickers are not all treated alike


def test_the_same_weights_act_on_any_number_of_tickers():
    small, wide = shared_model(tickers=3), shared_model(tickers=50)
    assert sum(p.numel() for p in small.parameters()) == sum(p.numel() for p in wide.parameters())
    wide.load_state_dict(small.state_dict())  # identical parameter shapes: weights move between universes
    for n in (3, 7):
        obs = torch.randn(1, 2, 5, 1 + (2 + K) * n)
        out = small(obs, small.initial_state(2), torch.ones(1, 2, dtype=torch.bool))
        assert out.mean.shape == (1, 2, n) and out.value.shape == (1, 2) and out.log_prob.shape == (1, 2)
        torch.testing.assert_close(wide(obs, wide.initial_state(2), torch.ones(1, 2, dtype=torch.bool)).mean, out.mean)
    assert small.initial_state(2).actor_h.shape == (1, 2, 0)  # no recurrence across days


def test_the_update_recomputes_the_rollouts_log_probs_and_values():
    model = small_model("shared", action_dist="tanh")
    buf = fake_rollout(model)
    out = model(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
    torch.testing.assert_close(out.log_prob, buf.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.value, buf.values, rtol=1e-5, atol=1e-5)
    stage1 = {id(p) for p in model.stage1_parameters()}
    assert id(model.shared.window_lstm.weight_ih_l0) in stage1 and id(model.log_std) not in stage1


def test_a_shared_policy_trains_and_backtests_and_refuses_norm_obs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = ["--data", "synthetic:tickers=3,days=200"]
    run = ["--policy", "shared", *QUICK, *data, "--checkpoint_dir", str(tmp_path), "--run_name", "s"]
    assert cli.main(["train", *run]) == 0
    assert "held-out test" in capsys.readouterr().out
    assert cli.main(["backtest", "--checkpoint", str(tmp_path / "s" / "best.pt"), "--out", str(tmp_path / "bt")]) == 0
    report = json.loads((tmp_path / "bt" / "report.json").read_text())
    assert report["metrics"]["policy"]["num_days"] > 10
    capsys.readouterr()
    code = cli.main(["train", *run[:-1], "s2", "--norm_obs"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--policy shared cannot use it" in err
    assert not (tmp_path / "s2").exists()


# ------------------------------------------------------------------- another universe (backtest --new_universe)

# 420 days: the training split (70%) holds days with the turbulence index's 252-day history, so the threshold the
# refit fits is finite.
TRAINED_ON = "synthetic:tickers=3,days=420,seed=1"
WIDER = "synthetic:tickers=5,days=420,seed=2"  # other prices, and SYN03, SYN04 the checkpoint never saw


@pytest.fixture(scope="module")
def shared_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``best.pt`` of one QUICK ``--policy shared`` run on TRAINED_ON (3 tickers), shared read-only; with the turbulence
    stop, whose threshold the refit tests follow."""
    root = tmp_path_factory.mktemp("shared_checkpoint")
    run = ["--policy", "shared", *QUICK, "--data", TRAINED_ON, "--checkpoint_dir", str(root), "--run_name", "s"]
    run += ["--use_turbulence"]
    assert cli.main(["train", *run]) == 0
    return root / "s" / "best.pt"


def scaled_prices(data: MarketData, days: slice, factor: float) -> MarketData:
    """``data`` with its open, high, low and close multiplied by ``factor`` on ``days`` (bars stay consistent)."""
    out = {}
    for name in ("open", "high", "low", "close"):
        prices = getattr(data, name).copy()
        prices[days] *= factor
        out[name] = prices
    return dataclasses.replace(data, **out)


def test_a_shared_checkpoint_backtests_on_tickers_it_never_saw(
    shared_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "bt"
    argv = ["backtest", "--checkpoint", str(shared_checkpoint), "--data", WIDER, "--new_universe", "--out", str(out)]
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert "| 5 tickers |" in said and "new universe: 5 tickers (trained on 3)" in said
    meta = json.loads((out / "report.json").read_text())["metadata"]
    assert meta["new_universe"] is True and meta["policy"] == "shared"
    assert meta["tickers"] == [f"SYN0{i}" for i in range(5)] and meta["trained_tickers"] == ["SYN00", "SYN01", "SYN02"]
    assert meta["period_source"] == "test split"
    fit = meta["refitted"]
    test_start = open_checkpoint(shared_checkpoint).market_spec["splits"]["test"]["start"]
    assert fit["days"] > 200 and fit["end"] < test_start  # refitted on training days, before the traded ones
    traded = set(pd.read_csv(out / "trades.csv")["ticker"])
    assert {"SYN03", "SYN04"} <= traded


def test_the_refit_sees_the_new_datas_training_days_only(shared_checkpoint: Path) -> None:
    ck = open_checkpoint(shared_checkpoint)
    own = refit_market(ck, load_market_data(TRAINED_ON)).to_spec()  # on its own data: what training fitted
    assert {k: own[k] for k in ("normalization", "turbulence_threshold", "splits")} == {
        k: ck.market_spec[k] for k in ("normalization", "turbulence_threshold", "splits")
    }
    data = load_market_data(WIDER)
    market = refit_market(ck, data)
    trained = build_market(ck.cfg.data, seed=ck.cfg.run.seed, data=data)  # what training fits on this data
    assert market.splits == trained.splits and market.num_tickers == 5
    assert np.isfinite(market.turbulence_threshold)
    assert market.turbulence_threshold == trained.turbulence_threshold
    fields = ("close_mean", "close_std", "indicator_mean", "indicator_std")
    for name in fields:
        np.testing.assert_array_equal(getattr(market.normalization, name), getattr(trained.normalization, name))

    after_training = slice(market.splits.train.stop, None)  # validation and the traded test days
    moved = refit_market(ck, scaled_prices(data, after_training, 1.7))
    assert not np.array_equal(moved.data.close, data.close)
    assert moved.turbulence_threshold == market.turbulence_threshold
    for name in fields:
        np.testing.assert_array_equal(getattr(moved.normalization, name), getattr(market.normalization, name))

    in_training = slice(market.splits.train.stop - 40, market.splits.train.stop)  # the refit does see these
    seen = refit_market(ck, scaled_prices(data, in_training, 1.7))
    assert not np.allclose(seen.normalization.close_mean, market.normalization.close_mean)
    assert seen.turbulence_threshold != market.turbulence_threshold

    restore_policy(ck, market, resize=True)  # the weights load strictly for 5 tickers
    with pytest.raises(UserError, match="does not fit its market spec"):
        restore_policy(ck, market)


@pytest.mark.filterwarnings("ignore:training split has no day")  # 200 days: no turbulence history
def test_new_universe_refuses_a_policy_sized_by_its_tickers(
    quick_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["backtest", "--checkpoint", str(quick_checkpoint), "--data", WIDER, "--new_universe"]
    assert cli.main([*argv, "--out", str(tmp_path / "bt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--new_universe needs a --policy shared checkpoint" in err
    assert "clstm policy, whose weights are sized by the 3 tickers it was trained on" in err
    assert not (tmp_path / "bt").exists()
    ck = open_checkpoint(quick_checkpoint)  # and its weights would not load for another count
    with pytest.raises(UserError, match="weights do not fit 5 tickers"):
        restore_policy(ck, refit_market(ck, load_market_data("synthetic:tickers=5,days=200,seed=2")), resize=True)


def test_without_the_flag_another_universe_is_refused_and_the_flag_named(
    shared_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["backtest", "--checkpoint", str(shared_checkpoint), "--data", WIDER, "--out", str(tmp_path / "bt")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected SYN03, SYN04" in err and "--new_universe" in err
    assert not (tmp_path / "bt").exists()
