"""`clstm-ppo trade` end to end: a tiny checkpoint trained on Alpaca bars, the real alpaca-py clients, two local
HTTP servers (market data: tests/alpaca_server.py; trading: tests/alpaca_trading_server.py). No mocks.

The checkpoint is trained once per module on 3 tickers x 2 years of served bars (share actions with ``--hmax
5000`` so the barely trained policy's small mean actions are whole shares; a second one with today's default
target-weight actions checks the plan against its own backtest) and backtested once with `clstm-ppo backtest`: its
trades.csv and equity.csv are the recorded backtest the plans are checked against. Each test then points
the command at fresh servers whose clock says "after the close" of a chosen session of that backtest.
Commands run in-process through `clstm_ppo.cli.main` (the same guarded entry point as the console script).
The tests that use those checkpoints are marked slow (training them is most of the module's time); the fast
loop, ``pytest -m "not slow"``, keeps the others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from clstm_ppo import cli
from clstm_ppo.cli.trade import build_parser, build_report_parser
from clstm_ppo.threads import torch_threads
from clstm_ppo.trading.decision import load_trading_market
from clstm_ppo.trading.orders import MAX_ID_LENGTH, client_order_id, run_tag
from clstm_ppo.trading.report import trade_report
from clstm_ppo.training.checkpoint import open_checkpoint
from envs.errors import UserError
from envs.kernel import target_weights

try:  # tests/ is a package in this repo; plain rootdir-relative import if it ever is not
    from tests.alpaca_server import AlpacaTestServer, ServerState, daily_bars
    from tests.alpaca_trading_server import NY, AlpacaTradingServer, AssetSpec, Holding, TradingState
    from tests.conftest import ALPACA_VARS, TINY_RUN, run_here, settings_file, use_alpaca_keys
except ImportError:
    from alpaca_server import AlpacaTestServer, ServerState, daily_bars
    from alpaca_trading_server import NY, AlpacaTradingServer, AssetSpec, Holding, TradingState
    from conftest import ALPACA_VARS, TINY_RUN, run_here, settings_file, use_alpaca_keys

ROOT = Path(__file__).resolve().parents[1]
KEY = "PKTRADECMDKEY0MUSTNOTLEAK"
SECRET = "tradeCmdSecret-must-not-leak-7f6e5d4c"
TICKERS = ["AAPL", "MSFT", "NVDA"]
START, END = "2022-01-03", "2023-12-29"
TINY = [*TINY_RUN, "--num_episodes", "8", "--use_turbulence"]
# The scenario tests below were written for the policy these settings train (the defaults before the learning
# work: share actions, the turbulence stop; their days have sells, buys cut to cash, a turbulent day, ...):
SHARES = [
    *["--action_mode", "shares", "--hmax", "5000", "--reward", "value", "--ent_coef", "0.01"],
    *["--turnover_penalty", "0", "--config", str(ROOT / "tests" / "fixtures" / "paper_distribution.json")],
]  # the paper's rules and Gaussian
MIXED_DAY = date(2023, 12, 22)  # the tiny policy sells MSFT and buys AAPL and NVDA on this day


def _subprocess_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ALPACA_VARS
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    }
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), ALPACA_API_KEY=KEY, ALPACA_SECRET_KEY=SECRET)
    return env


@dataclass
class Trained:
    """The module's checkpoint, the bars it was trained on, and its recorded backtest."""

    ckpt: Path | list[Path]  # several: an ensemble, traded and backtested as one policy
    bars: dict[str, list[dict[str, Any]]]
    trades: pd.DataFrame  # the backtest's trades.csv: date, ticker, side, shares, price, cost
    equity: pd.DataFrame  # the backtest's equity.csv: date, value, cash, holdings_value, baseline_value
    execution: str  # how the backtest filled the orders: close, next_open or next_close

    def fill_day(self, day: date) -> str:
        """The day an order decided on ``day``'s close is dated in trades.csv: that day, or the next traded one."""
        if self.execution == "close":
            return day.isoformat()
        dates = list(self.equity["date"])
        return dates[dates.index(day.isoformat()) + 1]

    def closes(self, day: date) -> dict[str, float]:
        stamp = pd.Timestamp(day).tz_localize("America/New_York").tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
        return {t: next(b["c"] for b in self.bars[t] if b["t"] == stamp) for t in TICKERS}

    def holdings_at(self, day: date) -> dict[str, float]:
        """Shares the backtest held at ``day``'s close, before its decision: the trades decided before ``day`` (dated
        before it at close fills; up to it, when orders fill on the next day)."""
        dated = pd.to_datetime(self.trades["date"]).dt.date
        before = self.trades[dated < day if self.execution == "close" else dated <= day]
        signed = before["shares"].where(before["side"] == "buy", -before["shares"])
        held = signed.groupby(before["ticker"]).sum()
        return {t: float(q) for t, q in held.items() if q}

    def cash_at(self, day: date) -> float:
        return float(self.equity.loc[self.equity["date"] == day.isoformat(), "cash"].iloc[0])

    def trades_on(self, day: date) -> list[tuple[str, str, float]]:
        """The backtest's trades decided on ``day``'s close."""
        rows = self.trades[self.trades["date"] == self.fill_day(day)]
        return sorted((r.ticker, r.side, float(r.shares)) for r in rows.itertuples())


def train_and_backtest(root: Path, flags: list[str], seeds: tuple[int, ...] = (1,)) -> Trained:
    """Train a tiny checkpoint on served bars with ``flags`` (one per seed: several make an ensemble) and backtest
    it with `clstm-ppo backtest`."""
    bars = daily_bars(TICKERS, START, END)
    names = ["alp"] if len(seeds) == 1 else [f"alp{seed}" for seed in seeds]
    ckpts = [root / "ck" / name / "latest.pt" for name in names]
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=bars)) as data:
        common = settings_file(root, data_url=data.url, data_cache_dir=str(root / "cache"))
        for name, seed in zip(names, seeds, strict=True):
            _train(root, [*flags, "--seed", str(seed), *common, "--run_name", name])
        with pytest.MonkeyPatch.context() as mp:
            use_alpaca_keys(mp, KEY, SECRET)
            backtest = ["backtest", "--checkpoint", *map(str, ckpts), "--out", str(root / "bt"), "--threads", "1"]
            assert cli.main(backtest) == 0
    report = json.loads((root / "bt" / "report.json").read_text())
    return Trained(
        ckpts[0] if len(ckpts) == 1 else ckpts,
        bars,
        pd.read_csv(root / "bt" / "trades.csv"),
        pd.read_csv(root / "bt" / "equity.csv"),
        report["metadata"]["execution"],
    )


def _train(root: Path, flags: list[str]) -> None:
    """One tiny training run on the served bars (``flags`` name the server, the seed and the run), in this
    interpreter (`tests.conftest.run_here`) with the keys in its environment."""
    data = ["--data", "alpaca", "--tickers", ",".join(TICKERS), "--start", START, "--end", END]
    train = run_here(["train", *TINY, *data, *flags, "--checkpoint_dir", str(root / "ck")], root, _subprocess_env())
    assert train.returncode == 0, train.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The paper's share actions and fills at the close: the broker scenarios below are worked on its days."""
    return train_and_backtest(tmp_path_factory.mktemp("trade"), [*SHARES, "--execution", "close"])


@pytest.fixture(scope="module")
def trained_weights(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train_and_backtest(tmp_path_factory.mktemp("trade-weights"), [])


@pytest.fixture(scope="module")
def trained_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Two seeds on the same bars, backtested (and traded) as one ensemble: target weights, next-open fills."""
    return train_and_backtest(tmp_path_factory.mktemp("trade-ensemble"), [], seeds=(1, 2))


@pytest.fixture(
    scope="module", params=[(SHARES, "next_open"), ([], "next_close")], ids=["shares-next-open", "weights-next-close"]
)
def trained_other_fills(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Trained:
    flags, execution = request.param
    return train_and_backtest(tmp_path_factory.mktemp(f"trade-{execution}"), [*flags, "--execution", execution])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """cwd in tmp_path (no .env), good keys, fast retries, a short timeout, one torch thread."""
    use_alpaca_keys(monkeypatch, KEY, SECRET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALPACA_TIMEOUT_SECONDS", "0.5")
    with torch_threads(1):
        yield tmp_path


@pytest.fixture
def data(trained: Trained) -> Iterator[AlpacaTestServer]:
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=trained.bars)) as server:
        yield server


def after_close(day: date, hour: int = 17) -> datetime:
    return datetime(day.year, day.month, day.day, hour, 0, tzinfo=NY)


def account(
    trained: Trained,
    day: date,
    *,
    cash: float = 100_000.0,
    positions: dict[str, float] | None = None,
    extra_prices: dict[str, float] | None = None,
    cls: type[TradingState] = TradingState,
    **knobs: Any,
) -> TradingState:
    """The trading server's state after ``day``'s close: last prices = that day's closes."""
    prices = {**trained.closes(day), **(extra_prices or {})}
    held = {s: Holding.at(q, prices[s]) for s, q in (positions or {}).items()}
    return cls(key=KEY, secret=SECRET, prices=prices, cash=cash, positions=held, now=after_close(day), **knobs)


@dataclass
class Run:
    code: int
    out: str
    err: str
    events: list[dict[str, Any]]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


@contextmanager
def broker(state: TradingState, monkeypatch: pytest.MonkeyPatch) -> Iterator[AlpacaTradingServer]:
    with AlpacaTradingServer(state) as server:
        monkeypatch.setenv("ALPACA_TRADING_URL", server.url)
        yield server


def trade(capsys: pytest.CaptureFixture, trained: Trained, data: AlpacaTestServer, journal: Path, *flags: str) -> Run:
    """Run the command; ``events`` are the journal lines this run added."""
    path = journal / "trades.jsonl"
    before = len(path.read_text().splitlines()) if path.is_file() else 0
    code = cli.main(
        [
            "trade",
            "--checkpoint",
            *map(str, trained.ckpt if isinstance(trained.ckpt, list) else [trained.ckpt]),
            "--data_url",
            data.url,
            "--data_cache_dir",
            str(journal.parent / "cache"),
            "--journal",
            str(journal),
            "--wait_seconds",
            "1",
            "--poll_seconds",
            "0.05",
            *flags,
        ]
    )
    cap = capsys.readouterr()
    events = [json.loads(line) for line in path.read_text().splitlines()[before:]] if path.is_file() else []
    return Run(code, cap.out, cap.err, events)


def posted(server: AlpacaTradingServer) -> list[tuple[str, str, float, str]]:
    """(symbol, side, qty, client order id) of every POST /v2/orders, in arrival order (refused ones too)."""
    return [
        (r["json"]["symbol"], r["json"]["side"], float(r["json"]["qty"]), r["json"]["client_order_id"])
        for r in server.requests_to("POST", "/v2/orders")
    ]


# ------------------------------------------------------------------------------------ the decision rule


def test_client_order_ids_are_deterministic_short_and_distinct() -> None:
    tag = run_tag("clstm-20261122-220100")
    assert tag == run_tag("clstm-20261122-220100") and tag.startswith("clstm-20261122-220100-")
    one = client_order_id(tag, date(2024, 1, 3), "AAPL")
    assert one == f"cp-{tag}-20240103-AAPL" and one == client_order_id(tag, date(2024, 1, 3), "aapl")
    ids = {
        client_order_id(t, d, s)
        for t in (tag, run_tag("other"))
        for d in (date(2024, 1, 3), date(2024, 1, 4))
        for s in ("AAPL", "MSFT", "BRK.B")
    }
    assert len(ids) == 12
    longest = client_order_id(run_tag("x" * 300), date(2024, 1, 3), "VERYLONGTICKER.WARRANT")
    assert len(longest) <= 64 <= MAX_ID_LENGTH
    assert run_tag("a/b c") != run_tag("a-b-c")  # same slug, different names: the hash tells them apart


@pytest.mark.slow
def test_plan_equals_the_backtest_trades_of_recorded_days(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For sessions of the recorded backtest: the account holds what the backtest held that day, the servers
    serve the same bars up to that day, and the planned orders are exactly the backtest's trades of the day."""
    check_plans_equal_backtest(trained, env, data, capsys, monkeypatch)


@pytest.mark.slow
def test_plan_equals_the_backtest_trades_with_target_weight_actions(
    trained_weights: Trained, env: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with today's default actions (target weights, a rebalance band, the tanh policy)."""
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=trained_weights.bars)) as data:
        check_plans_equal_backtest(trained_weights, env, data, capsys, monkeypatch)


def test_plan_equals_the_backtest_trades_under_the_other_fills(
    trained_other_fills: Trained, env: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with share actions filled at the next open, and target weights filled at the next close (the
    module's ``trained`` fills at the close, ``trained_weights`` at the next open, the default)."""
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=trained_other_fills.bars)) as data:
        check_plans_equal_backtest(trained_other_fills, env, data, capsys, monkeypatch)


@pytest.mark.slow
def test_an_ensembles_plan_equals_its_backtest_trades(
    trained_ensemble: Trained, env: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trade --checkpoint A B` plans exactly the trades `backtest --checkpoint A B` made, journals both members
    and sends under its own order ids (an ensemble and its first member never share one)."""
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=trained_ensemble.bars)) as data:
        check_plans_equal_backtest(trained_ensemble, env, data, capsys, monkeypatch)
    decisions = [json.loads(line) for p in env.glob("j-*/trades.jsonl") for line in p.read_text().splitlines()]
    decisions = [d for d in decisions if d["event"] == "decision"]
    assert decisions and all(d["checkpoint"] == "+".join(map(str, trained_ensemble.ckpt)) for d in decisions)
    ids = [o["client_order_id"] for d in decisions for o in d["plan"]]
    assert ids and all("ensemble2" in cid for cid in ids)
    with pytest.MonkeyPatch.context() as mp:  # the members differ: one alone would have planned other trades
        use_alpaca_keys(mp, KEY, SECRET)
        first = [
            "backtest",
            "--checkpoint",
            str(trained_ensemble.ckpt[0]),
            "--out",
            str(env / "first"),
            "--threads",
            "1",
        ]
        assert cli.main(first) == 0
    capsys.readouterr()
    alone = pd.read_csv(env / "first" / "trades.csv")
    assert not alone[["date", "ticker", "shares"]].equals(trained_ensemble.trades[["date", "ticker", "shares"]])


def check_plans_equal_backtest(
    trained: Trained,
    env: Path,
    data: AlpacaTestServer,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    *flags: str,
) -> None:
    # Two years of bars per session, answered by a server in this process: on a loaded 2-core box an answer took over
    # the `env` fixture's 0.5 s once (CI at ef68b5e). These tests check the plan, not timeouts (those tests keep 0.5 s).
    monkeypatch.setenv("ALPACA_TIMEOUT_SECONDS", "5")
    trades = trained.trades
    mode = open_checkpoint(trained.ckpt[0] if isinstance(trained.ckpt, list) else trained.ckpt).cfg.env.action_mode
    decided = {trained.fill_day(date.fromisoformat(d)): d for d in trained.equity["date"].iloc[:-1]}
    trades = trades.assign(decided=trades["date"].map(decided))  # the day each trade was decided on
    days = sorted(set(trades["decided"]))
    sell_days = sorted(set(trades.loc[trades["side"] == "sell", "decided"]))
    assert sell_days, "the tiny policy no longer sells in its backtest: the test would not cover sells"
    buy_sizes = trades[trades["side"] == "buy"].groupby("decided")["shares"].sum()
    quiet = [d for d in trained.equity["date"].iloc[1:-1] if d not in days]
    chosen = sorted({sell_days[0], sell_days[-1], str(buy_sizes.idxmax()), *(quiet[:1])})
    assert len(chosen) >= 3, chosen
    for day_text in chosen:
        day = date.fromisoformat(day_text)
        state = account(trained, day, cash=trained.cash_at(day), positions=trained.holdings_at(day))
        with broker(state, monkeypatch) as server:
            run = trade(capsys, trained, data, env / f"j-{day_text}", *flags)
        assert run.code == 0, run.err
        decision = run.of("decision")[-1]
        planned = sorted((o["ticker"], o["side"], o["shares"]) for o in decision["plan"])
        assert planned == trained.trades_on(day), day_text
        assert decision["execution"] == trained.execution
        assert decision["backtest_value"] == pytest.approx(
            float(trained.equity.loc[trained.equity["date"] == day_text, "value"].iloc[0]), rel=1e-12
        )
        assert decision["replay_start"] == trained.equity["date"].iloc[0]  # the backtest's first day
        assert not posted(server)  # a dry run
        targets = target_weights(torch.tensor([decision["action"]]))[0].tolist()
        for order in decision["plan"]:  # each reason in the terms of the checkpoint's action mode
            reason = order["reason"]
            if "turbulence" in reason:
                continue
            assert ("x hmax" in reason) == (mode == "shares"), order
            if mode == "weights":  # the target the rule trades toward, as the kernel computes it
                target = targets[decision["tickers"].index(order["ticker"])]
                assert reason.startswith(f"target {target:.1%} of the portfolio, held "), order


@pytest.mark.slow
def test_the_account_not_the_replay_is_what_the_policy_sees_and_trades(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same day, same replay, two accounts: the action changes with the account's cash and shares (they are
    the decision row's portfolio columns), and a holding the backtest never had (MSFT) is sold."""
    day = MIXED_DAY
    actions = []
    for cash, held in ((trained.cash_at(day), trained.holdings_at(day)), (2_000.0, {"MSFT": 300.0})):
        with broker(account(trained, day, cash=cash, positions=held), monkeypatch):
            run = trade(capsys, trained, data, env / f"j{len(actions)}")
        assert run.code == 0, run.err
        decision = run.of("decision")[-1]
        assert decision["cash"] == pytest.approx(cash) and decision["shares"] == [held.get(t, 0.0) for t in TICKERS]
        assert decision["replay_start"] == trained.equity["date"].iloc[0]
        actions.append(decision["action"])
    assert decision["backtest_value"] == pytest.approx(
        float(trained.equity.loc[trained.equity["date"] == day.isoformat(), "value"].iloc[0])
    )  # same replay
    assert actions[0] != actions[1]
    assert "MSFT" not in trained.holdings_at(day) and ("MSFT", "sell") in {
        (o["ticker"], o["side"]) for o in decision["plan"]
    }


@pytest.mark.slow
def test_a_checkpoint_trained_on_intraday_bars_is_refused(trained: Trained) -> None:
    ck = open_checkpoint(trained.ckpt)
    hourly = dataclasses.replace(ck, config={**ck.config, "data": "alpaca:timeframe=1Hour"})
    with pytest.raises(UserError, match=r"trained on 1Hour bars; .* daily bars \(1Day\)"):
        load_trading_market(hourly, MIXED_DAY)


@pytest.mark.slow
def test_buys_are_cut_to_the_account_cash(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with broker(account(trained, MIXED_DAY, cash=300.0), monkeypatch):
        run = trade(capsys, trained, data, env / "j")
    assert run.code == 0, run.err
    decision = run.of("decision")[-1]
    buys = [o for o in decision["plan"] if o["side"] == "buy"]
    assert buys and any("to fit the cash" in o["reason"] for o in buys), decision["plan"]
    assert 0.0 <= decision["cash_after"] < 300.0
    assert sum(o["value"] for o in buys) <= 300.0


# ------------------------------------------------------------------------------------ dry run and submit


@pytest.mark.slow
def test_dry_run_prints_journals_sends_nothing_and_leaves_other_tickers_alone(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20, "TSLA": 10}, extra_prices={"TSLA": 250.0})
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j")
    assert run.code == 0, run.err
    assert not posted(server)
    lines = run.out.splitlines()
    header = next(line for line in lines if line.startswith("ticker"))
    assert header.split() == ["ticker", "side", "shares", "last", "price", "value", "reason"]
    decision = run.of("decision")[-1]
    plan = decision["plan"]
    assert [o["side"] for o in plan] == sorted((o["side"] for o in plan), key=lambda s: s != "sell")  # sells first
    assert {"sell", "buy"} <= {o["side"] for o in plan}, "the tiny policy should sell MSFT and buy on this day"
    closes = trained.closes(MIXED_DAY)
    for order in plan:
        row = next(line for line in lines if line.startswith(order["ticker"] + " "))
        assert order["side"] in row and f"{order['shares']:g}" in row and f"${closes[order['ticker']]:,.2f}" in row
        assert order["reason"] in row and order["price"] == closes[order["ticker"]]
        assert order["client_order_id"] == client_order_id(run_tag("alp"), MIXED_DAY, order["ticker"])
    # TSLA is not the checkpoint's: no order, reported on the console and in the journal
    assert all(o["ticker"] != "TSLA" for o in plan)
    assert "left alone (not among the checkpoint's tickers): TSLA 10 shares ($2,500.00)" in run.out
    assert decision["unknown_positions"] == {"TSLA": 10.0} and decision["positions"] == {"MSFT": 20.0}
    assert decision["mode"] == "dry_run" and decision["endpoint"] == "paper" and decision["day"] == "2023-12-22"
    assert "dry run: nothing sent" in run.out and not run.of("order")
    equity = pd.read_csv(env / "j" / "equity.csv")
    assert list(equity["date"]) == ["2023-12-22"]
    assert equity["equity"].iloc[0] == pytest.approx(100_000 + 20 * closes["MSFT"] + 2_500, abs=0.01)
    assert equity["backtest_value"].iloc[0] == pytest.approx(decision["backtest_value"])


@pytest.mark.slow
def test_submit_sends_sells_then_buys_waits_and_journals_fills_partials_rejections(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(
        trained,
        MIXED_DAY,
        positions={"MSFT": 20},
        fill_when_closed=True,
        fill_mode={"AAPL": "partial", "NVDA": "reject"},
        fill_after_polls=1,
    )
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit")
        sent = posted(server)
        final = {o["symbol"]: o for o in server.orders()}
    assert run.code == 0, run.err
    plan = run.of("decision")[-1]["plan"]
    assert [(s, side, q) for s, side, q, _ in sent] == [(o["ticker"], o["side"], o["shares"]) for o in plan]
    assert [side for _, side, _, _ in sent] == ["sell", "buy", "buy"]  # MSFT sell first, then AAPL, NVDA
    assert all(
        r["json"]["type"] == "market" and r["json"]["time_in_force"] == "day"
        for r in server.requests_to("POST", "/v2/orders")
    )
    assert [cid for *_, cid in sent] == [o["client_order_id"] for o in plan]
    statuses = {e["ticker"]: e for e in run.of("order_status")}
    assert statuses["MSFT"]["status"] == "filled" and statuses["MSFT"]["filled_qty"] == plan[0]["shares"]
    assert statuses["AAPL"]["status"] == "partially_filled"
    assert 0 < statuses["AAPL"]["filled_qty"] < statuses["AAPL"]["qty"] == plan[1]["shares"]
    assert statuses["NVDA"]["status"] == "rejected" and statuses["NVDA"]["filled_qty"] == 0
    assert {k: v["status"] for k, v in final.items()} == {k: v["status"] for k, v in statuses.items()}
    assert [e["outcome"] for e in run.of("order")] == ["sent", "sent", "sent"]
    assert "MSFT sell 10: sent (filled), filled 10 of 10" in run.out
    assert "NVDA buy" in run.out and "(rejected)" in run.out
    assert "sent 3 of 3 orders" in run.out


@pytest.mark.slow
def test_rerun_on_the_same_day_sends_nothing_twice(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the close the orders wait for the next open: the account is unchanged, so the plan is the same.
    with broker(account(trained, MIXED_DAY, positions={"MSFT": 20}), monkeypatch) as server:
        started = time.monotonic()
        first = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "60")
        assert time.monotonic() - started < 30  # queued ("accepted") orders are not waited for
        assert first.code == 0, first.err
        assert len(posted(server)) == 3
        assert "not filled yet (orders sent after the close fill at the next open)" in first.out
        second = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert second.code == 0, second.err
        assert len(posted(server)) == 3 and len(server.orders()) == 3
    outcomes = [e["outcome"] for e in second.of("order")]
    assert outcomes == ["already_sent"] * 3
    assert "sent 0 of 3 orders, 3 already sent by an earlier run (not sent again)" in second.out


@pytest.mark.slow
@pytest.mark.parametrize("drop_status", [None, 504])
def test_dropped_answer_mid_batch_is_recovered_by_client_id(
    trained: Trained,
    env: Path,
    data: AlpacaTestServer,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    drop_status: int | None,
) -> None:
    """The second order is stored but its answer is lost: the connection closes (None), or a gateway answers
    504, alpaca-py retries the POST and the retry is refused as a duplicate client order id (422)."""
    state = account(trained, MIXED_DAY, positions={"MSFT": 20}, drop_after_orders=1, drop_status=drop_status)
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        again = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        statuses = [r["status"] for r in server.requests_to("POST", "/v2/orders")]
        assert statuses == ([200, "dropped", 200] if drop_status is None else [200, 504, 422, 200])
        assert len(server.orders()) == 3 and len({o["client_order_id"] for o in server.orders()}) == 3
    assert run.code == 0 and again.code == 0, run.err + again.err
    orders = run.of("order")
    assert [e["outcome"] for e in orders] == ["sent", "sent", "sent"]
    assert "found by client id" in orders[1]["message"]
    assert [e["outcome"] for e in again.of("order")] == ["already_sent"] * 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["processed", "lost"])
def test_timeout_mid_batch_then_the_order_is_found_or_resent_once(
    trained: Trained,
    env: Path,
    data: AlpacaTestServer,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """The second POST gets no answer within the 0.5 s timeout: handled and held back ("processed": found by
    its client id) or never handled ("lost": not found, sent again with the same id). Either way once."""
    state = account(
        trained, MIXED_DAY, positions={"MSFT": 20}, hang=("POST", "/v2/orders", 2), hang_mode=mode, hang_seconds=1.5
    )
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert len(server.orders()) == 3 and len({o["symbol"] for o in server.orders()}) == 3
        again = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert len(server.orders()) == 3
    assert run.code == 0 and again.code == 0, run.err + again.err
    assert [e["outcome"] for e in run.of("order")] == ["sent"] * 3
    assert "no answer from" in run.of("order")[1]["message"] and "within 0.5 s" in run.of("order")[1]["message"]
    assert len(posted(server)) == (3 if mode == "processed" else 4)  # "lost": the same id sent twice, stored once
    assert [e["outcome"] for e in again.of("order")] == ["already_sent"] * 3


class SilentAfterSecondOrder(TradingState):
    """Stores the second order, then stops answering: the POST's connection is dropped and the lookup by
    client id that follows hangs past the client's timeout (a server going away mid-batch)."""

    def submit(self, body: Any) -> tuple[int, Any]:
        status, answer = super().submit(body)
        if status == 200 and len(self.orders) == 2:
            self.drop_after_orders = 1
            lookups = sum(r["path"] == "/v2/orders:by_client_order_id" for r in self.requests)
            self.hang, self.hang_mode, self.hang_seconds = (
                ("GET", "/v2/orders:by_client_order_id", lookups + 1),
                "lost",
                1.5,
            )
        return status, answer


@pytest.mark.slow
def test_server_gone_mid_batch_one_line_journal_says_what_went_out_and_rerun_continues(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20}, cls=SilentAfterSecondOrder)
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert len(server.orders()) == 2
        again = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert len(server.orders()) == 3 and len({o["client_order_id"] for o in server.orders()}) == 3
    assert run.code == 2
    orders = run.of("order")
    assert [e["outcome"] for e in orders] == ["sent", "unknown", "not_sent"]
    assert [e["ticker"] for e in orders] == ["MSFT", "AAPL", "NVDA"]
    problems = [line for line in run.out.splitlines() if line.startswith(("AAPL buy", "NVDA buy"))]
    assert len(problems) == 2, problems
    assert problems[0].startswith("AAPL buy 1: unknown: ") and "re-run" in problems[0]
    assert problems[1].startswith("NVDA buy") and "not sent: the batch stopped after AAPL" in problems[1]
    assert "did not go out" in run.out and "run the same command again today" in run.out
    assert again.code == 0, again.err
    assert [e["outcome"] for e in again.of("order")] == ["already_sent", "already_sent", "sent"]
    # the unknown order was found by the re-run's reconciliation too
    assert any(e["event"] == "order_status" and e["ticker"] == "AAPL" for e in again.events)


class RateLimitedOrders(TradingState):
    """Answers the first two POST /v2/orders with Alpaca's 429, storing nothing."""

    limited = 2

    def submit(self, body: Any) -> tuple[int, Any]:
        if self.limited > 0:
            self.limited -= 1
            return 429, {"code": 42910000, "message": "rate limit exceeded"}
        return super().submit(body)


@pytest.mark.slow
def test_429_on_an_order_is_retried_and_the_order_goes_out_once(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20}, cls=RateLimitedOrders)
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert [r["status"] for r in server.requests_to("POST", "/v2/orders")] == [429, 429, 200, 200, 200]
        assert len(server.orders()) == 3
    assert run.code == 0, run.err
    assert [e["outcome"] for e in run.of("order")] == ["sent"] * 3


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.slow
def test_refusals_one_line_each_and_the_journal_says_which_went_out(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MSFT sell is accepted but not filled (after the close): the AAPL buy fits the $500 of cash, the NVDA
    buy needs the sale's proceeds and is refused for buying power. Then AAPL not tradable."""
    state = account(trained, MIXED_DAY, cash=500.0, positions={"MSFT": 20})
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
    assert run.code == 2
    plan = run.of("decision")[-1]["plan"]
    assert [o["ticker"] for o in plan] == ["MSFT", "AAPL", "NVDA"], plan
    assert [e["outcome"] for e in run.of("order")] == ["sent", "sent", "refused"]
    assert "insufficient buying power" in run.of("order")[2]["message"]
    lines = [line for line in run.out.splitlines() if "refused" in line and not line.startswith("sent ")]
    assert lines == [f"NVDA buy {plan[2]['shares']:g}: refused: insufficient buying power (HTTP 403)"]
    assert [o["symbol"] for o in server.orders()] == ["MSFT", "AAPL"]

    state = account(
        trained,
        MIXED_DAY,
        positions={"MSFT": 20},
        assets={"AAPL": AssetSpec("AAPL", tradable=False), "MSFT": AssetSpec("MSFT"), "NVDA": AssetSpec("NVDA")},
    )
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j2", "--submit", "--wait_seconds", "0")
    assert run.code == 2
    assert [e["outcome"] for e in run.of("order")] == ["sent", "refused", "sent"]
    assert 'AAPL buy 1: refused: asset "AAPL" is not tradable (HTTP 422)' in run.out
    assert [o["symbol"] for o in server.orders()] == ["MSFT", "NVDA"]


@pytest.mark.slow
def test_not_fractionable_sell_on_a_turbulent_day_is_refused_in_one_line(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turbulent day of the backtest: the rule sells everything held, 12.5 MSFT shares included, and Alpaca
    refuses a fractional order on a non-fractionable asset."""
    turbulent = date.fromisoformat(sorted(set(trained.trades.loc[trained.trades["side"] == "sell", "date"]))[-1])
    state = account(
        trained,
        turbulent,
        positions={"MSFT": 12.5, "NVDA": 3},
        assets={"MSFT": AssetSpec("MSFT", fractionable=False), "AAPL": AssetSpec("AAPL"), "NVDA": AssetSpec("NVDA")},
    )
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
    assert run.code == 2
    decision = run.of("decision")[-1]
    assert decision["turbulent"] and "turbulent day, sell everything, buy nothing" in run.out
    assert [(o["ticker"], o["side"], o["shares"]) for o in decision["plan"]] == [
        ("MSFT", "sell", 12.5),
        ("NVDA", "sell", 3.0),
    ]
    assert 'MSFT sell 12.5: refused: asset "MSFT" is not fractionable (HTTP 422)' in run.out
    assert [e["outcome"] for e in run.of("order")] == ["refused", "sent"]
    assert [o["symbol"] for o in server.orders()] == ["NVDA"]


@pytest.mark.slow
def test_wrong_keys_are_one_line_and_nothing_is_sent(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20})
    state.secret = "the-server-expects-another-secret"
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit")
        assert not posted(server)
    assert run.code == 2 and run.out == ""
    assert run.err.count("\n") == 1 and run.err.startswith("error: Alpaca rejected the API keys (HTTP 401")
    assert "paper account" in run.err
    monkeypatch.delenv("ALPACA_SECRET_KEY")
    run = trade(capsys, trained, data, env / "j", "--submit")
    assert run.code == 2 and run.err.count("\n") == 1 and "ALPACA_SECRET_KEY" in run.err


@pytest.mark.slow
@pytest.mark.parametrize("case", ["weekend", "holiday", "session_open", "before_open", "stale_bars"])
def test_no_session_before_the_close_or_stale_bars_one_line_nothing_sent(
    trained: Trained,
    env: Path,
    data: AlpacaTestServer,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20})
    state.now = {
        "weekend": datetime(2023, 12, 23, 17, 0, tzinfo=NY),  # a Saturday
        "holiday": datetime(2024, 7, 4, 17, 0, tzinfo=NY),
        "session_open": datetime(2023, 12, 22, 11, 0, tzinfo=NY),
        "before_open": datetime(2023, 12, 22, 8, 0, tzinfo=NY),
        "stale_bars": datetime(2024, 1, 2, 17, 0, tzinfo=NY),  # the bars end 2023-12-29
    }[case]
    with broker(state, monkeypatch) as server:
        run = trade(capsys, trained, data, env / "j", "--submit")
        assert not posted(server) and not server.requests_to("GET", "/v2/account")
    text = (run.out + run.err).strip()
    assert text.count("\n") == 0, text
    if case in ("weekend", "holiday"):
        assert run.code == 0 and text.startswith("no trade: market closed today")
        assert run.of("skipped") and not run.of("decision")
    else:
        assert run.code == 2 and text.startswith("error: ")
        assert not run.of("decision") and not run.of("order")
        want = (
            "stale bars: the newest daily bars are from 2023-12-29 but the last session was 2024-01-02"
            if case == "stale_bars"
            else "closes at 16:00 ET and the decision uses its closing bars"
        )
        assert want in text


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (a port bound, read and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_local_mistakes_are_refused_before_any_request(
    trained: Trained,
    quick_checkpoint: Path,
    env: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both Alpaca endpoints point at a closed port: a mistake that can be seen without the network is its own
    one line (not "cannot reach"), and with none left the same command does fail on the connection."""
    monkeypatch.setenv("ALPACA_TRADING_URL", closed_port_url())
    monkeypatch.setenv("ALPACA_DATA_URL", closed_port_url())
    monkeypatch.setenv("ALPACA_MAX_RETRIES", "0")
    (env / "a_file").write_text("a regular file where the journal folder should be\n")
    good = ["--checkpoint", str(trained.ckpt), "--journal", str(env / "j"), "--data_cache_dir", str(env / "cache")]
    cases = [
        (["--checkpoint", str(quick_checkpoint)], "trained on synthetic tickers (SYN00, SYN01, SYN02)"),
        ([*good, "--replay_start", "someday"], "--replay_start 'someday' is not a date (YYYY-MM-DD)"),
        ([*good, "--replay_start", "2023-02-30"], "--replay_start '2023-02-30' is not a date"),
        ([*good, "--history_start", "2022-13-45"], "--history_start date '2022-13-45' is not a date"),
        ([*good, "--data_url", "ftp://bars.example"], "is not an http(s) URL"),
        ([*good, "--journal", str(env / "a_file" / "j")], "cannot create the journal folder"),
        ([*good, "--wait_seconds", "-1", "--submit"], "--wait_seconds must be >= 0"),
        (["--checkpoint", str(env / "missing.pt")], "missing.pt"),
    ]
    for flags, expected in cases:
        code = cli.main(["trade", *flags])
        cap = capsys.readouterr()
        assert code == 2 and cap.out == "", (flags, cap)
        assert cap.err.count("\n") == 1 and cap.err.startswith("error: ") and expected in cap.err, (flags, cap.err)
        assert "reach" not in cap.err and "127.0.0.1" not in cap.err, cap.err
    assert not (env / "j").exists()  # nothing journaled: the command stopped before its first step
    monkeypatch.delenv("ALPACA_API_KEY")
    assert cli.main(["trade", *good]) == 2
    assert "Alpaca API keys not found: set ALPACA_API_KEY" in capsys.readouterr().err
    use_alpaca_keys(monkeypatch, KEY, SECRET)
    monkeypatch.setenv("ALPACA_TRADING_URL", closed_port_url())
    monkeypatch.setenv("ALPACA_MAX_RETRIES", "0")
    assert cli.main(["trade", *good]) == 2  # nothing local left wrong: now it is the connection
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "127.0.0.1" in cap.err, cap.err


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags,url", [(["--live"], None), (["--confirm_live_trading"], None), ([], "https://api.alpaca.markets")]
)
def test_live_without_both_flags_is_refused_before_any_request(
    trained: Trained,
    env: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    url: str | None,
) -> None:
    if url:
        monkeypatch.setenv("ALPACA_TRADING_URL", url)
    code = cli.main(["trade", "--checkpoint", str(trained.ckpt), "--submit", *flags])
    cap = capsys.readouterr()
    assert code == 2 and cap.out == "" and cap.err.count("\n") == 1 and "nothing was sent" in cap.err
    assert "--live" in cap.err and "--confirm_live_trading" in cap.err


@pytest.mark.slow
def test_live_with_both_flags_uses_the_live_journal(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with broker(account(trained, MIXED_DAY), monkeypatch) as server:
        code = cli.main(
            [
                "trade",
                "--checkpoint",
                str(trained.ckpt),
                "--live",
                "--confirm_live_trading",
                "--data_url",
                data.url,
                "--data_cache_dir",
                str(env / "cache"),
            ]
        )
        assert not posted(server)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "| live account" in cap.out and (trained.ckpt.parent / "trading-live" / "trades.jsonl").is_file()


# ------------------------------------------------------------------------------------ journal, report, keys


@pytest.mark.slow
def test_next_run_records_yesterdays_fills_and_report_uses_them(
    trained: Trained, env: Path, data: AlpacaTestServer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = account(trained, MIXED_DAY, positions={"MSFT": 20}, fill_prices={"MSFT": 70.0, "AAPL": 90.0})
    with broker(state, monkeypatch) as server:
        first = trade(capsys, trained, data, env / "j", "--submit", "--wait_seconds", "0")
        assert {o["status"] for o in server.orders()} == {"accepted"}
        # The next session opens and fills them; the next run, after its close, records the fills.
        nxt = date(2023, 12, 26)
        with state.lock:
            state.fill_when_closed = True
            state.now = after_close(nxt)
            state.prices.update(trained.closes(nxt))
        second = trade(capsys, trained, data, env / "j")
    assert first.code == 0 and second.code == 0, first.err + second.err
    filled = {e["ticker"]: e for e in second.of("order_status")}
    assert {t: e["status"] for t, e in filled.items()} == {"MSFT": "filled", "AAPL": "filled", "NVDA": "filled"}
    assert "earlier order cp-" in second.out
    plan = {o["ticker"]: o for o in first.of("decision")[0]["plan"]}
    nvda_fill = trained.closes(nxt)["NVDA"]  # no fill price knob: filled at the server's last price
    expected = (
        (70.0 - plan["MSFT"]["price"]) * -plan["MSFT"]["shares"]
        + (90.0 - plan["AAPL"]["price"]) * plan["AAPL"]["shares"]
        + (nvda_fill - plan["NVDA"]["price"]) * plan["NVDA"]["shares"]
    )
    report = trade_report(env / "j")
    assert report.fills == 3 and report.execution_cost == pytest.approx(expected, abs=1e-6)
    assert [r["date"] for r in report.rows] == ["2023-12-22", "2023-12-26"]


def test_report_numbers_match_a_hand_computation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "journal"
    folder.mkdir()
    (folder / "equity.csv").write_text(
        "date,equity,cash,long_market_value,backtest_value,recorded_at\n"
        "2024-01-02,100000.00,100000.00,0.00,1000000.0,t\n"
        "2024-01-03,101000.00,50000.00,51000.00,1020000.0,t\n"
        "2024-01-04,100500.00,50000.00,50500.00,1010000.0,t\n"
    )
    events = [
        {
            "event": "decision",
            "day": "2024-01-02",
            "plan": [
                {"ticker": "AAPL", "side": "buy", "shares": 10, "price": 100.0, "client_order_id": "cp-a"},
                {"ticker": "MSFT", "side": "sell", "shares": 4, "price": 50.0, "client_order_id": "cp-b"},
            ],
        },
        {
            "event": "order_status",
            "client_order_id": "cp-a",
            "status": "accepted",
            "filled_qty": 0,
            "filled_avg_price": None,
        },
        {
            "event": "order_status",
            "client_order_id": "cp-a",
            "status": "filled",
            "filled_qty": 10,
            "filled_avg_price": 101.5,
        },
        {
            "event": "order_status",
            "client_order_id": "cp-b",
            "status": "partially_filled",
            "filled_qty": 2,
            "filled_avg_price": 49.0,
        },
    ]
    (folder / "trades.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"cut short\n')
    code = cli.main(["trade", "report", "--journal", str(folder)])
    out = capsys.readouterr().out
    assert code == 0
    # By hand: paper +1.00% then -0.4950%; backtest +2.00% then -0.9804%; totals +0.50% vs +1.00%.
    # Gaps -1.00% and +0.4854%: std (ddof 1) = |g1 - g2| / sqrt(2) = 1.4854% / 1.41421 = 1.0503%.
    # Fills: AAPL bought at 101.5 vs 100 -> 10 x 1.5 = $15; MSFT sold at 49 vs 50 -> 2 x 1 = $2; $17 in all.
    report = pd.read_csv(folder / "report.csv")
    assert report["paper_return"].tolist()[1:] == pytest.approx([0.01, 100500 / 101000 - 1])
    assert report["backtest_return"].tolist()[1:] == pytest.approx([0.02, 1010000 / 1020000 - 1])
    g = [0.01 - 0.02, (100500 / 101000 - 1) - (1010000 / 1020000 - 1)]
    assert report["gap"].tolist()[1:] == pytest.approx(g)
    assert report["execution_cost"].tolist()[0] == pytest.approx(17.0)
    assert "paper +0.50%, backtest +1.00%, gap -0.50 pp; tracking error 1.05% per day" in out
    assert "fills vs decision closes: $17.00 over 2 filled order(s)" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("2024-")}
    assert rows["2024-01-02"] == ["2024-01-02", "$100,000.00", "-", "$1,000,000.00", "-", "-", "$17.00"]
    assert rows["2024-01-03"] == ["2024-01-03", "$101,000.00", "+1.00%", "$1,020,000.00", "+2.00%", "-1.00%", "-"]
    assert rows["2024-01-04"] == ["2024-01-04", "$100,500.00", "-0.50%", "$1,010,000.00", "-0.98%", "+0.49%", "-"]


@pytest.mark.slow
def test_keys_never_reach_any_output_or_file(
    trained: Trained, env: Path, data: AlpacaTestServer, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys from the environment (used) and from ./.env (planted): a dry run, a submit with a refusal and a
    dropped answer, a run with rejected keys, and the report; then every output and every file is searched."""
    planted = {"APCA_API_KEY_ID": "PKDOTENVPLANTED000111", "APCA_API_SECRET_KEY": "dotenvPlantedSecret999888777"}
    (env / ".env").write_text("".join(f"{k}={v}\n" for k, v in planted.items()), encoding="utf-8")
    state = account(trained, MIXED_DAY, cash=500.0, positions={"MSFT": 20}, drop_after_orders=0)
    outputs = []
    with broker(state, monkeypatch):
        for flags in ([], ["--submit", "--wait_seconds", "0"]):
            outputs.append(trade(capfd, trained, data, env / "journal", *flags))
        state.secret = "rotated"
        outputs.append(trade(capfd, trained, data, env / "journal", "--submit"))
    assert [r.code for r in outputs] == [0, 2, 2]
    assert cli.main(["trade", "report", "--journal", str(env / "journal")]) == 0
    report_out = capfd.readouterr()
    secrets = [KEY, SECRET, *planted.values()]
    texts = [r.out + r.err for r in outputs] + [report_out.out + report_out.err]
    for text in texts:
        assert not any(s in text for s in secrets)
    written = [p for p in env.rglob("*") if p.is_file() and p.name != ".env"]
    assert {"trades.jsonl", "equity.csv", "report.csv"} <= {p.name for p in written}
    assert any(p.suffix == ".parquet" for p in written)  # the bar cache is searched too
    for path in written:
        blob = path.read_bytes()
        assert not any(s.encode() in blob for s in secrets), path


def test_help_explains_every_flag(capsys: pytest.CaptureFixture) -> None:
    for parser in (build_parser(), build_report_parser()):
        flags = [a for a in parser._actions if a.option_strings]
        assert len(flags) >= 4
        assert all(a.help and len(a.help) > 15 for a in flags), [a.dest for a in flags if not a.help]
    for argv in (["trade", "--help"], ["trade", "report", "--help"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 0 and "--journal" in capsys.readouterr().out
    usage = subprocess.run(
        [sys.executable, "-m", "clstm_ppo.cli", "--help"],
        cwd=ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "  trade " in usage.stdout


@pytest.mark.slow
def test_a_policy_reading_a_column_trades_it_from_a_features_file_as_its_backtest_did(
    env: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Trained on a file of bars with a forecast column (``--indicators rsi,col:alpha``): `trade` refuses it in one
    line without ``--features``, and with the file plans exactly its backtest's trades on Alpaca's bars (which hold
    no column), the column read by date and ticker."""
    root = tmp_path_factory.mktemp("trade_columns")
    bars = daily_bars(TICKERS, START, END)
    rows = [
        {"date": pd.Timestamp(b["t"]).tz_convert("America/New_York").date().isoformat(), "tic": tic}
        | {name: b[key] for name, key in (("open", "o"), ("high", "h"), ("low", "l"), ("close", "c"), ("volume", "v"))}
        for tic, series in bars.items()
        for b in series
    ]
    frame = pd.DataFrame(rows)
    frame["alpha"] = np.random.default_rng(5).normal(size=len(frame))
    prices = root / "prices.csv"
    frame.to_csv(prices, index=False)
    command = ["train", *TINY, "--data", f"csv:{prices}", "--start", START, "--end", END]
    command += ["--indicators", "rsi,col:alpha", "--checkpoint_dir", str(root / "ck"), "--run_name", "col"]
    done = run_here(command, root, _subprocess_env())
    assert done.returncode == 0, done.stderr
    ckpt = root / "ck" / "col" / "latest.pt"
    backtest = ["backtest", "--checkpoint", str(ckpt), "--out", str(root / "bt"), "--threads", "1"]
    assert cli.main(backtest) == 0
    report = json.loads((root / "bt" / "report.json").read_text())
    trained = Trained(
        ckpt,
        bars,
        pd.read_csv(root / "bt" / "trades.csv"),
        pd.read_csv(root / "bt" / "equity.csv"),
        report["metadata"]["execution"],
    )
    with AlpacaTestServer(ServerState(key=KEY, secret=SECRET, bars=bars)) as data:
        day = date.fromisoformat(trained.equity["date"].iloc[5])
        with broker(account(trained, day), monkeypatch):
            refused = trade(capsys, trained, data, env / "j-refused")
        assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
        assert "--features FILE" in refused.err and "alpha" in refused.err
        capsys.readouterr()
        check_plans_equal_backtest(trained, env, data, capsys, monkeypatch, "--features", str(prices))
