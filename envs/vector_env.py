"""VectorStockTradingEnv: B trading episodes in lockstep as torch tensors on one device.

Each step is a fixed number of batched tensor operations, whatever B and N are: no Python loop over
envs or stocks. The trading math is ``envs.kernel.trade_step`` (shared with ``StockTradingEnv``).

Timing: the observation at day t holds closes and indicators up to day t only. The action's orders are sized at day t's
close and fill at the price ``EnvConfig.execution`` names (`envs.execution`); turbulence of day t decides a liquidation,
which fills the same way. The env then moves to day t+1 and the reward (the class docstring) is from the change of
value = cash + shares x close from t's close to t+1's: the costs, the gap between t's close and the fill, and the market
move of the holdings. Day t+1's prices reach the agent only through that reward and the next observation.

Observation [B, T, F] float32, F = 1 + N + N + K*N, row j = day t - T + 1 + j (oldest first):
  [0]                    cash / initial_amount, cash held when that day's observation was made
                         (cash / portfolio value with EnvConfig.portfolio_features = "weights")
  [1 : 1+N]              price feature per ticker, z-scored with training statistics: the close ("level")
                         or its daily log return ("return"); see envs.features.price_features
  [1+N : 1+2N]           shares held / Normalization.holdings_scale (1,000) (with "weights": each
                         holding's value / portfolio value)
  [1+2N : 1+2N+K*N]      indicator k of ticker i at 1+2N+k*N+i, z-scored with training statistics
Rows before the episode's first day show that day's market history with the starting portfolio
(cash 1.0, no shares); market days before the data's first day repeat day 0.

Speed: market rows are precomputed once ([D, F] float32 with zeros in the portfolio columns). The window lives in a
"mirror" ring buffer [B, 2T, F]: each step writes the new day's row at slot q and q + T, so the last T rows are always
the contiguous slice [q+1, q+T+1) and the returned observation is a single copy of it. Episode ends are known on the
host from the start days (no device sync).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from torch import Tensor

from envs.config import EnvConfig
from envs.data import DayRange
from envs.errors import UserError
from envs.execution import Terms
from envs.features import PreparedMarket
from envs.kernel import portfolio_value, trade_step
from envs.returns import annualised_sharpe
from envs.state import StateLayout

EPISODE_KEYS = ("reward", "final_value", "return", "trades", "sharpe", "max_drawdown", "length", "costs", "exposure")
"""Fields of ``info["episode"]``, in the order the trainer packs them for its all-gather."""
_RUNNING_SUMS = ("ep_reward", "ep_costs", "ep_trades", "sum_r", "sum_r2", "max_dd", "sum_exposure")
"""An episode's running statistics (``ep_trades`` int64, the rest float64 from 0): the summary is made from them."""


def write_portfolio_columns(
    rows: Tensor, cash: Tensor, shares: Tensor, close: Tensor, value: Tensor, config: EnvConfig, holdings_scale: float
) -> None:
    """Write the portfolio columns (0 and [1+N, 1+2N), module docstring) of state rows in place: the one encoding of
    cash and holdings, as ``config.portfolio_features`` says.

    :param rows: [B, F] float32 state rows, or [B, T, F] windows whose every row gets the same portfolio
    :param cash: [B] float64 dollars; shares: [B, N] float64 shares; close: [B, N] float64 dollars, the closes the
        holdings are valued at, and value: [B] float64 dollars, cash + shares . close (both "weights" only)
    """
    layout = StateLayout.of_width(rows.shape[-1], shares.shape[1])
    if config.portfolio_features == "weights":
        cash_col, hold_cols = cash / value, shares * close / value.unsqueeze(1)
    else:
        cash_col, hold_cols = cash * (1.0 / float(config.initial_amount)), shares * (1.0 / float(holdings_scale))
    if rows.dim() == 3:
        cash_col, hold_cols = cash_col.unsqueeze(1), hold_cols.unsqueeze(1)
    rows[..., 0] = cash_col
    rows[..., layout.holdings] = hold_cols


class VectorStockTradingEnv(gymnasium.vector.VectorEnv):
    """B stock-trading episodes on one device, same-step auto-reset.

    Action space: Box(-1, 1, (B, N), float32), one number per stock, clipped to [-1, 1], read as
    ``EnvConfig.action_mode`` says (`envs.kernel`'s rule 1): "weights" (the default) a target portfolio, "shares" the
    fraction of ``hmax`` shares to buy (> 0) or sell (< 0).

    Observation space: Box(-f32max, f32max, (B, T, F), float32); the layout is in the module docstring.
    Returned as torch tensors on ``device``.

    Reward: [B] float32 from value = cash + shares x close at t's close and t+1's (module docstring): 100 x its log
    change with ``EnvConfig.reward`` "log_return" (the default), its change x reward_scaling with "value"; the
    ``turnover_penalty`` lowers the later value by that fraction of the dollars traded.

    Starting state: cash = initial_amount, no shares, on a day drawn uniformly (seeded ``torch.Generator``) from the
    split's days that leave a full ``episode_length`` before the split's last day (the split's first day when the
    split is shorter or ``episode_length`` is "full").

    Episode end: terminated when the split's last day is reached (no later day to trade into); truncated after
    ``episode_length`` steps. A finished env is reset in the same step: its returned observation already belongs to the
    new episode; ``info["final_obs"]`` holds the observation it finished on (where ``info["_final_obs"]``; it is the
    returned obs itself on steps where no env finished). ``info["episode"]`` ([B] tensors, valid where
    ``info["_episode"]``) summarises the finished episodes: reward, final_value ($), return, trades (non-zero share
    changes), sharpe (`envs.returns.annualised_sharpe` of the daily simple returns), max_drawdown (fraction of the
    running peak, >= 0), length (days), costs ($), exposure (mean over the episode's days of the fraction of the
    portfolio value held in stock, in [0, 1]). Other info keys describe the step just taken (before any reset):
    portfolio_value, cash [B] ($), day [B] (index of the day the portfolio was valued at), costs [B] ($), num_trades
    [B], shares_traded [B, N], wanted_buy_value and refused_buy_value [B] ($ of buys asked for, and of those the cash
    could not pay for), fill_prices [B, N] ($ per share the step's orders filled at), dividends [B] ($ received for the
    day moved to). Cash earns ``EnvConfig.risk_free`` each day and the episode's Sharpe is on returns in excess of it
    (`envs.execution`).

    Arguments: split ("train" | "validation" | "test" or a DayRange), num_envs (B), seed (of the start generator),
    bands (each env's own no-trade band, ``--rebalance_band``, instead of the config's: a family of traders in one pass).

    Training pool: with ``pool=True`` on the "train" split of a market with a ``pool`` (a synthetic source's
    ``train_draws``: K markets of the same length D and spec; the trainer's env), each episode starts on a day drawn
    uniformly from the training days of all K markets and stays in its market: the K markets' days are stacked (day
    index k D + t), an episode ends at its market's split end, and its window never looks back into the market
    before it. Without it (evaluation, the default) the env runs on the market alone.

    Cells: ``seed`` may be a list of C seeds; the B envs are then C equal blocks of consecutive envs ("cells", a study's
    runs trained as one batch: `clstm_ppo.training.trainer`), each drawing its start days from its own generator in the
    order its envs need them, so block c behaves exactly as a ``B / C``-env ``VectorStockTradingEnv`` seeded ``seed[c]``
    (`cell_state_dict` gives that env's ``state_dict``).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        market: PreparedMarket,
        *,
        split: str | DayRange = "train",
        num_envs: int = 1,
        config: EnvConfig = EnvConfig(),  # noqa: B008 - frozen dataclass, safe as a default
        device: str | torch.device = "cpu",
        seed: int | list[int] = 0,
        pool: bool = False,
        bands: list[float] | None = None,
        _autoreset: bool = True,
    ) -> None:
        if num_envs < 1:
            raise UserError(f"num_envs must be >= 1, got {num_envs}")
        seeds = [int(s) for s in seed] if isinstance(seed, (list, tuple)) else [int(seed)]
        if num_envs % len(seeds):
            raise ValueError(f"{num_envs} envs do not split into {len(seeds)} cells")
        self.market = market
        self.config = config
        if bands is not None and len(bands) != num_envs:
            raise ValueError(f"{len(bands)} no-trade bands for {num_envs} envs")
        # each env's own no-trade band (a family of traders in one pass), else config.rebalance_band for all
        self._bands = None if bands is None else torch.tensor(bands, dtype=torch.float64, device=device)
        self.split_name = split if isinstance(split, str) else "custom"
        self.split = market.split_range(split)
        self.num_envs = int(num_envs)
        self.num_tickers = market.num_tickers
        self.num_features = market.num_features
        self.window = int(market.window)
        self.device = torch.device(device)
        self.render_mode = None
        self._autoreset = _autoreset

        N, T, F = self.num_tickers, self.window, self.num_features
        # Finite bounds (any finite float32): gymnasium's checker rejects infinite ones.
        big = float(np.finfo(np.float32).max)
        self.single_observation_space = gymnasium.spaces.Box(-big, big, (T, F), np.float32)
        self.action_dim = N  # one number per stock
        self.single_action_space = gymnasium.spaces.Box(-1.0, 1.0, (self.action_dim,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        # Market tensors over all days (the split only bounds which days an episode visits); a training pool's
        # markets stacked along the days (class docstring).
        dev = self.device
        if pool and split != "train":
            raise ValueError(f"a training pool runs on the train split, not {split!r}")
        markets = [market, *market.pool] if pool else [market]
        self._draw_days = market.data.num_days  # D: day k D + t is day t of the k-th market
        self._num_draws = len(markets)
        self.terms = Terms.of(market.data, config.execution, config.risk_free)
        self.execution = self.terms.execution
        terms = [self.terms, *(Terms.of(m.data, config.execution, config.risk_free) for m in markets[1:])]
        # A copy: the data's arrays can be read-only views of a pandas frame, which torch warns about.
        close = np.concatenate([np.asarray(m.data.close, dtype=np.float64) for m in markets])
        self._close = torch.tensor(close, device=dev)  # [K D, N]
        self._fill = torch.tensor(np.concatenate([t.fill for t in terms]), device=dev)  # row t: where t's orders fill
        dividends = np.concatenate([t.dividends for t in terms])
        self._dividends = torch.tensor(dividends, device=dev)  # [K D, N] dollars per share paid on day t
        self._pays_dividends = bool(dividends.any())  # host-known: no work per step without them
        self._turbulent = torch.as_tensor(np.concatenate([m.stopped_days() for m in markets]), device=dev)  # [K D] bool
        layout = market.layout
        mrows = np.zeros((close.shape[0], F), dtype=np.float32)
        rows = np.concatenate(
            [m.normalization.market_rows(np.asarray(m.data.close, dtype=np.float64), m.indicators) for m in markets]
        )  # [K D, N + K*N]
        mrows[:, layout.prices] = rows[:, :N]
        mrows[:, layout.indicators] = rows[:, N:]
        self._mrows = torch.as_tensor(mrows, device=dev)  # [K D, F] float32, portfolio columns zero
        self._offsets = torch.arange(-T + 1, 1, device=dev)  # [T] day offsets of a window

        self._gens = [torch.Generator().manual_seed(s) for s in seeds]  # per cell; CPU: same starts on every device
        self._cell_size = self.num_envs // len(seeds)
        self._buf = torch.zeros((self.num_envs, 2 * T, F), dtype=torch.float32, device=dev)
        self._q = T - 1
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self._reset_all(None)

    def _sample_starts(self, envs: np.ndarray) -> np.ndarray:
        """Start days [n] int64 of the envs ``envs`` ([n] ascending), as stacked day indices k D + t: day lo..hi of
        one of the K markets (K = 1 without a training pool), all K (hi - lo + 1) choices equally likely, hi the
        latest start that leaves a full episode (lo, the split's first day, when none does); each cell's envs drawn
        together from its own generator, which a single choice leaves untouched."""
        lo, stop = self.split.start, self.split.stop
        length = self.config.episode_days
        span = 1 if length is None else max(1, stop - length - lo)  # hi - lo + 1
        if self._num_draws * span == 1:
            return np.full(envs.size, lo, dtype=np.int64)
        cells = envs // self._cell_size
        draws = np.concatenate(
            [
                torch.randint(0, self._num_draws * span, (int((cells == c).sum()),), generator=self._gens[c]).numpy()
                for c in np.unique(cells)
            ]
        ).astype(np.int64)
        return (draws // span) * self._draw_days + lo + draws % span

    def _ends(self, starts: np.ndarray | Tensor) -> np.ndarray | Tensor | int:
        """The split's stop in the market of each start day ([n] like ``starts``; an int without a training pool)."""
        if self._num_draws == 1:
            return self.split.stop
        return (starts // self._draw_days) * self._draw_days + self.split.stop

    def _write_portfolio(self, rows: Tensor, cash: Tensor, shares: Tensor, prices: Tensor, value: Tensor) -> None:
        """`write_portfolio_columns` with this env's settings."""
        write_portfolio_columns(
            rows, cash, shares, prices, value, self.config, self.market.normalization.holdings_scale
        )

    def _window_rows(self, starts: Tensor, cash: Tensor, shares: Tensor) -> Tensor:
        """[n, T, F] float32 observation of portfolios (cash [n], shares [n, N]) starting at days `starts`
        ([n] int64 on device): the market's rows with that portfolio in every row."""
        days = starts.unsqueeze(1) + self._offsets
        if self._num_draws == 1:
            days = days.clamp_min(0)
        else:  # never into the market before: its first day repeats, as day 0 does
            days = torch.maximum(days, ((starts // self._draw_days) * self._draw_days).unsqueeze(1))
        w = self._mrows.index_select(0, days.reshape(-1)).view(starts.shape[0], self.window, -1)
        prices = self._close.index_select(0, starts)
        self._write_portfolio(w, cash, shares, prices, portfolio_value(cash, shares, prices))
        return w

    def _place_windows(self, idx: Tensor, windows: Tensor) -> None:
        """Write ordered windows [n, T, F] into the ring rows of envs `idx` for ring position self._q.

        Rows [q+1, q+1+T) are the window itself; the rows outside it are the mirror copies of the
        slots they share (row r and r + T hold the same slot), so later steps see a consistent ring.
        """
        T, q = self.window, self._q
        self._buf[idx, q + 1 : q + 1 + T] = windows
        self._buf[idx, : q + 1] = windows[:, T - q - 1 :]
        self._buf[idx, q + 1 + T :] = windows[:, : T - q - 1]

    def _fresh_state(self, n: int, start_value: Tensor | None = None) -> dict[str, Tensor]:
        """Episode state of ``n`` envs starting with ``initial_amount`` in cash (or ``start_value`` [n] dollars,
        the value of a given starting portfolio: `reset` sets its cash and shares)."""
        dev, f64 = self.device, torch.float64
        init = float(self.config.initial_amount)
        value = torch.full((n,), init, dtype=f64, device=dev) if start_value is None else start_value.to(dev, f64)
        return {
            "cash": torch.full((n,), init, dtype=f64, device=dev),
            "shares": torch.zeros((n, self.num_tickers), dtype=f64, device=dev),
            "value": value.clone(),
            "peak": value.clone(),
            **{k: torch.zeros(n, dtype=torch.int64 if k == "ep_trades" else f64, device=dev) for k in _RUNNING_SUMS},
        }

    def _reset_all(self, starts: np.ndarray | None, portfolio: tuple[Tensor, Tensor] | None = None) -> Tensor:
        B = self.num_envs
        starts = self._sample_starts(np.arange(B)) if starts is None else starts
        self._start_np = starts.copy()
        self._day_np = starts.copy()
        self._day = torch.as_tensor(starts, device=self.device)
        self._start = self._day.clone()
        if portfolio is None:
            self._s = self._fresh_state(B)
        else:
            cash, shares = portfolio
            self._s = self._fresh_state(B, portfolio_value(cash, shares, self._close.index_select(0, self._day)))
            self._s["cash"], self._s["shares"] = cash.clone(), shares.clone()
        self._q = self.window - 1
        rows = self._window_rows(self._day, self._s["cash"], self._s["shares"])
        self._place_windows(torch.arange(B, device=self.device), rows)
        self._needs_reset[:] = False
        return self._current_obs()

    def _check_portfolio(self, options: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
        """(cash [B], shares [B, N]) float64 on the device from reset options "cash" and "shares", if given."""
        if options.get("cash") is None and options.get("shares") is None:
            return None
        B, N, f64 = self.num_envs, self.num_tickers, torch.float64
        cash = torch.as_tensor(options.get("cash", self.config.initial_amount), dtype=f64).to(self.device)
        shares = torch.as_tensor(options.get("shares", 0.0), dtype=f64).to(self.device)
        cash, shares = cash.expand(B).clone(), shares.expand(B, N).clone()
        if bool((cash < 0).any()) or bool((shares < 0).any()) or bool((shares != shares.floor()).any()):
            raise UserError("a starting portfolio needs cash >= 0 and whole, non-negative share counts")
        return cash, shares

    def _check_starts(self, start_day: Any) -> np.ndarray:
        starts = np.broadcast_to(np.asarray(start_day, dtype=np.int64), (self.num_envs,)).copy()
        lo, hi = self.split.start, self.split.stop - 2
        if (starts < lo).any() or (starts > hi).any():
            raise UserError(f"start_day must be within days [{lo}, {hi}] of the split, got {start_day}")
        return starts

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tensor, dict]:
        """Start B new episodes. seed: reseeds the start-day generator (a list: each cell's); options: {"start_day":
        int | [B], "cash": dollars (scalar or [B]), "shares": [N] or [B, N] whole shares} -- a starting portfolio
        other than ``initial_amount`` in cash (the study carries one period's portfolio into the next this way).

        :return: (obs [B, T, F] float32 on device, info {"portfolio_value", "cash", "day"})
        """
        if seed is not None:
            for gen, value in zip(self._gens, seed if isinstance(seed, (list, tuple)) else [seed], strict=True):
                gen.manual_seed(int(value))
        starts = self._check_starts(options["start_day"]) if options and options.get("start_day") is not None else None
        obs = self._reset_all(starts, self._check_portfolio(options or {}))
        s = self._s
        return obs, {"portfolio_value": s["value"].clone(), "cash": s["cash"].clone(), "day": self._day.clone()}

    def _reward(self, value: Tensor, value_before: Tensor, shares_traded: Tensor, fill: Tensor) -> Tensor:
        """Today's reward ``[B]`` float64 (class docstring) from the portfolio value after and before the step ``[B]``
        ($); ``turnover_penalty`` x the dollars traded (``shares_traded [B, N]`` x ``fill [B, N]``) is a cost the
        reward charges and the portfolio never pays."""
        cfg = self.config
        if cfg.turnover_penalty:
            value = value - cfg.turnover_penalty * (shares_traded.abs() * fill).sum(1)
        if cfg.reward == "log_return":
            return 100.0 * torch.log(value / value_before)
        return (value - value_before) * cfg.reward_scaling

    def step(self, actions: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """Trade on each env's current close (orders fill as ``EnvConfig.execution`` says), move one day on, auto-reset
        finished envs.

        :param actions: [B, N] float in [-1, 1] (clipped), tensor on any device or numpy
        :return: obs [B, T, F] float32, reward [B] float32, terminated [B] bool, truncated [B] bool, info
        """
        if self._needs_reset.any():
            raise RuntimeError("episode finished: call reset() before step()")
        B, T = self.num_envs, self.window
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (B, self.action_dim):
            raise ValueError(f"actions must have shape {(B, self.action_dim)}, got {tuple(actions.shape)}")
        s, cfg = self._s, self.config

        day = self._day
        prices = self._close.index_select(0, day)
        fill = self._fill.index_select(0, day)
        cash, shares, stats = trade_step(
            s["cash"], s["shares"], actions, prices, self._turbulent.index_select(0, day), cfg, fill, self._bands
        )
        day = day + 1
        cash, paid = self._carry(cash, s["shares"], shares, day)
        value = portfolio_value(cash, shares, self._close.index_select(0, day))
        reward64 = self._reward(value, s["value"], stats.shares_traded, fill)

        # Episode statistics, O(B): running sums of daily returns in excess of the risk-free rate, running peak.
        ret = value / s["value"] - 1.0 - self.terms.cash_rate
        peak = torch.maximum(s["peak"], value)
        s["sum_r"] += ret
        s["sum_r2"] += ret * ret
        s["max_dd"] = torch.maximum(s["max_dd"], 1.0 - value / peak)
        s["sum_exposure"] += 1.0 - cash / value
        s["ep_reward"] += reward64
        s["ep_costs"] += stats.costs
        s["ep_trades"] += stats.num_trades
        s.update(cash=cash, shares=shares, value=value, peak=peak)

        # New day's row into the ring; the window is then the contiguous rows [q+1, q+T+1).
        self._q = q = (self._q + 1) % T
        row = self._mrows.index_select(0, day)
        self._write_portfolio(row, cash, shares, self._close.index_select(0, day), value)
        self._buf[:, q] = row
        self._buf[:, q + T] = row
        obs = self._current_obs()

        # Episode ends are decided on the host from the start days: no device synchronisation.
        self._day_np += 1
        term_np = self._day_np >= self._ends(self._start_np) - 1
        trunc_np = np.zeros(B, dtype=bool)
        if cfg.episode_days is not None:
            trunc_np = (self._day_np - self._start_np >= cfg.episode_days) & ~term_np
        done_np = term_np | trunc_np
        # The same flags computed on the device: a host-to-device copy of pageable memory would
        # synchronise the CUDA stream every step.
        terminated = day >= self._ends(self._start) - 1
        if cfg.episode_days is not None:
            truncated = (day - self._start >= cfg.episode_days).logical_and_(~terminated)
        else:
            truncated = torch.zeros_like(terminated)
        done = terminated | truncated
        self._day = day

        info: dict[str, Any] = {
            "portfolio_value": value,
            "cash": cash,
            "day": day,
            "costs": stats.costs,
            "num_trades": stats.num_trades,
            "shares_traded": stats.shares_traded,
            "fill_prices": fill,
            "dividends": paid,
            "wanted_buy_value": stats.wanted_buy_value,
            "refused_buy_value": stats.refused_buy_value,
            "final_obs": obs,
            "_final_obs": done,
        }
        if done_np.any():
            info["episode"] = self._episode_summary(day - self._start)
            info["_episode"] = done
            if self._autoreset:
                obs = self._autoreset_envs(done_np)
            else:
                self._needs_reset |= done_np
        return obs, reward64.to(torch.float32), terminated, truncated, info

    def _carry(self, cash: Tensor, before: Tensor, after: Tensor, day: Tensor) -> tuple[Tensor, Tensor]:
        """Cash [B] at ``day``'s close: the trade's cash with a day's interest, plus ``day``'s dividends on the
        shares held at the previous close (``after`` the trade when it filled at that close, else ``before``:
        `envs.execution`). Returns it and the dividends [B] paid."""
        if self.terms.cash_rate:
            cash = cash * (1.0 + self.terms.cash_rate)
        if not self._pays_dividends:
            return cash, torch.zeros_like(cash)
        holders = after if self.terms.paid_after_fill else before
        paid = (holders * self._dividends.index_select(0, day)).sum(1)
        return cash + paid, paid

    def _episode_summary(self, length: Tensor) -> dict[str, Tensor]:
        """[B] tensors describing each env's episode so far (valid where it just finished)."""
        s = self._s
        n = length.to(torch.float64)
        mean = s["sum_r"] / n
        var = (s["sum_r2"] - s["sum_r"] * mean) / (n - 1.0).clamp_min(1.0)
        return {
            "reward": s["ep_reward"].clone(),
            "final_value": s["value"].clone(),
            "return": s["value"] / float(self.config.initial_amount) - 1.0,
            "trades": s["ep_trades"].clone(),
            "sharpe": annualised_sharpe(mean, var.clamp_min(0.0).sqrt(), n),
            "max_drawdown": s["max_dd"].clone(),
            "length": length,
            "costs": s["ep_costs"].clone(),
            "exposure": s["sum_exposure"] / n,
        }

    def _current_obs(self) -> Tensor:
        """[B, T, F] float32: a copy of the ring's window rows [q+1, q+1+T)."""
        q, T = self._q, self.window
        return self._buf[:, q + 1 : q + 1 + T].clone(memory_format=torch.contiguous_format)

    def _autoreset_envs(self, done_np: np.ndarray) -> Tensor:
        """Reset the finished envs in place; return the observation with their new first windows."""
        idx_np = np.flatnonzero(done_np)
        starts_np = self._sample_starts(idx_np)
        self._start_np[idx_np] = starts_np
        self._day_np[idx_np] = starts_np
        idx = torch.from_numpy(idx_np).to(self.device)
        starts = torch.from_numpy(starts_np).to(self.device)
        # Out of place, so tensors already handed out in info keep the finished episodes' values.
        self._day = self._day.index_copy(0, idx, starts)
        self._start = self._start.index_copy(0, idx, starts)
        fresh = self._fresh_state(idx_np.size)
        self._s = {k: v.index_copy(0, idx, fresh[k]) for k, v in self._s.items()}
        self._place_windows(idx, self._window_rows(starts, fresh["cash"], fresh["shares"]))
        # A new tensor: the pre-reset obs stays untouched in info["final_obs"].
        return self._current_obs()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue these episodes bitwise (tensors on CPU, numpy arrays)."""
        return {
            # copies: on the CPU .cpu() would alias tensors that later steps update in place
            **{f"s_{k}": v.to("cpu", copy=True) for k, v in self._s.items()},
            "buf": self._buf.to("cpu", copy=True),
            "q": torch.tensor(self._q),
            "day": self._day.to("cpu", copy=True),
            "start": self._start.to("cpu", copy=True),
            "start_np": torch.from_numpy(self._start_np.copy()),
            "day_np": torch.from_numpy(self._day_np.copy()),
            "needs_reset": torch.from_numpy(self._needs_reset.copy()),
            "gen": self._gens[0].get_state() if len(self._gens) == 1 else [g.get_state() for g in self._gens],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict`` (same num_envs, tickers and window)."""
        if tuple(state["buf"].shape) != tuple(self._buf.shape):
            raise UserError(f"env state has shape {tuple(state['buf'].shape)}, this env {tuple(self._buf.shape)}")
        dev = self.device
        # Statistics added after a state was saved (e.g. exposure) start from zero for the running episodes.
        fresh = self._fresh_state(self.num_envs)
        self._s = {k: state[f"s_{k}"].to(dev, copy=True) if f"s_{k}" in state else v for k, v in fresh.items()}
        self._buf = state["buf"].to(dev).clone()
        self._q = int(state["q"])
        self._day = state["day"].to(dev, copy=True)
        self._start = state["start"].to(dev, copy=True)
        self._start_np = state["start_np"].numpy().copy()
        self._day_np = state["day_np"].numpy().copy()
        self._needs_reset = state["needs_reset"].numpy().copy()
        gens = state["gen"] if isinstance(state["gen"], list) else [state["gen"]]
        for gen, saved in zip(self._gens, gens, strict=True):
            gen.set_state(saved)

    def cell_state_dict(self, cell: int) -> dict[str, Any]:
        """What ``state_dict`` of cell ``cell``'s env alone holds (see the class docstring's Cells)."""
        envs = slice(cell * self._cell_size, (cell + 1) * self._cell_size)
        state = self.state_dict()
        out = {k: (v[envs].clone() if k not in ("q", "gen") else v) for k, v in state.items()}
        out["gen"] = self._gens[cell].get_state()
        return out

    def load_cell_state_dict(self, cell: int, state: dict[str, Any]) -> None:
        """Cell ``cell``'s envs from a ``state_dict`` of its env alone (its ring buffer's window is placed at this
        env's ring position, which may differ)."""
        envs = slice(cell * self._cell_size, (cell + 1) * self._cell_size)
        if tuple(state["buf"].shape) != (self._cell_size, *self._buf.shape[1:]):
            raise UserError(f"env state has shape {tuple(state['buf'].shape)}, a cell's {self._cell_size} envs differ")
        dev, T = self.device, self.window
        fresh = self._fresh_state(self._cell_size)
        for k, v in self._s.items():
            v[envs] = state[f"s_{k}"].to(dev) if f"s_{k}" in state else fresh[k]
        q = int(state["q"])
        window = state["buf"][:, q + 1 : q + 1 + T].to(dev)  # its envs' current windows, oldest day first
        self._place_windows(torch.arange(envs.start, envs.stop, device=dev), window)
        self._day[envs] = state["day"].to(dev)
        self._start[envs] = state["start"].to(dev)
        self._start_np[envs] = state["start_np"].numpy()
        self._day_np[envs] = state["day_np"].numpy()
        self._needs_reset[envs] = state["needs_reset"].numpy()
        self._gens[cell].set_state(state["gen"])
