"""A data-source string's parts, in a light module (no numpy, pandas or torch), so the settings can check a
``--data`` spec and ``--help`` stays fast: ``scheme[:k=v,...]`` or ``csv:PATH`` / ``parquet:PATH``.

Alpaca's options ride in the spec (``alpaca:feed=sip,adjustment=split,timeframe=1Hour``); `alpaca_options` is the one
reader of them (the loader, the settings' check and `clstm-ppo trade`'s daily-bars check all call it).
"""

from __future__ import annotations

from envs.errors import UserError

ALPACA_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "feed": ("iex", "sip"),
    "adjustment": ("raw", "split", "dividend", "all"),
    "timeframe": None,
}
"""``alpaca:k=v,...``'s options and their choices (None: any text, checked by Alpaca's own parser)."""

ALPACA_DEFAULTS = {"feed": "iex", "adjustment": "all", "timeframe": "1Day"}
"""The free plan's feed, total-return bars, daily bars."""


def split_source(source: str) -> tuple[str, dict[str, str]]:
    """``"alpaca:feed=sip,timeframe=1Hour"`` -> ``("alpaca", {"feed": "sip", "timeframe": "1Hour"})``: a source's
    scheme (lower case) and its ``k=v`` options; a file's path is returned whole, as its one option ``path``."""
    scheme, sep, rest = str(source).strip().partition(":")
    scheme = scheme.strip().lower()
    if scheme in ("csv", "parquet") or not sep:
        return scheme, ({"path": rest.strip()} if sep else {})
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not value.strip():
            raise UserError(f"data source {source!r}: option {item!r} must look like key=value")
        options[key.strip().lower()] = value.strip()
    return scheme, options


def alpaca_options(source: str) -> dict[str, str]:
    """An ``alpaca[:k=v,...]`` source's feed, adjustment and timeframe (`ALPACA_DEFAULTS` where it names none);
    UserError naming an unknown option or value."""
    _, options = split_source(source)
    for key, value in options.items():
        if key not in ALPACA_OPTIONS:
            raise UserError(
                f"data source {source!r}: unknown alpaca option {key!r}; accepted: {', '.join(ALPACA_OPTIONS)}"
            )
        if (choices := ALPACA_OPTIONS[key]) and value not in choices:
            raise UserError(f"data source {source!r}: {key} must be one of {', '.join(choices)}, got {value!r}")
    return {**ALPACA_DEFAULTS, **options}
