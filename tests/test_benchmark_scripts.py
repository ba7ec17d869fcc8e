"""The prepared benchmark scripts parse: the GPU session's one script (run only on a lent GPU, so a syntax error would
cost that session) and the other benchmarks' command lines."""

from __future__ import annotations

import re
import subprocess
import sys

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
