"""The shared window-LSTM kernel: same numbers and gradients as nn.LSTM over dense windows."""

from __future__ import annotations

import pytest
import torch

from clstm_ppo.agent.window_lstm import WindowLSTM, window_last_output
from clstm_ppo.agent.windows import Windows
from tests.conftest import record_env_rollout


def test_hand_written_backward_matches_autograd_float64():
    torch.manual_seed(0)
    projected = torch.randn(7, 4 * 4, dtype=torch.float64, requires_grad=True)  # 7 distinct rows
    index = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 6], [3, 4, 0], [4, 5, 5]])  # [T=5, M=3], rows reused
    w_hh = torch.randn(4 * 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(WindowLSTM.apply, (projected, index, w_hh))


def test_shared_and_fused_kernels_agree_in_value_and_gradient(window_market):
    store, _ = record_env_rollout(window_market, steps=24)
    windows = store.windows()
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(window_market.num_features, 16, batch_first=True)
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


def test_shared_kernel_runs_under_cpu_bf16_autocast(window_market):
    store, _ = record_env_rollout(window_market, steps=8)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(window_market.num_features, 16, batch_first=True)
    reference = window_last_output(lstm, store.windows(), "shared")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = window_last_output(lstm, store.windows(), "shared")
    out.float().sum().backward()
    assert out.dtype == torch.float32 and lstm.weight_hh_l0.grad is not None
    torch.testing.assert_close(out, reference, rtol=0.05, atol=0.05)


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="window kernel"):
        window_last_output(torch.nn.LSTM(3, 4), Windows.from_dense(torch.zeros(1, 1, 2, 3)), "magic")
