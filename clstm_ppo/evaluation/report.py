"""Backtest reports: metrics JSON, equity and trades CSVs, equity/drawdown PNG, console tables. Every metric comes
from `clstm_ppo.evaluation.metrics.summarize`, so a report can be re-derived from its own equity.csv and trades.csv.

Files written by `write_report(result, out_dir)`:

    report.json   {"metadata", "period", "risk_free", "metrics": {"policy", "baseline"[, "index"]}, "files"}
                  (NaN -- "unknown", e.g. no closed trade for a win rate -- is written as null)
    equity.csv    date, value, cash, holdings_value, baseline_value[, index_value]   (dollars; index as given)
    trades.csv    date, ticker, side, shares, price, cost                            (one row per order)
    equity.png    top: equity curves (index rescaled to the policy's starting value); bottom: drawdown
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.baselines import buy_and_hold
from envs.config import EnvConfig
from envs.errors import UserError
from envs.execution import Terms
from envs.text import money, text_table

TRADE_COLUMNS: tuple[str, ...] = ("date", "ticker", "side", "shares", "price", "cost")

METRIC_ROWS: dict[str, tuple[str, str]] = {
    "num_days": ("Days", "count"),
    "initial_value": ("Initial value", "dollars0"),
    "final_value": ("Final value", "dollars0"),
    "profit": ("Profit", "dollars0"),
    "cumulative_return": ("Cumulative return (CR)", "pct"),
    "annual_return": ("Annual return (CAGR)", "pct"),
    "annual_volatility": ("Annual volatility", "pct"),
    "sharpe": ("Sharpe ratio (SR)", "ratio"),
    "sortino": ("Sortino ratio", "ratio"),
    "max_drawdown": ("Max drawdown (MPB)", "pct"),
    "max_earning_rate": ("Max earning rate (MER)", "pct"),
    "calmar": ("Calmar ratio", "ratio"),
    "num_trades": ("Trades", "count"),
    "appt": ("Profit per trade (APPT)", "dollars2"),
    "turnover": ("Turnover (period)", "times"),
    "annual_turnover": ("Turnover (annual)", "times"),
    "win_rate": ("Win rate (closed trades)", "pct"),
    "daily_win_rate": ("Win rate (days up)", "pct"),
    "total_costs": ("Transaction costs", "dollars2"),
}
"""Metric key -> (label, kind): how the console tables name and format each number (see `format_metric`)."""


@dataclass(frozen=True)
class BacktestResult:
    """One policy's run over one period, with its baseline.

    :param dates: ``[D]`` trading days (datetime64 or anything ``pandas.to_datetime`` reads).
    :param values: ``[D] float64`` policy total value, dollars; ``values[0]`` the starting capital.
    :param cash: ``[D] float64`` policy cash, dollars.
    :param holdings_value: ``[D] float64`` shares x close, dollars (``cash + holdings_value == values``).
    :param baseline_values: ``[D] float64`` equal-weight buy-and-hold with the same costs
        (`clstm_ppo.evaluation.baselines.buy_and_hold`), dollars.
    :param trades: the policy's trades table, columns ``TRADE_COLUMNS`` (DataFrame or mapping of arrays;
        `clstm_ppo.evaluation.metrics.trades_from_holdings` builds one). None: unknown -- trade metrics are NaN
        (null in report.json) and trades.csv has only its header. An empty table means "no trades".
    :param metadata: JSON-able facts about the run: checkpoint path, period, tickers, config, ...
    :param index_values: optional ``[D]`` market index levels (any unit > 0), e.g. DJI closes.
    :param baseline_trades: optional trades table of the baseline (`clstm_ppo.evaluation.metrics.trades_from_holdings`)
        so its trade count, costs and turnover are reported too.
    """

    dates: Any
    values: Any
    cash: Any
    holdings_value: Any
    baseline_values: Any
    trades: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    index_values: Any | None = None
    baseline_trades: Any | None = None

    @classmethod
    def from_run(
        cls,
        run: Any,
        env: EnvConfig,
        terms: Terms,
        *,
        metadata: Mapping[str, Any] | None = None,
        index_values: Any | None = None,
    ) -> BacktestResult:
        """Build a result from a day-by-day policy record (`clstm_ppo.agent.evaluate.PolicyRun`'s fields).

        ``run`` needs ``dates [D]``, ``values [D]``, ``cash [D]``, ``holdings [D, N]`` (shares held at row i's close),
        ``prices [D, N]`` (row i's close), ``fill_prices [D, N]`` and ``fill_dates [D]`` (what and when the trades
        leading to row i filled) and ``tickers [N]``, recorded the env's way: row 0 is the starting day before any
        trade, and the shares that changed from row i-1 to row i were decided on row i-1's close and filled as
        ``--execution`` says (`envs.execution`). So the trades table is dated and priced at their fills. ``costs [D]``
        (dollars, row i holding the costs of those trades), when present, is checked against the rebuilt table, so a
        record that breaks this convention fails loudly instead of mis-reporting. The costs are ``env``'s; the baseline
        decides equal weights on row 0's close and trades on ``terms`` (the run's days' fills, dividends and interest:
        `envs.execution.Terms`), with ``env.buy_cost_pct``, starting at ``env.initial_amount`` like the policy.
        """
        prices = np.asarray(run.prices, dtype=np.float64)
        fills = np.asarray(run.fill_prices, dtype=np.float64)
        holdings = np.asarray(run.holdings, dtype=np.float64)
        trades = M.trades_from_holdings(
            np.asarray(run.fill_dates)[1:],
            run.tickers,
            holdings[1:],
            fills[1:],
            buy_cost_pct=env.buy_cost_pct,
            sell_cost_pct=env.sell_cost_pct,
            initial_holdings=holdings[0],
        )
        recorded = getattr(run, "costs", None)
        if recorded is not None:
            want, got = float(np.sum(recorded)), M.total_costs(trades)
            if not math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-6):
                raise ValueError(
                    f"trades rebuilt from holdings cost ${got:,.2f} but the run recorded ${want:,.2f}: "
                    "holdings and execution prices are misaligned"
                )
        baseline = buy_and_hold(prices, terms, env.initial_amount, env.buy_cost_pct)
        baseline_trades = M.trades_from_holdings(
            np.asarray(run.fill_dates)[1:],
            run.tickers,
            baseline.holdings[1:],
            fills[1:],
            buy_cost_pct=env.buy_cost_pct,
            sell_cost_pct=0.0,
        )
        return cls(
            dates=run.dates,
            values=np.asarray(run.values, dtype=np.float64),
            cash=np.asarray(run.cash, dtype=np.float64),
            holdings_value=np.sum(holdings * prices, axis=1),
            baseline_values=baseline.values,
            trades=trades,
            metadata=dict(metadata or {}),
            index_values=index_values,
            baseline_trades=baseline_trades,
        )

    def __post_init__(self) -> None:
        d = len(_iso_dates(self.dates))
        for name in ("values", "cash", "holdings_value", "baseline_values", "index_values"):
            arr = getattr(self, name)
            if arr is not None and np.shape(arr) != (d,):
                raise ValueError(f"{name} must have shape [D] = ({d},) like dates, got {np.shape(arr)}")


@dataclass(frozen=True)
class Report:
    """What `write_report` / `write_comparison` produced."""

    out_dir: Path
    metrics: dict[str, dict[str, float]]  # {"policy": summarize(...), "baseline": ..., ...}
    paths: dict[str, Path]  # {"report": .../report.json, "equity": ..., ...}
    table: str  # `compare_table(metrics)`, ready to print


# ----------------------------------------------------------------------------------------------- helpers


def _iso_dates(dates: Any) -> list[str]:
    """``[D]`` dates -> ISO strings (``YYYY-MM-DD``, with a time only when there is one)."""
    idx = pd.DatetimeIndex(pd.to_datetime(np.asarray(dates)))
    if len(idx) and (idx == idx.normalize()).all():
        return [d.strftime("%Y-%m-%d") for d in idx]
    return [d.isoformat() for d in idx]


def jsonable(obj: Any) -> Any:
    """Plain JSON types; NaN/inf -> None; numpy, dates, tuples converted; anything else (a Path) as its text."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return [jsonable(x) for x in obj.tolist()]
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(x) for x in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, pd.Timestamp | np.datetime64):
        return pd.Timestamp(obj).isoformat()
    return str(obj)


def _trades_frame(trades: Any) -> pd.DataFrame:
    """Trades table -> DataFrame with exactly ``TRADE_COLUMNS`` (empty table when None)."""
    if trades is None:
        return pd.DataFrame({c: [] for c in TRADE_COLUMNS})
    df = trades if isinstance(trades, pd.DataFrame) else pd.DataFrame({k: list(v) for k, v in trades.items()})
    missing = [c for c in TRADE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"trades table lacks columns {missing}; needs {list(TRADE_COLUMNS)}")
    df = df.loc[:, list(TRADE_COLUMNS)].copy()
    if len(df) and not pd.api.types.is_numeric_dtype(df["date"]):
        df["date"] = _iso_dates(df["date"])
    return df.astype({"ticker": str, "side": str, "shares": "float64", "price": "float64", "cost": "float64"})


def _prepare_out_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create report folder {out}: {err.strerror or err}") from err
    return out


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """``payload`` as indented JSON (`jsonable`: NaN and inf as null) in ``path``."""
    path.write_text(json.dumps(jsonable(payload), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _finish_report(
    out: Path, paths: dict[str, Path], metadata: Mapping[str, Any], dates: list[str], risk_free: float, metrics: Any
) -> Report:
    """Write the report's JSON (``paths["report"]``: metadata, ISO ``dates``' period, rate, metrics, other files)."""
    period = {"start": dates[0], "end": dates[-1], "num_days": len(dates)}
    files = {k: p.name for k, p in paths.items() if k != "report"}
    write_json(
        paths["report"],
        {"metadata": dict(metadata), "period": period, "risk_free": risk_free, "metrics": metrics, "files": files},
    )
    return Report(out_dir=out, metrics=metrics, paths=paths, table=compare_table(metrics))


# ------------------------------------------------------------------------------------------------ tables


def format_metric(value: float, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if kind == "pct":
        return f"{100.0 * value:.2f}%"
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "times":
        return f"{value:.2f}x"
    if kind == "count":
        return f"{value:,.0f}"
    if kind == "dollars0":
        return f"-${-value:,.0f}" if value < 0 else f"${value:,.0f}"
    if kind == "dollars2":
        return money(value)
    return f"{value:.4g}"


def compare_table(results: Mapping[str, Mapping[str, float]], *, keys: Sequence[str] | None = None) -> str:
    """Plain-text table: one row per metric, one column per result (policy, baseline, checkpoints ...).

    Fractions show as percentages, ratios with three decimals, dollars with thousands separators,
    unknown (NaN) as ``n/a``. ``keys`` picks and orders the rows (default: every metric `summarize` gives).
    """
    names = list(results)
    header = ["metric", *names]
    rows = []
    for key in M.METRIC_NAMES if keys is None else keys:
        label, kind = METRIC_ROWS.get(key, (key, "float"))
        rows.append([label, *[format_metric(results[n].get(key, math.nan), kind) for n in names]])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    head, *body = text_table([header, *rows], "l" + "r" * len(names))
    return "\n".join([head, "  ".join("-" * w for w in widths), *body])


# ------------------------------------------------------------------------------------------------- plots


def plot_comparison(
    dates: Any,
    curves: Mapping[str, Any],
    out_path: str | Path,
    *,
    title: str = "Equity and drawdown",
    rescale_to: float | None = None,
    rescale: Sequence[str] = (),
) -> Path:
    """Two-panel PNG: equity curves (dollars) over dates on top, drawdown (percent) below.

    :param dates: ``[D]`` dates shared by every curve.
    :param curves: ``{label: [D] values}``; the first is drawn boldest (the policy), later ones thinner.
    :param out_path: PNG file to write (folders created).
    :param rescale_to: dollars that curves named in ``rescale`` (e.g. an index in points) start at.
    :returns: the path written. Uses matplotlib's Agg canvas: no display, no global pyplot state.
    """
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    x = pd.to_datetime(np.asarray(dates)).to_numpy()
    fig = Figure(figsize=(11, 7), dpi=110, layout="constrained")
    ax_eq, ax_dd = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.4))
    styles = [("-", 2.0), ("--", 1.4), (":", 1.6), ("-.", 1.3)]
    for i, (label, raw) in enumerate(curves.items()):
        v = np.asarray(raw, dtype=np.float64)
        if label in rescale and rescale_to is not None:
            v = v / v[0] * rescale_to
            label = f"{label} (rescaled)"
        ls, lw = styles[i] if i < len(styles) else ("-", 1.0)
        stats = (
            f"CR {100 * M.cumulative_return(v):+.1f}%, SR {M.sharpe_ratio(v):.2f}, MPB {100 * M.max_drawdown(v):.1f}%"
        )
        (line,) = ax_eq.plot(x, v, ls=ls, lw=lw, label=f"{label}  ({stats})")
        dd = -100.0 * M.drawdown_series(v)
        ax_dd.plot(x, dd, ls=ls, lw=max(lw - 0.4, 0.8), color=line.get_color())
        if i == 0:
            ax_dd.fill_between(x, dd, 0.0, color=line.get_color(), alpha=0.15, lw=0)
    ax_eq.set_title(title)
    ax_eq.set_ylabel("portfolio value")
    ax_eq.yaxis.set_major_formatter(FuncFormatter(_dollar_tick))
    ax_eq.grid(alpha=0.3)
    ax_eq.legend(loc="best", fontsize=8.5)
    ax_dd.set_ylabel("drawdown")
    ax_dd.yaxis.set_major_formatter(PercentFormatter(decimals=None))
    ax_dd.grid(alpha=0.3)
    locator = AutoDateLocator()
    ax_dd.xaxis.set_major_locator(locator)
    ax_dd.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _dollar_tick(v: float, _pos: Any = None) -> str:
    if abs(v) >= 1e6:
        return f"${v / 1e6:,.2f}M"
    if abs(v) >= 1e3:
        return f"${v / 1e3:,.0f}k"
    return f"${v:,.0f}"


# --------------------------------------------------------------------------------------------- reports


def compute_metrics(result: BacktestResult, *, risk_free: float = 0.0) -> dict[str, dict[str, float]]:
    """``{"policy": ..., "baseline": ...[, "index": ...]}``, each `clstm_ppo.evaluation.metrics.summarize`.

    The index gets only value-based metrics (no trades); its dollar keys are in index points.
    """
    out = {
        "policy": summarize_curve(result.values, result.trades, risk_free),
        "baseline": summarize_curve(result.baseline_values, result.baseline_trades, risk_free),
    }
    if result.index_values is not None:
        out["index"] = summarize_curve(result.index_values, None, risk_free)
    return out


def summarize_curve(values: Any, trades: Any, risk_free: float) -> dict[str, float]:
    """`clstm_ppo.evaluation.metrics.summarize` of ``[D]`` dollar ``values`` and their trades table (None: unknown)."""
    return M.summarize(values, trades=None if trades is None else _trades_frame(trades), risk_free=risk_free)


def write_report(
    result: BacktestResult, out_dir: str | Path, *, risk_free: float = 0.0, title: str | None = None
) -> Report:
    """Write report.json, equity.csv, trades.csv and equity.png into ``out_dir`` (created).

    :param risk_free: annual risk-free rate for Sharpe and Sortino, recorded in report.json.
    :param title: plot title (default: checkpoint file name, period and day count).
    :returns: a `Report` whose ``table`` is the console table to print.
    """
    out = _prepare_out_dir(out_dir)
    dates = _iso_dates(result.dates)
    metrics = compute_metrics(result, risk_free=risk_free)
    paths = {
        "report": out / "report.json",
        "equity": out / "equity.csv",
        "trades": out / "trades.csv",
        "plot": out / "equity.png",
    }

    equity = pd.DataFrame(
        {
            "date": dates,
            "value": np.asarray(result.values, dtype=np.float64),
            "cash": np.asarray(result.cash, dtype=np.float64),
            "holdings_value": np.asarray(result.holdings_value, dtype=np.float64),
            "baseline_value": np.asarray(result.baseline_values, dtype=np.float64),
        }
    )
    if result.index_values is not None:
        equity["index_value"] = np.asarray(result.index_values, dtype=np.float64)
    equity.to_csv(paths["equity"], index=False)
    _trades_frame(result.trades).to_csv(paths["trades"], index=False)

    who = Path(str(result.metadata.get("checkpoint") or result.metadata.get("name") or "policy")).name
    curves = {"policy": result.values, "buy-and-hold": result.baseline_values}
    if result.index_values is not None:
        curves["index"] = result.index_values
    plot_comparison(
        dates,
        curves,
        paths["plot"],
        title=title or f"{who}: {dates[0]} .. {dates[-1]} ({len(dates)} days) vs equal-weight buy-and-hold",
        rescale_to=float(np.asarray(result.values)[0]),
        rescale=("index",),
    )

    return _finish_report(out, paths, result.metadata, dates, risk_free, metrics)


def write_comparison(
    dates: Any,
    curves: Mapping[str, Any],
    out_dir: str | Path,
    *,
    trades: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    risk_free: float = 0.0,
    title: str | None = None,
) -> Report:
    """Several runs on one period: compare.json, compare.csv (date + one value column per run), compare.png.

    :param dates: ``[D]`` the shared period.
    :param curves: ``{name: [D] values in dollars}``, e.g. one per checkpoint plus ``"buy-and-hold"``.
    :param trades: optional ``{name: trades table}`` for trade-based metrics.
    """
    out = _prepare_out_dir(out_dir)
    iso = _iso_dates(dates)
    trades = trades or {}
    metrics = {name: summarize_curve(v, trades.get(name), risk_free) for name, v in curves.items()}
    paths = {"report": out / "compare.json", "equity": out / "compare.csv", "plot": out / "compare.png"}
    columns = {name: np.asarray(v, dtype=np.float64) for name, v in curves.items()}
    pd.DataFrame({"date": iso, **columns}).to_csv(paths["equity"], index=False)
    plot_comparison(iso, curves, paths["plot"], title=title or f"{len(curves)} runs: {iso[0]} .. {iso[-1]}")
    return _finish_report(out, paths, metadata or {}, iso, risk_free, metrics)
