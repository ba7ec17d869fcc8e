"""The sealed hold-out (docs/study.md): days of a market that no study, backtest or compare may trade without
``--unseal``. A seal is a trials-ledger record (`make_seal`); `guard` refuses sealed days or records the unseal, once
per look; `holdout_summary` says how many looks a seal has had. A seal covers each of its tickers whose closes agree
with the sealed data's on the witness days both hold (`envs.fingerprint.market_witness`), so it survives a reload
with other dates, another format or other tickers, but not other prices.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from clstm_ppo.evaluation.ledger import Ledger, overlaps, record
from envs.data import MarketData
from envs.errors import UserError
from envs.fingerprint import agreeing_tickers, data_fingerprint, market_witness


def parse_day(text: str, flag: str) -> pd.Timestamp:
    """``text`` as a day (a timestamp at midnight); UserError naming ``flag`` where it is none."""
    try:
        return pd.Timestamp(text).normalize()
    except (ValueError, TypeError, AttributeError):  # AttributeError: "" and "nat" read as NaT, which has no day
        raise UserError(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def iso_days(data: MarketData) -> np.ndarray:
    """``[D]`` the data's trading days as ``YYYY-MM-DD`` strings."""
    return np.datetime_as_string(np.asarray(data.dates).astype("datetime64[D]"), unit="D")


def make_seal(data: MarketData, source: str, start: str, end: str = "") -> dict[str, Any]:
    """The ledger record sealing ``start .. end`` (inclusive; ``end`` empty: open-ended) of ``data``.

    :param source: the data source as the user named it (``csv:PATH``, ``synthetic:...``), for the record.
    :raises UserError: a date that is not a date, outside the data's first .. last day, ``end`` before ``start``,
        or a period with no trading day.
    """
    days = iso_days(data)
    first, last = str(days[0]), str(days[-1])
    lo = parse_day(start, "--from").strftime("%Y-%m-%d")
    hi = parse_day(end, "--to").strftime("%Y-%m-%d") if end else ""
    for flag, day in (("--from", lo), ("--to", hi)):
        if day and not first <= day <= last:
            raise UserError(f"{flag} {day} is outside the data ({first} .. {last}); a seal covers days the data holds")
    if hi and hi < lo:
        raise UserError(f"--to {hi} is before --from {lo}")
    sealed = days[(days >= lo) & (days <= (hi or last))]
    if sealed.size == 0:
        raise UserError(f"no trading day of the data lies in {lo} .. {hi}")
    fingerprint = data_fingerprint(data)
    key = _digest("seal", fingerprint, lo, hi)
    return record(
        "seal",
        key,
        id=key[:8],
        source=source,
        tickers=sorted(data.tickers),
        fingerprint=fingerprint,
        witness=market_witness(data),
        **{"from": lo, "to": hi},
        first_sealed_day=str(sealed[0]),
        sealed_days_then=int(sealed.size),
    )


class SealHit(NamedTuple):
    """A seal that covers some of the days to trade."""

    seal: dict[str, Any]  # its ledger record
    tickers: list[str]  # the sealed tickers of this market (those whose witness closes agree)
    first: str  # the first and last day to trade that the seal covers
    last: str


def sealed_hits(ledger: Ledger, witness: dict[str, Any], first: str, last: str) -> list[SealHit]:
    """The seals in the ledger that cover a day of ``first .. last`` on the market of ``witness``."""
    return [
        SealHit(seal, agree, max(first, seal["from"]), min(last, seal["to"] or last))
        for seal in ledger.records("seal")
        if overlaps(seal["from"], seal["to"], first, last) and (agree := agreeing_tickers(seal["witness"], witness)[0])
    ]


def holdout_summary(ledger: Ledger, data: MarketData, first: str, last: str) -> list[dict[str, Any]]:
    """For a report: each seal covering a day of ``first .. last`` of ``data``, its period, the covered days, when
    it was made, and how many times its days have been unsealed so far."""
    return [
        {
            "seal": h.seal["id"],
            "from": h.seal["from"],
            "to": h.seal["to"],
            "sealed_on": h.seal["time"][:10],
            "tickers": len(h.tickers),
            "first": h.first,
            "last": h.last,
            "unsealed": sum(1 for r in ledger.records("unseal") if r["seal"] == h.seal["key"]),  # distinct looks
        }
        for h in sealed_hits(ledger, market_witness(data), first, last)
    ]


def describe(entry: dict[str, Any]) -> str:
    """One line of `holdout_summary`, e.g. "2022-01-03 .. 2022-06-30 are sealed (seal 1a2b3c4d, from 2022-01-01
    on, made 2024-05-01; 6 tickers); these days have been unsealed 2 time(s) so far"."""
    period = f"from {entry['from']} to {entry['to']}" if entry["to"] else f"from {entry['from']} on"
    return (
        f"{entry['first']} .. {entry['last']} are sealed (seal {entry['seal']}, {period}, made {entry['sealed_on']}; "
        f"{entry['tickers']} tickers); these days have been unsealed {entry['unsealed']} time(s) so far"
    )


def guard(
    ledger: Ledger, data: MarketData, first: str, last: str, *, unseal: bool, command: str, look: str, what: str
) -> list[dict[str, Any]]:
    """Refuse to trade sealed days unless ``unseal``; with it, record the unseal. Call before trading anything.

    :param data: the market data loaded for the command; ``first`` .. ``last`` (``YYYY-MM-DD``) the days it trades.
    :param command: "study", "backtest" or "compare" (for the record).
    :param look: what makes this look distinct (a study's key, a checkpoint's hash and period): unsealing the same
        look twice counts once.
    :param what: a human name for it (the study folder, the checkpoint).
    :return: `holdout_summary` of those days (empty when no seal covers them).
    :raises UserError: sealed days and no ``unseal``; the ledger not writable.
    """
    hits = sealed_hits(ledger, market_witness(data), first, last)
    if not hits:
        return []
    if not unseal:
        h = hits[0]
        period = f"{h.seal['from']} .." + (f" {h.seal['to']}" if h.seal["to"] else "")
        raise UserError(
            f"{h.first} .. {h.last} of this data are sealed (seal {h.seal['id']}: {period}, made "
            f"{h.seal['time'][:10]}); pass --unseal to trade them anyway, which {ledger.path} records"
        )
    ledger.append(
        record(
            "unseal",
            _digest("unseal", h.seal["key"], look),
            seal=h.seal["key"],
            seal_id=h.seal["id"],
            command=command,
            what=what,
            look=look,
            first=h.first,
            last=h.last,
        )
        for h in hits
    )
    return holdout_summary(ledger, data, first, last)
