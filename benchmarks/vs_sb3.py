"""Our paper-preset trainer next to the paper's own stack (sb3-contrib RecurrentPPO + a CLSTM features
extractor), same env code, same data, same machine, same run.

    pip install stable-baselines3 sb3-contrib          # or: pip install -e .[bench]
    python benchmarks/vs_sb3.py --threads 1
    python benchmarks/vs_sb3.py --threads 2 --sb3_steps 2048 --our_envs 16 --our_updates 2
    python benchmarks/vs_sb3.py --threads 1 --device cuda --sb3_device cuda --our_envs 1024 --our_minibatches 4

Both sides (the paper's Table 1): window T = 30, stage-1 LSTM 181 -> 128 over the window, last output
through Linear(128,128)+tanh twice -> 128 features; separate actor and critic LSTMs of 512 (one layer);
n_steps 128, 10 epochs, minibatch 128, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5,
max grad norm 0.5, Adam lr 3e-4, eps 1e-8. Data: synthetic, 30 tickers x 2,520 days, 4 indicators
(F = 181), training split, episodes of 252 days with random starts.

sb3: ``RecurrentPPO("MlpLstmPolicy")`` on ``DummyVecEnv`` of our gymnasium ``StockTradingEnv`` (the
registered ``envs/StockTrading-v0`` class, built with the same PreparedMarket; sb3's Monitor wrapper), ``--sb3_envs`` envs
(default 1; the paper's figure was for 1 or 8), timed over ``learn(--sb3_steps)`` after a 128-step
warm-up learn. Ours: the Trainer's loop body on the VectorStockTradingEnv (``--our_envs`` envs in
lockstep; with the paper's minibatch of 128 env steps that is the same 10 gradient steps per 128 env
steps as sb3), timed over ``--our_updates`` updates after a 1-epoch warm-up. Both on the CPU with
``--threads`` torch threads unless ``--device cuda`` (ours) / ``--sb3_device cuda`` (sb3's networks).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.train_throughput import machine_name  # noqa: E402
from clstm_ppo.config import preset  # noqa: E402
from clstm_ppo.market import build_market  # noqa: E402
from clstm_ppo.training.distributed import Comm  # noqa: E402


def make_extractor_class() -> type:
    """The paper's stage 1 as an sb3 features extractor (imported lazily: sb3 is a benchmark extra)."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class CLSTMExtractor(BaseFeaturesExtractor):
        """obs [B, T, F] -> LSTM(F, 128) over T -> last output -> (Linear 128 + tanh) x 2 -> [B, 128]."""

        def __init__(self, observation_space, lstm_hidden: int = 128, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            self.lstm = nn.LSTM(observation_space.shape[-1], lstm_hidden, batch_first=True)
            self.head = nn.Sequential(
                nn.Linear(lstm_hidden, features_dim), nn.Tanh(), nn.Linear(features_dim, features_dim), nn.Tanh()
            )

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(obs)
            return self.head(out[:, -1])

    return CLSTMExtractor


def bench_sb3(market, cfg, n_envs: int, steps: int, device: str = "cpu") -> tuple[float, float]:
    """(env steps/s, seconds) of RecurrentPPO.learn(steps) after a warm-up."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from envs.trading_env import StockTradingEnv

    econf = cfg.env
    # Monitor: sb3's episode bookkeeping (it replaces our info["episode"] with its own {"r", "l", "t"}).
    venv = DummyVecEnv(
        [lambda i=i: Monitor(StockTradingEnv(market, split="train", config=econf, seed=i)) for i in range(n_envs)]
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=cfg.ppo.n_steps,
        batch_size=cfg.ppo.batch_size,
        n_epochs=cfg.ppo.epochs,
        gamma=cfg.ppo.gamma,
        gae_lambda=cfg.ppo.gae_lambda,
        clip_range=cfg.ppo.clip_coef,
        ent_coef=cfg.ppo.ent_coef,
        vf_coef=cfg.ppo.vf_coef,
        max_grad_norm=cfg.ppo.max_grad_norm,
        learning_rate=cfg.ppo.learning_rate_actor_critic,
        policy_kwargs=dict(
            features_extractor_class=make_extractor_class(),
            features_extractor_kwargs=dict(lstm_hidden=cfg.model.stage1_hidden, features_dim=cfg.model.feature_dim),
            lstm_hidden_size=cfg.model.stage2_hidden,
            n_lstm_layers=1,
            shared_lstm=False,
            enable_critic_lstm=True,
            net_arch=[],
            optimizer_kwargs=dict(eps=cfg.ppo.adam_eps),
        ),
        device=device,
        seed=0,
        verbose=0,
    )
    model.learn(total_timesteps=cfg.ppo.n_steps * n_envs)  # warm-up: one rollout + one update
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    seconds = time.perf_counter() - t0
    done = model.num_timesteps - cfg.ppo.n_steps * n_envs
    return done / seconds, seconds


def bench_ours(market, cfg, updates: int, device: str) -> tuple[float, float, int]:
    """(env steps/s, seconds, env steps) of ``updates`` calls of `Trainer.update`, the trainer's own step."""
    from clstm_ppo.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        comm = Comm(device=torch.device(device))
        trainer = Trainer([cfg.with_settings(checkpoint_dir=tmp)], market, comm, [Path(tmp) / "run"])
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        trainer.update(ppo=dataclasses.replace(cfg.ppo, epochs=1))  # warm-up: one rollout + a short update
        sync()
        t0 = time.perf_counter()
        for _ in range(updates):
            trainer.update()  # the trainer's own step
        sync()
        seconds = time.perf_counter() - t0
    steps = cfg.ppo.rollout_steps * updates
    return steps / seconds, seconds, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, required=True, help="torch threads for both (pass it explicitly)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where OUR trainer runs")
    p.add_argument("--sb3_device", choices=("cpu", "cuda"), default="cpu", help="where sb3's networks run")
    p.add_argument("--sb3_envs", type=int, default=1)
    p.add_argument("--sb3_steps", type=int, default=2048)
    p.add_argument("--our_envs", type=int, default=16)
    p.add_argument("--our_updates", type=int, default=2)
    p.add_argument(
        "--our_minibatches",
        type=int,
        default=0,
        help="minibatches per epoch for ours (0: the paper's 128 env steps per minibatch)",
    )
    p.add_argument("--skip_sb3", action="store_true", help="time ours only")
    args = p.parse_args(argv)
    try:
        import sb3_contrib  # noqa: F401
    except ImportError:
        if not args.skip_sb3:
            print("error: needs sb3-contrib: pip install stable-baselines3 sb3-contrib", file=sys.stderr)
            return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is visible", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    ours_cfg = dict(num_envs=args.our_envs, progress=False, num_episodes=10**9, threads=args.threads)
    if args.our_minibatches:
        ours_cfg["batch_size"] = 128 * args.our_envs // args.our_minibatches
    cfg = preset("paper", **ours_cfg).validate()
    market = build_market(cfg.data, seed=cfg.run.seed)
    print(f"machine: {machine_name('cpu')}" + (f"; ours on {machine_name('cuda')}" if args.device == "cuda" else ""))
    ours_sps, ours_s, ours_steps = bench_ours(market, cfg, args.our_updates, args.device)
    print(f"  ours: {ours_steps:,} env steps in {ours_s:.1f} s", flush=True)
    rows = [
        (
            "clstm-ppo (this repo)",
            f"VectorStockTradingEnv x {args.our_envs}, {args.device}",
            ours_steps,
            ours_s,
            ours_sps,
        )
    ]
    if not args.skip_sb3:
        sb3_cfg = preset("paper", num_envs=args.sb3_envs, progress=False, num_episodes=10**9)
        sb3_sps, sb3_s = bench_sb3(market, sb3_cfg, args.sb3_envs, args.sb3_steps, args.sb3_device)
        print(f"  sb3: {args.sb3_steps:,} env steps in {sb3_s:.1f} s", flush=True)
        rows.append(
            (
                "sb3-contrib RecurrentPPO + CLSTM extractor",
                f"DummyVecEnv(StockTradingEnv) x {args.sb3_envs}, {args.sb3_device}",
                args.sb3_steps,
                sb3_s,
                sb3_sps,
            )
        )
    print()
    print(f"Paper preset training throughput, {args.threads} torch thread(s); machine: {machine_name('cpu')}")
    print()
    print("| trainer | envs | env steps timed | seconds | env steps/s |")
    print("|---|---|---|---|---|")
    for name, envs, steps, secs, sps in rows:
        print(f"| {name} | {envs} | {steps:,} | {secs:.1f} | {sps:,.1f} |")
    if len(rows) == 2:
        print()
        print(f"ratio ours / sb3: {rows[0][4]:,.1f} / {rows[1][4]:,.1f} = {rows[0][4] / rows[1][4]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
