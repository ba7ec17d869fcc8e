"""`clstm-ppo trade`: one decision for the session that just closed, shown, journaled and (with ``submit``) sent.

The order of the steps is the order of the checks, so that nothing is sent unless everything before it held:
1. everything local, before the first request (docs/trading.md "Local checks first"); 2. the broker's clock and
calendar (`clstm_ppo.trading.schedule`); 3. orders journaled earlier and not yet final are looked up; 4. bars
through today's session, the checkpoint's market, the account and positions (tickers the checkpoint does not know
are left alone); 5. the decision (`clstm_ppo.trading.decision`), printed and journaled with the day's equity row;
6. with ``submit``: the orders, sells first, then a wait for fills (`clstm_ppo.trading.orders`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from clstm_ppo.evaluation.backtest import open_members, restore_acting
from clstm_ppo.trading.broker import Account, Broker, Endpoint, Position, calendar_window, resolve_endpoint
from clstm_ppo.trading.decision import Decision, check_tradable, decide, load_trading_market, replay_days
from clstm_ppo.trading.journal import Journal
from clstm_ppo.trading.orders import (
    OrderOutcome,
    client_order_id,
    describe,
    reconcile,
    run_tag,
    send_orders,
    wait_for_fills,
)
from clstm_ppo.trading.schedule import NoSessionToday, decision_session
from envs.alpaca import load_credentials, redact_url
from envs.errors import UserError
from envs.features import PreparedMarket
from envs.text import money, text_table

Say = Callable[[str], None]


@dataclass
class TradeOptions:
    """The command's settings (see `clstm_ppo.cli.trade` for each flag's help)."""

    checkpoint: str | list[str]  # several: an ensemble acting on the mean of their target weights
    submit: bool = False
    live: bool = False
    confirm_live: bool = False
    journal: str | None = None
    replay_start: str | None = None
    history_start: str | None = None
    wait_seconds: float = 10.0
    poll_seconds: float = 1.0
    order_tag: str | None = None
    trading_url: str | None = None
    data_url: str | None = None
    data_cache_dir: str | None = None
    device: str = "cpu"
    features: str | None = None  # a file of the feature columns the policy reads (Alpaca's bars hold none)


@dataclass
class TradeResult:
    """What a run did; ``problems`` counts orders refused, unknown or not sent (exit status 2 when > 0)."""

    decision: Decision | None
    outcomes: list[OrderOutcome]
    journal: Path
    problems: int = 0


def default_journal(checkpoint: Path, endpoint: Endpoint, members: int = 1) -> Path:
    """``trading-paper/`` (or ``trading-live/``) next to the checkpoint; for an ensemble of ``members``
    checkpoints, ``trading-paper-ensemble<members>/`` next to the first one (its own journal and order ids)."""
    return checkpoint.parent / (f"trading-{endpoint.label}" + (f"-ensemble{members}" if members > 1 else ""))


def run_trade(opts: TradeOptions, say: Say = print) -> TradeResult:
    """Run the steps of the module docstring; `UserError` (one line) for anything that stops the run."""
    if opts.wait_seconds < 0 or opts.poll_seconds <= 0:
        raise UserError("--wait_seconds must be >= 0 and --poll_seconds > 0")
    endpoint = resolve_endpoint(live=opts.live, confirm_live=opts.confirm_live, url=opts.trading_url)
    paths = [opts.checkpoint] if isinstance(opts.checkpoint, str | Path) else list(opts.checkpoint)
    cks = open_members(paths)
    ck = cks[0]  # the members share its market and env settings (open_members)
    for member in cks:
        check_tradable(
            member,
            replay_start=opts.replay_start,
            history_start=opts.history_start,
            data_url=opts.data_url,
            features=opts.features,
        )
    name = opts.order_tag or ck.cfg.run.run_name or ck.path.resolve().parent.name
    tag = run_tag(name if len(cks) == 1 else f"{name}-ensemble{len(cks)}")
    folder = Path(opts.journal) if opts.journal else default_journal(ck.path, endpoint, len(cks))
    traded = "+".join(str(c.path) for c in cks)
    journal = Journal(folder, run=tag, endpoint=endpoint.label, mode="submit" if opts.submit else "dry_run")
    creds = load_credentials()
    journal.create_folder()
    broker = Broker(creds, endpoint)

    # The first request: everything above was checked without the network.
    now = broker.clock()
    try:
        session = decision_session(now, broker.sessions(*calendar_window(now)))
    except NoSessionToday as why:
        say(f"no trade: {why}")
        journal.record("skipped", day=now.date().isoformat(), reason=str(why))
        return TradeResult(None, [], folder)
    day = session.day.isoformat()
    for state in reconcile(broker, journal):
        say(
            f"earlier order {state.client_order_id}: {state.status}, filled {state.filled_qty:g} of {state.qty:g}"
            + (f" at ${state.filled_avg_price:,.2f}" if state.filled_avg_price else "")
        )

    market = load_trading_market(
        ck,
        session.day,
        history_start=opts.history_start,
        data_url=opts.data_url,
        cache_dir=opts.data_cache_dir,
        features=opts.features,
    )
    days = replay_days(ck, market, opts.replay_start)
    account, shares, unknown = _holdings(broker, endpoint, market, submit=opts.submit)

    model = restore_acting(cks, market, torch.device(opts.device))
    decision = decide(ck, model, market, days, cash=account.cash, shares=shares, device=opts.device)
    ids = [client_order_id(tag, session.day, o.ticker) for o in decision.orders]
    _journal_decision(journal, day, traded, account, unknown, decision, ids)

    for line in plan_lines(decision, account, unknown, traded, endpoint, days.stop - days.start, opts.submit):
        say(line)
    if not opts.submit or not decision.orders:
        if decision.orders:
            say(
                f"dry run: nothing sent (add --submit to send these {len(decision.orders)} orders to the "
                f"{endpoint.label} account); journal: {journal.trades_path}"
            )
        else:
            say(f"no orders today; journal: {journal.trades_path}")
        return TradeResult(decision, [], folder)

    outcomes, problems = _send(broker, decision, ids, journal, say, day=day, opts=opts)
    return TradeResult(decision, outcomes, folder, problems)


def _holdings(
    broker: Broker, endpoint: Endpoint, market: PreparedMarket, *, submit: bool
) -> tuple[Account, np.ndarray, dict[str, Position]]:
    """The account, its [N] shares of the market's tickers, and its positions in other symbols; refuses an
    account that cannot trade (when submitting) or holds a short position in the universe."""
    account = broker.account()
    positions = broker.positions()
    if submit and (account.blocked or account.status.upper() not in ("ACTIVE", "")):
        raise UserError(
            f"the {endpoint.label} account {account.number} cannot trade (status {account.status}, "
            "trading or account blocked); nothing was sent"
        )
    tickers = [str(t) for t in market.data.tickers]
    shorts = [s for s, p in positions.items() if s in tickers and p.qty < 0]
    if shorts:
        raise UserError(
            f"the account is short {', '.join(shorts)}; the policy trades long only: close the short "
            "positions first; nothing was sent"
        )
    shares = np.array([positions[t].qty if t in positions else 0.0 for t in tickers], dtype=np.float64)
    unknown = {s: p for s, p in positions.items() if s not in tickers}
    return account, shares, unknown


def _journal_decision(
    journal: Journal,
    day: str,
    checkpoint: str,
    account: Account,
    unknown: dict[str, Position],
    decision: Decision,
    ids: list[str],
) -> None:
    """Journal the day's decision (the checkpoint, account, positions, the decision and its plan with client order
    ids) and the account's equity next to the backtest's."""
    journal.record(
        "decision",
        day=day,
        checkpoint=checkpoint,
        account={k: getattr(account, k) for k in ("number", "cash", "equity", "buying_power")},
        positions={t: float(q) for t, q in zip(decision.tickers, decision.shares, strict=True) if q},
        unknown_positions={s: p.qty for s, p in unknown.items()},
        **{k: v for k, v in decision.to_json().items() if k != "day"},
        plan=[
            {
                "ticker": o.ticker,
                "side": o.side,
                "shares": o.shares,
                "price": o.price,
                "value": o.value,
                "reason": o.reason,
                "client_order_id": cid,
            }
            for o, cid in zip(decision.orders, ids, strict=True)
        ],
    )
    journal.put_equity(
        day,
        equity=account.equity,
        cash=account.cash,
        long_market_value=account.long_market_value,
        backtest_value=decision.backtest_value,
    )


def _send(
    broker: Broker, decision: Decision, ids: list[str], journal: Journal, say: Say, *, day: str, opts: TradeOptions
) -> tuple[list[OrderOutcome], int]:
    """Send the plan's orders, wait for their fills, say each one and a summary: the outcomes and how many
    orders did not go out."""
    outcomes = send_orders(broker, list(zip(decision.orders, ids, strict=True)), journal, say, day=day)
    states = wait_for_fills(
        broker, outcomes, journal, say, day=day, wait_seconds=opts.wait_seconds, poll_seconds=opts.poll_seconds
    )
    for o in outcomes:
        o.state = states.get(o.client_order_id, o.state)
        if o.outcome in ("sent", "already_sent"):
            say(describe(o) + _fill_text(o))
    problems = sum(o.outcome in ("refused", "unknown", "not_sent") for o in outcomes)
    went = sum(o.outcome == "sent" for o in outcomes)
    before = sum(o.outcome == "already_sent" for o in outcomes)
    summary = f"sent {went} of {len(outcomes)} orders"
    if before:
        summary += f", {before} already sent by an earlier run (not sent again)"
    if problems:
        summary += (
            f"; {problems} did not go out (see above): run the same command again today to send what is "
            "missing -- orders already at the broker are recognised by their client ids"
        )
    say(f"{summary}; journal: {journal.trades_path}")
    return outcomes, problems


def _fill_text(o: OrderOutcome) -> str:
    s = o.state
    if s is None:
        return ""
    if s.filled_qty > 0:
        price = f" at ${s.filled_avg_price:,.2f}" if s.filled_avg_price else ""
        return f", filled {s.filled_qty:g} of {s.qty:g}{price} (decision price ${o.order.price:,.2f})"
    if s.status in ("accepted", "new", "pending_new"):
        return ", not filled yet (orders sent after the close fill at the next open)"
    return ""


def plan_lines(
    d: Decision,
    account: Account,
    unknown: dict[str, Position],
    ck_path: str,
    endpoint: Endpoint,
    days: int,
    submit: bool,
) -> list[str]:
    """The plan as the console shows it: a header, the orders table, what is left alone (``unknown``: the positions in
    symbols the checkpoint does not know); ``days`` replayed."""
    mode = "submit" if submit else "dry run"
    lines = [
        f"trade {d.day.isoformat()} (after the close) | {ck_path} | {endpoint.label} account {account.number} at "
        f"{redact_url(endpoint.url)} | {mode}",
        f"account: equity {money(account.equity)} | cash {money(d.cash)} | buying power "
        f"{money(account.buying_power)} | backtest replay from {d.replay_start.isoformat()} ({days} days): value "
        f"{money(d.backtest_value)}",
    ]
    threshold = f"{d.threshold:.2f}" if np.isfinite(d.threshold) else "off"
    lines.append(
        f"turbulence {d.turbulence:.2f} (threshold {threshold})"
        + (": turbulent day, sell everything, buy nothing" if d.turbulent else "")
    )
    lines += [f"note: {n}" for n in d.notes]
    if d.orders:
        header = ("ticker", "side", "shares", "last price", "value", "reason")
        rows = [(o.ticker, o.side, f"{o.shares:g}", money(o.price), money(o.value), o.reason) for o in d.orders]
        lines += text_table([header, *rows], "llrrrl")
        lines.append(f"expected after the orders at the close: cash {money(d.cash_after)}, costs {money(d.costs)}")
    if unknown:
        held = ", ".join(f"{s} {p.qty:g} shares ({money(p.market_value)})" for s, p in sorted(unknown.items()))
        lines.append(f"left alone (not among the checkpoint's tickers): {held}")
    return lines
