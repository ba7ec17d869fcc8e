"""The trading journal: ``trades.jsonl`` (one JSON line per decision and per order event) next to
``equity.csv`` (one row per session day: the account's value and the backtest's for the same day); the fields of
each are docs/trading.md "The journal". Lines are flushed to disk one at a time (`Journal.record`), so after a crash
the journal still says exactly which orders went out. Keys never reach the journal: it is given only these fields.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envs.atomic import atomic_write
from envs.errors import UserError

TRADES_FILE, EQUITY_FILE = "trades.jsonl", "equity.csv"
EQUITY_COLUMNS = ("date", "equity", "cash", "long_market_value", "backtest_value", "recorded_at")


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """``rows`` under a ``columns`` header (other keys ignored), UTF-8 with "\\n" line ends, written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    data = buffer.getvalue().encode("utf-8")
    atomic_write(path, lambda handle: handle.write(data))


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Journal:
    """Appends events to ``folder/trades.jsonl`` and keeps ``folder/equity.csv``; ``context`` joins every event."""

    def __init__(self, folder: str | Path, **context: Any) -> None:
        self.folder = Path(folder)
        self.trades_path, self.equity_path = self.folder / TRADES_FILE, self.folder / EQUITY_FILE
        self.context: dict[str, Any] = dict(context)

    def create_folder(self) -> None:
        """Make the journal folder (UserError naming it when it cannot be: a regular file in the way, rights)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the journal folder {self.folder}: {err.strerror or err}") from None

    def record(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event line (flushed and fsynced before returning); returns what was written."""
        self.create_folder()
        line = {"time": utc_now(), "event": event, **self.context, **fields}
        text = json.dumps(line, allow_nan=False, default=str)
        try:
            with open(self.trades_path, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            raise UserError(f"cannot write the journal {self.trades_path}: {err.strerror or err}") from None
        return line

    def events(self) -> list[dict[str, Any]]:
        """Every event, oldest first; a line that does not parse (cut short by a crash) is skipped with a note."""
        if not self.trades_path.is_file():
            return []
        out = []
        for number, text in enumerate(self.trades_path.read_text(encoding="utf-8").splitlines(), 1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except ValueError:
                print(f"note: {self.trades_path} line {number} is not JSON; skipped", file=sys.stderr)
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    def equity_rows(self) -> list[dict[str, str]]:
        """Rows of equity.csv as strings, in file order (dates ascending)."""
        if not self.equity_path.is_file():
            return []
        with open(self.equity_path, newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))

    def put_equity(
        self, day: str, *, equity: float, cash: float, long_market_value: float, backtest_value: float
    ) -> None:
        """Write (or replace) ``day``'s row; the file is rewritten atomically, sorted by date."""
        self.create_folder()
        rows = {r["date"]: r for r in self.equity_rows()}
        rows[day] = {
            "date": day,
            "equity": f"{equity:.2f}",
            "cash": f"{cash:.2f}",
            "long_market_value": f"{long_market_value:.2f}",
            "backtest_value": f"{backtest_value:.6f}",
            "recorded_at": utc_now(),
        }
        write_csv(self.equity_path, EQUITY_COLUMNS, [rows[key] for key in sorted(rows)])
