"""One trading day's decision, exactly as the backtest makes it: bars -> market -> replay -> action -> orders.

The steps (docs/trading.md "One decision per session" says why each reproduces the backtest): 1-2
`load_trading_market` (the checkpoint's tickers' bars, its stored market), 3-5 `decide` (the backtest's own
`run_policy` over `replay_days`; the account's cash and shares in the decision day's row; the mean action; the share
changes of `envs.kernel.trade_step` as orders, `plan_orders`). So when the account holds what the backtest held on day
t, the orders are the backtest's trades decided on day t (tests/test_trade.py). Beyond docs/trading.md "What differs
from the backtest": when the open gaps up so far that the buys no longer fit the cash, the backtest scales them pro
rata where the broker may refuse the last ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.evaluation.backtest import Period, load_backtest_data, run_policy
from clstm_ppo.market import is_alpaca
from clstm_ppo.training.checkpoint import Checkpoint, restore_market
from envs.alpaca import parse_timeframe, resolve_data_url
from envs.config import EnvConfig
from envs.data import DayRange, columns_from_file, parse_date
from envs.errors import UserError, shown_list
from envs.execution import FILLS_AT, resolve_execution
from envs.factor_market import is_synthetic_ticker
from envs.features import PreparedMarket
from envs.kernel import orders_from_actions, portfolio_value, target_weights, trade_step
from envs.state import column_of
from envs.vector_env import write_portfolio_columns


@dataclass(frozen=True)
class PlannedOrder:
    """One order of the plan: ``shares`` (> 0, whole except when selling a fractional holding) at ``price``."""

    ticker: str
    side: str  # "sell" | "buy"
    shares: float
    price: float  # dollars: the decision day's close, the price the rule assumed
    reason: str

    @property
    def value(self) -> float:
        """Dollars at the decision price (before costs)."""
        return self.shares * self.price


@dataclass
class Decision:
    """The decision for one session. N = the checkpoint's tickers; money in dollars, holdings in shares."""

    day: date
    tickers: list[str]
    prices: np.ndarray  # [N] float64 closes of ``day``
    action: np.ndarray  # [N] float32 policy mean action (the rule clips it to [-1, 1])
    requested: np.ndarray  # [N] float64 shares the action asks for (envs.kernel.orders_from_actions), + buy / - sell
    turbulence: float
    threshold: float  # inf when the run had the turbulence stop off
    cash: float  # account cash the rule used (a negative balance counts as 0)
    shares: np.ndarray  # [N] float64 account holdings of the checkpoint's tickers
    cash_after: float  # what the rule expects after the orders fill at the close, costs included
    shares_after: np.ndarray  # [N]
    costs: float  # the rule's transaction costs (buy_cost_pct / sell_cost_pct)
    orders: list[PlannedOrder]  # sells first, then buys, each in ticker order
    backtest_value: float  # the replayed (backtest) portfolio's value at ``day``'s close
    replay_start: date
    execution: str  # how the backtest fills these orders (envs.execution): next_open, next_close or close
    turbulent: bool = False  # the turbulence stop holds the book in cash today (hysteresis included)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """For the journal (plain numbers and strings; inf thresholds as null)."""
        return {
            "day": self.day.isoformat(),
            "replay_start": self.replay_start.isoformat(),
            "tickers": self.tickers,
            "prices": [float(p) for p in self.prices],
            "action": [float(a) for a in self.action],
            "requested": [float(r) for r in self.requested],
            "turbulence": float(self.turbulence),
            "threshold": float(self.threshold) if np.isfinite(self.threshold) else None,
            "turbulent": self.turbulent,
            "cash": self.cash,
            "shares": [float(s) for s in self.shares],
            "cash_after": self.cash_after,
            "shares_after": [float(s) for s in self.shares_after],
            "costs": self.costs,
            "backtest_value": self.backtest_value,
            "execution": self.execution,
            "notes": list(self.notes),
        }


def check_tradable(
    ck: Checkpoint,
    *,
    replay_start: str | None = None,
    history_start: str | None = None,
    data_url: str | None = None,
    features: str | None = None,
) -> None:
    """Everything about the checkpoint, its tickers and the dates that can be checked without the network.

    :raises UserError: synthetic tickers (no exchange lists them), bars other than daily, no start date for the
        bars, a ``history_start`` or ``replay_start`` that is not a date, no test split to start the replay at,
        a data URL that is not http(s), a policy reading feature columns without a ``features`` file holding them.
    """
    _feature_columns(ck, features)
    _bars_start(ck, history_start)
    _replay_start(ck, replay_start)
    resolve_data_url(data_url or ck.cfg.data.data_url or None)


def _feature_columns(ck: Checkpoint, features: str | None) -> list[str]:
    """The data columns ``ck``'s policy reads (``col:NAME`` indicators), once a ``features`` file (``trade
    --features``) is known to be given for them: Alpaca's bars hold none."""
    names = [c for n in ck.market_spec.get("indicator_names", []) if (c := column_of(str(n))) is not None]
    if names and not features:
        raise UserError(
            f"{ck.path} reads the column(s) {', '.join(names)} of its data (col:NAME), which Alpaca's bars do not "
            "hold: pass --features FILE with date, tic and those columns up to the decision day"
        )
    if features and not Path(features).is_file():
        raise UserError(f"--features {features}: no such file")
    return names


def _bars_start(ck: Checkpoint, history_start: str | None) -> str:
    """The first date of bars to download (``history_start``, else the checkpoint's start), once the
    checkpoint's bars are known to be downloadable: real tickers, daily bars."""
    cfg = ck.cfg
    synthetic = [t for t in ck.tickers if is_synthetic_ticker(t)]
    if synthetic:
        raise UserError(
            f"{ck.path} was trained on synthetic tickers ({shown_list(synthetic, 5)}), which no exchange lists: "
            "`clstm-ppo trade` needs a checkpoint trained on real tickers (--data alpaca, or a CSV/Parquet file "
            "of real bars)"
        )
    if is_alpaca(cfg.data.source):
        timeframe = cfg.data.alpaca_options["timeframe"]
        frame = parse_timeframe(timeframe)
        if (frame.amount_value, frame.unit_value.value) != (1, "Day"):
            raise UserError(
                f"{ck.path} was trained on {timeframe} bars; `clstm-ppo trade` decides once "
                "per session on daily bars (1Day)"
            )
    start = history_start or cfg.data.start
    if not start:
        raise UserError(
            f"{ck.path} has no start date for its data; pass --history_start YYYY-MM-DD "
            "(two years back covers the window, the indicators and the turbulence index)"
        )
    parse_date(start, "--history_start" if history_start else f"{ck.path}'s start")
    return start


def _replay_start(ck: Checkpoint, replay_start: str | None) -> tuple[date, str]:
    """The replay's first day (``replay_start``, else the checkpoint's test-split start) and how to name it."""
    if replay_start:
        first, what = replay_start, f"--replay_start {replay_start}"
    else:
        test = (ck.market_spec.get("splits") or {}).get("test")
        if not isinstance(test, dict):
            raise UserError(f"{ck.path} has no test split to start the replay at; pass --replay_start YYYY-MM-DD")
        first, what = test["start"], f"the checkpoint's test split start ({test['start']})"
    try:
        return date.fromisoformat(str(first)), what
    except ValueError:
        raise UserError(f"--replay_start {first!r} is not a date (YYYY-MM-DD)") from None


def load_trading_market(
    ck: Checkpoint,
    day: date,
    *,
    history_start: str | None = None,
    data_url: str | None = None,
    cache_dir: str | None = None,
    features: str | None = None,
) -> PreparedMarket:
    """The checkpoint's market over its tickers' daily Alpaca bars from its first date to ``day`` (step 1-2), with
    the feature columns its policy reads taken from the file ``features`` (`envs.data.columns_from_file`).

    :param history_start: first date of bars (default: the checkpoint's ``start``; earlier or later moves the
        indicators' warm-up away from the backtest's).
    :param data_url: / :param cache_dir: override the run's Alpaca data endpoint and cache folder.
    :raises UserError: synthetic tickers, bars other than daily, no start date, download problems (as for
        training), tickers missing, stale bars.
    """
    cfg = ck.cfg
    start = _bars_start(ck, history_start)
    overrides: dict[str, Any] = {"start": start, "data": cfg.data.source if is_alpaca(cfg.data.source) else "alpaca"}
    if data_url:
        overrides["data_url"] = data_url
    if cache_dir:
        overrides["data_cache_dir"] = cache_dir
    run_ck = dataclasses.replace(ck, config={**ck.config, **overrides})
    data = load_backtest_data(run_ck, end=day.isoformat())
    if columns := _feature_columns(ck, features):
        data = columns_from_file(str(features), columns, data)
    market = restore_market(ck, data)
    last = _day(market.data.dates[-1])
    if last < day:
        raise UserError(
            f"stale bars: the newest daily bars are from {last.isoformat()} but the last session was "
            f"{day.isoformat()} (the feed has not published it yet); nothing was sent, run again later"
        )
    lookback = market.turbulence_lookback + 1
    if np.isfinite(market.turbulence_threshold) and market.data.num_days <= lookback:
        raise UserError(
            f"the turbulence stop needs more than {lookback} trading days of bars before the decision "
            f"day and {market.data.num_days} were loaded from {start}; pass an earlier --history_start"
        )
    return market


def replay_days(ck: Checkpoint, market: PreparedMarket, replay_start: str | None = None) -> DayRange:
    """Days to replay: from ``replay_start`` (default: the checkpoint's test-split start) to the data's last day.

    :raises UserError: no test split and no ``replay_start``, too little lookback, or nothing to replay.
    """
    dates = np.asarray(market.data.dates).astype("datetime64[D]")
    first, what = _replay_start(ck, replay_start)
    lo = int(np.searchsorted(dates, np.datetime64(first, "D"), side="left"))
    last = len(dates) - 1
    if lo < market.window - 1:
        raise UserError(
            f"{what}: the window needs {market.window - 1} trading days of bars before the replay's "
            f"first day and the bars begin {_day(dates[0])}; pass a later --replay_start or an "
            "earlier --history_start"
        )
    if lo >= last:
        raise UserError(
            f"{what} is not before the decision day {_day(dates[last])}: the replay needs at least one "
            "day; pass an earlier --replay_start"
        )
    return DayRange(lo, last + 1)


def decide(
    ck: Checkpoint,
    model: ActorCritic,
    market: PreparedMarket,
    days: DayRange,
    *,
    cash: float,
    shares: np.ndarray,
    device: torch.device | str = "cpu",
) -> Decision:
    """Steps 3-5 of the module docstring for the decision day ``days.stop - 1``; a note when the backtest fills
    otherwise than at the next open, where these orders fill.

    :param cash: account cash in dollars (a negative balance, margin in use, counts as 0: no buys)
    :param shares: [N] account shares of ``market``'s tickers, >= 0 (no shorts: the policy is long-only)
    """
    env = ck.cfg.env
    t = days.stop - 1
    shares = np.asarray(shares, dtype=np.float64)
    notes = []
    if cash < 0:
        notes.append(f"account cash is ${cash:,.2f} (margin in use): counted as $0, so nothing is bought")
        cash = 0.0
    execution = resolve_execution(env.execution, market.data)
    if execution != "next_open":
        notes.append(
            f"this checkpoint's backtest fills orders {FILLS_AT[execution]}, "
            "but these orders fill at the next open: expect the backtest and the account to drift apart"
        )
    run = run_policy(ck, model, market, Period(days, "trade", "replay"), torch.device(device))
    assert run.last_obs is not None

    close = np.asarray(market.data.close[t], dtype=np.float64)
    cash_t = torch.tensor([cash], dtype=torch.float64)
    shares_t = torch.as_tensor(shares, dtype=torch.float64).unsqueeze(0)
    close_t = torch.as_tensor(close).unsqueeze(0)
    obs = torch.as_tensor(run.last_obs).clone()  # [T, F]; the last row is the decision day's
    write_portfolio_columns(
        obs[-1:],
        cash_t,
        shares_t,
        close_t,
        portfolio_value(cash_t, shares_t, close_t),
        env,
        market.normalization.holdings_scale,
    )
    with torch.no_grad():
        action, _, _, _ = model.act(
            obs.unsqueeze(0).to(device),
            run.last_state,
            torch.zeros(1, dtype=torch.bool, device=device),
            deterministic=True,
        )
    # As the env hands it to the rule: the env's action, float32 on the CPU.
    action_np = model.env_action(action)[0].float().cpu().numpy()

    action_t = torch.as_tensor(action_np).unsqueeze(0)
    stopped = bool(market.stopped_days()[t])  # the backtest's stop
    new_cash, new_shares, stats = trade_step(cash_t, shares_t, action_t, close_t, torch.tensor([stopped]), env)
    decision = Decision(
        day=_day(market.data.dates[t]),
        tickers=[str(x) for x in market.data.tickers],
        prices=close,
        action=action_np,
        requested=orders_from_actions(action_t, cash_t, shares_t, close_t, env)[0].numpy(),
        turbulence=float(market.turbulence[t]),
        turbulent=stopped,
        threshold=float(market.turbulence_threshold),
        cash=float(cash),
        shares=shares,
        cash_after=float(new_cash[0]),
        shares_after=new_shares[0].numpy().copy(),
        costs=float(stats.costs[0]),
        orders=[],
        backtest_value=float(run.values[-1]),
        replay_start=_day(market.data.dates[days.start]),
        execution=execution,
        notes=notes,
    )
    decision.orders = plan_orders(decision, stats.shares_traded[0].numpy(), env)
    return decision


def plan_orders(d: Decision, traded: np.ndarray, env: EnvConfig) -> list[PlannedOrder]:
    """The rule's share changes ``traded`` ([N], + bought / - sold) as orders, sells first, with their reasons in the
    terms of ``env``'s action mode: the action times hmax (shares), or the target weight and the weight held
    (weights)."""
    if env.action_mode == "weights":
        target = target_weights(torch.as_tensor(d.action).unsqueeze(0))[0, :-1].numpy()
        value = portfolio_value(
            torch.tensor([d.cash]), torch.as_tensor(d.shares)[None], torch.as_tensor(d.prices)[None]
        )
        held = d.shares * d.prices / max(float(value[0]), 1e-12)
        rule = [f"target {w:.1%} of the portfolio, held {h:.1%}" for w, h in zip(target, held, strict=True)]
    else:
        rule = [f"action {float(a):+.4f} x hmax {env.hmax}" for a in d.action]
    sells, buys = [], []
    for i, ticker in enumerate(d.tickers):
        change, asked, held_shares = float(traded[i]), float(d.requested[i]), float(d.shares[i])
        if change < 0:
            if d.turbulent:
                reason = (
                    f"turbulence {d.turbulence:.2f} >= threshold {d.threshold:.2f}: sell everything"
                    if d.turbulence >= d.threshold
                    else f"turbulence stop still on ({d.turbulence:.2f} < {d.threshold:.2f}, not yet calm for long"
                    " enough): sell everything"
                )
            elif -asked > held_shares:
                reason = f"{rule[i]} asks to sell {-asked:g}; capped at the {held_shares:g} held"
            else:
                reason = rule[i]
            sells.append(PlannedOrder(ticker, "sell", -change, float(d.prices[i]), reason))
        elif change > 0:
            reason = (
                f"{rule[i]} asks to buy {asked:g}; cut to {change:g} to fit the cash" if change < asked else rule[i]
            )
            buys.append(PlannedOrder(ticker, "buy", change, float(d.prices[i]), reason))
    return sells + buys


def _day(value: Any) -> date:
    return date.fromisoformat(str(np.datetime_as_string(np.datetime64(value, "D"), unit="D")))
