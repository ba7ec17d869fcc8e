"""StockTradingEnv: one trading episode as a gymnasium.Env, over the same kernel as the vector env.

It is ``VectorStockTradingEnv`` with one env on the CPU and auto-reset off, converted to numpy,
so the two cannot disagree about the trading math.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from envs.config import EnvConfig
from envs.data import DayRange
from envs.features import PreparedMarket
from envs.vector_env import VectorStockTradingEnv


def default_market(window: int = 30, seed: int = 0) -> PreparedMarket:
    """The synthetic market ``gymnasium.make("envs/StockTrading-v0")`` uses without arguments:
    30 tickers x 2,520 days (``envs.synthetic.generate_market(seed=seed)``), default 70/15/15 splits."""
    from envs.data import split_days
    from envs.synthetic import generate_market

    data = generate_market(seed=seed)
    return PreparedMarket.prepare(data, split_days(data, window=window), window=window)


class StockTradingEnv(gymnasium.Env):
    """Trade N stocks daily, FinRL / CLSTM-PPO style: one episode over one split of a PreparedMarket.

    ## Action space
    ``Box(-1, 1, (N,), float32)``: per stock, the fraction of ``hmax`` shares to buy (> 0) or sell
    (< 0) at today's close, clipped to [-1, 1] and truncated toward zero to whole shares. Sells run
    first (never more than held); buys are then scaled down pro rata, one factor for all stocks,
    when they would cost more than the cash (costs included). No shorting, cash never below 0.

    ## Observation space
    ``Box(-f32max, f32max, (T, F), float32)`` (any finite float32), T = ``market.window`` days (oldest first, today last),
    F = 1 + N + N + K*N. Row j describes day t - T + 1 + j:

    - ``[0]`` cash / initial_amount, >= 0 (1.0 at the start)
    - ``[1 : 1+N]`` price feature per ticker z-scored with the training split's mean/std (unbounded): the
      daily log return by default (``envs.features.DEFAULT_PRICE_MODE``), or the close itself ("level")
    - ``[1+N : 1+2N]`` shares held / 1,000, >= 0
    - ``[1+2N + k*N + i]`` indicator k (macd, rsi, cci, adx) of ticker i, z-scored with training stats

    Rows before the episode's first day hold that day's market history with the starting
    portfolio. Nothing after day t is in the observation of day t.

    ## Reward
    ``(value_{t+1} - value_t) * reward_scaling`` (1e-4), value = cash + shares x close: trades
    execute at day t's close, the reward is the resulting value change to day t+1's close,
    transaction costs (0.1% per side) included.

    ## Starting state
    ``initial_amount`` ($1,000,000) cash and no shares on a seeded uniform day that leaves a full
    ``episode_length`` before the split ends (the split's first day with ``episode_length="full"``); ``reset(options={"start_day": d})`` picks the day (a day index into the market's data).

    ## Episode end
    Terminated on the split's last day (there is no next close to trade into); truncated after
    ``episode_length`` steps ("full": never). On a day whose turbulence index is at or above the
    market's threshold, every position is sold and nothing is bought (the episode goes on).

    ## Arguments
    - ``market``: a ``PreparedMarket``; default: ``default_market()`` (synthetic, 30 stocks, 10 years)
    - ``split``: "train" | "validation" | "test" or a ``DayRange``
    - ``config``: ``EnvConfig`` (actions, costs, reward, episode length: `envs.config`)
    - ``seed``: seed of the start-day generator until ``reset(seed=...)`` reseeds it

    ``info`` (reset and step): date (numpy datetime64 of the observed day), day (index), portfolio_value,
    cash ($), holdings [N] (shares), prices [N] (that day's closes, $); after a step also trades
    [N] (shares bought + / sold -), num_trades, costs ($ this step); at the episode's end "episode"
    with the same summary as the vector env.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        market: PreparedMarket | None = None,
        *,
        split: str | DayRange = "train",
        config: EnvConfig | None = None,
        seed: int = 0,
        render_mode: str | None = None,
    ) -> None:
        config = config if config is not None else EnvConfig()
        if market is None:
            market = default_market()
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported (no rendering)")
        self.market = market
        self.config = config
        self._venv = VectorStockTradingEnv(
            market, split=split, num_envs=1, config=config, device="cpu", seed=seed, _autoreset=False
        )
        self.observation_space = self._venv.single_observation_space
        self.action_space = self._venv.single_action_space
        self.render_mode = None
        self._dates = np.asarray(market.data.dates)
        self._close = np.asarray(market.data.close, dtype=np.float64)

    def _info(self, vinfo: dict[str, Any], shares: torch.Tensor) -> dict[str, Any]:
        day = int(vinfo["day"][0])
        return {
            "date": self._dates[day],
            "day": day,
            "portfolio_value": float(vinfo["portfolio_value"][0]),
            "cash": float(vinfo["cash"][0]),
            "holdings": shares[0].numpy().copy(),
            "prices": self._close[day].copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, vinfo = self._venv.reset(seed=seed, options=options)
        return obs[0].numpy(), self._info(vinfo, self._venv._s["shares"])

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        act = torch.as_tensor(np.asarray(action, dtype=np.float32).reshape(1, -1))
        obs, reward, terminated, truncated, vinfo = self._venv.step(act)
        info = self._info(vinfo, self._venv._s["shares"])
        info["trades"] = vinfo["shares_traded"][0].numpy().copy()
        info["num_trades"] = int(vinfo["num_trades"][0])
        info["costs"] = float(vinfo["costs"][0])
        info["fill_prices"] = vinfo["fill_prices"][0].numpy().copy()  # what this step's orders filled at
        info["dividends"] = float(vinfo["dividends"][0])  # dollars received for the new day
        info["fill_date"] = self._dates[info["day"] - 1 if self._venv.execution == "close" else info["day"]]
        if "episode" in vinfo:
            info["episode"] = {k: v[0].item() for k, v in vinfo["episode"].items()}
        return obs[0].numpy(), float(reward[0]), bool(terminated[0]), bool(truncated[0]), info
