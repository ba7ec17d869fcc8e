"""`clstm-ppo plot`: training curves from a synthetic metrics.jsonl, and its user errors."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from clstm_ppo import cli
from clstm_ppo.cli import plot
from clstm_ppo.training import curves
from envs.errors import UserError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _episode(i: int, step: int, rng: np.random.Generator) -> dict:
    ret = 0.05 + 0.001 * i + rng.normal(0, 0.05)
    return {
        "kind": "episode",
        "episode": i + 1,
        "global_step": step,
        "rank": i % 2,
        "reward": 100.0 * ret,
        "final_value": 1e6 * (1 + ret),
        "return": ret,
        "trades": 400.0 + i,
        "sharpe": 0.5 + rng.normal(0, 0.2),
        "max_drawdown": 0.1,
        "length": 252,
        "time": step / 500.0,
    }


def _update(u: int, step: int) -> dict:
    return {
        "kind": "update",
        "update": u,
        "global_step": step,
        "policy_loss": -0.01 / (u + 1),
        "value_loss": 5.0 / (u + 1),
        "entropy": 40.0 - 0.1 * u,
        "approx_kl": 0.01,
        "clip_fraction": 0.1,
        "explained_variance": 1 - 1 / (u + 2),
        "lr_clstm": 3e-4,
        "lr_actor_critic": 3e-4,
        "grad_norm": 0.4,
        "steps_per_second": 900.0 + u,
        "time": step / 500.0,
    }


def _write_run(run, *, episodes=120, updates=40, extra_lines=()):
    rng = np.random.default_rng(0)
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for u in range(updates):
        step = (u + 1) * 1024
        for k in range(3):
            i = 3 * u + k
            if i < episodes:
                lines.append(json.dumps(_episode(i, step, rng)))
        lines.append(json.dumps(_update(u, step)))
    lines.extend(extra_lines)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_plot_writes_png_and_counts_malformed(tmp_path, capsys):
    bad = [
        '{"kind": "episode", "global_st',
        "[1, 2]",
        '{"no_kind": 1}',
        '{"kind": "update", "global_step": "x"}',
    ]
    run = _write_run(tmp_path / "run1", extra_lines=[*bad, "", '{"kind": "eval", "global_step": 5}'])
    with pytest.warns(UserWarning, match="skipped 4 malformed"):
        log = curves.load_training_log(run)
    assert len(log.episodes) == 120 and len(log.updates) == 40 and log.skipped == 4
    x, y = log.series("update", "steps_per_second")
    assert x[0] == 1024 and y[-1] == 939.0

    assert plot.main([str(run)]) == 0
    png = run / "training.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    captured = capsys.readouterr()
    assert "warning: skipped 4 malformed line(s)" in captured.err
    assert f"wrote {png} (120 episodes, 40 updates)" in captured.out

    from matplotlib.image import imread

    img = imread(png)
    assert img.shape[1] >= 1200 and img[..., :3].std() > 0.05


def test_plot_draws_without_loading_torch(tmp_path):
    """Curves are read from metrics.jsonl: the command neither needs nor imports torch (its 1 s import was half of a
    plot's time)."""
    import subprocess
    import sys

    run = _write_run(tmp_path / "run")
    probe = (
        "import sys\n"
        "from clstm_ppo.cli.plot import main\n"
        f"code = main([{str(run)!r}])\n"
        "print('torch loaded' if 'torch' in sys.modules else 'no torch')\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert (run / "training.png").read_bytes().startswith(PNG_MAGIC)
    assert out.strip().splitlines()[-1] == "no torch"


def test_out_option_file_path_and_only_one_kind(tmp_path):
    run = _write_run(tmp_path / "run2", episodes=0, updates=5)
    out = tmp_path / "figs" / "curves.png"
    assert plot.main([str(run / "metrics.jsonl"), "--out", str(out), "--smooth", "3", "--title", "t"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    only_episodes = _write_run(tmp_path / "run3", episodes=2, updates=1)
    lines = [ln for ln in (only_episodes / "metrics.jsonl").read_text().splitlines() if '"update"' not in ln]
    (only_episodes / "metrics.jsonl").write_text("\n".join(lines))
    assert plot.main([str(only_episodes)]) == 0


def test_resumed_run_rows_are_sorted_by_step(tmp_path):
    run = tmp_path / "run4"
    run.mkdir()
    rows = [_update(1, 2048), _update(0, 1024), _update(1, 2048)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    x, _ = curves.load_training_log(run).series("update", "entropy")
    np.testing.assert_array_equal(x, [1024, 2048, 2048])


def test_rolling_mean_skips_nan():
    y = np.array([1.0, math.nan, 3.0, 5.0])
    np.testing.assert_allclose(curves.rolling_mean(y, 2), [1.0, 1.0, 3.0, 4.0])


def _missing(p):
    pass


def _no_file(p):
    p.mkdir()


def _empty(p):
    p.mkdir()
    (p / "metrics.jsonl").write_text("")


def _garbage(p):
    p.mkdir()
    (p / "metrics.jsonl").write_text("garbage\n{}\n")


@pytest.mark.parametrize(
    "setup, message",
    [
        (_missing, "does not exist"),
        (_no_file, "no metrics.jsonl"),
        (_empty, "no episode or update rows"),
        (_garbage, "no episode or update rows"),
    ],
)
def test_user_errors(tmp_path, setup, message, capsys):
    run = tmp_path / "run"
    setup(run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UserError, match=message):
            curves.load_training_log(run)
    assert [str(w.message) for w in caught] == (
        [f"skipped 2 malformed line(s) in {run / 'metrics.jsonl'}"] if setup is _garbage else []
    )
    # through the real CLI: one line, exit status 2
    assert cli.main(["plot", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
