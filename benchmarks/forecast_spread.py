"""The spread of a ``--forecast_only`` policy's stock means over its training days: the unit of a no-trade
threshold measured in the forecast's own size (docs/learning.md section 20).

A ``--forecast_only`` policy's deterministic stock means are ``g x forecast + b`` (weight logits); its
``--forecast_threshold D`` holds a stock only where that clears D. D is in logit units, so one D means a different
selectivity on a market whose forecasts are larger or smaller. Here the unit is the policy's own spread::

    s = sqrt( mean over stocks i of Var over training days t of m[t, i] )

the pooled standard deviation of its stock means ``m [days, N]`` over the days it was fitted on (the ``train``
split, D = 0; stocks whose forecast barely moves add little, so the strong forecasts set the unit). A threshold
of K spreads is ``D = K x s``::

    python benchmarks/forecast_spread.py CHECKPOINT... [--sd K]    # prints s (or K x s), one line per checkpoint

The checkpoint's own market is rebuilt from its data and fitted statistics (as `backtest` does), so the days are the ones it trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import ActorCritic, ActOutput, RecurrentState  # noqa: E402
from clstm_ppo.evaluation.backtest import load_backtest_data  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint, restore_market, restore_policy  # noqa: E402
from envs.config import EnvConfig  # noqa: E402
from envs.features import PreparedMarket  # noqa: E402


class DelegatingPolicy:
    """What `evaluate_policy` calls of a policy, delegated to ``policy`` (deterministic), with `adjust` applied to
    its stocks' means ``[N]`` each day (weight logits before its ``forecast_threshold``): override it."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy

    @property
    def training(self) -> bool:
        return self.policy.training

    def eval(self) -> None:
        self.policy.eval()

    def train(self, mode: bool) -> None:
        self.policy.train(mode)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        return self.policy.initial_state(batch_size, device)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        return self.policy.env_action(u)

    def adjust(self, means: torch.Tensor) -> torch.Tensor:
        return means

    def act(self, obs, state, starts, *, deterministic: bool = True, generator=None) -> ActOutput:
        """One day ``obs [1, T, F]``: the policy's means ``[1, A]`` (`ActorCritic.forward`, before `deployed_mean`)
        with the stocks' adjusted."""
        out = self.policy.forward(obs.unsqueeze(0), state, starts.unsqueeze(0))
        mean, n = out.mean[0, 0], self.policy.spec.num_tickers
        action = torch.cat([self.adjust(mean[:n]), mean[n:]]).unsqueeze(0)
        return ActOutput(action, out.log_prob[0], out.value[0], out.state)


class _Recorder(DelegatingPolicy):
    """Records each day's stock means ``[N]`` and acts on them unchanged."""

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__(policy)
        self.means: list[np.ndarray] = []

    def adjust(self, means: torch.Tensor) -> torch.Tensor:
        self.means.append(means.double().numpy())
        return means


def stock_means(policy: ActorCritic, market: PreparedMarket, env_config: EnvConfig, split: str = "train") -> np.ndarray:
    """The policy's deterministic stock means (weight logits, before any threshold) on every day of ``split``:
    ``[days, N]`` float64. The policy acts through the split as in a backtest (`evaluate_policy`) at those means."""
    recorder = _Recorder(policy)
    evaluate_policy(recorder, market, split, env_config)
    return np.stack(recorder.means)


def pooled_spread(means: np.ndarray) -> float:
    """``s``: the square root of the mean over stocks of each stock's variance over days of ``means [days, N]``."""
    return float(np.sqrt(means.var(axis=0).mean()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", type=Path, nargs="+")
    p.add_argument("--sd", type=float, default=1.0, help="print K x s (default 1: s itself)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for path in args.checkpoints:
        ck = load_checkpoint(path)
        market = restore_market(ck, load_backtest_data(ck))
        policy = restore_policy(ck, market)
        if not policy.spec.forecast_only:
            raise SystemExit(f"{path}: not a --forecast_only policy (its means are not g x forecast + b)")
        print(f"{args.sd * pooled_spread(stock_means(policy, market, ck.cfg.env)):.6g}")


if __name__ == "__main__":
    main()
