"""Faults with real processes: a crashing or killed rank, SIGINT/SIGTERM, SIGKILL mid-checkpoint, NaN losses.

Every run is the real train script with 2 CPU workers (gloo). Faults come from a test hook on the training loop,
``tests/faults.py`` (a `clstm_ppo.training.callbacks.Callback` run through `python -m tests.faults SPEC ...`,
the train command with the hook on every worker). After each
fault the test checks the job ended with one ``error:`` line (no traceback), that no process it started
survives, that the checkpoint left behind loads, and that ``--resume latest`` continues the counters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from clstm_ppo.training.checkpoint import load_checkpoint
from clstm_ppo.training.run_folder import remove_stale_temp_files
from tests.conftest import TINY as CONFTEST_TINY
from tests.conftest import alive, descendants

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "train_distributed_clstm_ppo.py")
# 4 tickers, 5-day windows, tiny nets; 16-day episodes end with each 16-step rollout, so one update of
# 2 workers x 4 envs finishes 8 episodes.
EVERY_UPDATE = ROOT / "tests" / "fixtures" / "checkpoint_every_update.json"  # {"checkpoint_every": 1}
TINY = [*CONFTEST_TINY, "--log_every", "8", "--num_workers", "2", "--config", str(EVERY_UPDATE)]


def command(fault: str | None) -> list[str]:
    """The train command, with the fault hook `tests.faults` on every worker when ``fault`` names one."""
    return [sys.executable, "-m", "tests.faults", fault] if fault else [sys.executable, SCRIPT]


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "LOCAL_WORLD_SIZE",
            "CLSTM_PPO_DEBUG",
        )
    }
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), **extra}


class Job:
    """The train script as a child process whose output is read as it comes."""

    def __init__(self, tmp_path: Path, *args: str, fault: str | None = None, **env: str) -> None:
        cmd = [*command(fault), *TINY, "--checkpoint_dir", str(tmp_path / "ck"), *args]
        self.proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.workers: set[int] = set()
        self._threads = [
            threading.Thread(target=self._pump, args=(s, b), daemon=True)
            for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Wait until stdout holds ``text`` (and note the worker processes then alive)."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.out):
            assert self.proc.poll() is None, f"exited early: {''.join(self.err)[-2000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in {''.join(self.out)[-2000:]}"
            time.sleep(0.05)
        self.workers |= descendants(self.proc.pid)

    def finish(self, timeout: float) -> int:
        """Wait for the job to end (failing the test past ``timeout`` s); check nothing it started survives."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in descendants(self.proc.pid) | {self.proc.pid}:
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"still running after {timeout} s: {''.join(self.out)[-1500:]}") from None
        for t in self._threads:
            t.join(5)
        assert len(self.workers) >= 2, "never saw the worker processes"
        # the job has exited; its workers must be gone too (give the kernel a moment to reap them)
        deadline = time.monotonic() + 10
        while alive(self.workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(self.workers), f"orphans left behind: {alive(self.workers)}"
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    @property
    def stdout(self) -> str:
        return "".join(self.out)


def run(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, SCRIPT, *TINY, "--checkpoint_dir", str(tmp_path / "ck"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_resume_continues(tmp_path: Path, run_name: str | None, run_dir: Path) -> None:
    before = load_checkpoint(run_dir / "latest.pt").counters
    target = before["episodes"] + 16
    args = ["--resume", "latest", "--num_episodes", str(target)] + (["--run_name", run_name] if run_name else [])
    resumed = run(tmp_path, *args)
    assert resumed.returncode == 0, resumed.stderr
    after = load_checkpoint(run_dir / "latest.pt").counters
    assert after["update"] == before["update"] + 2 and after["episodes"] == target
    assert after["global_step"] == before["global_step"] + 2 * 2 * 4 * 16
    episodes = [m["episode"] for m in metrics(run_dir) if m["kind"] == "episode"]
    assert episodes[-16:] == list(range(before["episodes"] + 1, target + 1))


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0])
def test_exception_in_a_rank_ends_the_job_with_its_error_once(tmp_path, rank):
    job = Job(tmp_path, "--num_episodes", "1000", "--run_name", "crash", fault=f"rank={rank},update=3")
    job.wait_for("world size 2")
    code = job.finish(timeout=60)
    assert code == 1
    line = one_error_line(job.stderr)
    assert line == (
        f"error: worker rank {rank} failed: RuntimeError: injected fault on rank {rank} "
        f"at update 3 (--debug shows the traceback)"
    )
    run_dir = tmp_path / "ck" / "crash"
    assert load_checkpoint(run_dir / "latest.pt").counters["update"] == 2  # the last update before the crash
    if rank == 1:
        assert_resume_continues(tmp_path, "crash", run_dir)


@pytest.mark.slow
def test_debug_shows_the_failing_ranks_traceback(tmp_path):
    job = Job(tmp_path, "--num_episodes", "1000", "--run_name", "dbg", "--debug", fault="rank=1,update=3")
    job.wait_for("world size 2")
    assert job.finish(timeout=60) == 1
    assert "Traceback" in job.stderr and "in on_rollout_end" in job.stderr  # the hook raised it
    assert job.stderr.count("error: worker rank 1 failed: RuntimeError") == 1


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_ends_the_job(tmp_path):
    job = Job(tmp_path, "--num_episodes", "1000", "--run_name", "killed", fault="rank=1,update=3,kind=kill")
    job.wait_for("world size 2")
    assert job.finish(timeout=60) == 1
    assert one_error_line(job.stderr) == "error: worker rank 1 was killed by SIGKILL (out of memory?)"
    assert load_checkpoint(tmp_path / "ck" / "killed" / "latest.pt").counters["update"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_parent_saves_a_checkpoint_and_stops_every_process(tmp_path, sig):
    job = Job(tmp_path, "--num_episodes", "100000", "--run_name", "sig")
    job.wait_for("Episode 16/")
    job.proc.send_signal(sig)
    code = job.finish(timeout=30)
    assert code == 128 + sig, job.stderr
    assert "Traceback" not in job.stderr and "error:" not in job.stderr
    assert f"{sig.name}: finishing the current update and saving a checkpoint" in job.stderr
    assert "[Rank 0] stop requested: checkpoint saved, exiting" in job.stdout
    run_dir = tmp_path / "ck" / "sig"
    counters = load_checkpoint(run_dir / "latest.pt").counters
    assert f"stopped after {counters['episodes']} episodes (update {counters['update']})" in job.stdout
    assert counters["episodes"] >= 16
    # the last logged episode is the last one the checkpoint counts: nothing trained after the save
    assert [m for m in metrics(run_dir) if m["kind"] == "episode"][-1]["episode"] == counters["episodes"]
    assert_resume_continues(tmp_path, None if sig == signal.SIGINT else "sig", run_dir)  # newest run, or by name


def test_workers_of_a_launcher_killed_outright_save_and_stop(tmp_path):
    """SIGKILL of the launching process alone (nothing forwards it): each rank sees its parent gone, stops as on
    SIGTERM (the update finished by every rank, latest.pt written) and exits, leaving no orphan training."""
    job = Job(tmp_path, "--num_episodes", "100000", "--run_name", "orphaned")
    job.wait_for("Episode 16/")
    job.proc.kill()
    assert job.finish(timeout=30) == -signal.SIGKILL  # the workers are checked gone within 10 s of it
    assert load_checkpoint(tmp_path / "ck" / "orphaned" / "latest.pt").counters["episodes"] >= 16


@pytest.mark.slow
def test_a_second_signal_forces_the_exit(tmp_path):
    job = Job(tmp_path, "--num_episodes", "100000", "--run_name", "twice")
    job.wait_for("Episode 16/")  # update 2 logged: update 1's checkpoint is surely on disk
    job.proc.send_signal(signal.SIGINT)
    while "SIGINT: finishing" not in job.stderr:  # two signals at once would reach Python as one
        time.sleep(0.01)
    job.proc.send_signal(signal.SIGINT)
    assert job.finish(timeout=30) == 128 + signal.SIGINT
    assert "stopping at once: workers killed; the last complete checkpoint is kept" in job.stderr
    assert "Traceback" not in job.stderr
    assert load_checkpoint(tmp_path / "ck" / "twice" / "latest.pt").counters["update"] >= 1


WRITER = """
import sys, torch
from clstm_ppo.training.checkpoint import save_checkpoint
big = torch.arange(12_000_000, dtype=torch.float32)  # 48 MB: each write takes a while
i = 0
while True:
    payload = {"format_version": 1, "config": {}, "model_config": {}, "market_spec": {},
               "model_state": {"w": big + i}, "counters": {"i": i}}
    print(f"writing {i}", flush=True)
    save_checkpoint(sys.argv[1], payload)
    i += 1
"""


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_loadable(tmp_path):
    path = tmp_path / "run" / "latest.pt"
    for _attempt in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True
        )
        for line in proc.stdout:
            if line.startswith("writing 2"):
                break
        while not list(path.parent.glob(".latest.pt.*.tmp")):  # a write is in flight
            time.sleep(0.005)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if list(path.parent.glob(".latest.pt.*.tmp")):  # the temp file survived: killed mid-write
            break
    else:
        pytest.fail("never managed to kill the writer in the middle of a write")
    ckpt = load_checkpoint(path)
    i = ckpt.counters["i"]
    assert i >= 1 and torch.equal(ckpt.model_state["w"][:5], torch.arange(5, dtype=torch.float32) + i)
    assert len(remove_stale_temp_files(path.parent)) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]


@pytest.mark.slow
def test_a_nan_update_is_skipped_and_counted_and_training_goes_on(tmp_path):
    # rank 1's rewards are NaN in update 2 only: the all-reduced gradients are NaN on both ranks
    result = subprocess.run(
        [
            *command("rank=1,update=2,kind=nan,count=1"),
            *TINY,
            "--checkpoint_dir",
            str(tmp_path / "ck"),
            "--num_episodes",
            "32",
            "--run_name",
            "nan1",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    updates = [m for m in metrics(tmp_path / "ck" / "nan1") if m["kind"] == "update"]
    assert [u["skipped_steps"] for u in updates] == [0, 4, 0, 0]  # 2 epochs x 2 minibatches skipped
    counters = load_checkpoint(tmp_path / "ck" / "nan1" / "latest.pt").counters
    assert counters["skipped_steps"] == 4 and counters["bad_updates"] == 0 and counters["update"] == 4


@pytest.mark.slow
def test_nan_in_a_row_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path):
    (tmp_path / "bad3.json").write_text(json.dumps({"checkpoint_every": 1, "max_bad_updates": 3}))
    result = subprocess.run(
        [
            *command("rank=0,update=3,kind=nan"),
            *TINY,
            "--checkpoint_dir",
            str(tmp_path / "ck"),
            "--num_episodes",
            "1000",
            "--run_name",
            "nan",
            "--config",
            str(tmp_path / "bad3.json"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 2
    run_dir = tmp_path / "ck" / "nan"
    assert one_error_line(result.stderr) == (
        f"error: stopped: 3 updates in a row had NaN/inf loss or gradients (their optimizer steps were skipped); "
        f"the last good checkpoint is kept: {run_dir / 'latest.pt'}; try a lower learning rate or --max_grad_norm"
    )
    ckpt = load_checkpoint(run_dir / "latest.pt")
    assert ckpt.counters["update"] == 2 and ckpt.counters["bad_updates"] == 0
    assert all(torch.isfinite(v).all() for v in ckpt.model_state.values())
    updates = [m for m in metrics(run_dir) if m["kind"] == "update"]
    assert [u["skipped_steps"] for u in updates] == [0, 0, 4, 4, 4]
    assert_resume_continues(tmp_path, "nan", run_dir)
