"""The compact rollout store of observation windows rebuilds the env's own observations exactly."""

from __future__ import annotations

import torch

from clstm_ppo.agent.windows import Windows, WindowStore
from tests.conftest import record_env_rollout


def test_store_reconstructs_the_env_observations_across_resets(window_market):
    store, dense = record_env_rollout(window_market, steps=40)
    assert len(store.anchors) >= 4  # step 0 and the staggered/synchronous resets
    windows = store.windows()
    assert windows.rows.shape[1] == store.rows_per_env
    torch.testing.assert_close(windows.dense(), dense, rtol=0, atol=0)
    torch.testing.assert_close(windows.last_rows(), dense[:, :, -1], rtol=0, atol=0)
    cols = torch.tensor([3, 1])
    torch.testing.assert_close(windows.select(cols).dense(), dense[:, cols], rtol=0, atol=0)
    torch.testing.assert_close(store.columns(slice(1, 3)).windows().dense(), dense[:, 1:3], rtol=0, atol=0)
    assert store.nbytes() < dense.numel() * dense.element_size()


def test_store_without_anchors_at_resets_would_be_wrong(window_market):
    """The anchor flag matters: ignoring resets reconstructs different windows (the test above can fail)."""
    env_store, dense = record_env_rollout(window_market, steps=20)
    store = WindowStore(20, 4, window_market.window, window_market.num_features, "cpu")
    for step in range(20):
        store.record(step, dense[step], anchor=False)
    assert not torch.equal(store.windows().dense(), dense)


def test_dense_windows_round_trip():
    obs = torch.randn(5, 3, 4, 7)
    windows = Windows.from_dense(obs)
    assert torch.equal(windows.dense(), obs) and torch.equal(windows.last_rows(), obs[:, :, -1])
    gathered = Windows(windows.rows, windows.index)  # through the row numbers, not the kept tensor
    assert torch.equal(gathered.dense(), obs) and torch.equal(
        gathered.select(torch.tensor([2, 0])).dense(), obs[:, [2, 0]]
    )
