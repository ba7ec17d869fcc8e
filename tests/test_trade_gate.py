"""--trade_gate: the policy's own no-trade region (N gate actions after the N weight logits)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from clstm_ppo.agent.ensemble import Ensemble
from clstm_ppo.agent.evaluate import evaluate_policy
from clstm_ppo.agent.model import ActorCritic, ModelSpec
from clstm_ppo.training.augment import TickerPermutation
from clstm_ppo.training.checkpoint import load_checkpoint
from envs.config import EnvConfig
from envs.errors import UserError
from envs.kernel import orders_from_actions, target_weights
from envs.vector_env import VectorStockTradingEnv
from tests.conftest import clean_env, net_spec, train

f64 = torch.float64
NO_COSTS = {"action_mode": "weights", "buy_cost_pct": 0.0, "sell_cost_pct": 0.0, "rebalance_band": 0.0}


def test_a_closed_gate_keeps_the_holding_and_an_open_gate_trades_as_without_gates():
    """Ticker by ticker: a gate > 0 lets the ungated order through unchanged, a gate <= 0 leaves the holding."""
    plain, gated = EnvConfig(**NO_COSTS), EnvConfig(**NO_COSTS, trade_gate=True)
    prices = torch.tensor([[10.0, 20.0, 50.0]], dtype=f64)
    cash, shares = torch.tensor([100.0], dtype=f64), torch.tensor([[25.0, 30.0, 1.0]], dtype=f64)
    logits = torch.tensor([[0.3, -0.2, 0.1]])
    ungated = orders_from_actions(logits, cash, shares, prices, plain)
    assert (ungated != 0).all()  # every stock is off its target: the gates alone decide below
    for gates, open_ in [([1.0, 1.0, 1.0], [1, 1, 1]), ([-1.0, 0.0, -0.5], [0, 0, 0]), ([0.2, -3.0, 1e-6], [1, 0, 1])]:
        orders = orders_from_actions(torch.cat([logits, torch.tensor([gates])], 1), cash, shares, prices, gated)
        assert orders.tolist() == (ungated * torch.tensor(open_, dtype=f64)).tolist(), gates
    with pytest.raises(ValueError, match="3 action numbers for 3 stocks; expected 6"):
        orders_from_actions(logits, cash, shares, prices, gated)


def test_the_gate_needs_weight_actions_and_a_network_with_two_outputs_per_ticker():
    from clstm_ppo.config import TrainConfig

    with pytest.raises(UserError, match="--trade_gate needs --action_mode weights"):
        EnvConfig(action_mode="shares", trade_gate=True)
    cfg = TrainConfig()
    cfg = dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, trade_gate=True), model=dataclasses.replace(cfg.model, policy="shared")
    )
    with pytest.raises(UserError, match="--policy shared has one"):
        cfg.validate()


def test_the_env_takes_2n_numbers_per_action_and_the_network_gives_them(window_market):
    m = window_market
    n = m.num_tickers
    env = VectorStockTradingEnv(m, num_envs=2, config=EnvConfig(trade_gate=True), seed=0)
    assert env.single_action_space.shape == (2 * n,) and env.action_dim == 2 * n
    env.reset(seed=0)
    with pytest.raises(ValueError, match=rf"actions must have shape \(2, {2 * n}\)"):
        env.step(torch.zeros(2, n))
    env.step(torch.zeros(2, 2 * n))
    spec = net_spec("clstm", m.num_features, n, m.window, trade_gate=True)
    model = ActorCritic(spec)
    assert spec.action_dim == 2 * n and model.log_std.shape == (2 * n,)
    out = model.act(torch.randn(2, m.window, m.num_features), model.initial_state(2), torch.ones(2, dtype=torch.bool))
    assert out.action.shape == (2, 2 * n)
    legacy = {k: v for k, v in spec.to_dict().items() if k != "trade_gate"}  # a checkpoint from before the flag
    assert ModelSpec.from_dict(legacy).action_dim == n


def test_a_permuted_episode_sends_each_gate_to_its_own_ticker():
    """Under --permute_tickers the weight logits and the gates of slot j both go to the env's ticker perm[b, j]."""
    n = 4
    perm = TickerPermutation(3, n, 1 + 2 * n, torch.device("cpu"), seed=0)
    perm.redraw(torch.ones(3, dtype=torch.bool))
    action = torch.randn(3, 2 * n)
    sent = perm.to_env(action)
    for b in range(3):
        for j in range(n):
            k = int(perm.perm[b, j])
            assert sent[b, k] == action[b, j] and sent[b, n + k] == action[b, n + j]


def _gated_model(m, seed: int, gate_bias: list[float] | None = None) -> ActorCritic:
    torch.manual_seed(seed)
    spec = net_spec("mlp", m.num_features, m.num_tickers, m.window, feature_dim=8, stage2_hidden=16, trade_gate=True)
    model = ActorCritic(spec).eval()
    with torch.no_grad():
        model.actor_mean.weight[: m.num_tickers].normal_(0.0, 1.0)  # weight logits that move with the state
        if gate_bias is not None:
            model.actor_mean.weight[m.num_tickers :].zero_()
            model.actor_mean.bias[m.num_tickers :] = torch.tensor(gate_bias)
    return model


def test_a_policy_trades_only_the_stocks_its_gates_open_and_as_an_ungated_policy_where_they_are_open(window_market):
    """Through model, env and evaluation: gates held open trade exactly as the same weight logits without gates;
    a gate held shut never buys that stock."""
    m = window_market
    n = m.num_tickers
    gated_cfg = EnvConfig(trade_gate=True, execution="next_open")
    open_ = _gated_model(m, 0, [5.0] * n)
    twin = ActorCritic(dataclasses.replace(open_.spec, trade_gate=False)).eval()
    state = {
        k: (v[:n] if k in ("actor_mean.weight", "actor_mean.bias", "log_std") else v)
        for k, v in open_.state_dict().items()
    }
    twin.load_state_dict(state)
    a = evaluate_policy(open_, m, "test", gated_cfg)
    b = evaluate_policy(twin, m, "test", dataclasses.replace(gated_cfg, trade_gate=False))
    assert np.abs(np.diff(a.holdings, axis=0)).sum() > 0  # it trades
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.holdings, b.holdings)
    shut = evaluate_policy(_gated_model(m, 0, [-5.0] + [5.0] * (n - 1)), m, "test", gated_cfg)
    assert (shut.holdings[:, 0] == 0).all() and shut.holdings[:, 1:].sum() > 0


def test_an_ensemble_averages_its_members_gates_and_their_target_portfolios(window_market):
    m = window_market
    n = m.num_tickers
    a, b = _gated_model(m, 1), _gated_model(m, 2)
    with torch.no_grad():
        a.actor_mean.bias[n:] += 0.8  # gates near +0.8 and near -0.3: the mean leans open
        b.actor_mean.bias[n:] -= 0.3
    obs, starts = torch.randn(3, m.window, m.num_features), torch.ones(3, dtype=torch.bool)
    out = Ensemble([a, b], "weights").act(obs, Ensemble([a, b], "weights").initial_state(3), starts)
    acts = [x.act(obs, x.initial_state(3), starts, deterministic=True).action.double() for x in (a, b)]
    assert out.action.shape == (3, 2 * n)
    torch.testing.assert_close(
        out.action[:, n:].double(), (acts[0][:, n:].clamp(-1, 1) + acts[1][:, n:].clamp(-1, 1)) / 2
    )
    mean_target = (target_weights(acts[0][:, :n]) + target_weights(acts[1][:, :n])) / 2
    torch.testing.assert_close(target_weights(out.action[:, :n]), mean_target, rtol=1e-5, atol=1e-6)


def test_a_gated_run_trains_backtests_and_refuses_a_resume_without_the_gate(tmp_path: Path):
    """The real command with the gate (and held, permuted noise): the checkpoint keeps the flag and the 2N-wide
    head, backtest runs it, and a resume that drops the flag is refused in one line naming it once."""
    result = train(
        tmp_path, "--trade_gate", "--noise_hold", "3", "--permute_tickers", "--num_episodes", "4", "--run_name", "g"
    )
    assert result.returncode == 0, result.stderr
    ck = load_checkpoint(tmp_path / "ck" / "g" / "latest.pt")
    n = len(ck.tickers)
    assert ck.cfg.env.trade_gate and ck.model_state["actor_mean.bias"].shape == (2 * n,)
    bt = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "backtest", "--checkpoint", str(tmp_path / "ck" / "g" / "latest.pt"),
         "--out", str(tmp_path / "bt")],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bt.returncode == 0, bt.stderr
    again = train(tmp_path, "--num_episodes", "8", "--run_name", "g", "--resume", "latest")
    assert again.returncode != 0
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].count("--trade_gate True (now False)") == 1, again.stderr
