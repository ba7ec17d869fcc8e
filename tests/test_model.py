"""The actor-critic: the LSTM over days with episode cuts, rollout/update consistency, state resets, parameter groups."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clstm_ppo.agent.model import ActorCritic, ModelSpec, run_lstm
from clstm_ppo.agent.windows import Windows
from clstm_ppo.training.ppo import next_day_loss
from tests.conftest import fake_rollout, net_spec, small_model


def test_run_lstm_chunks_equal_step_by_step():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 8)
    x = torch.randn(20, 4, 6)
    starts = torch.rand(20, 4) < 0.15
    h0, c0 = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    out, (h, c) = run_lstm(lstm, x, (h0, c0), starts)
    hs, cs, outs = h0, c0, []
    for t in range(20):
        keep = (~starts[t]).float().view(1, -1, 1)
        o, (hs, cs) = lstm(x[t : t + 1], (hs * keep, cs * keep))
        outs.append(o)
    torch.testing.assert_close(out, torch.cat(outs), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, hs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "policy, action_dist, skip",
    [
        ("clstm", "gaussian", False),
        ("lstm", "gaussian", False),
        ("mlp", "gaussian", False),
        ("clstm", "tanh", False),
        ("mlp", "tanh", False),
        ("clstm", "tanh", True),
        ("lstm", "tanh", True),
        ("clstm-conv", "tanh", True),
        ("clstm-conv", "gaussian", False),
    ],
)
def test_update_recomputes_rollout_log_probs_and_values(policy, action_dist, skip):
    """Before any optimizer step, the update's forward must reproduce what the rollout recorded."""
    policy, _, stage1 = policy.partition("-")
    model = small_model(policy, action_dist=action_dist, skip=skip, stage1=stage1 or "lstm")
    buf = fake_rollout(model)
    windows = buf.obs.windows()
    assert windows.rows.shape[1] < buf.n_steps * model.spec.window  # rows really are shared
    for obs in (windows, windows.dense()):  # compact and dense windows alike
        out = model(obs, buf.initial_state, buf.starts, buf.actions)
        torch.testing.assert_close(out.log_prob, buf.log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.value, buf.values, rtol=1e-5, atol=1e-5)
    # and column subsets (a minibatch) give the same numbers
    cols = torch.tensor([2, 0])
    lp_cols = model(
        windows.select(cols), buf.initial_state.envs(cols), buf.starts[:, cols], buf.actions[:, cols]
    ).log_prob
    torch.testing.assert_close(lp_cols, buf.log_probs[:, cols], rtol=1e-5, atol=1e-5)


def test_a_convolution_stage_1_maps_the_whole_window_at_once():
    """--stage1 conv: stage 1 is one linear map of each observation's whole [T x F] window (day-major rows, in
    the step-major order of the other kernels); every window day reaches the features; the window LSTM is gone."""
    model = small_model("clstm", stage1="conv", window=6)
    assert not hasattr(model, "window_lstm") and model.window_conv.in_features == 6 * 16
    assert {id(p) for p in model.window_conv.parameters()} <= {id(p) for p in model.stage1_parameters()}
    obs = torch.randn(3, 2, 6, 16)  # L = 3 steps x E = 2 envs
    seen = []
    model.window_conv.register_forward_hook(lambda _m, inputs, _out: seen.append(inputs[0]))
    base = model.encode(Windows.from_dense(obs))
    torch.testing.assert_close(seen[0], obs.reshape(6, 6 * 16))
    assert base.shape == (6, 10)
    for day in range(6):
        moved = obs.clone()
        moved[:, :, day] += 1.0
        assert not torch.allclose(model.encode(Windows.from_dense(moved)), base)
    stored = {k: v for k, v in model.spec.to_dict().items() if k != "stage1"}
    assert ModelSpec.from_dict(stored).stage1 == "lstm"  # a checkpoint from before the setting: the window LSTM


def test_state_reset_at_episode_start_forgets_the_past():
    model = small_model("clstm")
    buf = fake_rollout(model, steps=6, envs=2)
    starts = buf.starts.clone()
    starts[3] = True
    dense = buf.obs.windows().dense()
    v1 = model(dense, buf.initial_state, starts, buf.actions).value
    obs2 = dense.clone()
    obs2[:3] = torch.randn_like(obs2[:3])  # change everything before the reset
    v2 = model(obs2, buf.initial_state, starts, buf.actions).value
    torch.testing.assert_close(v1[3:], v2[3:])
    assert not torch.allclose(v1[:3], v2[:3])


def test_parameter_groups_split_stage1_from_actor_critic():
    model = small_model("clstm")
    stage1 = {id(p) for p in model.stage1_parameters()}
    stage2 = {id(p) for p in model.stage2_parameters()}
    assert stage1 and stage2 and not stage1 & stage2
    assert stage1 | stage2 == {id(p) for p in model.parameters()}
    assert id(model.window_lstm.weight_ih_l0) in stage1 and id(model.actor_lstm.weight_ih_l0) in stage2


def test_tanh_policy_log_prob_is_the_squashed_gaussians_and_the_env_gets_tanh():
    """Oracle: torch's own TransformedDistribution(Normal, TanhTransform) at a = tanh(u)."""
    from torch.distributions import Normal, TanhTransform, TransformedDistribution

    model = small_model("mlp", action_dist="tanh")
    obs = torch.randn(4, model.spec.window, model.spec.num_features)
    starts = torch.ones(4, dtype=torch.bool)
    u, log_prob, _, _ = model.act(obs, model.initial_state(4), starts, generator=torch.Generator().manual_seed(1))
    mean = model.act(obs, model.initial_state(4), starts, deterministic=True).action
    oracle = TransformedDistribution(Normal(mean, model.policy_std().expand_as(mean)), [TanhTransform()])
    torch.testing.assert_close(log_prob, oracle.log_prob(torch.tanh(u)).sum(-1), rtol=1e-4, atol=1e-4)
    assert torch.equal(model.env_action(u), torch.tanh(u)) and (model.env_action(u).abs() < 1).all()
    # the entropy the update reports is the sample estimate -log pi at the scored actions
    out = model(obs.unsqueeze(0), model.initial_state(4), starts.unsqueeze(0), u.unsqueeze(0))
    torch.testing.assert_close(out.entropy, -out.log_prob)


def test_a_bounded_log_std_caps_the_policy_std_and_the_gaussian_is_left_alone():
    bounded, free = small_model("mlp", log_std_max=0.0), small_model("mlp")
    with torch.no_grad():
        bounded.log_std.fill_(3.0)
        free.log_std.fill_(3.0)
    assert torch.allclose(bounded.policy_std(), torch.ones(3)) and torch.allclose(
        free.policy_std(), torch.full((3,), 20.0855), rtol=1e-4
    )
    u = torch.tensor([[2.0, -3.0, 0.5]])
    assert torch.equal(free.env_action(u), u)  # the env clips it


@pytest.mark.parametrize("policy", ["clstm", "lstm"])
def test_skip_lets_todays_state_reach_the_heads_around_the_lstms(policy):
    """With the stage-2 LSTMs (and clstm's window LSTM) silenced, only the shortcuts carry today's state: the
    action mean then moves with today's row when ``skip`` is on, and not at all when it is off."""
    obs = torch.randn(1, 4, 5, 16)
    changed = obs.clone()
    changed[:, :, -1] += 1.0  # only today's row differs
    starts = torch.ones(1, 4, dtype=torch.bool)
    moved = {}
    for skip in (False, True):
        model = small_model(policy, skip=skip)
        lstms = [model.actor_lstm, model.critic_lstm] + ([model.window_lstm] if policy == "clstm" else [])
        with torch.no_grad():
            for lstm in lstms:
                for param in lstm.parameters():
                    param.zero_()
        means = [model(o, model.initial_state(4), starts).mean for o in (obs, changed)]
        moved[skip] = (means[0] - means[1]).abs().max().item()
    if policy == "clstm":
        assert moved[False] == 0.0  # the window LSTM's output is constant: nothing reaches the heads
    assert moved[True] > 1e-4


def test_recurrent_state_is_named_and_an_mlp_has_a_zero_width_one():
    """The state is the actor's and the critic's (h, c); selecting envs, cloning and running keep the names."""
    model = small_model("lstm")
    buf = fake_rollout(model, steps=4, envs=3)
    out = model(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
    assert out.state.actor_h.shape == out.state.critic_c.shape == (1, 3, 14) and out.next_day is None
    assert not torch.equal(out.state.actor_h, out.state.critic_h)  # two LSTMs, two states
    assert torch.equal(out.state.envs(torch.tensor([2])).actor_c, out.state.actor_c[:, [2]])
    mlp = small_model("mlp")
    assert mlp.initial_state(3).actor_h.shape == (1, 3, 0)


def test_checkpoints_without_the_skip_setting_rebuild_the_network_they_were_trained_with():
    model = small_model("clstm", skip=True)
    dropped = ("skip", "next_day_head", "action_dist", "forecast_skip")
    stored = {k: v for k, v in model.spec.to_dict().items() if k not in dropped}
    then = ModelSpec.from_dict(stored)
    assert then.skip is False and then.next_day_head is False and then.action_dist == "gaussian"
    assert then.forecast_skip is False
    assert then.stage2_hidden == 14 and then.window == model.spec.window  # what it stored is kept
    assert model.features[0].in_features == 12 + 16 and model.actor_mean.in_features == 14 + 10


@pytest.mark.parametrize("policy", ["clstm", "mlp"])
def test_a_policy_step_and_its_update_forward_make_no_host_checks(policy):
    """``bool(tensor)`` waits for the GPU: a rollout step (``act``) and the update's forward must make none.
    torch.distributions' argument checks made 8 per rollout step and 5 per minibatch (docs: benchmarks/README)."""
    from torch.profiler import ProfilerActivity, profile

    model = small_model(policy)
    obs = torch.randn(4, model.spec.window, model.spec.num_features)
    starts = torch.ones(4, dtype=torch.bool)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        u = model.act(obs, model.initial_state(4), starts, generator=torch.Generator().manual_seed(1)).action
        model(obs.unsqueeze(0), model.initial_state(4), starts.unsqueeze(0), u.unsqueeze(0))
    checks = [e.count for e in prof.key_averages() if e.key == "aten::is_nonzero"]
    assert not checks, f"{sum(checks)} bool(tensor) checks in one step and one forward"


def forecast_model(policy: str, forecast_skip: bool, trade_gate: bool = False) -> ActorCritic:
    torch.manual_seed(0)
    sizes = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True, next_day_head=True)
    return ActorCritic(net_spec(policy, 16, 3, 5, forecast_skip=forecast_skip, trade_gate=trade_gate, **sizes))


@pytest.mark.parametrize("policy, trade_gate", [("clstm", False), ("mlp", True), ("shared", False)])
def test_forecast_skip_adds_the_gain_times_the_detached_next_day_prediction(policy, trade_gate):
    """``--forecast_skip``: at its start (g = 0) the network acts exactly as without it; with g set, each stock's
    action mean moves by g x the next-day head's prediction for that stock (the gate actions do not move), and
    PPO's gradient reaches g but not the head, which only the next-day loss fits."""
    obs = torch.randn(2, 4, 5, 16)
    starts = torch.zeros(2, 4, dtype=torch.bool)
    starts[0] = True
    plain, model = forecast_model(policy, False, trade_gate), forecast_model(policy, True, trade_gate)
    model.load_state_dict({**plain.state_dict(), "forecast_gain": torch.zeros(())})  # the same weights but g
    run = lambda m: m(obs, m.initial_state(4), starts, predict_next=True)  # noqa: E731
    torch.testing.assert_close(run(model).mean, run(plain).mean, rtol=0, atol=0)
    with torch.no_grad():
        model.forecast_gain.fill_(1.5)
    out, base = run(model), run(plain)
    n = model.spec.num_tickers
    torch.testing.assert_close(out.mean[..., :n], base.mean[..., :n] + 1.5 * out.next_day, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.mean[..., n:], base.mean[..., n:], rtol=0, atol=0)  # gate actions, if any
    assert out.mean.shape[-1] == model.spec.action_dim
    out.mean.sum().backward()  # a loss on the action means alone
    head = model.shared.next_day if policy == "shared" else model.next_day
    assert model.forecast_gain.grad is not None and model.forecast_gain.grad.item() != 0.0
    torch.testing.assert_close(model.forecast_gain.grad, out.next_day.detach().sum(), rtol=1e-5, atol=1e-5)
    assert head.weight.grad is None or not head.weight.grad.any()  # detached: PPO does not fit the head
    assert model.forecast_gain in model.stage2_parameters()


def test_forecast_skip_update_recomputes_rollout_log_probs():
    """Acting and the update's forward agree when the action means follow the next-day prediction."""
    model = forecast_model("clstm", True)
    with torch.no_grad():
        model.forecast_gain.fill_(2.0)
    buf = fake_rollout(model)
    out = model(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
    torch.testing.assert_close(out.log_prob, buf.log_probs, rtol=1e-5, atol=1e-5)


def test_forecast_skip_needs_the_next_day_head():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="forecast_skip needs the next-day head"):
        ActorCritic(net_spec("clstm", 16, 3, 5, forecast_skip=True, next_day_head=False))


@pytest.mark.parametrize("policy", ["clstm", "lstm", "mlp"])
def test_linear_forecaster_is_one_linear_map_of_the_window_price_columns(policy):
    """``--forecaster linear``: it predicts 0 at the start; its forecast is ``W x`` the window's flattened ``[T x N]``
    price columns ``+ b`` whatever the network computes; the stock means move by ``g x`` it; PPO's gradient on the
    means reaches g and not W, and its next-day loss term reaches W."""
    torch.manual_seed(0)
    sizes = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True, next_day_head=True)
    model = ActorCritic(net_spec(policy, 16, 3, 5, forecast_skip=True, forecaster="linear", **sizes))
    obs = torch.randn(2, 4, 5, 16)  # [L, B, T, F]: cash, 3 price columns, 3 holdings, 3 indicators x 3
    starts = torch.zeros(2, 4, dtype=torch.bool)
    starts[0] = True
    run = lambda: model(obs, model.initial_state(4), starts)  # noqa: E731
    assert not run().forecast.any()  # zero at the start
    weight, bias = torch.randn(3, 15), torch.randn(3)
    with torch.no_grad():
        model.linear_forecast.weight.copy_(weight)
        model.linear_forecast.bias.copy_(bias)
        base = run().mean  # g = 0
        model.forecast_gain.fill_(1.5)
    out = run()
    expected = obs[..., 1:4].flatten(-2) @ weight.T + bias  # [L, B, N]
    torch.testing.assert_close(out.forecast, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.mean, base + 1.5 * expected, rtol=1e-5, atol=1e-5)
    out.mean.sum().backward()  # a loss on the action means alone
    assert model.forecast_gain.grad.item() != 0.0
    assert model.linear_forecast.weight.grad is None or not model.linear_forecast.weight.grad.any()
    model.zero_grad()
    next_day_loss(run().forecast, torch.randn(2, 4, 3), torch.ones(2, 4)).backward()
    assert model.linear_forecast.weight.grad.any() and model.linear_forecast in [*model.modules()]
    assert {id(p) for p in model.linear_forecast.parameters()} <= {id(p) for p in model.stage2_parameters()}


def test_linear_forecaster_needs_forecast_skip_and_tickers_of_its_own():
    torch.manual_seed(0)
    for policy, skip in (("clstm", False), ("shared", True)):
        with pytest.raises(ValueError, match="linear forecaster is what forecast_skip follows"):
            ActorCritic(net_spec(policy, 16, 3, 5, forecast_skip=skip, forecaster="linear", next_day_head=True))


@pytest.mark.parametrize("trade_gate", [False, True])
def test_forecast_only_means_are_the_gain_times_the_forecast_plus_a_bias(trade_gate):
    """``--forecast_only``: the stocks' means are ``stock_bias + g x forecast`` whatever the network computes (its
    weights moved, the means stay), the trade gates' means still come from the network, and a loss on the stocks'
    means reaches the bias and g, not the network."""
    torch.manual_seed(0)
    sizes = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True, next_day_head=False)
    spec = net_spec("clstm", 16, 3, 5, forecast_skip=True, forecaster="linear", forecast_only=True, **sizes)
    model = ActorCritic(dataclasses.replace(spec, trade_gate=trade_gate))
    obs = torch.randn(2, 4, 5, 16)
    starts = torch.zeros(2, 4, dtype=torch.bool)
    starts[0] = True
    run = lambda: model(obs, model.initial_state(4), starts)  # noqa: E731
    with torch.no_grad():
        model.linear_forecast.weight.normal_()
        model.forecast_gain.fill_(1.5)
        model.stock_bias.copy_(torch.tensor([-0.5, 0.1, 0.3]))
    out = run()
    torch.testing.assert_close(out.mean[..., :3], model.stock_bias + 1.5 * out.forecast, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        for p in model.actor_mean.parameters():
            p.add_(1.0)
    moved = run()
    torch.testing.assert_close(moved.mean[..., :3], out.mean[..., :3])
    assert (moved.mean[..., 3:] != out.mean[..., 3:]).all() if trade_gate else moved.mean.shape[-1] == 3
    model.zero_grad()
    run().mean[..., :3].sum().backward()
    assert model.stock_bias.grad.abs().min() > 0 and model.forecast_gain.grad.item() != 0.0
    assert not model.actor_mean.weight.grad.any() and not model.window_lstm.weight_hh_l0.grad.any()


@pytest.mark.parametrize("trade_gate", [False, True])
def test_forecast_threshold_lowers_the_deployed_stock_means_and_not_trainings_samples(trade_gate):
    """``--forecast_threshold D``: a deterministic action (validation, backtest, trade) is the stocks' means minus D,
    the gates' means unchanged; a sampled action (training) is what it would be without D, draw for draw."""
    torch.manual_seed(0)
    sizes = dict(stage1_hidden=12, feature_dim=10, stage2_hidden=14, skip=True, next_day_head=False)
    plain = net_spec("clstm", 16, 3, 5, forecast_skip=True, forecaster="linear", forecast_only=True, **sizes)
    plain = dataclasses.replace(plain, trade_gate=trade_gate)
    model = ActorCritic(plain)
    with torch.no_grad():
        model.linear_forecast.weight.normal_()
        model.forecast_gain.fill_(2.0)
    obs, starts = torch.randn(4, 5, 16), torch.ones(4, dtype=torch.bool)
    act = lambda **kw: model.act(obs, model.initial_state(4), starts, **kw).action  # noqa: E731
    mean, sample = act(deterministic=True), act(generator=torch.Generator().manual_seed(1))
    model.spec = dataclasses.replace(plain, forecast_threshold=0.7)
    deployed = act(deterministic=True)
    torch.testing.assert_close(deployed[:, :3], mean[:, :3] - 0.7)
    torch.testing.assert_close(deployed[:, 3:], mean[:, 3:])
    torch.testing.assert_close(act(generator=torch.Generator().manual_seed(1)), sample, rtol=0, atol=0)
    with pytest.raises(ValueError, match="forecast_threshold lowers the means forecast_only sets"):
        ActorCritic(dataclasses.replace(plain, forecast_only=False, forecast_threshold=0.7))


def test_forecast_only_needs_forecast_skip_and_tickers_of_its_own():
    torch.manual_seed(0)
    for policy, skip in (("clstm", False), ("shared", True)):
        with pytest.raises(ValueError, match="forecast_only sets the stocks' means"):
            ActorCritic(net_spec(policy, 16, 3, 5, forecast_skip=skip, forecast_only=True, next_day_head=True))
