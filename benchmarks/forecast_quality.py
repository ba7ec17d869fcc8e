"""Where a trained policy loses a planted lead-lag signal: in its forecast, or in the map from forecast to weights.

For each seed's checkpoint of a finished study on a lead-lag market (``signal_kind=lead_lag,lag=k``, trained with
``--aux_coef > 0`` so the network has its next-day head), the deterministic policy is run over the study's traded
days through the backtest's env, and every day records the observation, the next-day head's prediction for each
stock and the policy's action mean. Printed per seed, over the followers (tickers 1..N-1, the ones a leader moves):

- ``IC head``: correlation of the head's prediction with tomorrow's z-scored return (what the next-day loss fits);
  with ``--forecaster linear``, of the linear forecaster's (the forecast the actor follows).
- ``IC oracle``: the same for the leader's z-scored return ``k`` days back, the signal itself: the most any
  forecast can reach on these days.
- ``head~oracle``: correlation of the head's prediction with that signal (1 = the head found all of it).
- ``act~head``, ``act~oracle``: correlation of the policy's weight logits (action means) with each.
- Sharpe of the policy and of a rule that trades the head's forecast the way ``signal_rule.py``'s rules trade the
  signal (``head sign``: +1 where the forecast is above 0; ``head scaled``: forecast / its std over the training days, clipped to [-1, 1]),
  through the same env, costs and fills.

Usage::

    python benchmarks/forecast_quality.py STUDY_DIR --lag 5 [--config clstm-forecast_skip=False] [--checkpoint latest]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.signal_rule import LeadLagRule  # noqa: E402
from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import ActorCritic, RecurrentState  # noqa: E402
from clstm_ppo.study.markets import load_markets  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint, restore_policy  # noqa: E402
from envs.features import PreparedMarket  # noqa: E402
from envs.state import StateLayout  # noqa: E402


class Recorder:
    """Wraps a trained `ActorCritic` for `evaluate_policy`: acts with its mean (or with a rule on its forecast)
    and keeps each day's observation row, forecast ``[N]`` and action mean ``[A]``."""

    def __init__(self, model: ActorCritic, market: PreparedMarket, act_on: str, scale: float = 1.0) -> None:
        self.model, self.act_on, self.scale = model, act_on, scale
        self.layout = StateLayout(market.num_tickers, len(market.indicator_names))
        self.rows: list[np.ndarray] = []
        self.forecasts: list[np.ndarray] = []
        self.means: list[np.ndarray] = []
        self.training = False

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        return self.model.initial_state(batch_size, device)

    def act(self, obs: Tensor, state: RecurrentState, start: Tensor, **_: object) -> tuple[Tensor, None, None, Any]:
        out = self.model.forward(obs.unsqueeze(0), state, start.unsqueeze(0), predict_next=True)
        followed = out.next_day if out.forecast is None else out.forecast  # the head's, or --forecaster linear's
        forecast, mean = followed[0, 0].double(), out.mean[0, 0].double()  # [N], [A]
        self.rows.append(obs[0, -1].double().numpy())
        self.forecasts.append(forecast.numpy())
        self.means.append(mean.numpy())
        if self.act_on == "policy":
            return out.mean[0], None, None, out.state
        n = forecast.shape[0]
        if self.act_on == "head sign":
            stocks = torch.where(forecast > 0, 1.0, -1.0)
        else:
            stocks = (forecast / self.scale).clamp(-1.0, 1.0)
        action = torch.cat([stocks, mean[n:]]).unsqueeze(0)  # any action past the stocks: the policy's own
        return action, None, None, out.state

    def env_action(self, action: Tensor) -> Tensor:
        return action if self.act_on != "policy" else self.model.env_action(action)

    def eval(self) -> Recorder:
        return self

    def train(self, mode: bool = True) -> Recorder:
        return self


def corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equally shaped arrays, pooled over every entry."""
    a, b = a.ravel() - a.mean(), b.ravel() - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--lag", type=int, required=True)
    parser.add_argument("--config", default="", help="only the cells whose name starts with this")
    parser.add_argument("--checkpoint", default="latest", choices=["latest", "best"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    stem = sorted((args.study / "prepared").glob("*.json"))[0].stem
    market = load_markets(args.study / "prepared", stem)[0]
    layout = StateLayout(market.num_tickers, len(market.indicator_names))
    head = "IC head  IC oracle  head~oracle  act~head  act~oracle  Sharpe: policy  head sign  head scaled  (g)"
    print(f"{'cell':<34} {head}")
    cells = sorted(p for p in (args.study / "cells").iterdir() if p.name.startswith(args.config))
    for i, cell in enumerate(cells):
        path = cell / "periods" / "000" / f"{args.checkpoint}.pt"
        if not path.is_file():
            continue
        ckpt = load_checkpoint(path)
        model = restore_policy(ckpt, market)
        if i == 0:  # the hand rules through the cells' own env settings (costs, fills, band)
            rule = {
                k: evaluate_policy(LeadLagRule(market, args.lag, k), market, "test", ckpt.cfg.env).sharpe
                for k in ("sign", "scaled")
            }
            print(f"hand rules on the traded days: sign {rule['sign']:.2f}, scaled {rule['scaled']:.2f}")
        rec = Recorder(model, market, "policy")
        sharpe = evaluate_policy(rec, market, "test", ckpt.cfg.env).sharpe
        rows, forecast, mean = np.stack(rec.rows), np.stack(rec.forecasts), np.stack(rec.means)
        returns = rows[:, layout.prices]  # [D, N] z-scored returns of each acted day
        tomorrow = returns[1:, 1:]  # [D-1, N-1] followers' next-day returns
        oracle = np.full_like(returns, np.nan)  # leader's z-return lag-1 days before each acted day, for t + 1
        oracle[args.lag - 1 :, 1:] = returns[: len(returns) - args.lag + 1, :-1]
        ok = ~np.isnan(oracle[:-1, 1])
        f, o, m, y = forecast[:-1, 1:][ok], oracle[:-1, 1:][ok], mean[:-1, 1 : market.num_tickers][ok], tomorrow[ok]
        on_training = Recorder(model, market, "policy")  # the forecast's scale, from the training days only
        evaluate_policy(on_training, market, "train", ckpt.cfg.env)
        scale = float(np.stack(on_training.forecasts)[:, 1:].std())
        rule_sign = evaluate_policy(Recorder(model, market, "head sign"), market, "test", ckpt.cfg.env).sharpe
        rule_scaled = evaluate_policy(
            Recorder(model, market, "head scaled", scale), market, "test", ckpt.cfg.env
        ).sharpe
        gain = f"  g {model.forecast_gain.item():.2f}" if model.spec.forecast_skip else ""
        print(
            f"{cell.name:<34} {corr(f, y):7.3f} {corr(o, y):10.3f} {corr(f, o):12.3f} {corr(m, f):9.3f} "
            f"{corr(m, o):11.3f} {sharpe:15.2f} {rule_sign:10.2f} {rule_scaled:12.2f}{gain}"
        )


if __name__ == "__main__":
    main()
