"""A local HTTP server speaking Alpaca's trading REST protocol to alpaca-py's ``TradingClient`` (test helper).

Endpoints (all under /v2, keys in the APCA-API-KEY-ID / APCA-API-SECRET-KEY headers), with bodies shaped as
alpaca-py 0.44 parses them (alpaca/trading/models.py: TradeAccount, Position, Order, Clock, Calendar, Asset):

    GET    /v2/account                       account: cash, buying_power, equity, ... (numbers as strings)
    GET    /v2/positions                     open positions, by symbol
    GET    /v2/positions/{symbol|asset_id}   404 {"code": 40410000, "message": "position does not exist"}
    POST   /v2/orders                        market orders only (qty, not notional); validated as below
    GET    /v2/orders                        status=open|closed|all, limit, after, until, direction, symbols, side
    GET    /v2/orders/{id}                   404 {"code": 40410000, ...} when unknown
    GET    /v2/orders:by_client_order_id     ?client_order_id=...; 404 when unknown
    DELETE /v2/orders/{id}                   204 no body; 422 when already closed; 404 when unknown
    GET    /v2/clock                         from the ``now`` knob and the calendar
    GET    /v2/calendar                      ?start=YYYY-MM-DD&end=YYYY-MM-DD; weekdays minus ``holidays``
    GET    /v2/assets/{symbol|asset_id}      404 {"code": 40410000, "message": "asset not found for X"}

Order validation, in this order (codes as Alpaca answers them; see docs/alpaca-trading-protocol.md for which
were seen on the real API and which are best knowledge): missing field / bad client_order_id -> 422 40010001;
duplicate client_order_id (any earlier order, even canceled) -> 422 40010001 "client_order_id must be unique";
qty <= 0 -> 422; unknown symbol -> 422 42210000 'asset "X" not found'; inactive -> 422 40010001; not tradable
-> 422 42210000; fractional qty on a non-fractionable asset, or fractional and not a day order -> 422 42210000;
buy costing more than buying power (cash minus open buy orders at the last price) -> 403 40310000
"insufficient buying power"; sell of more than held minus open sells -> 403 40310000 "insufficient qty
available for order (requested: Q, available: A)". No shorting is simulated.

Fill model, per order, advanced whenever the order is read (GET by id, by client id, or in a list; each read
while the market is open is a "poll"): ``fill_mode[symbol]`` (else ``default_fill_mode``) is "fill" (all at
``fill_prices[symbol]``, else ``prices[symbol]``, on poll number ``fill_after_polls``; 0 = already filled in the
POST answer), "partial" (``partial_fraction`` of the qty, status partially_filled; the rest fills
``partial_completes_after_polls`` polls later if that is set), "reject" (status rejected) or "never" (stays
new). Fills move cash (less ``commission`` per fill) and positions (qty, avg entry price, cost basis; marked at
``prices``). An order placed while the market is closed is answered "accepted" and waits, untouched, until a
read after the clock (``now``; see ``set_now``/``advance``) reaches an open session, unless
``fill_when_closed``.

Fault knobs: ``fail_429`` (answer ``fail_status``, 429 by default, that many times first, with a Retry-After
header when ``retry_after`` is set); ``hang`` = (method, path, n): the n-th such request gets no answer for
``hang_seconds`` -- "processed" (``hang_mode``, default: handled at once, the answer held back) or "lost" (never
handled; the connection is closed after the wait); ``drop_after_orders`` = K: once K orders were accepted, the
next accepted order is stored but its connection is closed without an answer (or answered ``drop_status``, e.g.
504, when that is set); one drop, then the knob clears itself. Every request is recorded (method, path, query,
JSON body, headers without the secret, answered status).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from datetime import time as clock_time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from zoneinfo import ZoneInfo

try:  # tests/ is a package in this repo; plain rootdir-relative import if it ever is not
    from tests.alpaca_server import LocalHTTPServer
except ImportError:
    from alpaca_server import LocalHTTPServer

NY = ZoneInfo("America/New_York")

# Auth answers. Wrong keys: HTTP 401 with Alpaca's code (alpaca-py issue #519, alpaca-java #156). No key headers
# at all: the gateway's bare 403 {"message": "forbidden."} (Alpaca-API issue #228) -- a body without "code".
UNAUTHORIZED = {"code": 40110000, "message": "request is not authorized"}
FORBIDDEN = {"message": "forbidden."}
RATE_LIMITED = {"code": 42910000, "message": "rate limit exceeded"}
POSITION_NOT_FOUND = {"code": 40410000, "message": "position does not exist"}
DUPLICATE_CLIENT_ORDER_ID = {"code": 40010001, "message": "client_order_id must be unique"}

CLOSED_STATUSES = frozenset({"filled", "canceled", "expired", "rejected", "replaced"})
FILL_MODES = ("fill", "partial", "reject", "never")
TIME_IN_FORCE = ("day", "gtc", "opg", "cls", "ioc", "fok")

# NYSE full-day closures and 13:00 early closes, 2024-2025 (2025-01-09: national day of mourning).
NYSE_HOLIDAYS = frozenset(
    "2024-01-01 2024-01-15 2024-02-19 2024-03-29 2024-05-27 2024-06-19 2024-07-04 2024-09-02 2024-11-28 2024-12-25".split()
    + "2025-01-01 2025-01-09 2025-01-20 2025-02-17 2025-04-18 2025-05-26 2025-06-19 2025-07-04 2025-09-01 2025-11-27 2025-12-25".split()
)
NYSE_EARLY_CLOSES = dict.fromkeys("2024-07-03 2024-11-29 2024-12-24 2025-07-03 2025-11-28 2025-12-24".split(), "13:00")
EPS = 1e-9


def num(x: float) -> str:
    """A quantity or amount as Alpaca writes it: a decimal string, at most 9 places, no trailing zeros."""
    if abs(x) < EPS:
        return "0"
    return f"{x:.9f}".rstrip("0").rstrip(".")


def utc_stamp(when: datetime) -> str:
    """RFC 3339 in UTC with microseconds, as Alpaca stamps orders: 2024-01-03T15:00:00.000000Z."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class AssetSpec:
    """One asset as GET /v2/assets/{symbol} describes it."""

    symbol: str
    tradable: bool = True
    fractionable: bool = True
    status: str = "active"
    exchange: str = "NASDAQ"
    marginable: bool = True
    shortable: bool = True
    easy_to_borrow: bool = True
    name: str = ""

    @property
    def id(self) -> str:
        """A stable asset id (UUID derived from the symbol), so positions and orders agree on it."""
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"alpaca-test-asset:{self.symbol}"))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "class": "us_equity",
            "exchange": self.exchange,
            "symbol": self.symbol,
            "name": self.name or f"{self.symbol} Inc. Common Stock",
            "status": self.status,
            "tradable": self.tradable,
            "marginable": self.marginable,
            "maintenance_margin_requirement": 30,
            "margin_requirement_long": "30",
            "margin_requirement_short": "100",
            "shortable": self.shortable,
            "easy_to_borrow": self.easy_to_borrow,
            "fractionable": self.fractionable,
            "attributes": [],
        }


@dataclass
class Holding:
    """A long position: share count and total cost (average entry price = cost_basis / qty)."""

    qty: float
    cost_basis: float

    @classmethod
    def at(cls, qty: float, price: float) -> Holding:
        """``qty`` shares bought at ``price`` each."""
        return cls(qty, qty * price)


@dataclass
class SimOrder:
    """The server's record of one order; ``to_json`` is what the API answers."""

    id: str
    client_order_id: str
    symbol: str
    asset_id: str
    side: str
    qty: float
    time_in_force: str
    extended_hours: bool
    submitted_at: datetime
    expires_at: datetime | None
    seq: int
    status: str = "new"
    updated_at: datetime | None = None
    filled_at: datetime | None = None
    canceled_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    filled_qty: float = 0.0
    filled_avg_price: float | None = None
    polls: int = 0
    partial_at_poll: int | None = None

    @property
    def remaining(self) -> float:
        return max(self.qty - self.filled_qty, 0.0)

    @property
    def is_open(self) -> bool:
        return self.status not in CLOSED_STATUSES

    def to_json(self) -> dict[str, Any]:
        def stamp(when: datetime | None) -> str | None:
            return utc_stamp(when) if when else None

        return {
            "id": self.id,
            "client_order_id": self.client_order_id,
            "created_at": stamp(self.submitted_at),
            "updated_at": stamp(self.updated_at or self.submitted_at),
            "submitted_at": stamp(self.submitted_at),
            "filled_at": stamp(self.filled_at),
            "expired_at": stamp(self.expired_at),
            "canceled_at": stamp(self.canceled_at),
            "failed_at": stamp(self.failed_at),
            "replaced_at": None,
            "replaced_by": None,
            "replaces": None,
            "asset_id": self.asset_id,
            "symbol": self.symbol,
            "asset_class": "us_equity",
            "notional": None,
            "qty": num(self.qty),
            "filled_qty": num(self.filled_qty),
            "filled_avg_price": None if self.filled_avg_price is None else num(self.filled_avg_price),
            "order_class": "",
            "order_type": "market",
            "type": "market",
            "side": self.side,
            "position_intent": "buy_to_open" if self.side == "buy" else "sell_to_close",
            "time_in_force": self.time_in_force,
            "limit_price": None,
            "stop_price": None,
            "status": self.status,
            "extended_hours": self.extended_hours,
            "legs": None,
            "trail_percent": None,
            "trail_price": None,
            "hwm": None,
            "expires_at": stamp(self.expires_at),
        }


def _default_now() -> datetime:
    return datetime(2024, 1, 3, 10, 0, tzinfo=NY)  # a Wednesday, 30 minutes into the session


@dataclass
class TradingState:
    """What the server knows and what it saw; tests edit the knobs between requests (under ``lock``)."""

    key: str
    secret: str
    # account and market
    cash: float = 100_000.0
    prices: dict[str, float] = field(default_factory=dict)  # last trade price per symbol; marks positions
    lastday_prices: dict[str, float] = field(default_factory=dict)  # previous close; default: ``prices``
    assets: dict[str, AssetSpec] = field(default_factory=dict)  # default: a plain asset per priced symbol
    positions: dict[str, Holding] = field(default_factory=dict)
    account_number: str = "PA3TESTSRV01"
    account_id: str = "1d5c3c2e-6a8b-4f7e-9d0a-2b3c4d5e6f70"
    last_equity: float | None = None  # default: equity when the state is made
    trading_blocked: bool = False  # reported in the account only
    commission: float = 0.0  # dollars per fill, taken from cash
    # fills
    default_fill_mode: str = "fill"
    fill_mode: dict[str, str] = field(default_factory=dict)
    fill_prices: dict[str, float] = field(default_factory=dict)
    fill_after_polls: int = 0
    partial_fraction: float = 0.5
    partial_completes_after_polls: int | None = None
    fill_when_closed: bool = False
    # clock and calendar
    now: datetime = field(default_factory=_default_now)
    market_open: bool | None = None  # forces the clock's is_open; None: from ``now`` and the calendar
    holidays: set[str] = field(default_factory=lambda: set(NYSE_HOLIDAYS))
    early_closes: dict[str, str] = field(default_factory=lambda: dict(NYSE_EARLY_CLOSES))
    # faults
    fail_429: int = 0
    fail_status: int = 429
    retry_after: float | None = None
    hang: tuple[str, str, int] | None = None
    hang_mode: str = "processed"
    hang_seconds: float = 5.0
    drop_after_orders: int | None = None
    drop_status: int | None = None
    # records
    orders: list[SimOrder] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    release: threading.Event = field(default_factory=threading.Event)  # ends hangs at shutdown

    def __post_init__(self) -> None:
        for symbol in self.prices:
            self.assets.setdefault(symbol, AssetSpec(symbol))
        if self.last_equity is None:
            self.last_equity = self.cash + sum(
                h.qty * self.lastday_prices.get(s, self.prices.get(s, 0.0)) for s, h in self.positions.items()
            )

    # ------------------------------------------------------------------------------------ clock and calendar

    def session(self, day: date) -> tuple[datetime, datetime] | None:
        """(open, close) of the regular session on ``day`` in New York, or None when the market is shut."""
        if day.weekday() >= 5 or day.isoformat() in self.holidays:
            return None
        hours, minutes = (int(p) for p in self.early_closes.get(day.isoformat(), "16:00").split(":"))
        return (
            datetime.combine(day, clock_time(9, 30), tzinfo=NY),
            datetime.combine(day, clock_time(hours, minutes), tzinfo=NY),
        )

    def _sessions_from(self, day: date) -> Any:
        for offset in range(370):
            found = self.session(day + timedelta(days=offset))
            if found:
                yield found

    def market_is_open(self) -> bool:
        if self.market_open is not None:
            return self.market_open
        now = self.now.astimezone(NY)
        today = self.session(now.date())
        return bool(today and today[0] <= now < today[1])

    def clock(self) -> dict[str, Any]:
        now = self.now.astimezone(NY)
        next_open = next(o for o, _ in self._sessions_from(now.date()) if o > now)
        next_close = next(c for _, c in self._sessions_from(now.date()) if c > now)
        # Alpaca's clock timestamp carries nanoseconds; next_open/next_close whole seconds.
        stamp = now.isoformat(timespec="microseconds")
        return {
            "timestamp": stamp[:26] + "000" + stamp[26:],
            "is_open": self.market_is_open(),
            "next_open": next_open.isoformat(),
            "next_close": next_close.isoformat(),
        }

    def calendar(self, start: date, end: date) -> list[dict[str, str]]:
        out = []
        day = start
        while day <= end:
            found = self.session(day)
            if found:
                settle = next(o for o, _ in self._sessions_from(day + timedelta(days=1)))
                early = found[1].hour < 16
                out.append(
                    {
                        "date": day.isoformat(),
                        "open": found[0].strftime("%H:%M"),
                        "close": found[1].strftime("%H:%M"),
                        "session_open": "0400",
                        "session_close": "1700" if early else "2000",
                        "settlement_date": settle.date().isoformat(),
                    }
                )
            day += timedelta(days=1)
        return out

    # ------------------------------------------------------------------------------------ account

    def buying_power(self) -> float:
        """Cash less what open buy orders would cost at the last price (a multiplier-1 account)."""
        reserved = sum(
            o.remaining * self.prices.get(o.symbol, 0.0) for o in self.orders if o.is_open and o.side == "buy"
        )
        return max(self.cash - reserved, 0.0)

    def held_for_orders(self, symbol: str) -> float:
        return sum(o.remaining for o in self.orders if o.is_open and o.side == "sell" and o.symbol == symbol)

    def account(self) -> dict[str, Any]:
        long_value = sum(h.qty * self.prices.get(s, 0.0) for s, h in self.positions.items())
        equity = self.cash + long_value
        power = num(self.buying_power())
        return {
            "id": self.account_id,
            "account_number": self.account_number,
            "status": "ACTIVE",
            "crypto_status": "INACTIVE",
            "currency": "USD",
            "buying_power": power,
            "regt_buying_power": power,
            "daytrading_buying_power": "0",
            "effective_buying_power": power,
            "non_marginable_buying_power": power,
            "options_buying_power": power,
            "bod_dtbp": "0",
            "cash": num(self.cash),
            "accrued_fees": "0",
            "pending_transfer_in": "0",
            "pending_transfer_out": "0",
            "portfolio_value": num(equity),
            "pattern_day_trader": False,
            "trading_blocked": self.trading_blocked,
            "transfers_blocked": False,
            "account_blocked": False,
            "created_at": "2023-06-01T14:00:00.000000Z",
            "trade_suspended_by_user": False,
            "multiplier": "1",
            "shorting_enabled": False,
            "equity": num(equity),
            "last_equity": num(self.last_equity or 0.0),
            "long_market_value": num(long_value),
            "short_market_value": "0",
            "position_market_value": num(long_value),
            "initial_margin": num(long_value),
            "maintenance_margin": num(0.3 * long_value),
            "last_maintenance_margin": "0",
            "sma": "0",
            "daytrade_count": 0,
            "balance_asof": (self.now.astimezone(NY).date() - timedelta(days=1)).isoformat(),
            "options_approved_level": 0,
            "options_trading_level": 0,
        }

    def position_json(self, symbol: str) -> dict[str, Any]:
        holding = self.positions[symbol]
        asset = self.assets.get(symbol, AssetSpec(symbol))
        price = self.prices.get(symbol, holding.cost_basis / holding.qty)
        lastday = self.lastday_prices.get(symbol, price)
        value = holding.qty * price
        pl = value - holding.cost_basis
        intraday = holding.qty * (price - lastday)
        return {
            "asset_id": asset.id,
            "symbol": symbol,
            "exchange": asset.exchange,
            "asset_class": "us_equity",
            "asset_marginable": asset.marginable,
            "qty": num(holding.qty),
            "avg_entry_price": num(holding.cost_basis / holding.qty),
            "side": "long",
            "market_value": num(value),
            "cost_basis": num(holding.cost_basis),
            "unrealized_pl": num(pl),
            "unrealized_plpc": num(pl / holding.cost_basis if holding.cost_basis else 0.0),
            "unrealized_intraday_pl": num(intraday),
            "unrealized_intraday_plpc": num(intraday / (holding.qty * lastday) if lastday else 0.0),
            "current_price": num(price),
            "lastday_price": num(lastday),
            "change_today": num(price / lastday - 1 if lastday else 0.0),
            "qty_available": num(holding.qty - self.held_for_orders(symbol)),
        }

    # ------------------------------------------------------------------------------------ orders

    def _fill(self, order: SimOrder, qty: float) -> None:
        """Execute ``qty`` more of ``order`` at the fill price: cash, position, order fields."""
        price = self.fill_prices.get(order.symbol, self.prices[order.symbol])
        holding = self.positions.get(order.symbol)
        if order.side == "buy":
            if holding is None:
                holding = self.positions[order.symbol] = Holding(0.0, 0.0)
            holding.qty += qty
            holding.cost_basis += qty * price
            self.cash -= qty * price
        else:
            assert holding is not None and holding.qty + EPS >= qty, "sell validated against the position"
            holding.cost_basis -= qty * holding.cost_basis / holding.qty
            holding.qty -= qty
            self.cash += qty * price
            if holding.qty < EPS:
                del self.positions[order.symbol]
        self.cash -= self.commission
        total = order.filled_qty + qty
        order.filled_avg_price = ((order.filled_avg_price or 0.0) * order.filled_qty + price * qty) / total
        order.filled_qty = total
        order.filled_at = order.updated_at = self.now
        order.status = "filled" if order.remaining < EPS else "partially_filled"

    def advance_order(self, order: SimOrder, poll: bool) -> None:
        """Move ``order`` along the fill model; ``poll``: this is a client's read of it."""
        if not order.is_open:
            return
        if not (self.market_is_open() or self.fill_when_closed):
            return  # placed or waiting while the market is shut: stays as it is
        if order.status == "accepted":
            order.status, order.updated_at = "new", self.now
        if poll:
            order.polls += 1
        if order.polls < self.fill_after_polls:
            return
        mode = self.fill_mode.get(order.symbol, self.default_fill_mode)
        if mode not in FILL_MODES:
            raise ValueError(f"fill mode {mode!r} is not one of {FILL_MODES}")
        if mode == "reject" and order.filled_qty < EPS:
            order.status, order.failed_at, order.updated_at = "rejected", self.now, self.now
        elif mode == "fill":
            self._fill(order, order.remaining)
        elif mode == "partial":
            if order.partial_at_poll is None:
                part = order.qty * self.partial_fraction
                if not self.assets[order.symbol].fractionable:
                    part = math.floor(part + EPS)
                if part > EPS:
                    self._fill(order, min(part, order.remaining))
                    order.partial_at_poll = order.polls
            elif (
                self.partial_completes_after_polls is not None
                and order.polls - order.partial_at_poll >= self.partial_completes_after_polls
            ):
                self._fill(order, order.remaining)

    def submit(self, body: Any) -> tuple[int, Any]:
        """POST /v2/orders: validate like Alpaca, then store and advance the order."""
        if not isinstance(body, dict):
            return 400, {"code": 40010000, "message": "request body format is invalid"}
        for name in ("symbol", "side", "type", "time_in_force"):
            if not body.get(name):
                return 422, {"code": 40010001, "message": f"{name} is required"}
        if body.get("notional") is not None:
            return 501, {"message": "notional orders are not simulated by the test server"}
        if body.get("qty") is None:
            return 422, {"code": 40010001, "message": "qty is required"}
        if body["type"] != "market" or body.get("order_class") not in (None, "", "simple"):
            return 501, {"message": "only simple market orders are simulated by the test server"}
        if body["side"] not in ("buy", "sell"):
            return 422, {"code": 40010001, "message": "invalid side"}
        if body["time_in_force"] not in TIME_IN_FORCE:
            return 422, {"code": 40010001, "message": "invalid time_in_force"}
        client_order_id = str(body.get("client_order_id") or uuid.uuid4())
        if len(client_order_id) > 128:
            return 422, {"code": 40010001, "message": "client_order_id must be no more than 128 characters"}
        if any(o.client_order_id == client_order_id for o in self.orders):
            return 422, dict(DUPLICATE_CLIENT_ORDER_ID)
        try:
            qty = float(body["qty"])
        except (TypeError, ValueError):
            return 422, {"code": 40010001, "message": "qty must be a number"}
        if not qty > 0 or not math.isfinite(qty):
            return 422, {"code": 42210000, "message": "qty must be > 0"}
        symbol = str(body["symbol"]).upper()
        asset = self.assets.get(symbol)
        if asset is None:
            return 422, {"code": 42210000, "message": f'asset "{symbol}" not found'}
        if asset.status != "active":
            return 422, {"code": 40010001, "message": f"asset {symbol} is not active"}
        if not asset.tradable:
            return 422, {"code": 42210000, "message": f'asset "{symbol}" is not tradable'}
        fractional = abs(qty - round(qty)) > EPS
        if fractional and not asset.fractionable:
            return 422, {"code": 42210000, "message": f'asset "{symbol}" is not fractionable'}
        if fractional and body["time_in_force"] != "day":
            return 422, {"code": 42210000, "message": "fractional orders must be DAY orders"}
        if symbol not in self.prices:
            return 500, {"message": f"test server misconfigured: no price for {symbol}"}
        if body["side"] == "buy":
            cost = qty * self.prices[symbol]
            power = self.buying_power()
            if cost > power + EPS:
                return 403, {
                    "buying_power": num(power),
                    "code": 40310000,
                    "cost_basis": num(cost),
                    "message": "insufficient buying power",
                }
        else:
            holding = self.positions.get(symbol)
            existing = holding.qty if holding else 0.0
            held = self.held_for_orders(symbol)
            available = max(existing - held, 0.0)
            if qty > available + EPS:
                related = [o.id for o in self.orders if o.is_open and o.side == "sell" and o.symbol == symbol]
                return 403, {
                    "available": num(available),
                    "code": 40310000,
                    "existing_qty": num(existing),
                    "held_for_orders": num(held),
                    "message": f"insufficient qty available for order (requested: {num(qty)}, "
                    f"available: {num(available)})",
                    "related_orders": related,
                    "symbol": symbol,
                }
        now = self.now.astimezone(NY)
        open_now = self.market_is_open() or self.fill_when_closed
        close = next((c for _, c in self._sessions_from(now.date()) if c > now), None)
        order = SimOrder(
            id=str(uuid.uuid4()),
            client_order_id=client_order_id,
            symbol=symbol,
            asset_id=asset.id,
            side=body["side"],
            qty=qty,
            time_in_force=body["time_in_force"],
            extended_hours=bool(body.get("extended_hours", False)),
            submitted_at=self.now,
            expires_at=close if body["time_in_force"] == "day" else None,
            seq=len(self.orders),
            status="new" if open_now else "accepted",
        )
        self.orders.append(order)
        self.advance_order(order, poll=False)
        return 200, order.to_json()

    def find_order(self, order_id: str) -> SimOrder | None:
        return next((o for o in self.orders if o.id == order_id), None)

    def list_orders(self, params: dict[str, str]) -> tuple[int, Any]:
        """GET /v2/orders with Alpaca's defaults: status=open, limit=50 (at most 500), direction=desc."""
        status = params.get("status", "open")
        if status not in ("open", "closed", "all"):
            return 422, {"code": 40010001, "message": "invalid status"}
        try:
            limit = min(int(params.get("limit", 50)), 500)
            after = datetime.fromisoformat(params["after"]) if "after" in params else None
            until = datetime.fromisoformat(params["until"]) if "until" in params else None
        except ValueError:
            return 422, {"code": 40010001, "message": "invalid limit, after or until"}
        symbols = {s.strip().upper() for s in params["symbols"].split(",")} if params.get("symbols") else None
        for order in self.orders:
            self.advance_order(order, poll=True)
        chosen = [
            o
            for o in self.orders
            if (status == "all" or (status == "open") == o.is_open)
            and (after is None or o.submitted_at > after)
            and (until is None or o.submitted_at < until)
            and (symbols is None or o.symbol in symbols)
            and params.get("side") in (None, o.side)
        ]
        chosen.sort(key=lambda o: (o.submitted_at, o.seq), reverse=params.get("direction", "desc") != "asc")
        return 200, [o.to_json() for o in chosen[:limit]]

    def cancel(self, order_id: str) -> tuple[int, Any]:
        order = self.find_order(order_id)
        if order is None:
            return 404, {"code": 40410000, "message": "order not found"}
        if not order.is_open:
            return 422, {"code": 42210000, "message": f'order is already in "{order.status}" state'}
        order.status, order.canceled_at, order.updated_at = "canceled", self.now, self.now
        return 204, None

    def expire_day_orders(self) -> int:
        """The session ended: open day orders become expired (filled parts stay). Returns how many."""
        count = 0
        for order in self.orders:
            if order.is_open and order.time_in_force == "day":
                order.status, order.expired_at, order.updated_at = "expired", self.now, self.now
                count += 1
        return count


_ORDER_PATH = re.compile(r"^/v2/orders/([^/]+)$")
_POSITION_PATH = re.compile(r"^/v2/positions/([^/]+)$")
_ASSET_PATH = re.compile(r"^/v2/assets/([^/]+)$")
_DROP = object()  # sentinel answer: close the connection, say nothing


class _Handler(BaseHTTPRequestHandler):
    server: AlpacaTradingServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- silence per-request logging
        pass

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        state = self.server.state
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        key = self.headers.get("APCA-API-KEY-ID")
        secret = self.headers.get("APCA-API-SECRET-KEY")
        record = {
            "method": method,
            "path": path,
            "query": query,
            "query_string": parts.query,
            "json": body,
            "headers": {k: v for k, v in self.headers.items() if k.lower() != "apca-api-secret-key"},
            "secret_sent": secret is not None,
            "time": time.monotonic(),
            "status": None,
        }
        with state.lock:
            state.requests.append(record)
            nth = sum(1 for r in state.requests if (r["method"], r["path"]) == (method, path))
            hang = state.hang is not None and (method, path, nth) == tuple(state.hang)
            hang_mode, hang_seconds = state.hang_mode, state.hang_seconds

        if hang and hang_mode == "lost":
            record["status"] = "hung, lost"
            state.release.wait(hang_seconds)
            self.close_connection = True
            return
        with state.lock:
            status, answer, headers = self._answer(state, method, path, query, body, key, secret)
        if hang:
            state.release.wait(hang_seconds)
        if answer is _DROP:
            record["status"] = "dropped"
            self.close_connection = True
            return
        record["status"] = status
        self._send(status, answer, headers)

    def _answer(
        self,
        state: TradingState,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        key: str | None,
        secret: str | None,
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body or None or _DROP, extra headers); called with ``state.lock`` held."""
        if not key or not secret:
            return 403, FORBIDDEN, {}
        if (key, secret) != (state.key, state.secret):
            return 401, UNAUTHORIZED, {}
        if state.fail_429 > 0:
            state.fail_429 -= 1
            extra = {"Retry-After": f"{state.retry_after:g}"} if state.retry_after is not None else {}
            answer = RATE_LIMITED if state.fail_status == 429 else {"message": f"HTTP {state.fail_status}"}
            return state.fail_status, answer, extra
        status, answer = self._route(state, method, path, query, body)
        if (method, path) == ("POST", "/v2/orders") and status == 200 and state.drop_after_orders is not None:
            if len(state.orders) > state.drop_after_orders:
                state.drop_after_orders = None
                if state.drop_status is not None:
                    return state.drop_status, {"message": f"HTTP {state.drop_status}"}, {}
                return 0, _DROP, {}
        return status, answer, {}

    @staticmethod
    def _route(state: TradingState, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        if method == "GET":
            if path == "/v2/account":
                return 200, state.account()
            if path == "/v2/clock":
                return 200, state.clock()
            if path == "/v2/calendar":
                return _calendar(state, query)
            if path == "/v2/positions":
                return 200, [state.position_json(s) for s in sorted(state.positions)]
            if match := _POSITION_PATH.match(path):
                wanted = match.group(1)
                for symbol in state.positions:
                    if wanted.upper() == symbol or wanted == state.assets.get(symbol, AssetSpec(symbol)).id:
                        return 200, state.position_json(symbol)
                return 404, POSITION_NOT_FOUND
            if path == "/v2/orders":
                return state.list_orders(query)
            if path == "/v2/orders:by_client_order_id":
                if not query.get("client_order_id"):
                    return 422, {"code": 40010001, "message": "client_order_id is required"}
                order = next((o for o in state.orders if o.client_order_id == query["client_order_id"]), None)
                if order is None:
                    return 404, {"code": 40410000, "message": f"order not found for {query['client_order_id']}"}
                state.advance_order(order, poll=True)
                return 200, order.to_json()
            if match := _ORDER_PATH.match(path):
                order = state.find_order(match.group(1))
                if order is None:
                    return 404, {"code": 40410000, "message": f"order not found for {match.group(1)}"}
                state.advance_order(order, poll=True)
                return 200, order.to_json()
            if match := _ASSET_PATH.match(path):
                wanted = match.group(1)
                asset = state.assets.get(wanted.upper()) or next(
                    (a for a in state.assets.values() if a.id == wanted), None
                )
                if asset is None:
                    return 404, {"code": 40410000, "message": f"asset not found for {wanted}"}
                return 200, asset.to_json()
        if method == "POST" and path == "/v2/orders":
            return state.submit(body)
        if method == "DELETE" and (match := _ORDER_PATH.match(path)):
            return state.cancel(match.group(1))
        return 404, {"code": 40410000, "message": "endpoint not found"}

    def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        try:
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (its timeout fired during a hang)


def _calendar(state: TradingState, query: dict[str, str]) -> tuple[int, Any]:
    """GET /v2/calendar: trading days in [start, end]; without them, the 31 days from ``now``'s date."""
    try:
        start = date.fromisoformat(query["start"]) if query.get("start") else state.now.astimezone(NY).date()
        end = date.fromisoformat(query["end"]) if query.get("end") else start + timedelta(days=30)
    except ValueError:
        return 422, {"code": 40010001, "message": "invalid start or end"}
    return 200, state.calendar(start, end)


class AlpacaTradingServer(LocalHTTPServer):
    """The trading server; pass ``url`` as TradingClient's ``url_override``."""

    def __init__(self, state: TradingState) -> None:
        super().__init__(_Handler, state)

    # ------------------------------------------------------------------------------------ helpers for tests

    def requests_to(self, method: str, path: str) -> list[dict[str, Any]]:
        """Recorded requests with this method and path, in arrival order."""
        with self.state.lock:
            return [r for r in self.state.requests if (r["method"], r["path"]) == (method, path)]

    def orders(self) -> list[dict[str, Any]]:
        """Every order the server holds, as the API would show it now (reading here polls nothing)."""
        with self.state.lock:
            return [o.to_json() for o in self.state.orders]

    def order_by_client_id(self, client_order_id: str) -> dict[str, Any] | None:
        with self.state.lock:
            found = next((o for o in self.state.orders if o.client_order_id == client_order_id), None)
            return found.to_json() if found else None

    def position_qty(self, symbol: str) -> float:
        with self.state.lock:
            holding = self.state.positions.get(symbol)
            return holding.qty if holding else 0.0

    def set_now(self, when: datetime | str) -> None:
        """Move the server's clock to ``when`` (an aware datetime or ISO string with an offset)."""
        moment = datetime.fromisoformat(when) if isinstance(when, str) else when
        if moment.tzinfo is None:
            raise ValueError("set_now needs a time zone")
        with self.state.lock:
            self.state.now = moment

    def advance(self, seconds: float) -> None:
        """Move the server's clock forward."""
        with self.state.lock:
            self.state.now = self.state.now + timedelta(seconds=seconds)

    def expire_day_orders(self) -> int:
        with self.state.lock:
            return self.state.expire_day_orders()

    def __exit__(self, *exc: Any) -> None:
        self.state.release.set()  # end hanging requests before shutdown waits for them
        super().__exit__(*exc)
