"""`clstm-ppo trade report`: the paper account's equity next to what the backtest gave for the same days.

Read from the journal only (no keys, no network). The two start from different capital, so they are compared by
returns (the day returns and their gap, total returns, the tracking error: std, ddof 1, of the daily gaps) and by
the dollars the fills lost against the decision closes, as docs/trading.md "The journal" defines them. Deposits
and withdrawals move the equity and are not separated out: the report assumes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clstm_ppo.trading.journal import Journal, write_csv
from envs.errors import UserError
from envs.text import money, text_table

REPORT_FILE = "report.csv"
REPORT_COLUMNS = ("date", "paper_equity", "backtest_value", "paper_return", "backtest_return", "gap", "execution_cost")


@dataclass
class TradeReport:
    """Rows (one per equity.csv day) and the totals; returns as fractions, money in dollars."""

    rows: list[dict[str, Any]]
    paper_return: float
    backtest_return: float
    tracking_error: float | None
    execution_cost: float
    fills: int
    path: Path

    @property
    def gap(self) -> float:
        return self.paper_return - self.backtest_return


def execution_costs(events: list[dict[str, Any]]) -> tuple[dict[str, float], int]:
    """Dollars lost to fills away from the decision price, per decision day, and the number of orders filled."""
    planned: dict[str, tuple[str, str, float]] = {}  # client id -> (day, side, decision price)
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("event") == "decision":
            for order in event.get("plan") or []:
                planned[order["client_order_id"]] = (str(event["day"]), order["side"], float(order["price"]))
        elif event.get("event") == "order_status" and event.get("client_order_id"):
            latest[event["client_order_id"]] = event
    costs: dict[str, float] = {}
    fills = 0
    for cid, status in latest.items():
        qty, price = float(status.get("filled_qty") or 0.0), status.get("filled_avg_price")
        if cid not in planned or qty <= 0 or price is None:
            continue
        day, side, decided = planned[cid]
        costs[day] = costs.get(day, 0.0) + (1.0 if side == "buy" else -1.0) * (float(price) - decided) * qty
        fills += 1
    return costs, fills


def trade_report(folder: str | Path, out: str | Path | None = None) -> TradeReport:
    """Compare the journal's paper equity with the backtest's values; write ``report.csv`` (or ``out``)."""
    journal = Journal(folder)
    rows = journal.equity_rows()
    if not rows:
        raise UserError(f"no account values in {journal.equity_path} yet: run `clstm-ppo trade` after a close first")
    try:
        equity = np.array([float(r["equity"]) for r in rows])
        backtest = np.array([float(r["backtest_value"]) for r in rows])
    except (KeyError, ValueError):
        raise UserError(
            f"{journal.equity_path} is not a trade equity file (columns date,equity,...,backtest_value)"
        ) from None
    if not (np.all(equity > 0) and np.all(backtest > 0)):
        raise UserError(f"{journal.equity_path}: equity and backtest values must be positive")
    costs, fills = execution_costs(journal.events())
    paper_r = np.concatenate([[np.nan], equity[1:] / equity[:-1] - 1.0])  # [rows]: day returns, none on the first
    bt_r = np.concatenate([[np.nan], backtest[1:] / backtest[:-1] - 1.0])
    gaps = paper_r[1:] - bt_r[1:]
    out_rows = [
        {
            "date": r["date"],
            "paper_equity": float(e),
            "backtest_value": float(b),
            "paper_return": None if np.isnan(p) else float(p),
            "backtest_return": None if np.isnan(q) else float(q),
            "gap": None if np.isnan(p) else float(p - q),
            "execution_cost": costs.get(r["date"]),
        }
        for r, e, b, p, q in zip(rows, equity, backtest, paper_r, bt_r, strict=True)
    ]
    path = Path(out) if out else journal.folder / REPORT_FILE
    try:
        write_csv(path, REPORT_COLUMNS, [{k: "" if v is None else v for k, v in row.items()} for row in out_rows])
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}") from None
    return TradeReport(
        rows=out_rows,
        paper_return=float(equity[-1] / equity[0] - 1.0),
        backtest_return=float(backtest[-1] / backtest[0] - 1.0),
        tracking_error=float(np.std(gaps, ddof=1)) if len(gaps) >= 2 else None,
        execution_cost=float(sum(costs.values())),
        fills=fills,
        path=path,
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def report_table(report: TradeReport) -> str:
    """The console view: one line per day, then the totals."""
    header = ("date", "paper equity", "day", "backtest value", "day", "gap", "fills vs close")
    body = [
        (
            r["date"],
            money(r["paper_equity"]),
            _pct(r["paper_return"]),
            money(r["backtest_value"]),
            _pct(r["backtest_return"]),
            _pct(r["gap"]),
            money(r["execution_cost"]),
        )
        for r in report.rows
    ]
    lines = text_table([header, *body], "lrrrrrr")
    n = len(report.rows)
    te = "-" if report.tracking_error is None else f"{report.tracking_error * 100:.2f}% per day"
    lines += [
        "",
        f"over {n} session(s) {report.rows[0]['date']} .. {report.rows[-1]['date']}: paper {_pct(report.paper_return)}, "
        f"backtest {_pct(report.backtest_return)}, gap {report.gap * 100:+.2f} pp; tracking error {te}",
        f"fills vs decision closes: {money(report.execution_cost)} over {report.fills} filled order(s) "
        "(positive = lost to trading at the next open)",
    ]
    return "\n".join(lines)
