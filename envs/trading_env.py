"""StockTradingEnv: one trading episode as a gymnasium.Env, ``VectorStockTradingEnv`` with one env on the CPU and
auto-reset off, converted to numpy, so the two cannot disagree about the trading math."""

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
    """Trade N stocks daily: one episode over one split of a PreparedMarket. It is `VectorStockTradingEnv` with one
    env, so that class and its module docstring give the action and observation spaces, the reward, the starting day
    and the episode's end (`envs.kernel` the trading rules, `envs.config` the defaults); observations come as numpy
    arrays, rewards and flags as Python numbers.

    Arguments: ``market`` (default: `default_market`), ``split`` ("train" | "validation" | "test" or a ``DayRange``),
    ``seed`` (of the start-day generator until ``reset(seed=...)`` reseeds it).

    ``info`` (reset and step): date (numpy datetime64 of the observed day), day (index), portfolio_value,
    cash ($), holdings [N] (shares), prices [N] (that day's closes, $); after a step also trades [N] (shares
    bought + / sold -), num_trades, costs ($ this step), fill_prices [N] ($ per share the step's orders filled at),
    dividends ($ received for the new day), fill_date (the day they filled: the day before under ``execution``
    "close", else the new day); at the episode's end "episode" with the same summary as the vector env.
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
        market = default_market() if market is None else market
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
