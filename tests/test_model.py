"""The policy families behind one interface: recurrence, log-probabilities, the distribution, old specs."""

from __future__ import annotations

import pytest
import torch

from clstm_ppo.agent.build import FAMILIES, make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.recurrence import run_lstm
from clstm_ppo.config import POLICIES
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
    "policy, action_dist",
    [("clstm", "gaussian"), ("lstm", "gaussian"), ("mlp", "gaussian"), ("clstm", "tanh"), ("mlp", "tanh")],
)
def test_update_recomputes_rollout_log_probs_and_values(policy, action_dist):
    """Before any optimizer step, the update's forward must reproduce what the rollout recorded."""
    model = small_model(policy, action_dist=action_dist)
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


@pytest.mark.parametrize("policy", POLICIES)
def test_every_family_has_one_interface_and_its_own_module(policy):
    """Each family is its own class (module ``clstm_ppo.agent.<policy>``) behind `ActorCritic`'s interface:
    ``initial_state``, ``evaluate`` (the forward) and ``act``, with the same shapes."""
    cls = FAMILIES[policy]
    assert issubclass(cls, ActorCritic) and cls.__module__ == f"clstm_ppo.agent.{policy}"
    torch.manual_seed(0)
    model = make_policy(net_spec(policy, 16, 3, 5, stage1_hidden=6, feature_dim=6, stage2_hidden=8))
    state = model.initial_state(4)
    assert state.actor_h.shape == (1, 4, 8 if policy in ("clstm", "lstm") else 0)
    obs, starts = torch.randn(2, 4, 5, 16), torch.ones(2, 4, dtype=torch.bool)
    out = model.evaluate(obs, state, starts)
    assert out.mean.shape == (2, 4, 3) and out.value.shape == out.log_prob.shape == out.entropy.shape == (2, 4)
    torch.testing.assert_close(model(obs, state, starts).mean, out.mean)  # forward is evaluate (DDP calls it)
    step = model.act(obs[0], state, starts[0], deterministic=True)
    torch.testing.assert_close(step.action, out.mean[0])
    sampled = model.act(obs[0], state, starts[0], generator=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled.action, step.action)


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
    oracle = TransformedDistribution(Normal(mean, model.std()[0].expand_as(mean)), [TanhTransform()])
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
    assert torch.allclose(bounded.std()[0], torch.ones(3)) and torch.allclose(
        free.std()[0], torch.full((3,), 20.0855), rtol=1e-4
    )
    u = torch.tensor([[2.0, -3.0, 0.5]])
    assert torch.equal(free.env_action(u), u)  # the env clips it


def test_recurrent_state_is_named_and_an_mlp_has_a_zero_width_one():
    """The state is the actor's and the critic's (h, c); selecting envs, cloning and running keep the names."""
    model = small_model("lstm")
    buf = fake_rollout(model, steps=4, envs=3)
    out = model(buf.obs.windows(), buf.initial_state, buf.starts, buf.actions)
    assert out.state.actor_h.shape == out.state.critic_c.shape == (1, 3, 14)
    assert not torch.equal(out.state.actor_h, out.state.critic_h)  # two LSTMs, two states
    assert torch.equal(out.state.envs(torch.tensor([2])).actor_c, out.state.actor_c[:, [2]])
    mlp = small_model("mlp")
    assert mlp.initial_state(3).actor_h.shape == (1, 3, 0)


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
