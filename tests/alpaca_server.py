"""A local HTTP server speaking Alpaca's market-data protocol for GET /v2/stocks/bars (test helper).

Shape of an answer, as alpaca-py 0.44 parses it (alpaca/common/rest.py `_get_marketdata`):

    {"bars": {"AAPL": [{"t": "2024-01-02T05:00:00Z", "o": .., "h": .., "l": .., "c": .., "v": ..,
                        "n": .., "vw": ..}, ...], "MSFT": [...]},
     "next_page_token": "..." | null}

Like the real API: keys in the APCA-API-KEY-ID / APCA-API-SECRET-KEY headers (missing -> 401, wrong
-> 403); ``limit`` caps the bars of one page across all symbols, ordered by symbol then time; the page
token is opaque; symbols without bars are simply absent. Knobs for tests: ``page_size`` (a server-side
cap below alpaca-py's 10,000 so small data spans pages), ``fail_429`` (answer 429 that many times
first), ``mode`` ("ok", "not_json", "no_bars_key", "bars_list", "bad_bar",
"sip_recent": the free plan's 403 for recent SIP data, "hang": accept the request and answer nothing for
``hang_seconds``). Every request is recorded.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd


def daily_bars(symbols: list[str], start: str, end: str, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Weekday bars stamped at midnight New York (as Alpaca does: 05:00Z in winter, 04:00Z in summer)."""
    days = pd.bdate_range(start, end)
    stamps = days.tz_localize("America/New_York").tz_convert("UTC")
    return _bars(symbols, [s.strftime("%Y-%m-%dT%H:%M:%SZ") for s in stamps], seed)


def intraday_bars(symbols: list[str], day: str, minutes: int = 15, seed: int = 0) -> dict[str, list[dict]]:
    """Bars every ``minutes`` from 09:30 to 16:00 New York on ``day``."""
    local = pd.date_range(f"{day} 09:30", f"{day} 15:59", freq=f"{minutes}min", tz="America/New_York")
    return _bars(symbols, [s.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ") for s in local], seed)


def _bars(symbols: list[str], stamps: list[str], seed: int) -> dict[str, list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for i, symbol in enumerate(symbols):
        close = 100.0 + 10 * i + np.cumsum(rng.normal(0, 1, len(stamps)))
        out[symbol] = [
            {
                "t": t,
                "o": round(float(c) - 0.5, 4),
                "h": round(float(c) + 1.0, 4),
                "l": round(float(c) - 1.0, 4),
                "c": round(float(c), 4),
                "v": int(1000 + 10 * j + i),
                "n": 50 + j,
                "vw": round(float(c) - 0.1, 4),
            }
            for j, (t, c) in enumerate(zip(stamps, close, strict=True))
        ]
    return out


@dataclass
class ServerState:
    """What the server knows and what it saw; tests edit the knobs between requests."""

    key: str
    secret: str
    bars: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    page_size: int = 10_000
    fail_429: int = 0
    mode: str = "ok"
    hang_seconds: float = 5.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _offset(token: str) -> int:
    return int(base64.urlsafe_b64decode(token.encode()).decode().split(":")[1])


class _Handler(BaseHTTPRequestHandler):
    server: AlpacaTestServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- silence per-request logging
        pass

    def _send(self, status: int, body: Any, raw: bool = False) -> None:
        data = body.encode() if raw else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if raw else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        state = self.server.state
        parts = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        key = self.headers.get("APCA-API-KEY-ID")
        secret = self.headers.get("APCA-API-SECRET-KEY")
        with state.lock:
            state.requests.append(
                {"path": parts.path, "params": params, "key": key, "secret": secret, "time": time.monotonic()}
            )
            throttle = state.fail_429 > 0
            if throttle:
                state.fail_429 -= 1
        if parts.path != "/v2/stocks/bars":
            return self._send(404, {"message": "endpoint not found"})
        if not key or not secret:
            return self._send(401, {"message": "unauthorized."})
        if (key, secret) != (state.key, state.secret):
            return self._send(403, {"message": "forbidden"})
        if throttle:
            return self._send(429, {"message": "too many requests."})
        if state.mode == "hang":
            time.sleep(state.hang_seconds)
            return self._send(504, {"message": "gateway timeout"})
        if state.mode == "sip_recent":
            return self._send(403, {"message": "subscription does not permit querying recent SIP data"})
        if state.mode == "not_json":
            return self._send(200, "<html>proxy error</html>", raw=True)
        if state.mode == "no_bars_key":
            return self._send(200, {"data": [], "next_page_token": None})
        if state.mode == "bars_list":
            return self._send(200, {"bars": [1, 2, 3], "next_page_token": None})
        if "symbols" not in params or "timeframe" not in params:
            return self._send(400, {"message": "symbols and timeframe are required"})

        start = pd.Timestamp(params["start"]) if "start" in params else None
        end = pd.Timestamp(params["end"]) if "end" in params else None
        items: list[tuple[str, dict[str, Any]]] = []
        for symbol in sorted(set(params["symbols"].split(","))):
            for bar in state.bars.get(symbol, []):
                t = pd.Timestamp(bar["t"])
                if (start is None or t >= start) and (end is None or t <= end):
                    items.append((symbol, bar))
        offset = _offset(params["page_token"]) if params.get("page_token") else 0
        limit = min(int(params.get("limit", 1000)), state.page_size)
        page = items[offset : offset + limit]
        grouped: dict[str, list[dict[str, Any]]] = {}
        for symbol, bar in page:
            grouped.setdefault(symbol, []).append(dict(bar))
        if state.mode == "bad_bar" and grouped:
            first = next(iter(grouped.values()))[0]
            first["c"] = "not a price"
        more = offset + limit < len(items)
        self._send(200, {"bars": grouped, "next_page_token": _token(offset + limit) if more else None})


_Server = TypeVar("_Server", bound="LocalHTTPServer")


class LocalHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer on 127.0.0.1 at a free port, served from a thread while used as a context manager."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], state: Any) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.state = state
        # A short poll interval so shutdown() (which waits for the loop to notice) is quick.
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self: _Server) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


class AlpacaTestServer(LocalHTTPServer):
    """The market-data server; ``url`` is what to pass as data_url."""

    def __init__(self, state: ServerState) -> None:
        super().__init__(_Handler, state)

    def bar_requests(self) -> list[dict[str, Any]]:
        """Recorded requests to /v2/stocks/bars, in arrival order."""
        with self.state.lock:
            return [r for r in self.state.requests if r["path"] == "/v2/stocks/bars"]
