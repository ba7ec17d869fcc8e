"""What a planted lead-lag signal is worth to a rule that knows it, traded like a policy (issue 27's denominator).

A synthetic lead-lag market (`envs.synthetic`, ``signal_kind=lead_lag,lag=k``) moves ticker i+1 on day t+1 by
ticker i's shock of day t+1-k. The hand rule reads that shock's day from the observation, as a policy would, and
acts through the same env as the backtest: the same costs, fills (``--execution``), no-trade band and turbulence
stop, on a finished study's traded days. Two rules, both causal:

- ``sign``: target weights on the followers whose leader rose ("hold ticker i+1 after ticker i rose"): action +1 for
  them, -1 for the rest (cash takes what is left; all cash when no leader rose).
- ``scaled``: action = clip(leader's return / its training-days std, -1, 1): the follower's weight grows with the
  size of the shock that moves it.
- ``sign>Z`` (``--threshold Z``): the sign rule that holds a follower only when its leader's return is more than Z
  training-days standard deviations above 0: only the strongest signals, so fewer trades (Z = 0 is ``sign``).
- ``--gate Z``: the sign and scaled rules through the env's trade gate (``--trade_gate``): a follower is traded
  only on days its leader's return is more than Z training-days standard deviations from 0 (either way); on the
  other days its holding stays whatever the target says. Selectivity that holds instead of selling: a weak signal
  neither buys nor sells.
- ``--horizon H`` (H <= lag): each rule reads the leader's shocks that move its follower over the next H days, not
  only tomorrow (window rows ``-lag .. -lag+H-1``, all already seen), summed and divided by sqrt(H) so the sum has
  the one day's scale: an aim in front of tomorrow's target (Garleanu and Pedersen 2013), which moves less from
  day to day, so fewer trades, at the price of holding days the signal does not pay yet.

Usage (a study on a lead-lag market with ``--retrain none``; its prepared market is reused)::

    python benchmarks/signal_rule.py STUDY_DIR --lag 1 [--band 0.01 0.03] [--trade_rate 1 0.5] [--threshold 1 2]
        [--horizon 1 3 5] [--gate 1 1.5] [--execution auto]

Prints one row per rule and band: Sharpe on the traded days, return, turnover a year, costs, exposure, next to the
study's buy-and-hold.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.evaluate import PolicyRun, evaluate_policy
from clstm_ppo.agent.model import RecurrentState
from clstm_ppo.evaluation.report import BacktestResult, compute_metrics
from clstm_ppo.evaluation.statistics import mean_exposure
from clstm_ppo.study.markets import load_markets
from envs.config import EnvConfig
from envs.features import PreparedMarket
from envs.state import StateLayout


class HandRule:
    """The policy interface `evaluate_policy` drives, for a rule with no weights and no recurrent state: a subclass
    gives ``act``; its actions go to the env as they are."""

    training = False

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        return RecurrentState.zeros(batch_size, 0, device)

    def env_action(self, action: Tensor) -> Tensor:
        return action

    def eval(self) -> HandRule:
        return self

    def train(self, mode: bool = True) -> HandRule:
        return self


class LeadLagRule(HandRule):
    """A hand rule with the policy interface `evaluate_policy` drives (``act``, ``env_action``, no recurrent state).

    Observations ``[1, T, F]``: the leader's return that moves its follower tomorrow is on window row ``-lag``,
    standardised by the market's training-days statistics, which the rule undoes.
    """

    def __init__(
        self,
        market: PreparedMarket,
        lag: int,
        kind: str,
        threshold: float = 0.0,
        horizon: int = 1,
        gate: float | None = None,
    ) -> None:
        if market.window < lag:
            raise SystemExit(f"the window ({market.window} days) must cover the lag ({lag} days)")
        if not 1 <= horizon <= lag:
            raise SystemExit(f"--horizon must be 1 .. the lag ({lag}), got {horizon}")
        self.layout = StateLayout(market.num_tickers, len(market.indicator_names))
        self.lag, self.kind, self.threshold, self.horizon, self.gate = lag, kind, threshold, horizon, gate
        self.mean = torch.as_tensor(market.normalization.close_mean, dtype=torch.float64)
        self.std = torch.as_tensor(market.normalization.close_std, dtype=torch.float64)

    def act(self, obs: Tensor, state: RecurrentState, start: Tensor, **_: object) -> tuple[Tensor, None, None, Any]:
        """Actions ``[1, N]`` (``[1, 2N]`` with a gate: the weights' actions, then the gates) in [-1, 1] from the
        observation ``[1, T, F]``."""
        rows = obs[0, -self.lag : obs.shape[1] - self.lag + self.horizon, self.layout.prices].double()  # [H, N]
        raw = rows * self.std + self.mean  # [H, N] daily log returns, standardised leader returns undone
        leader = raw[:, :-1].sum(0) / self.horizon**0.5  # [N - 1] ticker i leads ticker i + 1
        if self.kind == "sign":
            follow = torch.where(leader > self.threshold * self.std[:-1], 1.0, -1.0)
        else:
            follow = (leader / self.std[:-1]).clamp(-1.0, 1.0)
        action = torch.cat([torch.full((1,), -1.0, dtype=torch.float64), follow])  # ticker 0 follows nobody
        if self.gate is not None:  # ticker 0's gate stays open: its target is cash
            strong = torch.where((leader / self.std[:-1]).abs() > self.gate, 1.0, -1.0)
            action = torch.cat([action, torch.ones(1, dtype=torch.float64), strong])
        return action.unsqueeze(0), None, None, state


def policy_metrics(run: PolicyRun, config: EnvConfig) -> dict[str, float]:
    """The backtest metrics of ``run`` (Sharpe, return, turnover, costs, ...) under ``config``'s capital and costs."""
    result = BacktestResult.from_run(
        run,
        initial_amount=config.initial_amount,
        buy_cost_pct=config.buy_cost_pct,
        sell_cost_pct=config.sell_cost_pct,
    )
    return compute_metrics(result)["policy"]


def rule_cells(run: PolicyRun, config: EnvConfig, *, costs: bool = False) -> str:
    """A rule's printed columns: Sharpe, cumulative return, turnover a year, (costs,) exposure."""
    m = policy_metrics(run, config)
    paid = f" {m['total_costs']:>11,.0f}" if costs else ""
    exposure = mean_exposure(run.values, run.holdings_value)
    return f"{m['sharpe']:>7.2f} {m['cumulative_return']:>8.1%} {m['annual_turnover']:>10.1f}x{paid} {exposure:>8.0%}"


def print_buy_and_hold(study: Path) -> None:
    """A finished study's equal-weight buy-and-hold Sharpe on the same days (nothing for an unfinished one)."""
    report = study / "study.json"
    if report.exists():
        print(f"buy-and-hold Sharpe {json.loads(report.read_text())['baselines']['buy-and-hold']['sharpe']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a finished study folder on a lead-lag market (--retrain none)")
    parser.add_argument("--lag", type=int, default=1)
    parser.add_argument("--band", type=float, nargs="+", default=[0.01])
    parser.add_argument("--trade_rate", type=float, nargs="+", default=[1.0], help="partial adjustment (envs.kernel)")
    parser.add_argument("--threshold", type=float, nargs="+", default=[], help="also the sign rule above Z std")
    parser.add_argument("--horizon", type=int, nargs="+", default=[1], help="days ahead each rule aims (<= lag)")
    parser.add_argument("--gate", type=float, nargs="+", default=[], help="also sign and scaled, traded above Z std")
    parser.add_argument("--execution", default="auto")
    args = parser.parse_args()
    prepared = sorted((args.study / "prepared").glob("*.json"))
    if not prepared:
        raise SystemExit(f"{args.study}: no prepared market (is it a finished study folder?)")
    market = load_markets(args.study / "prepared", prepared[0].stem)[0]
    print(
        f"{args.study.name}: {market.num_tickers} tickers, test days {market.splits.test.stop - market.splits.test.start}"
    )
    head = (
        f"{'rule':<8} {'days':>4} {'band':>5} {'rate':>5} {'Sharpe':>7} {'return':>8} {'turnover/yr':>11} {'costs':>11}"
    )
    print(f"{head} {'exposure':>8}")
    rules = [("sign", 0.0, None), ("scaled", 0.0, None), *(("sign", z, None) for z in args.threshold)]
    rules += [(kind, 0.0, g) for g in args.gate for kind in ("sign", "scaled")]
    for (kind, z, gate), days, band, rate in itertools.product(rules, args.horizon, args.band, args.trade_rate):
        config = EnvConfig(rebalance_band=band, trade_rate=rate, execution=args.execution, trade_gate=gate is not None)
        run = evaluate_policy(LeadLagRule(market, args.lag, kind, z, days, gate), market, "test", config)
        name = f"sign>{z:g}" if z else kind if gate is None else f"{kind}|{gate:g}"
        print(f"{name:<8} {days:>4} {band:>5.2f} {rate:>5.2f} {rule_cells(run, config, costs=True)}")
    print_buy_and_hold(args.study)


if __name__ == "__main__":
    main()
