"""The broker: alpaca-py's ``TradingClient`` with our keys, endpoint, timeout and backoff, and the calls
`clstm-ppo trade` makes, every failure turned into one line that names the problem and never a key.

Answers are read as raw JSON (``raw_data=True``) and only the fields used here are parsed, defensively: a field
Alpaca adds or an enum value it invents does not break the command. Errors are `BrokerError` (a `UserError`: one
line, exit status 2): `KeysRejected`, `Refused`, `Unreachable`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from envs.alpaca import Credentials, patient_client_class, read_settings, redact_url, retry_settings
from envs.errors import UserError, first_line

NY = ZoneInfo("America/New_York")
PAPER_URL = "https://paper-api.alpaca.markets"
LIVE_URL = "https://api.alpaca.markets"
LIVE_HOST = "api.alpaca.markets"
TRADING_URL_VAR = "ALPACA_TRADING_URL"
FINAL_STATUSES = frozenset({"filled", "canceled", "expired", "rejected", "replaced", "done_for_day"})
KEY_HINT = (
    "check ALPACA_API_KEY/ALPACA_SECRET_KEY (or APCA_API_KEY_ID/APCA_API_SECRET_KEY) and that they "
    "belong to the {label} account"
)


class BrokerError(UserError):
    """A broker call failed; ``str(err)`` is one line without keys."""


class KeysRejected(BrokerError):
    """HTTP 401, or 403 without an error code (the gateway's bare "forbidden."): the keys are wrong or for the
    other endpoint."""


class Refused(BrokerError):
    """The broker answered no (403 with a code: buying power, quantity; 404; 422: asset not tradable / not fractionable
    / not found, duplicate client order id); the request changed nothing. ``status``/``code`` as Alpaca sent them."""

    def __init__(self, message: str, status: int | None, code: int | None, detail: str) -> None:
        super().__init__(message)
        self.status, self.code, self.detail = status, code, detail

    @property
    def duplicate(self) -> bool:
        """The order's client id was used before: the order exists (maybe from our own earlier attempt)."""
        return "client_order_id must be unique" in self.detail


class Unreachable(BrokerError):
    """No usable answer (timeout, dropped connection, HTTP 5xx, still 429 after the retries): a request that changes
    something may or may not have taken effect; look the order up by client id."""


@dataclass(frozen=True)
class Endpoint:
    """Where orders go. ``live`` is True only after both live flags."""

    url: str
    live: bool

    @property
    def label(self) -> str:
        return "live" if self.live else "paper"


def resolve_endpoint(*, live: bool = False, confirm_live: bool = False, url: str | None = None) -> Endpoint:
    """The trading endpoint: ``url``, else ALPACA_TRADING_URL, else Alpaca's paper (or, with both live flags,
    live) API. UserError for a live endpoint without both flags, or a URL that is not http(s)."""
    if live and not confirm_live:
        raise UserError("--live trades real money: it needs --confirm_live_trading as well; nothing was sent")
    if confirm_live and not live:
        raise UserError("--confirm_live_trading confirms --live, which was not given; nothing was sent")
    chosen = url or read_settings([TRADING_URL_VAR]).get(TRADING_URL_VAR) or (LIVE_URL if live else PAPER_URL)
    chosen = re.sub(r"/v2$", "", chosen.strip().rstrip("/"))  # alpaca-py appends /v2 itself
    parts = urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"trading URL {redact_url(chosen)!r} is not an http(s) URL like {PAPER_URL}")
    if parts.hostname == LIVE_HOST and not live:
        raise UserError(
            f"the trading URL {redact_url(chosen)} is Alpaca's live endpoint: live trading needs "
            "--live --confirm_live_trading; nothing was sent"
        )
    return Endpoint(chosen, live)


@dataclass(frozen=True)
class Account:
    """The account's money (dollars) and flags, from GET /v2/account."""

    number: str
    status: str
    cash: float
    equity: float
    buying_power: float
    long_market_value: float
    blocked: bool  # trading_blocked or account_blocked


@dataclass(frozen=True)
class Position:
    """One open position: ``qty`` shares (negative for a short), valued at ``market_value`` dollars."""

    symbol: str
    qty: float
    market_value: float


@dataclass(frozen=True)
class Session:
    """One regular session of the exchange: its date and closing instant (aware, New York)."""

    day: date
    close: datetime


@dataclass(frozen=True)
class OrderState:
    """An order as the broker shows it now; quantities in shares, prices in dollars."""

    client_order_id: str
    order_id: str
    ticker: str
    side: str
    qty: float
    status: str
    filled_qty: float
    filled_avg_price: float | None

    @property
    def final(self) -> bool:
        """Nothing more will happen to it (filled, canceled, expired, rejected, ...)."""
        return self.status in FINAL_STATUSES

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: Any, default: float = 0.0) -> float:
    try:
        return float(value) if value is not None and value != "" else default
    except (TypeError, ValueError):
        return default


def _order_state(raw: dict[str, Any]) -> OrderState:
    avg = raw.get("filled_avg_price")
    return OrderState(
        client_order_id=str(raw.get("client_order_id", "")),
        order_id=str(raw.get("id", "")),
        ticker=str(raw.get("symbol", "")),
        side=str(raw.get("side", "")),
        qty=_num(raw.get("qty")),
        status=str(raw.get("status", "unknown")),
        filled_qty=_num(raw.get("filled_qty")),
        filled_avg_price=None if avg in (None, "") else _num(avg),
    )


def _session_time(day: date, text: Any) -> datetime:
    """Calendar times are "HH:MM" (or a full timestamp) in New York time."""
    text = str(text)
    if len(text) <= 5:
        hours, minutes = (int(p) for p in text.split(":"))
        return datetime(day.year, day.month, day.day, hours, minutes, tzinfo=NY)
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=NY) if moment.tzinfo is None else moment.astimezone(NY)


class Broker:
    """The calls `clstm-ppo trade` makes, on one ``TradingClient`` (see the module docstring for errors)."""

    def __init__(self, creds: Credentials, endpoint: Endpoint) -> None:
        from alpaca.trading.client import TradingClient

        retries, wait, timeout = retry_settings(None, None)  # from the environment (docs/trading.md "Safety")
        self.endpoint = endpoint
        self.timeout = timeout
        self._secrets = (creds.key, creds.secret)
        self._client = patient_client_class(TradingClient, wait, timeout)(
            creds.key, creds.secret, paper=not endpoint.live, raw_data=True, url_override=endpoint.url
        )
        self._client._retry = retries

    # ------------------------------------------------------------------ reads

    def clock(self) -> datetime:
        """The broker's current time (aware, New York): the clock every schedule check uses."""
        raw = self._call("read the market clock", self._client.get_clock)
        try:
            return datetime.fromisoformat(_trim_nanos(str(raw["timestamp"]))).astimezone(NY)
        except (KeyError, TypeError, ValueError):
            raise self._malformed("clock") from None

    def sessions(self, start: date, end: date) -> list[Session]:
        """Regular sessions with dates in [start, end] (weekends and holidays absent), oldest first."""
        from alpaca.trading.requests import GetCalendarRequest

        raw = self._call(
            "read the market calendar", lambda: self._client.get_calendar(GetCalendarRequest(start=start, end=end))
        )
        try:
            out = []
            for item in raw or []:
                day = date.fromisoformat(str(item["date"]))
                out.append(Session(day, _session_time(day, item["close"])))
            return sorted(out, key=lambda s: s.day)
        except (KeyError, TypeError, ValueError):
            raise self._malformed("calendar") from None

    def account(self) -> Account:
        raw = self._call("read the account", self._client.get_account)
        if not isinstance(raw, dict):
            raise self._malformed("account")
        return Account(
            number=str(raw.get("account_number", "")),
            status=str(raw.get("status", "")),
            cash=_num(raw.get("cash")),
            equity=_num(raw.get("equity")),
            buying_power=_num(raw.get("buying_power")),
            long_market_value=_num(raw.get("long_market_value")),
            blocked=bool(raw.get("trading_blocked")) or bool(raw.get("account_blocked")),
        )

    def positions(self) -> dict[str, Position]:
        """Open positions by symbol."""
        raw = self._call("read the positions", self._client.get_all_positions)
        try:
            out = {}
            for item in raw or []:
                qty = _num(item["qty"])
                if str(item.get("side", "long")).lower() == "short" and qty > 0:
                    qty = -qty
                out[str(item["symbol"])] = Position(str(item["symbol"]), qty, _num(item.get("market_value")))
            return out
        except (KeyError, TypeError):
            raise self._malformed("positions") from None

    def find_order(self, client_order_id: str) -> OrderState | None:
        """The order with this client id, or None when the broker has none (it never arrived)."""
        try:
            raw = self._call(
                f"look up order {client_order_id}", lambda: self._client.get_order_by_client_id(client_order_id)
            )
        except Refused as err:
            if err.status == 404:
                return None
            raise
        if not isinstance(raw, dict):
            raise self._malformed("order")
        return _order_state(raw)

    # ------------------------------------------------------------------ orders

    def submit_market(self, symbol: str, side: str, qty: float, client_order_id: str) -> OrderState:
        """A market order, time in force day, with our client order id. Raises `Refused` / `Unreachable`."""
        from alpaca.trading.enums import OrderSide, TimeInForce
        from alpaca.trading.requests import MarketOrderRequest

        request = MarketOrderRequest(
            symbol=symbol, qty=qty, side=OrderSide(side), time_in_force=TimeInForce.DAY, client_order_id=client_order_id
        )
        raw = self._call(f"{side} {shares_text(qty)} {symbol}", lambda: self._client.submit_order(request))
        if not isinstance(raw, dict):
            raise self._malformed("order")
        return _order_state(raw)

    # ------------------------------------------------------------------ errors

    def _call(self, what: str, fn: Any) -> Any:
        """``fn()``; every failure becomes a one-line `BrokerError` naming ``what`` and the endpoint."""
        import requests
        from alpaca.common.exceptions import APIError

        where = redact_url(self.endpoint.url)
        try:
            return fn()
        except APIError as err:
            raise self._api_error(what, err) from None
        except requests.exceptions.Timeout:
            why = f"no answer from {where} within {self.timeout:g} s (ALPACA_TIMEOUT_SECONDS)"
        except requests.exceptions.ConnectionError:
            why = (
                f"the connection to {where} failed or was dropped "
                "(network down, wrong ALPACA_TRADING_URL, or the server closed it)"
            )
        except requests.exceptions.RequestException as err:
            why = f"request to {where} failed ({type(err).__name__})"
        except (ValueError, TypeError, KeyError) as err:  # a non-JSON 2xx body, alpaca-py's own parsing
            why = f"malformed answer from {where} ({type(err).__name__})"
        raise Unreachable(self._clean(f"cannot {what}: {why}"))

    def _api_error(self, what: str, err: Any) -> BrokerError:
        status = getattr(err, "status_code", None)
        code, detail = None, ""
        try:  # err.code / err.message raise on bodies without them (see docs/alpaca-trading-protocol.md)
            body = json.loads(str(err))
            if isinstance(body, dict):
                code = body.get("code") if isinstance(body.get("code"), int) else None
                detail = str(body.get("message", ""))[:200]
        except (ValueError, TypeError):
            detail = first_line(err, 200)
        where = redact_url(self.endpoint.url)
        if status == 401 or (status == 403 and code is None):
            hint = KEY_HINT.format(label=self.endpoint.label)
            return KeysRejected(self._clean(f"Alpaca rejected the API keys (HTTP {status} from {where}); {hint}"))
        if status == 429:
            why = "Alpaca's rate limit (HTTP 429) held after the retries; wait a minute and run again"
        elif status is None or status >= 500:
            why = f"HTTP {status} from {where}" + (f": {detail}" if detail else "")
        else:
            message = self._clean(f"{what}: refused (HTTP {status}): {detail or 'no reason given'}")
            return Refused(message, status, code, self._clean(detail))
        return Unreachable(self._clean(f"cannot {what}: {why}"))

    def _malformed(self, what: str) -> Unreachable:
        return Unreachable(
            f"malformed {what} answer from {redact_url(self.endpoint.url)}; is ALPACA_TRADING_URL right?"
        )

    def _clean(self, text: str) -> str:
        """A proxy could echo request headers into an error body: never pass the keys on."""
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        return text


def _trim_nanos(stamp: str) -> str:
    """Alpaca's clock has nanoseconds and Python 3.10 reads neither them nor a "Z": microseconds, +00:00."""
    return re.sub(r"(\.\d{6})\d+", r"\1", stamp.strip()).replace("Z", "+00:00")


def shares_text(qty: float) -> str:
    """A share count as people write it: 10, 12.5, 0.333333."""
    return f"{qty:g}" if float(qty).is_integer() else f"{qty:.6g}"


def calendar_window(now: datetime, days: int = 10) -> tuple[date, date]:
    """Dates to ask the calendar for: ``days`` either side of ``now``'s New York date."""
    today = now.astimezone(NY).date()
    return today - timedelta(days=days), today + timedelta(days=days)
