"""Seeds as a batch dimension, piece by piece: K networks stacked compute what each computes alone (forward, action,
gradients), the stacked LSTM kernels against nn.LSTM and autograd, each seed's Adam over its views, and the vector
env's per-cell start days against one env per cell. The whole loop is tests/test_cells.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.evaluate import evaluate_cells, evaluate_policy
from clstm_ppo.agent.recurrence import cut_days, run_lstm
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
from clstm_ppo.agent.stacked_lstm import StackedLSTM, stacked_lstm
from clstm_ppo.agent.window_lstm import WindowLSTM, stacked_window_last_output, window_last_output
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import TrainConfig
from clstm_ppo.training.ppo import build_optimizer, optimizer_step
from envs.config import EnvConfig
from envs.features import PreparedMarket
from envs.vector_env import VectorStockTradingEnv
from tests.conftest import fake_rollout, net_spec

CELLS, ENVS, STEPS = 3, 4, 10
pytestmark = pytest.mark.filterwarnings("ignore:grad and param do not obey the gradient layout contract")


def cell_networks(policy: str, obs_norm: bool = False, market: PreparedMarket | None = None) -> tuple[list, list]:
    """K networks of one family (cell k initialised from seed k) twice: the ones to stack, and their twins alone;
    for ``market``'s state and window when given (3 tickers)."""
    if market is not None:
        features, window = market.num_features, market.window
    else:  # shared: 1 + (2 + 3 indicators) x 3 tickers
        features, window = (16 if policy == "shared" else 13), 5
    stacked, alone = [], []
    for k in range(CELLS):
        torch.manual_seed(k)
        net = make_policy(
            net_spec(policy, features, 3, window, stage1_hidden=12, feature_dim=10, stage2_hidden=14, obs_norm=obs_norm)
        )
        twin = make_policy(net.spec)
        twin.load_state_dict(net.state_dict())
        if obs_norm:  # statistics that differ per cell
            sums = torch.cat(
                [torch.tensor([5.0]), torch.randn(features).double() * (k + 1), torch.full((features,), 9.0).double()]
            )
            net.update_obs_stats(sums)
            twin.update_obs_stats(sums)
        stacked.append(net)
        alone.append(twin)
    return stacked, alone


def side_by_side(bufs: list) -> tuple[Windows, RecurrentState, torch.Tensor, torch.Tensor]:
    """The cells' rollouts as one cell-major batch (row tables padded to one length, as a batched rollout's are)."""
    windows = [b.obs.windows() for b in bufs]
    rows = max(w.rows.shape[1] for w in windows)
    table = torch.cat([torch.nn.functional.pad(w.rows, (0, 0, 0, rows - w.rows.shape[1])) for w in windows])
    state = RecurrentState(*(torch.cat([b.initial_state[i] for b in bufs], dim=1) for i in range(4)))
    both = Windows(table, torch.cat([w.index for w in windows], dim=1))
    return both, state, torch.cat([b.starts for b in bufs], dim=1), torch.cat([b.actions for b in bufs], dim=1)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |a| (0 for two empty or zero tensors)."""
    if not a.numel():
        return 0.0
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("policy, obs_norm", [("clstm", True), ("lstm", False), ("mlp", True), ("shared", False)])
def test_stacked_cells_score_act_and_differentiate_as_each_network_alone(policy, obs_norm):
    nets, alone = cell_networks(policy, obs_norm)
    bufs = [fake_rollout(twin, steps=STEPS, envs=ENVS, seed=k) for k, twin in enumerate(alone)]
    cells = CellPolicy(nets)
    windows, state, starts, actions = side_by_side(bufs)
    out = cells.evaluate(windows, state, starts, actions)
    (out.log_prob.sum() + out.value.square().sum() + out.entropy.sum()).backward()
    for k, (twin, buf) in enumerate(zip(alone, bufs, strict=True)):
        ref = twin.evaluate(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
        (ref.log_prob.sum() + ref.value.square().sum() + ref.entropy.sum()).backward()
        cols = slice(k * ENVS, (k + 1) * ENVS)
        for name in ("log_prob", "entropy", "value", "mean"):
            assert relative(getattr(ref, name), getattr(out, name)[:, cols]) < 1e-5, name
        for mine, theirs in zip(out.state, ref.state, strict=True):
            assert relative(theirs, mine[:, cols]) < 1e-5
        grads = {n: p.grad for n, p in twin.named_parameters()}
        for name, grad in grads.items():  # each cell's gradient lands in its own view, never in another's
            assert relative(grad, cells.cell(k).get_parameter(name).grad) < 1e-4, name
            assert relative(grad, cells.params[name].grad[k]) < 1e-4, name  # in the buffer the optimizer steps
    # a rollout step: each cell's noise from its own generator, as alone
    obs, now = torch.cat([b.obs.windows().dense()[3] for b in bufs]), starts[3]
    acted = cells.act(obs, state, now, generators=[torch.Generator().manual_seed(10 + k) for k in range(CELLS)])
    for k, twin in enumerate(alone):
        cols = slice(k * ENVS, (k + 1) * ENVS)
        ref = twin.act(obs[cols], state.envs(cols), now[cols], generator=torch.Generator().manual_seed(10 + k))
        for mine, theirs in zip(acted[:3], ref[:3], strict=True):
            assert relative(theirs, mine[cols]) < 1e-5


def test_a_cells_network_is_a_view_of_the_stacked_weights():
    nets, _ = cell_networks("mlp", obs_norm=True)
    cells = CellPolicy(nets)
    before = [cells.cell(k).critic.bias.detach().clone() for k in range(CELLS)]
    with torch.no_grad():
        cells.flat[1][2].add_(1.0)  # stage 2 of cell 2 moves; its network sees it, the others do not
        cells.buffers["obs_mean"][0].fill_(3.0)
    assert torch.equal(cells.cell(2).critic.bias, before[2] + 1.0)
    assert torch.equal(cells.cell(1).critic.bias, before[1]) and torch.equal(cells.cell(0).critic.bias, before[0])
    assert float(cells.cell(0).obs_mean[0]) == 3.0 and float(cells.cell(1).obs_mean[0]) != 3.0
    state = cells.cell(2).state_dict()
    loaded = make_policy(cells.cell(2).spec)
    loaded.load_state_dict(state)  # loads as a single network's weights
    assert torch.equal(loaded.critic.bias, cells.params["critic.bias"][2])


@pytest.mark.parametrize("change", ["a step on the stacked weights", "a load into one cell"])
def test_stacked_stage2_weights_kept_without_autograd_follow_every_change(change):
    """The stage-2 weights a no-grad forward keeps (a backtest's day after day) are joined again once a weight moves
    in place: the next forward is each network's alone, with its new weights."""
    nets, alone = cell_networks("clstm")
    bufs = [fake_rollout(twin, steps=STEPS, envs=ENVS, seed=k) for k, twin in enumerate(alone)]
    cells = CellPolicy(nets)
    windows, state, starts, _ = side_by_side(bufs)
    with torch.no_grad():
        first = cells.evaluate(windows, state, starts).mean
        assert cells.stage2_weights()[0] is cells.stage2_weights()[0]  # kept between forwards
        if change == "a step on the stacked weights":
            cells.flat[1].add_(0.05 * torch.randn_like(cells.flat[1]))
        else:
            moved = {n: t + 0.05 * torch.randn_like(t) for n, t in cells.cell(1).state_dict().items()}
            cells.cell(1).load_state_dict(moved)
        for k, twin in enumerate(alone):
            twin.load_state_dict(cells.cell(k).state_dict())
        out = cells.evaluate(windows, state, starts).mean
    assert relative(first, out) > 1e-3  # it moved
    for k, (twin, buf) in enumerate(zip(alone, bufs, strict=True)):
        ref = twin.evaluate(buf.obs.windows(), buf.initial_state, buf.starts).mean
        assert relative(ref, out[:, k * ENVS : (k + 1) * ENVS]) < 1e-5


def test_stacked_lstm_runs_each_network_as_run_lstm_does():
    torch.manual_seed(0)
    networks, days, seqs, width, hidden = 3, 7, 4, 5, 6
    lstms = [torch.nn.LSTM(width, hidden) for _ in range(networks)]
    x = torch.randn(networks, days, seqs, width, requires_grad=True)
    starts = torch.rand(days, networks, seqs) < 0.2
    h0, c0 = torch.randn(networks, seqs, hidden), torch.randn(networks, seqs, hidden)
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    weights = [torch.stack([getattr(m, n).detach() for m in lstms]).requires_grad_() for n in names]
    out, (h, c) = stacked_lstm(x, *weights, (h0, c0), starts, cut_days(starts.reshape(days, -1)))
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    for k, lstm in enumerate(lstms):
        xk = x.detach()[k].clone().requires_grad_()
        ref, (hr, cr) = run_lstm(lstm, xk, (h0[k : k + 1], c0[k : k + 1]), starts[:, k])
        (ref * upstream[k]).sum().backward()
        torch.testing.assert_close(out[k], ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close((h[k], c[k]), (hr[0], cr[0]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.grad[k], xk.grad, rtol=1e-4, atol=1e-6)
        for stacked, name in zip(weights, names, strict=True):
            torch.testing.assert_close(stacked.grad[k], getattr(lstm, name).grad, rtol=1e-4, atol=1e-6)


def test_stacked_lstm_backward_matches_autograd_float64():
    gen = torch.Generator().manual_seed(0)
    xproj = torch.randn(2, 4, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    w_hh = torch.randn(2, 8, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    h0, c0 = (torch.randn(2, 3, 2, dtype=torch.float64, generator=gen) for _ in range(2))
    keep = (torch.rand(2, 4, 3, 1, generator=gen) > 0.4).double()
    assert torch.autograd.gradcheck(lambda a, w: StackedLSTM.apply(a, w, h0, c0, keep, (0, 2))[0], (xproj, w_hh))


def test_stacked_window_lstm_is_each_networks_window_lstm(window_market):
    from tests.conftest import record_env_rollout

    store, _ = record_env_rollout(window_market, steps=12)
    windows = store.windows()  # 4 envs: 2 cells of 2
    torch.manual_seed(0)
    lstms = [torch.nn.LSTM(window_market.num_features, 8, batch_first=True) for _ in range(2)]
    names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    weights = [torch.stack([getattr(m, n).detach() for m in lstms]).requires_grad_() for n in names]
    out = stacked_window_last_output(*weights, windows, 2)  # [2, L x 2, H]
    out.square().sum().backward()
    for k, lstm in enumerate(lstms):
        mine = windows.select(torch.arange(2 * k, 2 * k + 2))
        ref = window_last_output(lstm, mine, "shared")
        ref.square().sum().backward()
        torch.testing.assert_close(out[k], ref, rtol=1e-5, atol=1e-6)
        for stacked, name in zip(weights, names, strict=True):
            torch.testing.assert_close(stacked.grad[k], getattr(lstm, name).grad, rtol=1e-4, atol=1e-6)
    projected = torch.randn(9, 16, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[0, 1, 2, 3], [1, 2, 4, 5], [2, 8, 6, 7]])  # [T=3, M=4]: two networks of 2 windows
    w_hh = torch.randn(2, 16, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(WindowLSTM.apply, (projected, index, w_hh))


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_each_seeds_adam_steps_its_views_of_the_stacked_weights_as_its_network_alone(weight_decay):
    """A seed of a batch has its own torch fused Adam over its own network's parameters, which are views of the
    stacked weights (and its gradients views of the stacked gradients): `optimizer_step` on it moves the seed's rows
    exactly as on the same network alone, its clip and NaN skip its own, and the other seeds' rows stay put."""
    nets, alone = cell_networks("clstm")
    lrs, clips = [(1e-3, 3e-4), (2e-3, 1e-3), (5e-4, 5e-4)], [0.5, 10.0, 0.1]
    ppos = [
        TrainConfig.from_dict(dict(learning_rate_clstm=a, learning_rate_actor_critic=b, weight_decay=weight_decay)).ppo
        for a, b in lrs
    ]
    cells = CellPolicy(nets)
    mine = [build_optimizer(ppo, cells.cell(k), 1) for k, ppo in enumerate(ppos)]
    theirs = [build_optimizer(ppo, twin, 1) for ppo, twin in zip(ppos, alone, strict=True)]
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        stepping = [True, step % 2 == 0, step != 3]  # seed 1 steps every other time, seed 2 all but once
        before = [flat.clone() for flat in cells.flat]
        for k, twin in enumerate(alone):
            for name, param in twin.named_parameters():
                grad = torch.randn(param.shape, generator=gen) * (3.0 if k == 0 else 0.1)  # seed 0 clips
                if k == 2 and step == 1:
                    grad.fill_(float("nan"))  # seed 2's step 1 is skipped
                param.grad = grad.clone()
                cells.cell(k).get_parameter(name).grad.copy_(grad)  # lands in the stacked gradient buffer
            if stepping[k]:
                for opt in (mine[k], theirs[k]):
                    params = [p for group in opt.param_groups for p in group["params"]]
                    _, skipped = optimizer_step(opt, params, clips[k], None, weight_decay)
                    assert skipped.item() == (k == 2 and step == 1)
            twin.zero_grad()
        cells.stepped()
        for k in range(CELLS):
            moved = any(not torch.equal(b[k], f[k]) for b, f in zip(before, cells.flat, strict=True))
            assert moved == (stepping[k] and not (k == 2 and step == 1)), (step, k)
    for k, twin in enumerate(alone):
        for name, param in twin.named_parameters():
            assert torch.equal(param, cells.cell(k).get_parameter(name)), (k, name)
        a, b = mine[k].state_dict(), theirs[k].state_dict()  # what each checkpoint holds: a run's own format
        assert a["param_groups"] == b["param_groups"]
        for index, entry in b["state"].items():
            assert all(torch.equal(value, a["state"][index][key]) for key, value in entry.items())


def test_a_vector_env_of_cells_gives_each_cell_the_episodes_of_its_own_env(window_market):
    """Each cell's block of envs, with its own seed, starts, trades and resets as a vector env of its own; its state
    in that env's format; and a cell restored at another ring position continues alike."""
    config = EnvConfig(episode_length=9)
    seeds = [3, 11]
    both = VectorStockTradingEnv(window_market, num_envs=6, config=config, seed=seeds)
    alone = [VectorStockTradingEnv(window_market, num_envs=3, config=config, seed=s) for s in seeds]
    obs_both, _ = both.reset(seed=seeds)
    obs_alone = [env.reset(seed=s)[0] for env, s in zip(alone, seeds, strict=True)]
    gen = torch.Generator().manual_seed(0)
    for step in range(30):
        torch.testing.assert_close(obs_both, torch.cat(obs_alone), rtol=0, atol=0)
        actions = torch.rand(6, window_market.num_tickers, generator=gen) * 2 - 1
        out = both.step(actions)
        outs = [env.step(actions[3 * k : 3 * k + 3]) for k, env in enumerate(alone)]
        obs_both, obs_alone = out[0], [o[0] for o in outs]
        assert torch.equal(out[1], torch.cat([o[1] for o in outs]))
        assert ("_episode" in out[4]) == any("_episode" in o[4] for o in outs)
        if step == 13:
            for k, env in enumerate(alone):
                mine, theirs = both.cell_state_dict(k), env.state_dict()
                assert mine.keys() == theirs.keys()
                for key, value in theirs.items():
                    if torch.is_tensor(value):
                        assert torch.equal(value, mine[key]), key
    # cell 1 restored from its own env's state into a batch whose ring stands elsewhere
    restored = VectorStockTradingEnv(window_market, num_envs=6, config=config, seed=[5, 6])
    restored.step(torch.zeros(6, window_market.num_tickers))  # ring position differs from `alone[1]`'s
    restored.load_cell_state_dict(1, alone[1].state_dict())
    actions = torch.rand(6, window_market.num_tickers, generator=gen) * 2 - 1
    mine, theirs = restored.step(actions), alone[1].step(actions[3:])
    assert torch.equal(mine[0][3:], theirs[0]) and torch.equal(mine[1][3:], theirs[1])
    assert np.array_equal(restored.cell_state_dict(1)["start_np"].numpy(), alone[1].state_dict()["start_np"].numpy())


@pytest.mark.parametrize("policy", ["clstm", "shared"])
def test_a_batch_of_cells_trades_a_split_as_each_network_alone(policy, window_market):
    """`evaluate_cells` (how a study trades a batch's windows) against `evaluate_policy` of each network (what
    `clstm-ppo backtest` runs), each from its own starting portfolio: the stacked forward rounds differently, so the
    actions agree to float rounding and the records to the whole shares those actions buy."""
    market, config = window_market, EnvConfig(hmax=50)
    tickers = market.num_tickers
    starts = [(400_000.0 + 50_000.0 * k, np.arange(tickers, dtype=np.float64) * (k + 1) * 7) for k in range(CELLS)]
    nets, alone = cell_networks(policy, obs_norm=policy == "clstm", market=market)
    runs = evaluate_cells(nets, market, "test", config, start_portfolios=starts)
    for run, twin, start in zip(runs, alone, starts, strict=True):
        one = evaluate_policy(twin, market, "test", config, start_portfolio=start)
        assert np.array_equal(run.dates, one.dates) and np.array_equal(run.fill_dates, one.fill_dates)
        assert np.array_equal(run.prices, one.prices) and run.tickers == one.tickers
        assert run.holdings[0].tolist() == start[1].tolist() and run.cash[0] == start[0]
        assert np.abs(np.diff(run.holdings, axis=0)).sum() > 0  # the network traded
        torch.testing.assert_close(run.last_state.actor_h, one.last_state.actor_h, rtol=1e-5, atol=1e-6)
        for field in ("values", "cash", "holdings", "costs", "fill_prices", "last_obs"):
            # a share more or less where an action sits on a whole-share boundary
            np.testing.assert_allclose(getattr(run, field), getattr(one, field), rtol=1e-3, atol=2.0, err_msg=field)
