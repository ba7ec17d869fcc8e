"""A no-trade threshold with hysteresis on a ``--forecast_only`` study's policies, at deploy time only.

Section 20 of docs/learning.md: ``--forecast_threshold`` holds a stock only on days its mean ``g x forecast + b``
clears D, so a forecast that hovers near D buys and sells on alternate days. With hysteresis a stock the policy
holds stays in while its mean is above an exit threshold and a stock it does not hold enters only above the entry
threshold (both in units of the seed's own spread ``s``, `clstm_ppo.evaluation.forecast_spread`)::

    python benchmarks/deploy_hysteresis.py STUDY_DIR --enter 1.5 2 --exit 0.5 1 [--csv FILE]

"Held" is the policy's own decision of the day before (its mean cleared that day's threshold); each run starts in
cash. ``--exit`` equal to ``--enter`` is the plain threshold. ``--sizing sign`` holds the stocks that clear it at
action +1 and the others at -1 (the hand rule's ``sign>Z`` sizing: equal weights among the selected, cash when none
is) instead of at their lowered means; ``--trade_rate R`` moves R of the way to the target each day. Prints, per
setting, the seeds' mean Sharpe, return, turnover and exposure; ``--csv`` also writes one row per setting and seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.deploy_slower import study_policies  # noqa: E402
from benchmarks.signal_rule import policy_metrics  # noqa: E402
from clstm_ppo.agent.evaluate import evaluate_policy  # noqa: E402
from clstm_ppo.agent.model import ActorCritic, RecurrentState  # noqa: E402
from clstm_ppo.evaluation.forecast_spread import DelegatingPolicy, forecast_spread  # noqa: E402
from clstm_ppo.evaluation.statistics import mean_exposure  # noqa: E402


class HysteresisPolicy(DelegatingPolicy):
    """``policy`` (``--forecast_only``, deterministic) with its stocks' means ``[N]`` lowered by ``exit_at`` for
    the stocks it held the day before and by ``enter_at`` for the others (logit units)."""

    def __init__(self, policy: ActorCritic, enter_at: float, exit_at: float, sizing: str = "shift") -> None:
        super().__init__(policy)
        self.enter_at, self.exit_at, self.sizing = enter_at, exit_at, sizing
        self.held = torch.zeros(policy.spec.num_tickers, dtype=torch.bool)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        self.held = torch.zeros(self.policy.spec.num_tickers, dtype=torch.bool)  # each run starts in cash
        return super().initial_state(batch_size, device)

    def adjust(self, means: torch.Tensor) -> torch.Tensor:
        lowered = means - torch.where(self.held, self.exit_at, self.enter_at)
        self.held = lowered > 0
        if self.sizing == "sign":  # tanh(+-4) = +-0.9993: the env's +-1
            return torch.where(self.held, 4.0, -4.0).to(lowered.dtype)
        return lowered


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=Path)
    p.add_argument("--enter", type=float, nargs="+", required=True, help="entry threshold, in spreads")
    p.add_argument("--exit", type=float, nargs="+", required=True, help="exit threshold, in spreads")
    p.add_argument("--sizing", choices=("shift", "sign"), default="shift", help="the selected stocks' size")
    p.add_argument("--trade_rate", type=float, nargs="+", default=[1.0], help="partial adjustment (envs.kernel)")
    p.add_argument("--cells", default="*", help="a glob over the study's cell folders (default: all)")
    p.add_argument("--csv", type=Path, help="also write one row per setting and seed here")
    args = p.parse_args()
    torch.set_num_threads(1)
    market, paths, checkpoints, policies = study_policies(args.study, args.cells)
    if not all(policy.spec.forecast_only for policy in policies):
        raise SystemExit("hysteresis needs --forecast_only policies (g x forecast + b)")
    spreads = [forecast_spread(pol, market, ck.cfg.env) for ck, pol in zip(checkpoints, policies, strict=True)]
    rows = []
    for rate, enter_at, exit_at in itertools.product(args.trade_rate, args.enter, args.exit):
        if exit_at > enter_at:
            continue
        for path, ck, policy, spread in zip(paths, checkpoints, policies, spreads, strict=True):
            env = dataclasses.replace(ck.cfg.env, trade_rate=rate)
            acting = HysteresisPolicy(policy, enter_at * spread, exit_at * spread, args.sizing)
            run = evaluate_policy(acting, market, "test", env)
            metrics = policy_metrics(run, env)
            rows.append(
                {"cell": path.parents[2].name, "sizing": args.sizing, "trade_rate": rate, "enter": enter_at,
                 "exit": exit_at, "spread": spread,
                 "sharpe": metrics["sharpe"], "annual_turnover": metrics["annual_turnover"],
                 "exposure": mean_exposure(run.values, run.holdings_value),
                 "cumulative_return": metrics["cumulative_return"]}
            )  # fmt: skip
        now = pd.DataFrame(rows[-len(paths) :])
        seeds = " ".join(f"{x:.2f}" for x in now["sharpe"])
        print(
            f"{args.sizing} rate {rate:g} enter {enter_at:g} exit {exit_at:g} (spreads): Sharpe {now['sharpe'].mean():.2f} ({seeds}), "
            f"return {now['cumulative_return'].mean():.1%}, turnover {now['annual_turnover'].mean():.0f}x a year, "
            f"exposure {now['exposure'].mean():.0%}"
        )
    print("spread s per seed: " + " ".join(f"{x:.3f}" for x in spreads))
    if args.csv:
        pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
