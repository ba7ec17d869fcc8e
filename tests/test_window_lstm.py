"""Compact window storage and the shared window-LSTM kernel: same numbers as nn.LSTM over dense windows."""

from __future__ import annotations

import pytest
import torch

from clstm_ppo.agent.window_lstm import WindowLSTM, window_last_output
from clstm_ppo.agent.windows import Windows, WindowStore
from envs.data import split_days
from envs.features import PreparedMarket
from envs.kernel import EnvConfig
from envs.synthetic import generate_market
from envs.vector_env import VectorStockTradingEnv

WINDOW = 6


@pytest.fixture(scope="module")
def market() -> PreparedMarket:
    data = generate_market(num_tickers=3, num_days=300, seed=5)
    return PreparedMarket.prepare(data, split_days(data, window=WINDOW), window=WINDOW, use_turbulence=False)


def record_env_rollout(market: PreparedMarket, steps: int, envs: int = 4) -> tuple[WindowStore, torch.Tensor]:
    """Run the env with random actions, recording like Trainer.collect_rollout; also keep the dense obs."""
    env = VectorStockTradingEnv(market, num_envs=envs, config=EnvConfig(episode_length=9), seed=1)
    stop = env.split.stop
    # staggered start days near the split's end: envs terminate on different steps, then restart
    obs, _ = env.reset(options={"start_day": [stop - 2 - k for k in (2, 4, 7, 30)][:envs]})
    store = WindowStore(steps, envs, WINDOW, market.num_features, "cpu")
    dense, anchor = [], True
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        store.record(step, obs, anchor=anchor)
        dense.append(obs.clone())
        obs, _, _, _, info = env.step(torch.rand(envs, market.num_tickers, generator=gen) * 2 - 1)
        anchor = "_episode" in info
    return store, torch.stack(dense)


def test_store_reconstructs_the_env_observations_across_resets(market):
    store, dense = record_env_rollout(market, steps=40)
    assert len(store.anchors) >= 4  # step 0 and the staggered/synchronous resets
    windows = store.windows()
    assert windows.rows.shape[1] == store.rows_per_env
    torch.testing.assert_close(windows.dense(), dense, rtol=0, atol=0)
    torch.testing.assert_close(windows.last_rows(), dense[:, :, -1], rtol=0, atol=0)
    cols = torch.tensor([3, 1])
    torch.testing.assert_close(windows.select(cols).dense(), dense[:, cols], rtol=0, atol=0)
    torch.testing.assert_close(store.columns(slice(1, 3)).windows().dense(), dense[:, 1:3], rtol=0, atol=0)
    assert store.nbytes() < dense.numel() * dense.element_size()


def test_store_without_anchors_at_resets_would_be_wrong(market):
    """The anchor flag matters: ignoring resets reconstructs different windows (the test above can fail)."""
    env_store, dense = record_env_rollout(market, steps=20)
    store = WindowStore(20, 4, WINDOW, market.num_features, "cpu")
    for step in range(20):
        store.record(step, dense[step], anchor=False)
    assert not torch.equal(store.windows().dense(), dense)


def test_dense_windows_round_trip():
    obs = torch.randn(5, 3, 4, 7)
    windows = Windows.from_dense(obs)
    assert torch.equal(windows.dense(), obs) and torch.equal(windows.last_rows(), obs[:, :, -1])
    gathered = Windows(windows.rows, windows.index)  # through the row numbers, not the kept tensor
    assert torch.equal(gathered.dense(), obs) and torch.equal(gathered.select(torch.tensor([2, 0])).dense(), obs[:, [2, 0]])


def test_hand_written_backward_matches_autograd_float64():
    torch.manual_seed(0)
    projected = torch.randn(7, 4 * 4, dtype=torch.float64, requires_grad=True)  # 7 distinct rows
    index = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 6], [3, 4, 0], [4, 5, 5]])  # [T=5, M=3], rows reused
    w_hh = torch.randn(4 * 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(WindowLSTM.apply, (projected, index, w_hh))


def test_shared_and_fused_kernels_agree_in_value_and_gradient(market):
    store, _ = record_env_rollout(market, steps=24)
    windows = store.windows()
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(market.num_features, 16, batch_first=True)
    weights = torch.randn(24 * 4, 16)
    results = []
    for kernel in ("shared", "fused"):
        lstm.zero_grad()
        out = window_last_output(lstm, windows, kernel)
        (out * weights).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in lstm.parameters()]))
    (out_s, grads_s), (out_f, grads_f) = results
    torch.testing.assert_close(out_s, out_f, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_s, grads_f, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_shared_kernel_runs_under_cpu_bf16_autocast(market):
    store, _ = record_env_rollout(market, steps=8)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(market.num_features, 16, batch_first=True)
    reference = window_last_output(lstm, store.windows(), "shared")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = window_last_output(lstm, store.windows(), "shared")
    out.float().sum().backward()
    assert out.dtype == torch.float32 and lstm.weight_hh_l0.grad is not None
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="window kernel"):
        window_last_output(torch.nn.LSTM(3, 4), Windows.from_dense(torch.zeros(1, 1, 2, 3)), "magic")
