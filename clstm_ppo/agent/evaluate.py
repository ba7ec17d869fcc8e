"""Run a policy through one split with the training env code: the day-by-day record a backtest reports.

Used by the trainer (validation score for ``best.pt``), the backtest and a study's cells (`evaluate_cells`: a
batch of cells' networks at once). The env is the training env (`envs.vector_env.VectorStockTradingEnv`, on the
CPU, no auto-reset: `envs.trading_env.StockTradingEnv` wraps the same), one column per network; the policy carries
its recurrent state from the split's first day to its last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clstm_ppo.agent.ensemble import Ensemble, EnsembleState
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked import CellPolicy
from envs.config import EnvConfig
from envs.data import DayRange
from envs.features import PreparedMarket
from envs.returns import sharpe_from_returns
from envs.vector_env import VectorStockTradingEnv


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
    model: ActorCritic | Ensemble,
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

    :param model: a network or an ensemble, or anything that acts like one (``act``, ``env_action``,
        ``initial_state``, ``eval``/``train``: the reference trader's `clstm_ppo.evaluation.oracle.ReferencePolicy`).
    :param split: "train" | "validation" | "test", or a `DayRange` of day indices into ``market.data``
        (a custom period; its first observation looks back ``window - 1`` days before ``split.start``).
    :param config: env settings (the episode length is not: the run covers the whole split).
    :param generator: noise source for ``deterministic=False`` (on any device; a CPU one gives the same draws
        on every device), so sampled runs are seeded.
    :param start_portfolio: ``(cash in dollars, shares [N])`` held on the first day instead of the config's
        ``initial_amount`` in cash (a walk-forward study hands one period's last portfolio to the next).
    """

    def decide(obs: torch.Tensor, state: Any, start: torch.Tensor) -> tuple[torch.Tensor, Any]:
        action, _, _, state = model.act(obs, state, start, deterministic=deterministic, generator=generator)
        return model.env_action(action), state

    was_training = model.training
    model.eval()
    try:
        (run,), state = _trade(decide, model.initial_state(1, device), market, split, config, device, [start_portfolio])
    finally:
        model.train(was_training)
    run.last_state = state.map(lambda t: t.detach().clone())
    return run


def evaluate_cells(
    models: list[ActorCritic] | CellPolicy,
    market: PreparedMarket,
    split: str | DayRange,
    config: EnvConfig,
    *,
    device: torch.device | str = "cpu",
    start_portfolios: list[tuple[float, np.ndarray] | None] | None = None,
) -> list[PolicyRun]:
    """`evaluate_policy` (deterministic) of K networks of one family and shape at once, as a study trades a batch of
    cells: one stacked forward (`clstm_ppo.agent.stacked.CellPolicy`) and one env of K columns a day, network k
    trading column k from ``start_portfolios[k]``. Run k is network k's `evaluate_policy` up to the float rounding
    of the stacked forward (``tests/test_stacked.py``).

    :param models: the networks, whose parameters become views of the stacked weights (pass networks used for
        nothing else), or networks already stacked (a `CellPolicy`: the batch a `Trainer` of K seeds trains).

    A column whose network gives non-finite actions (a diverged cell of a training batch, which is never scored)
    holds its portfolio.
    """
    cells = models if isinstance(models, CellPolicy) else CellPolicy(models)

    def decide(obs: torch.Tensor, state: RecurrentState, start: torch.Tensor) -> tuple[torch.Tensor, RecurrentState]:
        out = cells.evaluate(obs.unsqueeze(0), state, start.unsqueeze(0))
        actions = cells.env_action(out.mean[0])
        return torch.where(actions.isfinite(), actions, torch.zeros_like(actions)), out.state

    state = cells.initial_state(cells.cells, device)
    with torch.no_grad():
        runs, state = _trade(decide, state, market, split, config, device, start_portfolios or [None] * cells.cells)
    for k, run in enumerate(runs):
        run.last_state = state.map(lambda t, k=k: t[:, k : k + 1].clone())
    return runs


def evaluate_actions(
    actions: np.ndarray,
    market: PreparedMarket,
    split: str | DayRange,
    config: EnvConfig,
    bands: list[float] | None = None,
) -> list[PolicyRun]:
    """B fixed rules through the whole ``split`` in one pass, one env column each (a reference trader's family:
    `clstm_ppo.evaluation.oracle`): column b trades ``actions[t, b]`` on day t's close, as `evaluate_policy` trades
    a policy's action for day t, and run b equals that rule's `evaluate_policy` run.

    :param actions: ``[D, B, A]`` the env actions of every day of ``market.data`` (D its days; the split's are read).
    :param bands: ``[B]`` each column's no-trade band (``config.rebalance_band`` for all by default).
    """
    days = market.split_range(split)
    table = torch.as_tensor(np.asarray(actions), dtype=torch.float32)
    day = iter(range(days.start, days.stop))

    def decide(obs: torch.Tensor, state: None, start: torch.Tensor) -> tuple[torch.Tensor, None]:
        return table[next(day)], state

    runs, _ = _trade(decide, None, market, days, config, "cpu", [None] * table.shape[1], bands)
    return runs


def _trade(
    decide: Callable[[torch.Tensor, Any, torch.Tensor], tuple[torch.Tensor, Any]],
    state: Any,
    market: PreparedMarket,
    split: str | DayRange,
    config: EnvConfig,
    device: torch.device | str,
    start_portfolios: list[tuple[float, np.ndarray] | None],
    bands: list[float] | None = None,
) -> tuple[list[PolicyRun], Any]:
    """Trade B = ``len(start_portfolios)`` env columns over the whole ``split`` (the env `StockTradingEnv` wraps,
    on the CPU), ``decide(obs [B, T, F], state, starts [B]) -> (env actions [B, A], state)`` choosing each day's
    actions; each column's record (``last_state`` left unset) and the state after the last day acted on."""
    columns = len(start_portfolios)
    env = VectorStockTradingEnv(
        market,
        split=split,
        num_envs=columns,
        config=config.whole_split(),
        device="cpu",
        seed=0,
        bands=bands,
        _autoreset=False,
    )
    obs, info = env.reset(seed=0, options=_portfolio_options(start_portfolios))
    dates, close = np.asarray(market.data.dates), np.asarray(market.data.close, dtype=np.float64)
    days, values, cash = [info["day"]], [info["portfolio_value"]], [info["cash"]]
    holdings = [env._s["shares"].clone()]
    costs: list[torch.Tensor] = [torch.zeros(columns, dtype=torch.float64)]
    fills: list[torch.Tensor | None] = [None]  # the first row's fill is its own close
    start = torch.ones(columns, dtype=torch.bool, device=device)
    with torch.no_grad():
        done = False
        while not done:
            actions, state = decide(obs.to(device), state, start)
            start = torch.zeros_like(start)
            obs, _, terminated, truncated, info = env.step(actions.float().cpu())
            days.append(info["day"])
            values.append(info["portfolio_value"])
            cash.append(info["cash"])
            holdings.append(env._s["shares"].clone())
            costs.append(info["costs"])
            fills.append(info["fill_prices"])
            done = bool(terminated[0] or truncated[0])  # the columns trade the same days
    day = np.array([int(d[0]) for d in days])
    fill_day = np.concatenate([day[:1], day[1:] - 1 if env.execution == "close" else day[1:]])

    def by_day(rows: list[Any]) -> np.ndarray:  # [D, B, ...] float64, stacked once for every column
        return torch.stack([torch.as_tensor(r, dtype=torch.float64) for r in rows]).numpy()

    value_rows, cash_rows, held_rows, cost_rows = by_day(values), by_day(cash), by_day(holdings), by_day(costs)
    fill_rows = by_day(fills[1:])  # the loop steps at least once
    runs = [
        PolicyRun(
            dates=dates[day].astype("datetime64[ns]"),
            values=value_rows[:, k].copy(),
            cash=cash_rows[:, k].copy(),
            holdings=held_rows[:, k].copy(),
            prices=close[day].copy(),
            costs=cost_rows[:, k].copy(),
            tickers=tuple(market.data.tickers),
            fill_prices=np.concatenate([close[day[0]][None], fill_rows[:, k]]),
            fill_dates=dates[fill_day].astype("datetime64[ns]"),
            last_obs=obs[k].numpy().astype(np.float32, copy=True),
        )
        for k in range(columns)
    ]
    return runs, state


def _portfolio_options(start_portfolios: list[tuple[float, np.ndarray] | None]) -> dict[str, Any] | None:
    """The env's reset options for the columns' starting portfolios: None (all start in cash) or every one's."""
    given = [p is not None for p in start_portfolios]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("give every column a starting portfolio, or none")
    return {
        "cash": np.array([p[0] for p in start_portfolios], dtype=np.float64),  # type: ignore[index]
        "shares": np.stack([np.asarray(p[1], dtype=np.float64) for p in start_portfolios]),  # type: ignore[index]
    }
