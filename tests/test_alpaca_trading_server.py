"""Alpaca's trading protocol as alpaca-py 0.44's real ``TradingClient`` speaks it, against the local server.

No mocks of the client: every call below goes over HTTP to tests/alpaca_trading_server.py. These tests pin
the protocol facts the `clstm-ppo trade` command will rely on (see docs/alpaca-trading-protocol.md): paths and
query strings sent, the error each refusal raises, what alpaca-py retries and how long it waits, that it sets
no timeout, and that an order whose answer was lost can be found again by its client order id.
"""

from __future__ import annotations

import time
import types
import uuid
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
import requests
from alpaca.common import rest
from alpaca.common.exceptions import APIError
from alpaca.trading.client import TradingClient
from alpaca.trading.enums import (
    AccountStatus,
    AssetClass,
    AssetExchange,
    AssetStatus,
    OrderSide,
    OrderStatus,
    QueryOrderStatus,
    TimeInForce,
)
from alpaca.trading.requests import GetCalendarRequest, GetOrdersRequest, MarketOrderRequest

try:  # tests/ is a package in this repo; plain rootdir-relative import if it ever is not
    from tests.alpaca_trading_server import NY, AlpacaTradingServer, AssetSpec, TradingState
except ImportError:
    from alpaca_trading_server import NY, AlpacaTradingServer, AssetSpec, TradingState

KEY = "PKTRADE7Q2ZKEYIDVALUE"
SECRET = "tr4de-s3cr3t-do-not-leak-1a2b3c"
PRICES = {"AAPL": 190.0, "MSFT": 370.0, "BRKX": 600.0}


@pytest.fixture
def state() -> TradingState:
    return TradingState(
        key=KEY,
        secret=SECRET,
        prices=dict(PRICES),
        assets={
            "BRKX": AssetSpec("BRKX", fractionable=False, exchange="NYSE"),
            "OTCX": AssetSpec("OTCX", tradable=False, exchange="OTC"),
            "DEAD": AssetSpec("DEAD", status="inactive", tradable=False),
        },
    )


@pytest.fixture
def server(state: TradingState):
    with AlpacaTradingServer(state) as srv:
        yield srv


@pytest.fixture
def client(server: AlpacaTradingServer) -> TradingClient:
    """The real client pointed at the server, its retry wait cut to 10 ms (alpaca-py's default is 3 s)."""
    trading = TradingClient(KEY, SECRET, paper=True, url_override=server.url)
    trading._retry_wait = 0.01
    return trading


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What alpaca-py's retry loop would sleep, recorded instead of slept (only rest.py's ``time`` is swapped)."""
    taken: list[float] = []
    monkeypatch.setattr(rest, "time", types.SimpleNamespace(sleep=taken.append))
    return taken


def market(
    symbol: str, qty: float, side: str = "buy", cid: str | None = None, tif: TimeInForce = TimeInForce.DAY
) -> MarketOrderRequest:
    return MarketOrderRequest(
        symbol=symbol,
        qty=qty,
        side=OrderSide(side),
        time_in_force=tif,
        client_order_id=cid or f"test-{uuid.uuid4().hex[:12]}",
    )


def refusal(excinfo: pytest.ExceptionInfo[APIError]) -> tuple[int | None, int, str]:
    """(HTTP status, Alpaca code, message) of an APIError, read the way a caller would."""
    err = excinfo.value
    return err.status_code, err.code, err.message


class TimeoutTradingClient(TradingClient):
    """How a caller imposes a timeout: alpaca-py passes none to requests (common/rest.py `_one_request`)."""

    def __init__(self, *args: Any, timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timeout = timeout

    def _one_request(self, method: str, url: str, opts: dict, retry: int) -> Any:
        return super()._one_request(method, url, {**opts, "timeout": self._timeout}, retry)


# ------------------------------------------------------------------------------------ account and positions


def test_account_parses_as_trade_account(server: AlpacaTradingServer, client: TradingClient) -> None:
    account = client.get_account()
    assert account.status == AccountStatus.ACTIVE and account.currency == "USD"
    assert account.account_number == "PA3TESTSRV01" and account.trading_blocked is False
    assert (account.cash, account.buying_power, account.equity, account.portfolio_value) == (
        "100000",
        "100000",
        "100000",
        "100000",
    )
    assert account.last_equity == "100000" and account.multiplier == "1"
    (request,) = server.requests_to("GET", "/v2/account")
    assert request["headers"]["APCA-API-KEY-ID"] == KEY and request["secret_sent"]
    assert request["headers"]["User-Agent"].startswith("APCA-PY/0.44.0 Python/")
    assert SECRET not in repr(server.state.requests)


def test_buy_then_sell_moves_cash_positions_and_marks(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.commission = 1.0
    order = client.submit_order(market("AAPL", 10, cid="buy-1"))
    assert order.status == OrderStatus.FILLED and order.client_order_id == "buy-1"
    assert (order.qty, order.filled_qty, order.filled_avg_price) == ("10", "10", "190")
    # alpaca-py sends qty as a JSON float and enums as their values; nothing else.
    assert server.requests_to("POST", "/v2/orders")[0]["json"] == {
        "symbol": "AAPL",
        "qty": 10.0,
        "side": "buy",
        "type": "market",
        "time_in_force": "day",
        "client_order_id": "buy-1",
    }
    state.fill_prices["AAPL"] = 190.5
    client.submit_order(market("AAPL", 10))
    state.prices["AAPL"] = 200.0
    (position,) = client.get_all_positions()
    assert (position.symbol, position.qty, position.side.value) == ("AAPL", "20", "long")
    assert (position.avg_entry_price, position.cost_basis) == ("190.25", "3805")
    assert (position.market_value, position.unrealized_pl, position.current_price) == ("4000", "195", "200")
    assert client.get_open_position("AAPL").qty_available == "20"
    account = client.get_account()
    assert account.cash == "96193"  # 100000 - 1900 - 1905 - 2 x 1 commission
    assert (account.equity, account.long_market_value) == ("100193", "4000")

    del state.fill_prices["AAPL"]  # back to the last price
    sold = client.submit_order(market("AAPL", 20, side="sell"))
    assert sold.status == OrderStatus.FILLED and sold.filled_avg_price == "200"
    assert client.get_all_positions() == []
    assert client.get_account().cash == "100192"
    with pytest.raises(APIError) as excinfo:
        client.get_open_position("AAPL")
    assert refusal(excinfo) == (404, 40410000, "position does not exist")


# ------------------------------------------------------------------------------------ the fill model


def test_fill_after_polls(server: AlpacaTradingServer, client: TradingClient, state: TradingState) -> None:
    state.fill_after_polls = 2
    order = client.submit_order(market("MSFT", 3, cid="slow"))
    assert order.status == OrderStatus.NEW and order.filled_qty == "0" and order.filled_avg_price is None
    assert client.get_order_by_id(order.id).status == OrderStatus.NEW
    assert server.position_qty("MSFT") == 0
    filled = client.get_order_by_client_id("slow")
    assert filled.status == OrderStatus.FILLED and filled.filled_at is not None
    assert server.position_qty("MSFT") == 3


def test_partial_fill_then_completion(server: AlpacaTradingServer, client: TradingClient, state: TradingState) -> None:
    state.fill_mode["AAPL"] = "partial"
    state.partial_fraction = 0.3
    state.partial_completes_after_polls = 2
    order = client.submit_order(market("AAPL", 10))
    assert (order.status, order.filled_qty) == (OrderStatus.PARTIALLY_FILLED, "3")
    assert client.get_open_position("AAPL").qty == "3"
    assert client.get_order_by_id(order.id).status == OrderStatus.PARTIALLY_FILLED
    done = client.get_order_by_id(order.id)
    assert (done.status, done.filled_qty) == (OrderStatus.FILLED, "10")
    assert client.get_open_position("AAPL").qty == "10"


def test_partial_fill_of_whole_shares_then_cancel_keeps_the_filled_part(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.fill_mode["BRKX"] = "partial"  # not fractionable: half of 3 shares rounds down to 1
    order = client.submit_order(market("BRKX", 3))
    assert (order.status, order.filled_qty) == (OrderStatus.PARTIALLY_FILLED, "1")
    assert client.get_account().buying_power == str(100_000 - 600 - 2 * 600)  # the rest is reserved
    assert client.cancel_order_by_id(order.id) is None
    canceled = client.get_order_by_id(order.id)
    assert (canceled.status, canceled.filled_qty) == (OrderStatus.CANCELED, "1")
    assert client.get_open_position("BRKX").qty == "1"
    assert client.get_account().buying_power == "99400"


def test_rejected_order_changes_nothing(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.fill_mode["AAPL"] = "reject"
    order = client.submit_order(market("AAPL", 5))
    assert order.status == OrderStatus.REJECTED and order.failed_at is not None and order.filled_qty == "0"
    assert client.get_all_positions() == []
    account = client.get_account()
    assert (account.cash, account.buying_power) == ("100000", "100000")


def test_never_filled_order_cancel_expire_and_unknown_ids(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.fill_mode["MSFT"] = "never"
    first = client.submit_order(market("MSFT", 1))
    second = client.submit_order(market("MSFT", 1))
    for _ in range(3):
        assert client.get_order_by_id(first.id).status == OrderStatus.NEW
    assert client.cancel_order_by_id(first.id) is None  # 204, empty body
    assert server.requests_to("DELETE", f"/v2/orders/{first.id}")[0]["status"] == 204
    canceled = client.get_order_by_id(first.id)
    assert canceled.status == OrderStatus.CANCELED and canceled.canceled_at is not None
    with pytest.raises(APIError) as excinfo:
        client.cancel_order_by_id(first.id)
    assert refusal(excinfo) == (422, 42210000, 'order is already in "canceled" state')
    assert server.expire_day_orders() == 1
    assert client.get_order_by_id(second.id).status == OrderStatus.EXPIRED
    stranger = uuid.uuid4()
    with pytest.raises(APIError) as excinfo:
        client.cancel_order_by_id(stranger)
    assert refusal(excinfo)[:2] == (404, 40410000)
    with pytest.raises(APIError) as excinfo:
        client.get_order_by_id(stranger)
    assert refusal(excinfo) == (404, 40410000, f"order not found for {stranger}")


# ------------------------------------------------------------------------------------ refusals


def test_insufficient_buying_power_counts_open_buys(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 600))  # 114,000 > 100,000
    assert refusal(excinfo) == (403, 40310000, "insufficient buying power")
    assert excinfo.value.response.json()["cost_basis"] == "114000"
    assert server.orders() == []
    state.fill_mode["AAPL"] = "never"
    parked = client.submit_order(market("AAPL", 500))  # 95,000 reserved while it waits
    assert client.get_account().buying_power == "5000"
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 30))  # 5,700
    assert refusal(excinfo)[:2] == (403, 40310000)
    client.cancel_order_by_id(parked.id)
    assert client.submit_order(market("AAPL", 30)).status == OrderStatus.NEW


def test_selling_more_than_available_is_refused(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    client.submit_order(market("AAPL", 10))
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 11, side="sell"))
    assert refusal(excinfo) == (403, 40310000, "insufficient qty available for order (requested: 11, available: 10)")
    state.fill_mode["AAPL"] = "never"
    client.submit_order(market("AAPL", 6, side="sell"))  # open: holds 6 of the 10
    assert client.get_open_position("AAPL").qty_available == "4"
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 5, side="sell"))
    body = excinfo.value.response.json()
    assert (body["available"], body["existing_qty"], body["held_for_orders"]) == ("4", "10", "6")
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("MSFT", 1, side="sell"))  # flat: no shorting here
    assert refusal(excinfo)[:2] == (403, 40310000)


def test_duplicate_client_order_id_even_after_cancel(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.fill_mode["AAPL"] = "never"
    order = client.submit_order(market("AAPL", 1, cid="once"))
    client.cancel_order_by_id(order.id)
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 1, cid="once"))
    assert refusal(excinfo) == (422, 40010001, "client_order_id must be unique")
    assert len(server.orders()) == 1


@pytest.mark.parametrize(
    ("symbol", "qty", "tif", "code", "message"),
    [
        ("OTCX", 1, TimeInForce.DAY, 42210000, 'asset "OTCX" is not tradable'),
        ("DEAD", 1, TimeInForce.DAY, 40010001, "asset DEAD is not active"),
        ("ZZZZ", 1, TimeInForce.DAY, 42210000, 'asset "ZZZZ" not found'),
        ("BRKX", 0.5, TimeInForce.DAY, 42210000, 'asset "BRKX" is not fractionable'),
        ("AAPL", 0.5, TimeInForce.GTC, 42210000, "fractional orders must be DAY orders"),
    ],
)
def test_asset_refusals_are_422(
    server: AlpacaTradingServer,
    client: TradingClient,
    symbol: str,
    qty: float,
    tif: TimeInForce,
    code: int,
    message: str,
) -> None:
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market(symbol, qty, tif=tif))
    assert refusal(excinfo) == (422, code, message)
    assert server.orders() == []


def test_fractional_day_order_on_fractionable_asset_fills(client: TradingClient) -> None:
    order = client.submit_order(market("AAPL", 0.25))
    assert (order.status, order.filled_qty) == (OrderStatus.FILLED, "0.25")
    assert client.get_open_position("AAPL").market_value == "47.5"


# ------------------------------------------------------------------------------------ order queries


def test_get_order_by_client_id(server: AlpacaTradingServer, client: TradingClient) -> None:
    order = client.submit_order(market("AAPL", 1, cid="run7-step3-AAPL"))
    assert client.get_order_by_client_id("run7-step3-AAPL").id == order.id
    with pytest.raises(APIError) as excinfo:
        client.get_order_by_client_id("never-sent")
    assert refusal(excinfo) == (404, 40410000, "order not found for never-sent")
    requests_made = server.requests_to("GET", "/v2/orders:by_client_order_id")
    assert [r["query"] for r in requests_made] == [
        {"client_order_id": "run7-step3-AAPL"},
        {"client_order_id": "never-sent"},
    ]


def test_get_orders_filters_and_query_strings(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    t0 = state.now
    state.fill_mode["MSFT"] = "never"
    o1 = client.submit_order(market("AAPL", 1)).id
    server.advance(60)
    o2 = client.submit_order(market("MSFT", 1)).id  # stays open
    server.advance(60)
    o3 = client.submit_order(market("AAPL", 2)).id
    server.advance(60)
    o4 = client.submit_order(market("AAPL", 1, side="sell")).id

    def ids(**filters: Any) -> list[Any]:
        return [o.id for o in client.get_orders(GetOrdersRequest(**filters) if filters else None)]

    assert ids() == [o2]  # Alpaca's default: open orders only
    assert server.requests_to("GET", "/v2/orders")[-1]["query_string"] == ""
    assert ids(status=QueryOrderStatus.CLOSED) == [o4, o3, o1]  # newest first by default
    assert ids(status=QueryOrderStatus.ALL, direction="asc") == [o1, o2, o3, o4]
    assert ids(status=QueryOrderStatus.ALL, limit=2) == [o4, o3]
    after, until = t0 + timedelta(seconds=30), t0 + timedelta(seconds=150)
    assert ids(status=QueryOrderStatus.ALL, after=after, until=until) == [o3, o2]
    assert ids(status=QueryOrderStatus.ALL, symbols=["MSFT", "NVDA"], nested=True) == [o2]
    assert ids(status=QueryOrderStatus.ALL, side=OrderSide.SELL) == [o4]
    sent = [r["query"] for r in server.requests_to("GET", "/v2/orders")]
    assert sent[4] == {"status": "all", "after": after.isoformat(), "until": until.isoformat()}
    assert sent[5] == {"status": "all", "nested": "True", "symbols": "MSFT,NVDA"}
    assert sent[6] == {"status": "all", "side": "sell"}


# ------------------------------------------------------------------------------------ clock, calendar, assets


def test_clock_follows_now_and_the_calendar(server: AlpacaTradingServer, client: TradingClient) -> None:
    clock = client.get_clock()  # Wednesday 2024-01-03 10:00 New York
    assert clock.is_open
    assert clock.timestamp == datetime(2024, 1, 3, 10, 0, tzinfo=NY)
    assert clock.next_close == datetime(2024, 1, 3, 16, 0, tzinfo=NY)
    assert clock.next_open == datetime(2024, 1, 4, 9, 30, tzinfo=NY)
    server.set_now("2024-01-03T09:00:00-05:00")
    clock = client.get_clock()
    assert not clock.is_open and clock.next_open == datetime(2024, 1, 3, 9, 30, tzinfo=NY)
    server.set_now("2024-07-03T13:30:00-04:00")  # after the 13:00 early close, before the July 4 holiday
    clock = client.get_clock()
    assert not clock.is_open
    assert clock.next_open == datetime(2024, 7, 5, 9, 30, tzinfo=NY)
    assert clock.next_close == datetime(2024, 7, 5, 16, 0, tzinfo=NY)


def test_calendar_skips_weekends_and_holidays(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    days = client.get_calendar(GetCalendarRequest(start=date(2024, 7, 1), end=date(2024, 7, 8)))
    assert [d.date for d in days] == [date(2024, 7, d) for d in (1, 2, 3, 5, 8)]
    # alpaca-py builds naive local (New York) datetimes from "date" + "HH:MM".
    assert days[2].open == datetime(2024, 7, 3, 9, 30) and days[2].close == datetime(2024, 7, 3, 13, 0)
    assert days[0].close == datetime(2024, 7, 1, 16, 0)
    assert server.requests_to("GET", "/v2/calendar")[0]["query"] == {"start": "2024-07-01", "end": "2024-07-08"}
    state.holidays.add("2024-07-05")
    days = client.get_calendar(GetCalendarRequest(start=date(2024, 7, 1), end=date(2024, 7, 8)))
    assert [d.date.day for d in days] == [1, 2, 3, 8]


def test_order_placed_while_closed_is_accepted_and_fills_after_the_open(
    server: AlpacaTradingServer, client: TradingClient
) -> None:
    server.set_now("2024-01-06T12:00:00-05:00")  # Saturday
    order = client.submit_order(market("AAPL", 10))
    assert (order.status, order.filled_qty) == (OrderStatus.ACCEPTED, "0")
    assert order.expires_at == datetime(2024, 1, 8, 21, 0, tzinfo=timezone.utc)  # Monday's close
    assert client.get_order_by_id(order.id).status == OrderStatus.ACCEPTED
    account = client.get_account()
    assert (account.cash, account.buying_power) == ("100000", "98100")
    server.set_now("2024-01-08T09:31:00-05:00")
    assert client.get_order_by_id(order.id).status == OrderStatus.FILLED
    assert client.get_open_position("AAPL").qty == "10"


def test_get_asset(client: TradingClient) -> None:
    asset = client.get_asset("AAPL")
    assert (asset.symbol, asset.tradable, asset.fractionable) == ("AAPL", True, True)
    assert (asset.status, asset.exchange, asset.asset_class) == (
        AssetStatus.ACTIVE,
        AssetExchange.NASDAQ,
        AssetClass.US_EQUITY,
    )
    assert client.get_asset("BRKX").fractionable is False
    assert client.get_asset("OTCX").tradable is False
    assert client.get_asset(asset.id).symbol == "AAPL"  # by asset id as well
    with pytest.raises(APIError) as excinfo:
        client.get_asset("ZZZZ")
    assert refusal(excinfo) == (404, 40410000, "asset not found for ZZZZ")


# ------------------------------------------------------------------------------------ auth


def test_wrong_keys_are_401_with_a_code(server: AlpacaTradingServer) -> None:
    wrong = TradingClient(KEY, "not-the-secret", paper=True, url_override=server.url)
    with pytest.raises(APIError) as excinfo:
        wrong.get_account()
    assert refusal(excinfo) == (401, 40110000, "request is not authorized")


def test_missing_key_headers_are_403_without_a_code(server: AlpacaTradingServer) -> None:
    with pytest.raises(ValueError, match="method of authentication"):
        TradingClient(None, None, url_override=server.url)  # alpaca-py refuses before any request
    bearer = TradingClient(oauth_token="an-oauth-token", url_override=server.url)  # sends no APCA-* headers
    with pytest.raises(APIError) as excinfo:
        bearer.get_account()
    err = excinfo.value
    assert err.status_code == 403 and err.message == "forbidden."
    with pytest.raises(KeyError):
        _ = err.code  # APIError.code is json.loads(body)["code"]: a body without one raises
    (request,) = server.requests_to("GET", "/v2/account")
    assert "APCA-API-KEY-ID" not in request["headers"] and not request["secret_sent"]


# ------------------------------------------------------------------------------------ retries


def test_defaults_retry_429_three_times_three_seconds_apart_ignoring_retry_after(
    server: AlpacaTradingServer, state: TradingState, sleeps: list[float]
) -> None:
    plain = TradingClient(KEY, SECRET, paper=True, url_override=server.url)
    assert (plain._retry, plain._retry_wait, plain._retry_codes) == (3, 3, [429, 504])
    state.fail_429, state.retry_after = 3, 30
    assert plain.get_account().cash == "100000"
    assert len(server.requests_to("GET", "/v2/account")) == 4 and sleeps == [3, 3, 3]
    state.fail_429 = 10
    with pytest.raises(APIError) as excinfo:
        plain.get_account()
    assert refusal(excinfo) == (429, 42910000, "rate limit exceeded")
    assert len(server.requests_to("GET", "/v2/account")) == 8 and sleeps == [3] * 6


def test_post_orders_is_retried_on_429_like_any_request(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.fail_429 = 2
    assert client.submit_order(market("AAPL", 1, cid="r1")).status == OrderStatus.FILLED
    posts = server.requests_to("POST", "/v2/orders")
    assert [p["status"] for p in posts] == [429, 429, 200]
    assert all(p["json"] == posts[0]["json"] for p in posts) and len(server.orders()) == 1


@pytest.mark.parametrize(("status", "attempts", "fails"), [(504, 2, False), (503, 1, True), (500, 1, True)])
def test_only_429_and_504_are_retried(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState, status: int, attempts: int, fails: bool
) -> None:
    state.fail_429, state.fail_status = 1, status
    if fails:
        with pytest.raises(APIError) as excinfo:
            client.get_clock()
        assert excinfo.value.status_code == status
    else:
        assert client.get_clock().is_open
    assert len(server.requests_to("GET", "/v2/clock")) == attempts


# ------------------------------------------------------------------------------------ hangs, timeouts, drops


def test_alpaca_py_sets_no_timeout_and_waits_out_a_hang(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.hang, state.hang_seconds = ("GET", "/v2/account", 1), 0.4
    sent: list[dict] = []
    real_request = client._session.request

    def spy(method: str, url: str, **opts: Any) -> Any:
        sent.append(opts)
        return real_request(method, url, **opts)

    client._session.request = spy  # type: ignore[method-assign] -- observe, still the real HTTP call
    started = time.monotonic()
    assert client.get_account().cash == "100000"
    assert time.monotonic() - started >= 0.4
    assert "timeout" not in sent[0] and sent[0]["allow_redirects"] is False


def test_timeout_subclass_fires_and_the_order_is_recovered_by_client_id(
    server: AlpacaTradingServer, state: TradingState
) -> None:
    timed = TimeoutTradingClient(KEY, SECRET, paper=True, url_override=server.url, timeout=0.25)
    state.hang, state.hang_seconds = ("POST", "/v2/orders", 2), 5.0  # processed; the answer held back
    timed.submit_order(market("AAPL", 1, cid="first"))
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        timed.submit_order(market("AAPL", 2, cid="second"))
    assert time.monotonic() - started < 2.0
    assert issubclass(requests.exceptions.ReadTimeout, requests.exceptions.Timeout)
    recovered = timed.get_order_by_client_id("second")
    assert (recovered.status, recovered.qty) == (OrderStatus.FILLED, "2")
    assert server.position_qty("AAPL") == 3


def test_lost_request_times_out_and_is_safe_to_resend_with_the_same_id(
    server: AlpacaTradingServer, state: TradingState
) -> None:
    timed = TimeoutTradingClient(KEY, SECRET, paper=True, url_override=server.url, timeout=0.25)
    state.hang, state.hang_mode, state.hang_seconds = ("POST", "/v2/orders", 1), "lost", 5.0
    with pytest.raises(requests.exceptions.ReadTimeout):
        timed.submit_order(market("AAPL", 2, cid="maybe"))
    with pytest.raises(APIError) as excinfo:
        timed.get_order_by_client_id("maybe")
    assert excinfo.value.status_code == 404
    assert timed.submit_order(market("AAPL", 2, cid="maybe")).status == OrderStatus.FILLED
    assert len(server.orders()) == 1


def test_dropped_answer_is_a_connection_error_but_the_order_exists(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.drop_after_orders = 1
    client.submit_order(market("AAPL", 1, cid="a"))
    with pytest.raises(requests.exceptions.ConnectionError):
        client.submit_order(market("AAPL", 4, cid="b"))
    assert [p["status"] for p in server.requests_to("POST", "/v2/orders")] == [200, "dropped"]  # no retry
    assert server.order_by_client_id("b") is not None
    recovered = client.get_order_by_client_id("b")
    assert (recovered.status, recovered.filled_qty) == (OrderStatus.FILLED, "4")
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 4, cid="b"))  # a blind resend is refused, not doubled
    assert refusal(excinfo)[:2] == (422, 40010001)
    assert server.position_qty("AAPL") == 5


def test_504_after_the_order_landed_turns_alpaca_py_retry_into_a_duplicate_error(
    server: AlpacaTradingServer, client: TradingClient, state: TradingState
) -> None:
    state.drop_after_orders, state.drop_status = 0, 504
    with pytest.raises(APIError) as excinfo:
        client.submit_order(market("AAPL", 3, cid="gw"))
    assert refusal(excinfo) == (422, 40010001, "client_order_id must be unique")
    posts = server.requests_to("POST", "/v2/orders")
    assert [p["status"] for p in posts] == [504, 422] and posts[0]["json"] == posts[1]["json"]
    assert client.get_order_by_client_id("gw").status == OrderStatus.FILLED
    assert server.position_qty("AAPL") == 3
