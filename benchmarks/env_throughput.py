"""Env steps per second of VectorStockTradingEnv next to FinRL's pandas StockTradingEnv, on the same data.

    python benchmarks/env_throughput.py                 # CPU (1 thread), plus CUDA when available
    python benchmarks/env_throughput.py --quick         # shorter timings
    python benchmarks/env_throughput.py --devices cpu   # or cuda
    python benchmarks/env_throughput.py --action_mode shares   # FinRL's own kind of action (hmax shares a day)

Data: synthetic, 30 tickers x 2,520 trading days (10 years), the paper's 4 indicators, turbulence on.
Actions: uniform random in [-1, 1], pregenerated on the env's device, read as today's training default
(``EnvConfig()``: target weights, log-return reward) unless ``--action_mode shares`` asks for the paper's and
FinRL's share orders. An "env step" is one day of one
episode, so a vector step of B envs counts B. Each figure is the median of 3 timed runs after a warm-up;
episodes (252 days) auto-reset inside the timed runs. torch uses 1 thread.

FinRL: ``finrl.meta.env_stock_trading.env_stocktrading.StockTradingEnv`` (``pip install finrl --no-deps``
plus stable-baselines3, which that module imports) is loaded from its file, skipping ``finrl/__init__``
(which imports live-trading clients). If it cannot be imported the reason is printed and a faithful
re-creation of its per-step pandas loop is timed instead, labelled as such.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from envs.config import EnvConfig
from envs.data import split_days
from envs.features import PreparedMarket
from envs.synthetic import generate_market
from envs.trading_env import StockTradingEnv
from envs.vector_env import VectorStockTradingEnv

FINRL_NAMES = {"macd": "macd", "rsi": "rsi_30", "cci": "cci_30", "adx": "dx_30"}


def _median_rate(run: Callable[[int], None], steps: int, per_step: int, repeats: int = 3) -> float:
    """Median env steps/s of `repeats` timed calls of run(steps)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        rates.append(steps * per_step / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_vector(
    market: PreparedMarket, config: EnvConfig, device: str, window: int, num_envs: int, seconds: float
) -> float:
    env = VectorStockTradingEnv(
        dataclasses.replace(market, window=window), num_envs=num_envs, config=config, device=device
    )
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    pool = [(torch.rand(num_envs, market.num_tickers, generator=g) * 2 - 1).to(device) for _ in range(16)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run(steps: int) -> None:
        for i in range(steps):
            env.step(pool[i % 16])
        sync()

    run(20)
    t0 = time.perf_counter()
    run(20)
    per_call = (time.perf_counter() - t0) / 20
    steps = max(30, int(seconds / per_call))
    return _median_rate(run, steps, num_envs)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_1024(market: PreparedMarket, config: EnvConfig, window: int) -> tuple[int, int, int, int]:
    """(state tensors, one step's returned tensors, RSS growth, market tensors) in bytes, 1024 CPU envs."""
    before = _rss_bytes()
    env = VectorStockTradingEnv(dataclasses.replace(market, window=window), num_envs=1024, config=config)
    env.reset(seed=0)
    actions = torch.rand(1024, market.num_tickers) * 2 - 1
    out = None
    for _ in range(300):  # past an auto-reset, holding the last step's outputs
        out = env.step(actions)
    grown = _rss_bytes() - before
    state = env._buf.nbytes + env._day.nbytes + sum(t.nbytes for t in env._s.values())
    obs, reward, term, trunc, info = out
    returned = obs.nbytes + reward.nbytes + sum(v.nbytes for v in info.values() if torch.is_tensor(v) and v is not obs)
    market_bytes = env._close.nbytes + env._mrows.nbytes + env._turbulent.nbytes
    return state, returned, grown, market_bytes


def finrl_frame(market: PreparedMarket) -> pd.DataFrame:
    """FinRL's input: long rows (date, tic, close, indicators, turbulence), index = day number."""
    data = market.data
    D, N = data.num_days, data.num_tickers
    cols = {
        "date": np.repeat(np.asarray(data.dates).astype("datetime64[D]").astype(str), N),
        "tic": np.tile(np.asarray(data.tickers), D),
        "close": data.close.reshape(-1),
    }
    for k, name in enumerate(market.indicator_names):
        cols[FINRL_NAMES[name]] = market.indicators[:, :, k].reshape(-1)
    cols["turbulence"] = np.repeat(market.turbulence, N)
    df = pd.DataFrame(cols)
    df.index = np.repeat(np.arange(D), N)  # FinRL's data_split: index = date.factorize()[0]
    return df


def load_finrl_env() -> tuple[type | None, str]:
    """FinRL's StockTradingEnv class, or None and the reason it cannot be imported."""
    spec = importlib.util.find_spec("finrl")
    if spec is None or not spec.submodule_search_locations:
        return None, "finrl is not installed (pip install finrl --no-deps)"
    path = os.path.join(spec.submodule_search_locations[0], "meta", "env_stock_trading", "env_stocktrading.py")
    try:
        mod_spec = importlib.util.spec_from_file_location("finrl_env_stocktrading", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - report any import failure as the reason
        return None, f"{type(err).__name__}: {err}"
    return module.StockTradingEnv, f"finrl {_version('finrl')} env_stocktrading.StockTradingEnv"


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


class FinRLRecreation:
    """The per-step work of FinRL's StockTradingEnv (0.3.x), re-created when it cannot be imported:
    a `df.loc[day, :]` lookup of the day's rows, Python loops over stocks for sells and buys, the
    state rebuilt as a Python list, and the memories FinRL appends to every step."""

    def __init__(self, df: pd.DataFrame, n: int, indicators: list[str], threshold: float) -> None:
        self.df, self.n, self.ind, self.threshold = df, n, indicators, threshold
        self.reset()

    def _state(self, cash: float, shares: list[float]) -> list[float]:
        d = self.data
        return [cash] + d.close.values.tolist() + list(shares) + sum((d[t].values.tolist() for t in self.ind), [])

    def reset(self) -> list[float]:
        self.day = 0
        self.data = self.df.loc[self.day, :]
        self.state = self._state(1e6, [0.0] * self.n)
        self.asset_memory, self.rewards, self.actions, self.dates = [1e6], [], [], [self.data.date.unique()[0]]
        return self.state

    def step(self, actions: np.ndarray) -> tuple[list[float], float, bool]:
        n, s = self.n, self.state
        if self.day >= len(self.df.index.unique()) - 1:
            return s, 0.0, True
        actions = (actions * 100).astype(int)
        begin = s[0] + sum(np.array(s[1 : n + 1]) * np.array(s[n + 1 : 2 * n + 1]))
        if self.data.turbulence.values[0] >= self.threshold:
            actions = np.array([-100] * n)
        order = np.argsort(actions)
        for i in order[: np.where(actions < 0)[0].shape[0]]:
            if s[i + 1] > 0 and s[i + n + 1] > 0:
                q = min(abs(actions[i]), s[i + n + 1])
                s[0] += s[i + 1] * q * (1 - 0.001)
                s[i + n + 1] -= q
        for i in order[::-1][: np.where(actions > 0)[0].shape[0]]:
            if s[i + 1] > 0:
                q = min(s[0] // (s[i + 1] * 1.001), actions[i])
                s[0] -= s[i + 1] * q * 1.001
                s[i + n + 1] += q
        self.actions.append(actions)
        self.day += 1
        self.data = self.df.loc[self.day, :]
        self.state = self._state(s[0], s[n + 1 : 2 * n + 1])
        end = self.state[0] + sum(np.array(self.state[1 : n + 1]) * np.array(self.state[n + 1 : 2 * n + 1]))
        self.asset_memory.append(end)
        self.dates.append(self.data.date.unique()[0])
        self.rewards.append(end - begin)
        return self.state, (end - begin) * 1e-4, False


def bench_finrl(market: PreparedMarket, steps: int) -> tuple[float, str]:
    df = finrl_frame(market)
    n = market.num_tickers
    names = [FINRL_NAMES[x] for x in market.indicator_names]
    cls, label = load_finrl_env()
    rng = np.random.default_rng(0)
    if cls is not None:
        env = cls(
            df=df,
            stock_dim=n,
            hmax=100,
            initial_amount=1_000_000,
            num_stock_shares=[0] * n,
            buy_cost_pct=[1e-3] * n,
            sell_cost_pct=[1e-3] * n,
            reward_scaling=1e-4,
            state_space=1 + 2 * n + len(names) * n,
            action_space=n,
            tech_indicator_list=names,
            turbulence_threshold=market.turbulence_threshold,
            print_verbosity=10**9,
        )
        env.reset(seed=0)

        def run(k: int) -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                for _ in range(k):
                    _, _, term, trunc, _ = env.step(rng.uniform(-1, 1, n).astype(np.float32))
                    if term or trunc:
                        env.reset()
    else:
        reason = label
        label = f"RE-CREATION of FinRL's per-step pandas loop (FinRL import failed: {reason})"
        env = FinRLRecreation(df, n, names, market.turbulence_threshold)

        def run(k: int) -> None:
            for _ in range(k):
                _, _, done = env.step(rng.uniform(-1, 1, n))
                if done:
                    env.reset()

    run(20)
    return _median_rate(run, steps, 1), label


def bench_gym(market: PreparedMarket, config: EnvConfig, steps: int) -> float:
    env = StockTradingEnv(market, config=config)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, (64, market.num_tickers)).astype(np.float32)

    def run(k: int) -> None:
        for i in range(k):
            _, _, term, trunc, _ = env.step(acts[i % 64])
            if term or trunc:
                env.reset()

    run(20)
    return _median_rate(run, steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="auto", help="auto | cpu | cuda | cpu,cuda")
    parser.add_argument("--quick", action="store_true", help="shorter timings (noisier)")
    parser.add_argument(
        "--action_mode",
        default=EnvConfig().action_mode,
        choices=("weights", "shares"),
        help="what an action means (default: training's default); shares is FinRL's own kind",
    )
    parser.add_argument("--memory-only", type=int, default=None, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = EnvConfig(action_mode=args.action_mode)
    if args.memory_only is not None:
        data = generate_market(num_tickers=30, num_days=2520, seed=0)
        market = PreparedMarket.prepare(data, split_days(data, window=30), window=30)
        print(json.dumps(memory_1024(market, config, args.memory_only)))
        return
    devices = (
        ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) if args.devices == "auto" else args.devices.split(",")
    )
    seconds = 0.3 if args.quick else 1.0

    data = generate_market(num_tickers=30, num_days=2520, seed=0)
    market = PreparedMarket.prepare(data, split_days(data, window=30), window=30)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        f" ({torch.get_num_threads()} thread)" + (f", {torch.cuda.get_device_name()}" if "cuda" in devices else "")
    )
    print(
        f"data: synthetic {data.num_tickers} tickers x {data.num_days} days, indicators "
        f"{', '.join(market.indicator_names)}, F = {market.num_features}; train split {market.splits.train}"
    )

    finrl_rate, finrl_label = bench_finrl(market, 150 if args.quick else 500)
    gym_rate = bench_gym(market, config, 500 if args.quick else 3000)
    print(f"FinRL: {finrl_label}")
    print(f"ours: {config.action_mode} actions, {config.reward} reward (FinRL: shares, value)")
    print()
    print("| env | device | T | B | env steps/s | x FinRL |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| FinRL StockTradingEnv (pandas) | cpu | - | 1 | {finrl_rate:,.0f} | 1 |")
    print(f"| StockTradingEnv (gymnasium, numpy out) | cpu | 30 | 1 | {gym_rate:,.0f} | {gym_rate / finrl_rate:,.0f} |")
    for device in devices:
        for window in (30, 1):
            for b in (1, 64, 256, 1024) + ((4096, 16384) if device == "cuda" else ()):
                rate = bench_vector(market, config, device, window, b, seconds)
                print(
                    f"| VectorStockTradingEnv | {device} | {window} | {b} | {rate:,.0f} | {rate / finrl_rate:,.0f} |",
                    flush=True,
                )
    print()
    for window in (30, 1):
        # A fresh process each, so the RSS growth is not hidden by memory earlier runs freed.
        child = subprocess.run(
            [sys.executable, __file__, "--memory-only", str(window), "--action_mode", args.action_mode],
            check=True,
            capture_output=True,
            text=True,
        )
        state, returned, grown, market_bytes = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"memory, 1024 envs, T = {window}, CPU: per-env state {state / 2**20:.1f} MiB + one step's returned "
            f"tensors {returned / 2**20:.1f} MiB; process RSS growth {grown / 2**20:.1f} MiB, which includes "
            f"the env's market tensors ({market_bytes / 2**20:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
