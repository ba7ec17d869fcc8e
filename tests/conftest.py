"""Shared test helpers: the tiny-run flags and process helpers, small models and rollouts, a small market.

Fast loop: ``python -m pytest -m "not slow"`` (about 2 minutes on 2 cores); the full suite is ``python -m pytest``
(two workers, one test file each at a time: pyproject.toml's addopts; ``-n 0`` runs it in one process).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clstm_ppo.agent.build import make_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.spec import ModelSpec
from clstm_ppo.agent.windows import WindowStore
from clstm_ppo.config import PPOConfig, TrainConfig
from clstm_ppo.threads import torch_threads
from clstm_ppo.training.checkpoint import open_checkpoint
from clstm_ppo.training.rollout import RolloutBuffer
from envs.config import EnvConfig
from envs.data import split_days
from envs.factor_market import MarketModel
from envs.features import PreparedMarket
from envs.synthetic import generate_market
from envs.vector_env import VectorStockTradingEnv
from tests.procs import live_tree, proc_table

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "train_distributed_clstm_ppo.py")

TINY_MODEL = [
    "--window",
    "5",
    "--num_envs",
    "4",
    "--n_steps",
    "16",
    "--batch_size",
    "32",
    "--epochs",
    "2",
    "--episode_length",
    "16",
    "--stage1_hidden",
    "8",
    "--feature_dim",
    "8",
    "--stage2_hidden",
    "16",
]
"""A tiny model and rollout: the flags a study's cells and most end-to-end tests start from."""
TINY_RUN = [*TINY_MODEL, "--num_gpus", "0", "--no-progress", "--threads", "1"]
"""The tiny model trained on one CPU process and thread, no data named."""
TINY = ["--data", "synthetic:tickers=4,days=400", *TINY_RUN, "--log_every", "1"]


@pytest.fixture(autouse=True, scope="session")
def private_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every test (and every command it starts) keeps its trials ledger in a temporary folder, never in the
    user's home: a test that needs its own ledger passes ``--ledger``."""
    from clstm_ppo.evaluation.ledger import LEDGER_ENV

    path = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    os.environ[LEDGER_ENV] = str(path)
    return path


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """Torch work inside the test process runs on one thread (subprocesses choose their own, mostly --threads 1).

    The models here are tiny: a second OpenMP thread buys nothing, and on the 2-core box, busy with the
    subprocesses the tests start (or any other job), it spins and waits: test_ppo's aux-loss test took 177 s
    with two threads and 5 s with one on a loaded box.
    """
    with torch_threads(1):
        yield


def clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


ALPACA_VARS = (
    "ALPACA_API_KEY",
    "ALPACA_SECRET_KEY",
    "APCA_API_KEY_ID",
    "APCA_API_SECRET_KEY",
    "ALPACA_DATA_URL",
    "ALPACA_TRADING_URL",
    "ALPACA_MAX_RETRIES",
    "ALPACA_RETRY_WAIT_SECONDS",
    "ALPACA_TIMEOUT_SECONDS",
)
"""Every environment variable the Alpaca code reads."""


def use_alpaca_keys(monkeypatch: pytest.MonkeyPatch, key: str, secret: str) -> None:
    """No Alpaca variable but these keys, and fast retries."""
    for name in ALPACA_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALPACA_API_KEY", key)
    monkeypatch.setenv("ALPACA_SECRET_KEY", secret)
    monkeypatch.setenv("ALPACA_RETRY_WAIT_SECONDS", "0.01")


def settings_file(folder: Path, **settings: object) -> list[str]:
    """``["--config", PATH]`` of a JSON file in ``folder`` holding ``settings``: how a run sets the knobs that have
    no flag (``data_url``, ``data_cache_dir``, ``checkpoint_every``, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"settings-{len(list(folder.glob('settings-*.json')))}.json"
    path.write_text(json.dumps(settings), encoding="utf-8")
    return ["--config", str(path)]


def train(
    tmp_path: Path, *args: str, launcher: list[str] | None = None, timeout: int = 240, here: bool = False
) -> subprocess.CompletedProcess:
    """The tiny run (`TINY`) with ``args``, its folders under ``tmp_path``: the training script as a process (through
    ``launcher``, e.g. torchrun), or with ``here`` the same command in this interpreter (`run_here`)."""
    argv = [*TINY, "--checkpoint_dir", str(tmp_path / "ck"), *args]
    if here:
        assert launcher is None, "a launcher starts processes"
        return run_here(["train", *argv], tmp_path)
    cmd = [*(launcher or [sys.executable]), SCRIPT, *argv]
    return subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def run_here(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``clstm-ppo ARGV`` run by `clstm_ppo.cli.main` (what ``python -m clstm_ppo.cli`` and the training script run)
    in this interpreter, in ``cwd`` with ``env`` (default: this one's) as its environment, its output captured: the
    command's result without a process's 2-3 CPU-s of imports (torch, and torch._dynamo with the first optimizer).

    For a command whose test claims nothing about the command's own process (the processes it starts, such as a
    study's cells, are processes as always); a test of signals, kills, ranks, launchers or what a process prints
    beside the command (Python's warnings) starts a real one. After it, this interpreter's working folder,
    environment, signal handlers, torch thread count and the torch and NumPy global generators are as they were."""
    from clstm_ppo import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    generators, threads = (torch.get_rng_state(), np.random.get_state()), torch.get_num_threads()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        torch.set_rng_state(generators[0])
        np.random.set_state(generators[1])
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


QUICK_DATA = ["--data", "synthetic:tickers=3,days=200"]
QUICK = [
    *TINY_RUN,
    *["--num_envs", "2", "--n_steps", "8", "--batch_size", "16", "--epochs", "1", "--episode_length", "8"],
    *["--num_episodes", "2"],
]
"""The smallest run that writes a checkpoint (2 episodes of 8 days), without its data flag (QUICK_DATA)."""


@pytest.fixture(scope="session")
def quick_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``latest.pt`` of one QUICK run on QUICK_DATA (3 synthetic tickers, stage-2 width 16), trained once per
    session by the real command and shared read-only (copy it before changing it)."""
    root = tmp_path_factory.mktemp("quick_checkpoint")
    result = subprocess.run(
        [sys.executable, SCRIPT, *QUICK_DATA, *QUICK, "--checkpoint_dir", str(root / "ck"), "--run_name", "quick"],
        cwd=root,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return root / "ck" / "quick" / "latest.pt"


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == "episode"], [r for r in rows if r["kind"] == "update"]


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


TINY_CELL_RUN = dict(
    data="synthetic:tickers=3,days=400",
    window=5,
    stage1_hidden=12,
    feature_dim=10,
    stage2_hidden=16,
    num_envs=8,
    n_steps=16,
    batch_size=64,
    epochs=2,
    episode_length=20,
    num_episodes=16,
    progress=False,
    log_every=1000,
)
"""A batched cell's tiny run, by setting name (tests/test_cells.py, tests/test_cuda.py): 8 envs x 16 days per update,
20-day episodes, so 3 updates finish 16 episodes (episode ends, truncations and resets inside the rollouts); 2 epochs
of 2 minibatches."""


PAPER_NET = dict(
    stage1_hidden=128,
    feature_dim=128,
    stage2_hidden=512,
    init_log_std=-0.5,
    action_dist="gaussian",
    log_std_max=None,
    obs_norm=False,
)
"""The network fields tests build unless they say otherwise: the paper's (Gaussian, unbounded log-std)."""


def net_spec(policy: str, num_features: int, num_tickers: int, window: int, **fields) -> ModelSpec:
    """A `ModelSpec` for a test network of F features, N tickers and a T-day window (`PAPER_NET` unless told)."""
    return ModelSpec(
        policy=policy, num_features=num_features, num_tickers=num_tickers, window=window, **{**PAPER_NET, **fields}
    )


def small_model(
    policy: str = "clstm",
    tickers: int = 3,
    window: int = 5,
    features: int = 16,
    action_dist: str = "gaussian",
    log_std_max: float | None = None,
) -> ActorCritic:
    torch.manual_seed(0)
    return make_policy(
        net_spec(
            policy,
            features,
            tickers,
            window,
            stage1_hidden=12,
            feature_dim=10,
            stage2_hidden=14,
            action_dist=action_dist,
            log_std_max=log_std_max,
        )
    )


def fake_rollout(model: ActorCritic, steps: int = 12, envs: int = 4, seed: int = 0) -> RolloutBuffer:
    """A rollout collected step by step with model.act on random episode starts and random windows that
    move on by one random row per step, as the env's do (a fresh random window at each episode start)."""
    cfg = model.spec
    gen = torch.Generator().manual_seed(seed)
    buf = RolloutBuffer.allocate(steps, envs, (cfg.window, cfg.num_features), cfg.num_tickers, "cpu")
    state = model.initial_state(envs)
    buf.initial_state = state.map(torch.Tensor.clone)
    start = torch.ones(envs, dtype=torch.bool)
    obs = torch.randn(envs, cfg.window, cfg.num_features, generator=gen)
    for s in range(steps):
        fresh = torch.randn(envs, cfg.window, cfg.num_features, generator=gen)
        moved = torch.cat([obs[:, 1:], fresh[:, :1]], dim=1)
        obs = torch.where(start.view(-1, 1, 1), fresh, moved) if s else fresh
        buf.obs.record(s, obs, anchor=bool(start.any()))
        buf.starts[s] = start
        action, log_prob, value, state = model.act(obs, state, start, generator=gen)
        buf.actions[s], buf.log_probs[s], buf.values[s] = action, log_prob, value
        buf.rewards[s] = torch.randn(envs, generator=gen)
        done = torch.rand(envs, generator=gen) < 0.2
        buf.dones[s] = done
        start = done
    return buf


def ppo_cfg(**kw) -> PPOConfig:
    """Small PPO settings (the PPO section) for the update tests; ``kw`` by flag name."""
    base = dict(num_envs=4, n_steps=12, batch_size=24, epochs=3, ent_coef=0.01)
    return TrainConfig.from_dict({**base, **kw}).validate().ppo


WINDOW_MARKET_WINDOW = 6


@pytest.fixture(scope="module")
def window_market() -> PreparedMarket:
    """3 synthetic tickers, 300 days, 6-day windows, no turbulence stop."""
    data = generate_market(num_tickers=3, num_days=300, seed=5)
    return PreparedMarket.prepare(
        data, split_days(data, window=WINDOW_MARKET_WINDOW), window=WINDOW_MARKET_WINDOW, use_turbulence=False
    )


def record_env_rollout(market: PreparedMarket, steps: int, envs: int = 4) -> tuple[WindowStore, torch.Tensor]:
    """Run the env with random actions, recording like RolloutCollector.collect; also keep the dense obs."""
    env = VectorStockTradingEnv(market, num_envs=envs, config=EnvConfig(episode_length=9), seed=1)
    stop = env.split.stop
    # staggered start days near the split's end: envs terminate on different steps, then restart
    obs, _ = env.reset(options={"start_day": [stop - 2 - k for k in (2, 4, 7, 30)][:envs]})
    store = WindowStore(steps, envs, market.window, market.num_features, "cpu")
    dense, anchor = [], True
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        store.record(step, obs, anchor=anchor)
        dense.append(obs.clone())
        obs, _, _, _, info = env.step(torch.rand(envs, market.num_tickers, generator=gen) * 2 - 1)
        anchor = "_episode" in info
    return store, torch.stack(dense)


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (from /proc)."""
    return live_tree([pid]) - {pid}


def alive(pids: set[int]) -> set[int]:
    return pids & proc_table().keys()


CHECKSUM_RTOL = 1e-10
"""Relative tolerance of `array_checksums`: numpy's exp and log round the last bit differently by CPU (AVX2 against
AVX-512), which moves a checksum by about 1e-15; a changed generator moves every value, and its checksums by far more."""


def array_checksums(x: np.ndarray) -> list[float]:
    """Three numbers that pin a float array up to the last bits: its sum, its sum of squares and its sum weighted by
    fixed pseudo-random weights in [0.5, 1.5) (compared with `CHECKSUM_RTOL`; a hash of the bytes would fail on a CPU
    whose numpy rounds the last bit differently)."""
    flat = np.asarray(x, dtype=np.float64).ravel()
    weights = np.random.default_rng(20261127).uniform(0.5, 1.5, flat.size)
    return [float(flat.sum()), float((flat * flat).sum()), float((flat * weights).sum())]


VALUE_RTOL = 1e-4
"""Relative tolerance of a final portfolio value recorded on another machine (the fixtures': an AVX2 EPYC). Here the
market is generated again (numpy's exp and log may round the last bit otherwise: prices move by about 1e-16 of
themselves) and the network runs on this CPU's kernels (oneDNN's float32 LSTM on AVX-512 rounds otherwise: actions
move by about 1e-7). A share count is an action times hmax rounded to a whole share, so an action that sits within
1e-7 of a rounding boundary buys one share more or less: a $20-200 stock moving a few percent until the end of the
episode, under $100 of $1,000,000. A changed generator, network or trading rule moves these values by far more."""
SHARPE_ATOL = 1e-3
"""Absolute tolerance of a Sharpe ratio recorded on another machine: one share more or less on a day moves a day's
return by under 1e-4 of the book, and the Sharpe ratio of a year's days by well under 1e-3."""


REAL_STOCK_RANGES = {
    "abs_acf1": (0.15, 0.30),
    "pair_corr": (0.2, 0.5),
    "overnight_share": (0.30, 0.50),
    "annual_vol": (0.20, 0.45),
    "leverage": (-0.15, -0.01),
}
"""Issue 48's ranges of stylized facts for the mean over tickers of real daily stocks (docs/data.md's table)."""


def assert_facts_of_real_stocks(facts: Any, ranges: dict[str, tuple[float, float]], seed: int) -> None:
    """A generated market's `envs.facts.Facts` within ``ranges``, with correlations that rise in sell-offs and no
    stock leading another (no planted signal)."""
    for name, (lo, hi) in ranges.items():
        assert lo <= getattr(facts, name) <= hi, (seed, name, getattr(facts, name))
    assert facts.selloff_corr > facts.pair_corr + 0.03  # correlations rise in sell-offs
    assert facts.next_day_corr_median < 0.03  # no stock leads another without a planted signal


SYNTHETIC_BAD_ARGUMENTS = [
    ({"signal_ic": 0.5}, "signal_ic must be in [0, 0.5)"),
    ({"signal_ic": -0.01}, "signal_ic must be in [0, 0.5)"),
    ({"signal_ic": float("nan")}, "signal_ic must be in [0, 0.5)"),
    ({"signal_kind": "noise"}, "unknown synthetic signal 'noise'"),
    ({"signal_halflife": 0}, "signal_halflife must be a positive number"),
    ({"signal_overnight": 1.0}, "signal_overnight must be in [0, 1)"),
    ({"lag": 10}, "synthetic lag 10 must be shorter than the 10 days"),
    ({"num_tickers": 0}, "num_tickers must be a whole number >= 1"),
    ({"start": "yesterday-ish"}, "start date 'yesterday-ish' is not a date"),
    ({"model": MarketModel(ticker_vol=(0.2, 0.3))}, "this fitted synthetic market has 2 tickers, not 30"),
]
"""Arguments generators 2 and 3 refuse (with ``num_days=10``), each with the words of its one-line error."""


TIMINGS = ("time", "steps_per_second", "rollout_seconds", "update_seconds")
"""metrics.jsonl's wall-clock figures: never the same twice."""


def same_number(a: float, b: float) -> bool:
    """Equal to 4 significant figures; near-zero means of +-1 terms (the policy loss) to their float32 rounding."""
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


def assert_same_run(alone: Path, batched: Path) -> None:
    """``batched`` (a cell of a batch) holds what ``alone`` (its run alone) holds: float32 weights within 1e-5
    relative (the largest difference over the network's largest weight; and each entry within 1e-4 relative or 1e-6:
    the biases start at 0 and move by Adam's normalised steps, where float rounding of a near-zero gradient shows
    most), every metric line to 4 figures, the counters, and checkpoints of one format."""
    a, b = open_checkpoint(alone / "latest.pt"), open_checkpoint(batched / "latest.pt")
    assert a.model_state.keys() == b.model_state.keys()
    weights = {k: v for k, v in a.model_state.items() if v.dtype == torch.float32}
    scale = max(float(w.abs().max()) for w in weights.values())
    for name, weight in a.model_state.items():
        other = b.model_state[name]
        assert other.dtype == weight.dtype and other.shape == weight.shape, name
        if name in weights and weight.numel():
            assert float((weight - other).abs().max()) < 1e-5 * scale, name
            torch.testing.assert_close(other, weight, rtol=1e-4, atol=1e-6, msg=name)
    skip = {"elapsed", "best_score"}
    assert {k: v for k, v in a.counters.items() if k not in skip} == {
        k: v for k, v in b.counters.items() if k not in skip
    }
    assert same_number(a.counters["best_score"], b.counters["best_score"])
    assert a.model_config == b.model_config and a.market_spec == b.market_spec
    output = ("run_name", "checkpoint_dir")  # where each wrote
    assert {k: v for k, v in a.config.items() if k not in output} == {
        k: v for k, v in b.config.items() if k not in output
    }
    assert a.optimizer_state["param_groups"] == b.optimizer_state["param_groups"]
    for index, entry in a.optimizer_state["state"].items():
        assert {k: (v.dtype, v.shape) for k, v in entry.items()} == {
            k: (v.dtype, v.shape) for k, v in b.optimizer_state["state"][index].items()
        }
    assert len(a.worker_states) == len(b.worker_states)  # one per rank
    for wa, wb in zip(a.worker_states, b.worker_states, strict=True):
        assert wa.keys() == wb.keys() and wa["env"].keys() == wb["env"].keys()
        assert torch.equal(wa["shuffle_gen"], wb["shuffle_gen"]) and torch.equal(wa["action_gen"], wb["action_gen"])
        assert torch.equal(wa["torch_rng"], wb["torch_rng"]) and torch.equal(wa["env"]["gen"], wb["env"]["gen"])
    assert (alone / "best.pt").is_file() == (batched / "best.pt").is_file()
    lines_a = [json.loads(x) for x in (alone / "metrics.jsonl").read_text().splitlines()]
    lines_b = [json.loads(x) for x in (batched / "metrics.jsonl").read_text().splitlines()]
    assert len(lines_a) == len(lines_b)
    for row_a, row_b in zip(lines_a, lines_b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a.keys() - set(TIMINGS):
            va, vb = row_a[key], row_b[key]
            pairs = zip(va, vb, strict=True) if isinstance(va, list) else [(va, vb)]
            assert all(same_number(x, y) if isinstance(x, float) else x == y for x, y in pairs), (row_a["kind"], key)


def nudged(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``function`` with its result moved up by 1 ulp in about 3% of the elements (those whose bits end in 00000 in
    binary): how numpy's AVX-512 ``exp`` and ``log`` differ from the C library's (never by more than 1 ulp)."""

    def other_cpu(x: np.ndarray) -> np.ndarray:
        out = np.asarray(function(x), dtype=np.float64)
        chosen = (out.view(np.uint64) % np.uint64(32)) == 0
        return np.where(chosen, np.nextafter(out, np.inf), out)[()]

    return other_cpu


@pytest.fixture
def another_cpus_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic generators' ``exp`` and ``log`` (`envs.libm`) round as on a CPU whose numpy differs from the C
    library in the last bit (`nudged`), on any CPU."""
    from envs import libm

    monkeypatch.setattr(libm, "machine_exp", nudged(np.exp))
    monkeypatch.setattr(libm, "machine_log", nudged(np.log))
