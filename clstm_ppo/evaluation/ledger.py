"""The trials ledger (docs/study.md): one append-only JSON-lines file, by default one per user (`ledger_path`), that
remembers every configuration traded on a market's days, every seal of a hold-out period and every time one was broken.

Each line is one JSON object with ``"kind"`` (study, trial, seal, unseal, tried: `REQUIRED` lists their fields; a
"tried" record counts trials run before or outside the ledger, by hand: `tried_record`), ``"key"`` and
``"ledger": 1``. A record whose ``(kind, key)`` is already there is not written again (re-reporting a study never counts
its cells twice). Every record is written whole, flushed and fsynced before the next; a line that is not a record (a
last line cut short by a kill) is reported once on stderr and skipped, and the next append starts on a fresh line.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from envs.data import MarketData
from envs.errors import UserError
from envs.fingerprint import agreeing_tickers, data_fingerprint, market_witness, same_columns

LEDGER_ENV = "CLSTM_PPO_LEDGER"
DEFAULT_LEDGER = "~/.clstm_ppo/ledger.jsonl"
LEDGER_FORMAT = 1

REQUIRED: dict[str, tuple[str, ...]] = {
    "study": ("key", "fingerprint", "tickers", "witness", "first", "last", "configurations"),
    "trial": (
        "key",
        "config",
        "study",
        "fingerprint",
        "first",
        "last",
        "num_days",
        "sharpe",
        "sharpe_daily",
        "active_sharpe",
        "active_sharpe_daily",
    ),
    "seal": ("key", "fingerprint", "tickers", "witness", "from", "to", "source", "time"),
    "unseal": ("key", "seal", "command", "what", "first", "last", "time"),
    "tried": ("key", "fingerprint", "tickers", "witness", "first", "last", "num_trials", "num_configurations", "what"),
}
"""The fields each kind of record must hold; a line lacking one is reported and skipped."""


def ledger_path(given: str | Path | None = None) -> Path:
    """The ledger file: ``given`` (``--ledger``), else ``$CLSTM_PPO_LEDGER``, else ``~/.clstm_ppo/ledger.jsonl``."""
    text = str(given) if given else os.environ.get(LEDGER_ENV, "") or DEFAULT_LEDGER
    try:
        return Path(text).expanduser()
    except RuntimeError:  # no home folder to expand ~ into
        raise UserError(f"cannot find a home folder for the ledger {text}; pass --ledger or set {LEDGER_ENV}") from None


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class Ledger:
    """One ledger file (``path`` as `ledger_path` resolves it): `records` reads it, `append` adds records durably."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = ledger_path(path)
        self._records: list[dict[str, Any]] | None = None
        self._keys: set[tuple[str, str]] = set()
        self._size = -1  # the file's size when last read or written: another process may append meanwhile
        self._warned: set[int] = set()  # line numbers already reported: a line is reported once per Ledger

    # ---------------------------------------------------------------------------------------------- reading

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every valid record in file order (of one ``kind`` if given); read again only when the file has changed
        since this object last read or wrote it (another study appending at the same time)."""
        if self._records is None or self._size != self._file_size():
            self._records = self._read()
            self._keys = {(r["kind"], r["key"]) for r in self._records}
        return [r for r in self._records if kind is None or r["kind"] == kind]

    def _file_size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return -1

    def _read(self) -> list[dict[str, Any]]:
        self._size = self._file_size()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except IsADirectoryError:
            raise UserError(
                f"the ledger {self.path} is a folder; give a file, e.g. {self.path / 'ledger.jsonl'}"
            ) from None
        except OSError as err:
            raise UserError(f"cannot read the ledger {self.path}: {err.strerror or err}") from None
        lines = raw.split(b"\n")
        torn = lines[-1] != b""  # a complete file ends with a newline
        out = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            problem = _problem(line)
            if problem is None:
                out.append(json.loads(line))
            elif number in self._warned:
                continue
            elif torn and number == len(lines):
                _stderr(
                    f"{self.path} line {number}: the last line is cut short (a write interrupted, e.g. by a killed "
                    f"process); skipped"
                )
            else:
                _stderr(f"{self.path} line {number}: {problem}; skipped")
            self._warned.add(number)
        return out

    # ---------------------------------------------------------------------------------------------- writing

    def check_writable(self) -> None:
        """UserError (one line) unless records can be appended to the file, without creating anything."""
        path = self.path
        if path.is_dir():
            raise UserError(f"the ledger {path} is a folder; give a file, e.g. {path / 'ledger.jsonl'}")
        if path.exists():
            if not os.access(path, os.W_OK):
                raise UserError(f"cannot write the ledger {path} (not writable); pass --ledger or set {LEDGER_ENV}")
            return
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(
                f"cannot write the ledger {path} ({parent} is not a writable folder); pass --ledger or set {LEDGER_ENV}"
            )

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Append the records whose ``(kind, key)`` the ledger does not hold yet, each flushed and fsynced.

        :return: how many were written.
        """
        self.records()
        new = []
        for r in records:
            problem = _problem(json.dumps(r).encode())
            if problem is not None:  # a bug in the caller, not the user's input
                raise ValueError(f"not a valid ledger record: {problem}")
            if (r["kind"], r["key"]) not in self._keys:
                self._keys.add((r["kind"], r["key"]))
                new.append(r)
        if not new:
            return 0
        self.check_writable()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                start = f.tell()
                if start > 0 and not _ends_with_newline(self.path):
                    f.write(b"\n")  # a torn last line stays a line of its own, reported, never glued to ours
                for r in new:
                    f.write(json.dumps(r, allow_nan=False).encode() + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                end = f.tell()
        except OSError as err:
            raise UserError(f"cannot write the ledger {self.path}: {err.strerror or err}") from None
        assert self._records is not None
        self._records.extend(new)
        # someone else appended since we read: read it all again next time
        self._size = end if start == max(self._size, 0) else -1
        return len(new)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _problem(line: bytes) -> str | None:
    """Why ``line`` is not a ledger record, or None when it is one."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "not JSON"
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("kind")
    if kind not in REQUIRED:
        return f"unknown record kind {kind!r}"
    missing = [k for k in REQUIRED[kind] if k not in record]
    if missing:
        return f"a {kind} record without {', '.join(missing)}"
    if not isinstance(record["key"], str):
        return f"a {kind} record whose key is not a string"
    return None


def record(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    """A ledger record: ``{"kind", "key", "ledger": LEDGER_FORMAT, "time" (now, ISO 8601 UTC to the second), **fields}``."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"kind": kind, "key": key, "ledger": LEDGER_FORMAT, "time": now, **fields}


# --------------------------------------------------------------------------------------------------- trials


def overlaps(first_a: str, last_a: str, first_b: str, last_b: str) -> bool:
    """Do two day ranges (inclusive, ``YYYY-MM-DD``; ``""`` as a last day: open-ended) share a day?"""
    return first_a <= (last_b or "9999-12-31") and first_b <= (last_a or "9999-12-31")


def same_market(study: dict[str, Any], tickers: list[str], witness: dict[str, Any]) -> bool:
    """Is a ledger study record's data the market described by ``tickers`` and ``witness``?

    The same tickers, every one of them agreeing on the witness days both hold (`agreeing_tickers`), and the same
    feature columns (`same_columns`): a file with a planted forecast is another market than its bars alone, and a
    forecast planted with another seed another again, so each counts its own trials.
    """
    if sorted(study["tickers"]) != sorted(tickers):
        return False
    agree, differ = agreeing_tickers(study["witness"], witness)
    return not differ and len(agree) == len(tickers) and same_columns(study["witness"], witness)


def same_data_trials(
    ledger: Ledger, *, fingerprint: str, tickers: list[str], witness: dict[str, Any], first: str, last: str
) -> list[dict[str, Any]]:
    """Every trial in the ledger on the same data that traded a day of ``first .. last`` (each trial once).

    Same data: the same `data_fingerprint`, or the same market over another date range (`same_market` on the trial's
    study record), so loading the file again with a later end date does not start the count afresh. One trial
    recorded twice under two fingerprints (a study's cells run on a machine whose numpy rounds the market's last
    bits differently, then reported here) counts once: the same configuration, cell, days and Sharpe ratio
    (`_trial_identity`) are one trial.
    """
    studies = {r["key"]: r for r in ledger.records("study")}
    verdicts: dict[str, bool] = {}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}  # by `_trial_identity`
    for trial in ledger.records("trial"):
        identity = _trial_identity(trial)
        if identity in out or not overlaps(trial["first"], trial["last"], first, last):
            continue
        if trial["fingerprint"] != fingerprint:
            study = studies.get(trial["study"])
            if study is None:
                continue
            if study["key"] not in verdicts:
                verdicts[study["key"]] = same_market(study, tickers, witness)
            if not verdicts[study["key"]]:
                continue
        out[identity] = trial
    return list(out.values())


def tried_record(
    data: MarketData, source: str, first: str, last: str, *, trials: int, configurations: int, what: str
) -> dict[str, Any]:
    """The ledger record of ``trials`` trials of ``configurations`` configurations traded on ``first .. last``
    (inclusive, ``YYYY-MM-DD``) of ``data`` before or outside the ledger (``clstm-ppo study tried``): counted with the
    ledger's own trials wherever a report counts trials on those days of that market (`count_trials`). Their Sharpe
    ratios are unknown, so they add to the count, not to the spread of Sharpe ratios.

    :raises UserError: a day outside the data or before ``first``, fewer trials than configurations, or none.
    """
    days = np.datetime_as_string(np.asarray(data.dates).astype("datetime64[D]"), unit="D")
    for name, day in (("--from", first), ("--to", last)):
        if not str(days[0]) <= day <= str(days[-1]):
            raise UserError(f"{name} {day} is outside the data ({days[0]} .. {days[-1]})")
    if last < first:
        raise UserError(f"--to {last} is before --from {first}")
    if configurations < 1 or trials < configurations:
        raise UserError(f"give at least one configuration and no fewer trials: {trials} trials of {configurations}")
    if not what.strip():
        raise UserError("say what was tried (--what): the record is read by people too")
    fingerprint = data_fingerprint(data)
    key = hashlib.sha256(f"tried\n{fingerprint}\n{first}\n{last}\n{what.strip()}".encode()).hexdigest()[:16]
    return record(
        "tried",
        key,
        source=source,
        fingerprint=fingerprint,
        tickers=sorted(data.tickers),
        witness=market_witness(data),
        first=first,
        last=last,
        num_trials=int(trials),
        num_configurations=int(configurations),
        what=what.strip(),
    )


def same_data_tried(
    ledger: Ledger, *, fingerprint: str, tickers: list[str], witness: dict[str, Any], first: str, last: str
) -> list[dict[str, Any]]:
    """Every "tried" record (`tried_record`) on the same data (its fingerprint, or `same_market`) that traded a day of
    ``first .. last``."""
    return [
        r
        for r in ledger.records("tried")
        if overlaps(r["first"], r["last"], first, last)
        and (r["fingerprint"] == fingerprint or same_market(r, tickers, witness))
    ]


def _trial_identity(trial: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two trial records one trial: the configuration, the cell (its seed), the days and the Sharpe ratio
    it earned on them; a record without a cell name is only itself (its key)."""
    if "cell" not in trial:
        return ("key", trial["key"])
    return (trial["config"], trial["cell"], trial["first"], trial["last"], round(float(trial["sharpe_daily"]), 12))


class TrialCount(NamedTuple):
    """What the deflated Sharpe ratio needs from the ledger: how many trials, and how far their Sharpe ratios
    spread. Variances are of DAILY Sharpe ratios (``annualised / sqrt(252)``), ddof = 1; 0 for one trial."""

    num_trials: int  # trials (cells: a configuration and a seed) on these days of this data
    num_configurations: int  # distinct configurations among them
    sharpe_variance_daily: float  # variance of their daily Sharpe ratios
    active_variance_daily: float  # variance of the daily Sharpe ratios of their returns over buy-and-hold


def count_trials(trials: list[dict[str, Any]], tried: list[dict[str, Any]] | None = None) -> TrialCount:
    """`TrialCount` of ledger trial records (`same_data_trials`) and "tried" records (`same_data_tried`): the latter
    add their trials and configurations to the counts, and nothing to the variances (their Sharpe ratios are not
    known)."""
    extra_trials = sum(int(r["num_trials"]) for r in tried or [])
    extra_configurations = sum(int(r["num_configurations"]) for r in tried or [])
    if not trials:
        return TrialCount(extra_trials, extra_configurations, 0.0, 0.0)
    sharpe = np.array([t["sharpe_daily"] for t in trials], dtype=np.float64)
    active = np.array([t["active_sharpe_daily"] for t in trials], dtype=np.float64)
    many = len(trials) > 1
    return TrialCount(
        num_trials=len(trials) + extra_trials,
        num_configurations=len({t["config"] for t in trials}) + extra_configurations,
        sharpe_variance_daily=float(sharpe.var(ddof=1)) if many else 0.0,
        active_variance_daily=float(active.var(ddof=1)) if many else 0.0,
    )
