"""Run a policy through one split with the training env code: the day-by-day record a backtest reports.

Used by the trainer (validation score for ``best.pt``) and by the backtest. The env is the same
`StockTradingEnv` over the same step kernel as training; the policy carries its recurrent state
from the split's first day to its last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clstm_ppo.agent.ensemble import Ensemble, EnsembleState
from clstm_ppo.agent.model import ActorCritic, RecurrentState, unwrap
from envs.config import EnvConfig
from envs.data import DayRange
from envs.features import PreparedMarket
from envs.returns import sharpe_from_returns
from envs.trading_env import StockTradingEnv


@dataclass
class PolicyRun:
    """One pass over a split. D = days in the split (the first is the starting day, before any trade)."""

    dates: np.ndarray  # [D] datetime64[ns]
    values: np.ndarray  # [D] float64, portfolio value in dollars at each day's close
    cash: np.ndarray  # [D] float64, dollars
    # [D, N] float64, shares held at row i's close. The shares that changed from row i-1 to row i were decided
    # on row i-1's close and filled at fill_prices[i] on fill_dates[i] (row i-1's close itself under
    # --execution close, row i's open or close otherwise); row 0 is the starting portfolio, before any trade.
    holdings: np.ndarray
    prices: np.ndarray  # [D, N] float64, close prices in dollars
    costs: np.ndarray  # [D] float64, dollars: row i holds the costs of the trades leading to row i
    tickers: tuple[str, ...]
    fill_prices: np.ndarray  # [D, N] float64 dollars the trades leading to row i filled at (row 0: prices[0])
    fill_dates: np.ndarray  # [D] datetime64[ns] the day those trades filled (row 0: dates[0])
    # The observation of the last day ([T, F] float32), which the run never acts on (no later close to trade
    # into), and the recurrent state after the last day it acted on: what `clstm_ppo.trading.decision`
    # continues from to decide that day.
    last_obs: np.ndarray | None = None
    last_state: RecurrentState | EnsembleState | None = None

    @property
    def holdings_value(self) -> np.ndarray:
        """[D] dollars held in stock at each day's close."""
        return (self.holdings * self.prices).sum(axis=1)

    @property
    def sharpe(self) -> float:
        """Annualised Sharpe ratio of the daily returns of ``values``."""
        return sharpe_from_returns(self.values[1:] / self.values[:-1] - 1.0)


def evaluate_policy(
    model: torch.nn.Module | Ensemble,
    market: PreparedMarket,
    split: str | DayRange,
    config: EnvConfig,
    *,
    device: torch.device | str = "cpu",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    start_portfolio: tuple[float, np.ndarray] | None = None,
) -> PolicyRun:
    """Run ``model`` over the whole ``split`` once (deterministic = mean action) and record every day.

    :param split: "train" | "validation" | "test", or a `DayRange` of day indices into ``market.data``
        (a custom period; its first observation looks back ``window - 1`` days before ``split.start``).
    :param config: env settings (the episode length is not: the run covers the whole split).
    :param generator: noise source for ``deterministic=False`` (on any device; a CPU one gives the same draws
        on every device), so sampled runs are seeded.
    :param start_portfolio: ``(cash in dollars, shares [N])`` held on the first day instead of the config's
        ``initial_amount`` in cash (a walk-forward study hands one period's last portfolio to the next).
    """
    policy: ActorCritic | Ensemble = unwrap(model) if isinstance(model, torch.nn.Module) else model
    env = StockTradingEnv(market=market, split=split, config=config.whole_split())
    options = None if start_portfolio is None else {"cash": start_portfolio[0], "shares": start_portfolio[1]}
    obs, info = env.reset(seed=0, options=options)
    state = policy.initial_state(1, device)
    start = torch.ones(1, dtype=torch.bool, device=device)
    record = [info]
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad():
            done = False
            while not done:
                obs_t = torch.as_tensor(obs, device=device).unsqueeze(0)
                action, _, _, state = policy.act(obs_t, state, start, deterministic=deterministic, generator=generator)
                start = torch.zeros_like(start)
                obs, _, terminated, truncated, info = env.step(policy.env_action(action)[0].float().cpu().numpy())
                record.append(info)
                done = terminated or truncated
    finally:
        policy.train(was_training)
    return PolicyRun(
        dates=np.array([r["date"] for r in record], dtype="datetime64[ns]"),
        values=np.array([r["portfolio_value"] for r in record], dtype=np.float64),
        cash=np.array([r["cash"] for r in record], dtype=np.float64),
        holdings=np.stack([np.asarray(r["holdings"], dtype=np.float64) for r in record]),
        prices=np.stack([np.asarray(r["prices"], dtype=np.float64) for r in record]),
        costs=np.array([r.get("costs", 0.0) for r in record], dtype=np.float64),
        tickers=tuple(market.data.tickers),
        fill_prices=np.stack([np.asarray(r.get("fill_prices", r["prices"]), dtype=np.float64) for r in record]),
        fill_dates=np.array([r.get("fill_date", r["date"]) for r in record], dtype="datetime64[ns]"),
        last_obs=np.asarray(obs, dtype=np.float32).copy(),
        last_state=state.map(lambda t: t.detach().clone()),
    )
