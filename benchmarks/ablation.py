"""The paper's ablation, rerunnable: CLSTM-PPO vs LSTM-PPO vs MLP-PPO vs buy-and-hold over several seeds.

Each (policy, seed) trains with the real train script (a subprocess, CPU or GPU), then its ``best.pt``
runs deterministically over the held-out test split with the training env (`evaluate_policy`), next to
equal-weight buy-and-hold with the same costs. Prints one row per run and a mean +- std summary.

    python benchmarks/ablation.py                                  # synthetic lead-lag market, seeds 1-4
    python benchmarks/ablation.py --data csv:examples/data/stocks_daily_6_ohlcv.csv --seeds 1,2 \\
        --train_args "--num_episodes 2000 --window 30"
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import build_model  # noqa: E402
from clstm_ppo.config import TrainConfig  # noqa: E402
from clstm_ppo.evaluation.metrics import buy_and_hold_values, cumulative_return, max_drawdown, sharpe_ratio  # noqa: E402
from clstm_ppo.market import build_market, env_config  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint  # noqa: E402

# The learning test's market and settings (tests/test_learning.py), sized for a CPU.
DEFAULT_TRAIN = ("--num_envs 32 --n_steps 32 --batch_size 256 --epochs 4 --episode_length 63 --stage1_hidden 32 "
                 "--feature_dim 32 --stage2_hidden 64 --num_episodes 3000 --hmax 2000 --gamma 0.9 "
                 "--learning_rate_clstm 1e-3 --learning_rate_actor_critic 1e-3 --ent_coef 0 --window 5")


def train_and_score(policy: str, seed: int, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    run = f"{policy}-s{seed}"
    cmd = [sys.executable, str(ROOT / "train_distributed_clstm_ppo.py"), "--data", args.data, "--policy", policy,
           "--seed", str(seed), "--run_name", run, "--checkpoint_dir", str(folder), "--no-progress",
           "--threads", str(args.threads), *shlex.split(args.train_args)]
    if args.device == "cpu":
        cmd += ["--num_gpus", "0"]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"training {run} failed:\n{result.stderr[-2000:]}")
    seconds = time.perf_counter() - start
    ckpt = load_checkpoint(folder / run / "best.pt")
    cfg = TrainConfig.from_dict(ckpt.config)
    market = build_market(cfg)
    model = build_model(cfg, market)
    model.load_state_dict(ckpt.model_state)
    record = evaluate_policy(model, market, "test", env_config(cfg, full_episodes=True))
    baseline = buy_and_hold_values(record.prices, cfg.initial_amount, cfg.buy_cost_pct)
    return {"policy": policy, "seed": seed, "seconds": seconds,
            "sharpe": sharpe_ratio(record.values), "cr": cumulative_return(record.values),
            "mpb": max_drawdown(record.values), "bh_sharpe": sharpe_ratio(baseline),
            "bh_cr": cumulative_return(baseline), "bh_mpb": max_drawdown(baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="synthetic:tickers=5,days=2520,signal=0.9,signal_kind=lead_lag")
    parser.add_argument("--policies", default="clstm,lstm,mlp")
    parser.add_argument("--seeds", default="1,2,3,4")
    parser.add_argument("--train_args", default=DEFAULT_TRAIN, help="extra train-script flags, one string")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    parser.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 1) // 1), help="runs at once")
    parser.add_argument("--out", default="", help="keep checkpoints here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.out or tmp)
        jobs = [(p, s) for p in policies for s in seeds]
        with ThreadPoolExecutor(args.parallel) as pool:
            rows = list(pool.map(lambda job: train_and_score(job[0], job[1], args, folder), jobs))
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(f"\nAblation on the test split of {args.data}; machine: {machine}")
    print(f"train flags: {args.train_args}\n")
    print("| policy | seed | train s | Sharpe | CR | MPB | buy-and-hold Sharpe | buy-and-hold CR | beats B&H (Sharpe) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['seed']} | {r['seconds']:.0f} | {r['sharpe']:.2f} | {r['cr']:+.1%} | {r['mpb']:.1%} | "
              f"{r['bh_sharpe']:.2f} | {r['bh_cr']:+.1%} | {'yes' if r['sharpe'] > r['bh_sharpe'] else 'no'} |")
    print("\n| policy | mean Sharpe | std | mean CR | runs beating B&H |")
    print("|---|---:|---:|---:|---:|")
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        sharpes = [r["sharpe"] for r in mine]
        std = statistics.stdev(sharpes) if len(sharpes) > 1 else 0.0
        wins = sum(r["sharpe"] > r["bh_sharpe"] for r in mine)
        print(f"| {policy} | {statistics.mean(sharpes):.2f} | {std:.2f} | "
              f"{statistics.mean(r['cr'] for r in mine):+.1%} | {wins}/{len(mine)} |")
    bh = [r["bh_sharpe"] for r in rows if r["policy"] == policies[0]]
    print(f"| buy-and-hold | {statistics.mean(bh):.2f} | {statistics.stdev(bh) if len(bh) > 1 else 0.0:.2f} | "
          f"{statistics.mean(r['bh_cr'] for r in rows if r['policy'] == policies[0]):+.1%} | - |")


if __name__ == "__main__":
    main()
