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

TOY_IC = 0.1
"""A planted signal's IC from which its market is a toy: real daily stocks show next-day cross-stock correlations of
about 0.02 (docs/data.md's facts), and a realistic planted signal is 0.03-0.05."""


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
        choices = ALPACA_OPTIONS[key]
        if choices and value not in choices:
            raise UserError(f"data source {source!r}: {key} must be one of {', '.join(choices)}, got {value!r}")
    return {**ALPACA_DEFAULTS, **options}


def describe_source(source: str) -> str:
    """What a data source is, in words for a console line: ``synthetic market, no planted signal``, ``synthetic
    market, planted lead_lag signal of IC 0.04``, ``CSV file prices.csv``, ``Alpaca 1Day bars (iex feed, all
    adjustment)``. A synthetic source's signal kind defaults to its generator's (`envs.sources.default_signal_kind`,
    imported for a synthetic source only: it needs numpy)."""
    scheme, options = split_source(source)
    if scheme == "synthetic":
        from envs.sources import default_signal_kind, synthetic_version

        # signal= (a strength) is generator 1's alone; an older checkpoint's source names it without generator=1
        version = 1 if "signal" in options else synthetic_version(str(source).partition(":")[2])
        kind = options.get("signal_kind") or default_signal_kind(version)
        ic = float(options.get("signal_ic", 0))
        if ic >= TOY_IC:
            return f"toy synthetic market, planted {kind} signal of IC {ic:g} (real daily stocks: about 0.02)"
        if ic > 0:
            return f"synthetic market, planted {kind} signal of IC {ic:g}"
        if "signal" in options and float(options["signal"]) > 0:
            return f"synthetic market, planted {kind} signal of strength {float(options['signal']):g}"
        return "synthetic market, no planted signal"
    if scheme in ("csv", "parquet"):
        return f"{scheme.upper() if scheme == 'csv' else 'Parquet'} file {options.get('path', '')}"
    if scheme == "alpaca":
        o = alpaca_options(source)
        return f"Alpaca {o['timeframe']} bars ({o['feed']} feed, {o['adjustment']} adjustment)"
    return source  # a bare file path
