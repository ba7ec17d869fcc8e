"""The prepared benchmark scripts parse: the GPU session's one script (run only on a lent GPU, so a syntax error would
cost that session) and the other benchmarks' command lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, clean_env


def test_the_gpu_check_script_parses_and_its_six_steps_fit_in_8_minutes():
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    limits = [int(m) for m in re.findall(r'^step "[^"]*" (\d+) ', text, flags=re.MULTILINE)]
    assert len(limits) == 6 and sum(limits) <= 480, limits  # each step's timeout: the worst case stays under 8 min
    assert "tests/test_cuda.py" in text and "--batch_cells 12" in text and "--window_kernels shared" in text


@pytest.mark.parametrize(
    "script, named",
    [
        ("study_batched.py", ["--batch_cells 1"]),  # the batched-study benchmark's ways
        ("study_ray.py", ["--cells", "--repeats", "--ray"]),  # the local pool against a two-node Ray cluster
        ("same_numbers.py", ["--before", "--presets", "--seeds"]),  # the same-numbers check's yardstick, presets, batch
    ],
)
def test_a_benchmark_explains_itself(script, named):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert proc.returncode == 0 and all(flag in proc.stdout for flag in named), proc.stdout


def test_the_learning_test_is_sized_by_an_upper_bound_on_the_failure_rate(tmp_path):
    """benchmarks/learning_test_size.py: from seeds that never fail the test's chance of failing is small and falls
    with more seeds; the same seeds with a quarter behind buy-and-hold give a far larger chance, and the upper bound
    is above the point estimate."""

    def seeds(behind: int) -> dict:
        rng = np.random.default_rng(behind)
        rows = []
        for i in range(24):
            bh = float(rng.normal(1.0, 1.0))
            trained = bh - 1.0 if i < behind else bh + 1.5 + float(rng.normal(0.0, 0.6))
            rows.append({"seed": i, "trained": trained, "buy_and_hold": bh, "untrained": bh - 0.1, "oracle": bh + 3.5})
        return {"seeds": rows, "commit": "test"}

    chances = {}
    for behind in (0, 6):
        (tmp_path / f"{behind}.json").write_text(json.dumps(seeds(behind)))
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "learning_test_size.py"), str(tmp_path / f"{behind}.json")]
            + ["--seeds", "6,10"],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        rows = re.findall(r"^\| (\d+) \| ([\d.]+)% \| ([\d.]+)% \|$", proc.stdout, re.M)
        chances[behind] = {int(m): (float(upper), float(point)) for m, upper, point in rows}
        assert f"{behind}/24 distinct seeds behind buy-and-hold" in proc.stdout
    assert chances[0][10][0] <= chances[0][6][0] < 5.0
    assert chances[6][6][0] > 5 * max(chances[0][6][0], 0.1) and chances[6][6][0] > chances[6][6][1]


@pytest.mark.slow
def test_the_signal_recovery_curve_plants_trains_reads_and_resumes(tmp_path):
    """benchmarks/signal_recovery.py on a tiny plan: one planted file per seed, one run per seed, each read beside
    its untrained self, buy-and-hold and the reference trader of its column; run again, it reads and trains nothing."""
    from envs.synthetic import generate_market

    data = tmp_path / "prices.csv"
    generate_market(num_tickers=3, num_days=560, seed=3).to_path(data)
    tiny = {"window": 5, "num_envs": 4, "n_steps": 16, "batch_size": 32, "epochs": 1, "episode_length": 16}
    tiny |= {"stage1_hidden": 8, "feature_dim": 8, "stage2_hidden": 16, "num_episodes": 4, "policy": "mlp"}
    days = {"train_end": "2015-03-31", "validation_end": "2015-08-31", "test_end": "2016-02-24"}
    plan = {"data": f"csv:{data}", "halflife": 5, "choose": {**days, "ics": [0.2], "seeds": [11, 12]}}
    plan["choose"]["candidates"] = {"tiny": tiny}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    command = [sys.executable, str(ROOT / "benchmarks" / "signal_recovery.py"), "--plan", str(tmp_path / "plan.json")]
    command += ["--phase", "choose", "--dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out.json")]
    proc = subprocess.run(command, capture_output=True, text=True, env=clean_env(), timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    rows = out["candidates"]["tiny"]["rows"]["0.2"]
    assert [r["seed"] for r in rows] == [11, 12] and all(np.isfinite(r["oracle"]) for r in rows)
    assert all(r["train_seconds"] > 0 for r in rows)
    curve = out["candidates"]["tiny"]["curve"]["0.2"]
    assert set(curve["minus_untrained"]) >= {"mean", "lo", "hi"} and "paired test of share" in curve["share_words"]
    assert "| 0.2 |" in proc.stdout and "IC 0.2 with the next-open fill returns" in out["planted"]["ic0.2-s11"]
    again = subprocess.run([*command, "--train_only"], capture_output=True, text=True, env=clean_env(), timeout=300)
    assert again.returncode == 0 and "(0 s of training)" in again.stdout, again.stderr  # resumed: nothing to train
    planted = [(tmp_path / "runs" / "choose" / "planted" / f"ic0.2-s{s}.csv").read_text() for s in (11, 12)]
    assert planted[0] != planted[1]  # each seed its own forecast
