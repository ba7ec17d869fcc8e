"""Backtest report files: written, self-consistent with summarize(), readable PNG, tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation import report as R
from clstm_ppo.evaluation.baselines import buy_and_hold
from envs.config import EnvConfig
from envs.errors import UserError
from envs.execution import Terms

TICKERS = ["AAA", "BBB", "CCC"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SHARES = dict(action_mode="shares", reward="value")  # the paper's actions and reward, which these cases work by hand


def _result(days: int = 120, *, with_index: bool = True, seed: int = 0) -> R.BacktestResult:
    """A policy that rebalances to random whole-share holdings every 10 days, bookkept exactly."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2021-01-04", periods=days).to_numpy()
    close = 50.0 * np.exp(np.cumsum(rng.normal(0.0003, 0.012, (days, len(TICKERS))), axis=0))
    holdings = np.zeros((days, len(TICKERS)))
    cash = np.empty(days)
    h, c = np.zeros(len(TICKERS)), 100_000.0
    for t in range(days):
        if t % 10 == 0:
            new = np.floor(rng.uniform(0, 1, len(TICKERS)) * 500)
            delta = new - h
            c -= float(delta @ close[t] + np.abs(delta) @ close[t] * 1e-3)
            h = new
        holdings[t], cash[t] = h, c
    hv = np.sum(holdings * close, axis=1)
    trades = M.trades_from_holdings(dates, TICKERS, holdings, close, buy_cost_pct=1e-3, sell_cost_pct=1e-3)
    bh = buy_and_hold(close, None, 100_000.0, 1e-3)
    return R.BacktestResult(
        dates=dates,
        values=cash + hv,
        cash=cash,
        holdings_value=hv,
        baseline_values=bh.values,
        trades=trades,
        metadata={"checkpoint": "checkpoints/demo/best.pt", "tickers": tuple(TICKERS), "split": "test"},
        index_values=close.mean(axis=1) if with_index else None,
        baseline_trades=M.trades_from_holdings(
            dates[:-1], TICKERS, bh.holdings[1:], close[:-1], buy_cost_pct=1e-3, sell_cost_pct=0.0
        ),
    )


def _assert_same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        if b[k] is None or (isinstance(b[k], float) and math.isnan(b[k])):
            assert a[k] is None or math.isnan(a[k]), k
        else:
            assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-9), k


def test_write_report_files_and_self_consistency(tmp_path):
    result = _result()
    rep = R.write_report(result, tmp_path / "out", risk_free=0.02)
    for name in ("report.json", "equity.csv", "trades.csv", "equity.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name

    payload = json.loads((tmp_path / "out" / "report.json").read_text())
    assert payload["metadata"]["tickers"] == TICKERS
    assert payload["period"] == {"start": "2021-01-04", "end": "2021-06-18", "num_days": 120}
    assert payload["risk_free"] == 0.02
    assert set(payload["metrics"]) == {"policy", "baseline", "index"}

    equity = pd.read_csv(tmp_path / "out" / "equity.csv")
    assert list(equity.columns) == [
        "date",
        "value",
        "cash",
        "holdings_value",
        "baseline_value",
        "index_value",
    ]
    np.testing.assert_allclose(equity["cash"] + equity["holdings_value"], equity["value"], rtol=1e-12)
    trades = pd.read_csv(tmp_path / "out" / "trades.csv")
    assert list(trades.columns) == list(R.TRADE_COLUMNS)
    assert set(trades["side"]) <= {"buy", "sell"} and (trades["shares"] > 0).all()

    # the report's numbers are exactly what its own CSVs give back
    _assert_same(payload["metrics"]["policy"], M.summarize(equity["value"], trades=trades, risk_free=0.02))
    base = M.summarize(equity["baseline_value"], risk_free=0.02)
    assert payload["metrics"]["baseline"]["sharpe"] == pytest.approx(base["sharpe"], rel=1e-9)
    assert payload["metrics"]["baseline"]["num_trades"] == len(TICKERS)
    _assert_same(payload["metrics"]["index"], M.summarize(equity["index_value"], risk_free=0.02))
    # NaN ("no closed trade" for buy-and-hold) is JSON null, the file is strict JSON
    assert payload["metrics"]["baseline"]["win_rate"] is None
    assert payload["metrics"]["policy"]["num_trades"] == len(trades) > 0
    assert rep.metrics["policy"]["sharpe"] == pytest.approx(payload["metrics"]["policy"]["sharpe"])


def test_png_is_a_real_image(tmp_path):
    from matplotlib.image import imread

    R.write_report(_result(), tmp_path)
    png = tmp_path / "equity.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    img = imread(png)
    h, w = img.shape[:2]
    assert w > 800 and h > 500
    assert img[..., :3].std() > 0.05  # not a blank canvas


def test_without_index_and_without_trades(tmp_path):
    r = _result(30, with_index=False)
    r2 = R.BacktestResult(
        dates=r.dates,
        values=r.values,
        cash=r.cash,
        holdings_value=r.holdings_value,
        baseline_values=r.baseline_values,
    )
    R.write_report(r2, tmp_path)
    equity = pd.read_csv(tmp_path / "equity.csv")
    assert "index_value" not in equity.columns
    trades = pd.read_csv(tmp_path / "trades.csv")
    assert list(trades.columns) == list(R.TRADE_COLUMNS) and len(trades) == 0
    payload = json.loads((tmp_path / "report.json").read_text())
    assert set(payload["metrics"]) == {"policy", "baseline"}
    assert payload["metrics"]["policy"]["num_trades"] is None  # unknown, not zero


def test_shape_mismatch_and_bad_folder(tmp_path):
    r = _result(20)
    with pytest.raises(ValueError, match="baseline_values"):
        R.BacktestResult(r.dates, r.values, r.cash, r.holdings_value, r.baseline_values[:-1])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="cannot create report folder"):
        R.write_report(r, blocker / "sub")


def test_compare_table_formats():
    hand = M.summarize([100.0, 110.0, 99.0, 121.0, 121.0], trades=2)
    table = R.compare_table({"ckpt-a": hand, "buy-and-hold": M.summarize([100.0, 100.0])})
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "ckpt-a", "buy-and-hold"]
    assert len(lines) == 2 + len(M.METRIC_NAMES)
    row = {ln[:26].strip(): ln[26:].split() for ln in lines[2:]}
    assert row["Cumulative return (CR)"] == ["21.00%", "0.00%"]
    assert row["Max drawdown (MPB)"] == ["10.00%", "0.00%"]
    assert row["Max earning rate (MER)"] == ["22.22%", "0.00%"]
    assert row["Profit per trade (APPT)"] == ["$10.50", "n/a"]
    assert row["Final value"] == ["$121", "$100"]
    assert row["Sharpe ratio (SR)"][1] == "0.000"
    assert R.compare_table({"x": hand}, keys=["sharpe"]).splitlines()[2].split()[-1] == f"{hand['sharpe']:.3f}"


def test_write_comparison(tmp_path):
    a, b = _result(60, seed=1), _result(60, seed=2)
    rep = R.write_comparison(
        a.dates,
        {"run-a": a.values, "run-b": b.values, "buy-and-hold": a.baseline_values},
        tmp_path / "cmp",
        trades={"run-a": a.trades},
        metadata={"period": "test"},
    )
    frame = pd.read_csv(rep.paths["equity"])
    assert list(frame.columns) == ["date", "run-a", "run-b", "buy-and-hold"]
    payload = json.loads(rep.paths["report"].read_text())
    _assert_same(payload["metrics"]["run-b"], M.summarize(frame["run-b"]))
    assert payload["metrics"]["run-a"]["num_trades"] == len(a.trades["side"])
    assert payload["metrics"]["run-b"]["num_trades"] is None
    assert rep.paths["plot"].read_bytes()[:8] == PNG_MAGIC
    assert rep.table.splitlines()[0].split() == ["metric", "run-a", "run-b", "buy-and-hold"]


def test_plot_comparison_many_curves(tmp_path):
    dates = pd.bdate_range("2020-01-01", periods=40)
    curves = {f"seed{i}": 1e6 * np.exp(np.linspace(0, 0.01 * i, 40)) for i in range(6)}
    path = R.plot_comparison(dates, curves, tmp_path / "deep" / "c.png", title="six")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_from_run_rebuilds_trades_and_checks_costs(tmp_path):
    from types import SimpleNamespace

    # the env's record: row i holds the shares traded at row i-1's close, and that trade's costs
    rng = np.random.default_rng(3)
    days = 15
    prices = 20.0 * np.exp(np.cumsum(rng.normal(0, 0.02, (days, 2)), axis=0))
    holdings = np.zeros((days, 2))
    holdings[2:6] = [10, 0]  # bought at row 1's close
    holdings[6:] = [4, 7]  # X sold, Y bought at row 5's close
    delta = np.diff(holdings, axis=0)  # [D-1]: trade at row i's close, i = 0..D-2
    trade_costs = np.abs(delta * prices[:-1]).sum(axis=1) * 1e-3
    costs = np.r_[0.0, trade_costs]
    cash = 1000.0 - np.cumsum(np.r_[0.0, (delta * prices[:-1]).sum(axis=1) + trade_costs])
    run = SimpleNamespace(
        dates=pd.bdate_range("2022-03-01", periods=days).to_numpy(),
        values=cash + (holdings * prices).sum(axis=1),
        cash=cash,
        holdings=holdings,
        prices=prices,
        costs=costs,
        tickers=("X", "Y"),
        fill_prices=np.vstack([prices[:1], prices[:-1]]),  # --execution close: at the deciding row's close
    )
    run.fill_dates = np.r_[run.dates[:1], run.dates[:-1]]
    env = EnvConfig(initial_amount=1000.0, buy_cost_pct=1e-3, sell_cost_pct=1e-3)
    terms = Terms("close", prices, np.zeros_like(prices), 0.0)  # an order decided on row t fills at its close
    result = R.BacktestResult.from_run(run, env, terms)
    assert list(result.trades["side"]) == ["buy", "sell", "buy"]
    assert list(result.trades["date"]) == list(run.dates[[1, 5, 5]])
    np.testing.assert_allclose(result.trades["price"], prices[[1, 5, 5], [0, 0, 1]])
    assert result.baseline_values[0] == 1000.0
    np.testing.assert_allclose(result.cash + result.holdings_value, result.values)
    rep = R.write_report(result, tmp_path)
    assert rep.metrics["policy"]["num_trades"] == 3
    assert rep.metrics["policy"]["total_costs"] == pytest.approx(costs.sum())
    # a record priced the other way (trade at the same row's close): the cost check catches it
    shifted = SimpleNamespace(**{**vars(run), "fill_prices": prices})
    with pytest.raises(ValueError, match="misaligned"):
        R.BacktestResult.from_run(shifted, env, terms)


@pytest.mark.parametrize("execution", ["close", "next_open", "next_close"])
def test_from_run_on_the_real_env_record(tmp_path, execution):
    """The env's own day-by-day record (random actions) goes through from_run: trades and costs agree, and every
    trade is dated and priced at its fill (the deciding day's close, the next day's open or its close)."""
    from types import SimpleNamespace

    from envs.data import split_days
    from envs.features import PreparedMarket
    from envs.synthetic import generate_market
    from envs.trading_env import StockTradingEnv

    data = generate_market(num_tickers=4, num_days=300, seed=5)
    market = PreparedMarket.prepare(data, split_days(data, window=10), window=10, use_turbulence=False)
    cfg = EnvConfig(episode_length="full", execution=execution, **SHARES)
    env = StockTradingEnv(market=market, split="test", config=cfg)
    _, info = env.reset(seed=0)
    record, done, rng = [info], False, np.random.default_rng(0)
    while not done:
        _, _, terminated, truncated, info = env.step(rng.uniform(-1, 1, 4).astype(np.float32))
        record.append(info)
        done = terminated or truncated
    run = SimpleNamespace(
        dates=np.array([r["date"] for r in record], dtype="datetime64[ns]"),
        values=np.array([r["portfolio_value"] for r in record]),
        cash=np.array([r["cash"] for r in record]),
        holdings=np.stack([r["holdings"] for r in record]),
        prices=np.stack([r["prices"] for r in record]),
        costs=np.array([r.get("costs", 0.0) for r in record]),
        tickers=tuple(data.tickers),
        fill_prices=np.stack([r.get("fill_prices", r["prices"]) for r in record]),
        fill_dates=np.array([r.get("fill_date", r["date"]) for r in record], dtype="datetime64[ns]"),
    )
    test = market.splits.test
    result = R.BacktestResult.from_run(run, cfg, Terms.of(data, execution, cfg.risk_free).days(test.start, test.stop))
    assert len(result.trades["side"]) == sum(r.get("num_trades", 0) for r in record) > 0
    index = {d: i for i, d in enumerate(np.asarray(data.dates, dtype="datetime64[ns]"))}
    source = data.open if execution == "next_open" else data.close
    days = [index[np.datetime64(d, "ns")] for d in result.trades["date"]]
    for day, ticker, price in zip(days, result.trades["ticker"], result.trades["price"], strict=True):
        assert price == source[day, data.tickers.index(ticker)]
    first = index[np.datetime64(run.dates[0], "ns")]
    assert (min(days) == first) == (execution == "close")  # a decision on the first day fills on it only at close
    np.testing.assert_allclose(result.cash + result.holdings_value, result.values, rtol=1e-12)
    rep = R.write_report(result, tmp_path)
    assert rep.metrics["policy"]["total_costs"] == pytest.approx(run.costs.sum(), rel=1e-9)
    assert rep.metrics["policy"]["initial_value"] == cfg.initial_amount
