"""Sending a plan: client order ids, sells then buys, waiting for fills, recovering lost answers, re-runs.

The client order id (`client_order_id`) is the idempotency key: Alpaca refuses an id it has seen before, so every
order is looked up by id before it is sent and after an answer is lost (`_send_one`), and running the command again
on the same day sends exactly the orders that did not go out. docs/trading.md "Safety" tells the whole protocol
with the lines a user sees.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

from clstm_ppo.trading.broker import FINAL_STATUSES, Broker, OrderState, Refused, Unreachable, shares_text
from clstm_ppo.trading.decision import PlannedOrder
from clstm_ppo.trading.journal import Journal

ID_PREFIX = "cp"
MAX_ID_LENGTH = 128  # Alpaca's limit on client_order_id
SETTLED_OUTCOMES = frozenset({"refused", "not_sent"})  # nothing at the broker to reconcile

Say = Callable[[str], None]


def run_tag(name: str) -> str:
    """``<slug>-<hash6>`` for a run name: readable in Alpaca's order list, distinct for distinct names."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:24].strip("-") or "run"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:6]}"


def client_order_id(tag: str, day: date, ticker: str) -> str:
    """``cp-<tag>-<YYYYMMDD>-<TICKER>``: the order id of ``ticker`` on session ``day`` for the run ``tag`` (`run_tag`).

    At most 60 characters (Alpaca allows 128). The side is left out on purpose: one id per (run, day, ticker), so
    a strategy sends at most one order per ticker per session whatever happens between two runs.
    """
    symbol = re.sub(r"[^A-Za-z0-9.]", ".", ticker.upper())[:16]
    cid = f"{ID_PREFIX}-{tag}-{day:%Y%m%d}-{symbol}"
    assert len(cid) <= MAX_ID_LENGTH
    return cid


@dataclass
class OrderOutcome:
    """What happened to one planned order when sending."""

    order: PlannedOrder
    client_order_id: str
    outcome: str  # sent | already_sent | refused | unknown | not_sent
    state: OrderState | None = None
    message: str = ""


def describe(o: OrderOutcome) -> str:
    """One line: "AAPL sell 19: sent (accepted)", "MSFT buy 5: refused: ...", ..."""
    head = f"{o.order.ticker} {o.order.side} {shares_text(o.order.shares)}"
    if o.outcome in ("refused", "unknown", "not_sent"):
        return f"{head}: {o.outcome.replace('_', ' ')}: {o.message}"
    return f"{head}: {o.outcome.replace('_', ' ')}" + (f" ({o.state.status})" if o.state else "")


def send_orders(
    broker: Broker, planned: list[tuple[PlannedOrder, str]], journal: Journal, say: Say, *, day: str
) -> list[OrderOutcome]:
    """Send ``planned`` ((order, client id), sells first) one by one, journaling each outcome as it happens.

    Sells go first as the rule assumed their proceeds; after the close they do not fill before the next open, so on
    an account without margin a buy that needs them may be refused for buying power: reported, and not retried
    differently on a re-run that day (the next session starts from the filled account). A refusal is one line and
    the batch goes on; bad keys (`KeysRejected`) stop everything; an "unknown" outcome stops the rest as "not_sent".
    """
    outcomes: list[OrderOutcome] = []
    stopped = ""
    for order, cid in planned:
        if stopped:
            result = OrderOutcome(order, cid, "not_sent", message=stopped)
        else:
            result = _send_one(broker, order, cid)
            if result.outcome == "unknown":
                stopped = f"not sent: the batch stopped after {order.ticker} lost contact with the broker"
        outcomes.append(result)
        state = result.state.to_json() if result.state else {}
        journal.record(
            "order",
            day=day,
            client_order_id=cid,
            ticker=order.ticker,
            side=order.side,
            qty=order.shares,
            outcome=result.outcome,
            message=result.message or None,
            status=state.get("status"),
            order_id=state.get("order_id"),
        )
        if result.outcome in ("refused", "unknown", "not_sent"):
            say(describe(result))
    return outcomes


def _send_one(broker: Broker, order: PlannedOrder, cid: str) -> OrderOutcome:
    """Send ``order`` under the id ``cid`` at most once, whatever answers are lost.

    Found by its id before sending -> "already_sent" (an earlier run, or the attempt whose answer was lost). A
    submit answered 422 "client_order_id must be unique" (alpaca-py's retry of a POST that a gateway answered 504
    after the order landed), or with no usable answer (timeout, dropped connection, 5xx), is looked up: found ->
    "sent"; not found -> sent once more with the same id (a duplicate would be refused, never doubled); the lookup
    failing too -> "unknown", and `send_orders` stops the batch.
    """
    try:
        existing = broker.find_order(cid)
    except Unreachable as err:
        return OrderOutcome(order, cid, "unknown", message=f"{err} (before sending; re-run to check)")
    if existing is not None:
        return OrderOutcome(order, cid, "already_sent", existing)
    problem = ""
    for attempt in (1, 2):
        try:
            state = broker.submit_market(order.ticker, order.side, order.shares, cid)
            note = f"first attempt: {problem}; not at the broker, sent again with the same id" if problem else ""
            return OrderOutcome(order, cid, "sent", state, message=note)
        except Refused as err:
            if not err.duplicate:
                return OrderOutcome(order, cid, "refused", message=f"{err.detail or 'refused'} (HTTP {err.status})")
            problem = f"{err}"
        except Unreachable as err:
            problem = f"{err}"
        # No usable answer, or "id already used": does the broker hold the order?
        try:
            found = broker.find_order(cid)
        except Unreachable as err:
            return OrderOutcome(
                order,
                cid,
                "unknown",
                message=f"{problem}; the lookup by client id failed too ({err}); re-run to find out and continue",
            )
        if found is not None:
            return OrderOutcome(order, cid, "sent", found, message=f"answer lost ({problem}); found by client id")
        if attempt == 2:
            return OrderOutcome(order, cid, "unknown", message=f"{problem}, twice; re-run to try again")
    raise AssertionError("unreachable")


def wait_for_fills(
    broker: Broker,
    outcomes: list[OrderOutcome],
    journal: Journal,
    say: Say,
    *,
    day: str,
    wait_seconds: float,
    poll_seconds: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, OrderState]:
    """Poll the sent orders until all are final or ``wait_seconds`` pass; journal the state each reached.

    Orders sent after the close stay "accepted" (queued) until the next open, so the wait ends at once when every
    open order is; the next run's `reconcile` journals their fills.

    :return: client id -> last state seen, for the orders that are at the broker.
    """
    states = {
        o.client_order_id: o.state for o in outcomes if o.outcome in ("sent", "already_sent") and o.state is not None
    }
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    pending = {cid for cid, s in states.items() if not s.final}
    while pending and time.monotonic() < deadline and any(states[c].status != "accepted" for c in pending):
        sleep(min(poll_seconds, max(deadline - time.monotonic(), 0.0)))
        try:
            for cid in sorted(pending):
                found = broker.find_order(cid)
                if found is not None:
                    states[cid] = found
                    if found.final:
                        pending.discard(cid)
        except Unreachable as err:
            say(f"stopped waiting for fills: {err}; the next run records them")
            break
    for state in states.values():
        journal.record("order_status", day=day, **state.to_json())
    return states


def reconcile(broker: Broker, journal: Journal) -> list[OrderState]:
    """Look up every journaled order whose last known state was not final; journal what changed.

    Run at the start of each decision, so yesterday's orders (sent after the close, filled at today's open)
    get their fills into the journal. An "unknown" order the broker does not know is journaled "not_found".
    """
    last: dict[str, dict] = {}
    for event in journal.events():
        cid = event.get("client_order_id")
        if cid and event.get("event") in ("order", "order_status"):
            last[cid] = event
    changed = []
    for cid, event in last.items():
        if event.get("outcome") in SETTLED_OUTCOMES or event.get("status") in (*FINAL_STATUSES, "not_found"):
            continue
        found = broker.find_order(cid)
        if found is None:
            if event.get("outcome") == "unknown":
                journal.record(
                    "order_status",
                    day=event.get("day"),
                    client_order_id=cid,
                    ticker=event.get("ticker"),
                    side=event.get("side"),
                    status="not_found",
                )
            continue
        if found.status != event.get("status") or found.filled_qty != event.get("filled_qty"):
            journal.record("order_status", day=event.get("day"), **found.to_json())
            changed.append(found)
    return changed
