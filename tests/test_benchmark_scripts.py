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
        ("same_numbers.py", ["--before", "--presets"]),  # the same-numbers check's yardstick and presets
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
