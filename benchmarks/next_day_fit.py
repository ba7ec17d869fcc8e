"""Can the network learn tomorrow's return from the window at all? The next-day fit alone, without PPO.

A lead-lag market (``signal_kind=lead_lag,lag=k``) makes tomorrow's return of ticker i+1 a linear function of ticker
i's return k - 1 days before today. This script fits only the next-day prediction (the ``--aux_coef`` target: each
stock's z-scored return of tomorrow) on a finished study's training days and measures, on its traded days, the
correlation of the prediction with tomorrow's return over the followers (tickers 1..N-1), next to:

- the signal itself (the leader's return k - 1 days back): what a forecast that found all of it reaches;
- least squares on the flattened window's price columns ``[T x N] -> [N]`` (closed form, ridge ``--ridge``).

``--fit head`` trains the network's next-day head through the whole network (what ``--aux_coef`` trains, here
with no PPO loss); ``linear`` one linear map of the window's price columns (what ``--forecaster linear`` fits);
``sum`` both, their predictions added. Sequences of 32 days, 32 at a time from random training days, Adam (AdamW
with ``--weight_decay``), gradient norm clipped to 0.5, as the trainer does.

Usage (docs/learning.md section 16)::

    python benchmarks/next_day_fit.py STUDY_DIR --lag 5 [--fit head|linear|sum] [--stage1 lstm|conv] [--no_stage2]
        [--noise 0.5] [--weight_decay 1] [--sizes 8,8,16] [--lr 3e-4] [--steps 1800] [--seed 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.agent.model import ActorCritic, ModelSpec  # noqa: E402
from clstm_ppo.agent.windows import Windows  # noqa: E402
from clstm_ppo.study.markets import load_markets  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint  # noqa: E402
from envs.features import PreparedMarket  # noqa: E402
from envs.state import StateLayout  # noqa: E402
from envs.trading_env import StockTradingEnv  # noqa: E402

SEQUENCE, BATCH = 32, 32


def split_windows(market: PreparedMarket, split: str, env_config) -> Tensor:
    """Every observation of ``split`` in day order, ``[D, T, F]`` (the portfolio part stays all cash)."""
    env = StockTradingEnv(market=market, split=split, config=env_config.whole_split())
    obs, _ = env.reset(seed=0)
    out, done = [obs], False
    while not done:
        obs, _, terminated, truncated, _ = env.step(np.zeros(env.action_space.shape, np.float32))
        out.append(obs)
        done = terminated or truncated
    return torch.as_tensor(np.stack(out))


def follower_ic(forecast: np.ndarray, windows: Tensor, prices: slice, lag: int) -> tuple[float, float]:
    """Correlation over the followers of ``forecast [D, N]`` (made on each day) with tomorrow's return, and the
    signal's own: ``(forecast IC, signal IC)`` on the days where the signal exists."""
    returns = windows[:, -1, prices].double().numpy()  # [D, N]
    signal = np.full_like(returns, np.nan)
    signal[lag - 1 :, 1:] = returns[: len(returns) - lag + 1, :-1]
    ok = ~np.isnan(signal[:-1, 1])
    tomorrow = returns[1:, 1:][ok]
    corr = lambda a, b: float(np.corrcoef(a.ravel(), b.ravel())[0, 1])  # noqa: E731
    return corr(forecast[:-1, 1:][ok], tomorrow), corr(signal[:-1, 1:][ok], tomorrow)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path, help="a finished study on a lead-lag market (its prepared market and a cell)")
    p.add_argument("--lag", type=int, required=True)
    p.add_argument("--fit", default="head", choices=("head", "linear", "sum"))
    p.add_argument("--stage1", default="lstm", choices=("lstm", "conv"))
    p.add_argument("--no_stage2", action="store_true", help="the head reads the stage-1 features only")
    p.add_argument("--noise", type=float, default=0.0, help="Gaussian noise added to the inputs' price columns")
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--sizes", default="", help="stage1_hidden,feature_dim,stage2_hidden (default: the study's)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ridge", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    prepared = sorted((a.study / "prepared").glob("*.json"))
    market = load_markets(a.study / "prepared", prepared[0].stem)[0]
    ckpt = load_checkpoint(next((a.study / "cells").glob("*/periods/000/latest.pt")))
    prices = StateLayout(market.num_tickers, len(market.indicator_names)).prices
    train, test = split_windows(market, "train", ckpt.cfg.env), split_windows(market, "test", ckpt.cfg.env)

    flat = lambda w: w[..., prices].flatten(-2).double()  # noqa: E731  [..., T x N]
    x, y = flat(train[:-1]), train[1:, -1, prices].double()
    weights = torch.linalg.solve(x.T @ x + a.ridge * torch.eye(x.shape[1], dtype=x.dtype), x.T @ y)
    ls_ic, signal_ic = follower_ic((flat(test) @ weights).numpy(), test, prices, a.lag)

    sizes = (
        dict(zip(("stage1_hidden", "feature_dim", "stage2_hidden"), map(int, a.sizes.split(",")), strict=True))
        if a.sizes
        else {}
    )
    spec = dataclasses.replace(
        ModelSpec.from_dict(ckpt.model_config),
        forecast_skip=False,
        forecaster="head",
        next_day_head=True,
        stage1=a.stage1,
        **sizes,
    )
    torch.manual_seed(a.seed)
    model = ActorCritic(spec)
    linear = nn.Linear(market.window * market.num_tickers, market.num_tickers)
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    params = [*(model.parameters() if a.fit != "linear" else []), *(linear.parameters() if a.fit != "head" else [])]
    optimizer = torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay)

    def predict(obs: Tensor) -> Tensor:  # [L, B, T, F] -> [L, B, N]
        out = 0.0
        if a.fit != "linear":
            if a.no_stage2:  # the head's input with the stage-2 LSTM's part zeroed
                feats = model.encode(model.normalize(Windows.from_dense(obs))).reshape(*obs.shape[:2], -1)
                zeros = torch.zeros(*obs.shape[:2], spec.stage2_hidden)
                out = model.next_day(torch.cat([zeros, feats], -1) if model.head_skip else zeros)
            else:
                starts = torch.zeros(obs.shape[:2], dtype=torch.bool)
                starts[0] = True
                out = model(obs, model.initial_state(obs.shape[1]), starts, predict_next=True).next_day
        if a.fit != "head":
            out = out + linear(obs[..., prices].flatten(-2))
        return out

    best, loss = -1.0, torch.zeros(())
    for step in range(a.steps + 1):
        first = torch.randint(0, len(train) - SEQUENCE - 1, (BATCH,)).tolist()
        seq = torch.stack([train[s : s + SEQUENCE + 1] for s in first], 1)  # [L + 1, B, T, F]
        inputs = seq[:-1].clone()
        inputs[..., prices] += a.noise * torch.randn_like(inputs[..., prices])
        loss = (predict(inputs) - seq[1:, :, -1, prices]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        if step % max(a.steps // 6, 1) == 0:
            with torch.no_grad():
                ic, _ = follower_ic(predict(test.unsqueeze(1))[:, 0].double().numpy(), test, prices, a.lag)
            best = max(best, ic)
    setting = " ".join(f"{k}={v}" for k, v in vars(a).items() if k not in ("study", "lag"))
    print(
        f"{setting}: IC on the traded days: fit {ic:.3f} (best of 7 checks {best:.3f}), training loss {loss.item():.3f}; "
        f"the signal {signal_ic:.3f}, least squares on the window {ls_ic:.3f}"
    )


if __name__ == "__main__":
    main()
