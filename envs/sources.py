"""One entry point from a data-source string to validated :class:`MarketData`.

Sources::

    synthetic[:k=v,k=v]               the ``generate_market`` of generator ``generator=`` (1 | 2 | 3, default
                                      `GENERATOR_VERSION`: envs.synthetic_v1, envs.synthetic_v2, envs.synthetic),
                                      drawn from ``seed`` unless the options name one; each version's options
                                      are `SYNTHETIC_OPTIONS` (docs/data.md says what each means), and generator
                                      3's ``train_draws`` (`training_draws`)
    csv:PATH | parquet:PATH           a long-format file (see envs.data); a bare PATH ending in
                                      .csv / .parquet / .pq works too
    alpaca[:feed=,adjustment=,        envs.alpaca.fetch_bars(tickers, start, end, ...): the options as
           timeframe=]                `envs.source_spec.alpaca_options` reads them, plus ``alpaca_kwargs``

Filters apply to every source: ``tickers`` (names; UserError naming unknown ones), ``start`` / ``end`` (inclusive ISO
dates). For files the filters apply before alignment, so gaps in tickers or dates you did not ask for do not matter. For
synthetic data they apply after generation (use the ``start`` option to move the generated calendar).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from envs import synthetic, synthetic_v1, synthetic_v2
from envs.data import MarketData, date_mask, read_frame, standardize_frame
from envs.errors import UserError, shown_list
from envs.fingerprint import data_fingerprint, market_witness
from envs.source_spec import alpaca_options, split_source
from envs.state import MAX_PRICE_RATIO
from envs.synthetic import GENERATOR_VERSION, GENERATOR_VERSIONS

# option name -> (generate_market argument, parser), for each generator version
SYNTHETIC_OPTIONS: dict[int, dict[str, tuple[str, type]]] = {
    1: {
        "tickers": ("num_tickers", int),
        "days": ("num_days", int),
        "start": ("start", str),
        "signal": ("signal_strength", float),
        "signal_kind": ("signal", str),
        "lag": ("lag", int),
        "seed": ("seed", int),
    },
    2: {
        "tickers": ("num_tickers", int),
        "days": ("num_days", int),
        "start": ("start", str),
        "signal_ic": ("signal_ic", float),
        "signal_kind": ("signal_kind", str),
        "signal_halflife": ("signal_halflife", float),
        "signal_overnight": ("signal_overnight", float),
        "lag": ("lag", int),
        "seed": ("seed", int),
    },
}
SYNTHETIC_OPTIONS[3] = dict(SYNTHETIC_OPTIONS[2])
GENERATORS = {1: synthetic_v1.generate_market, 2: synthetic_v2.generate_market, 3: synthetic.generate_market}
TRAINING_OPTION = "train_draws"
"""Generator 3's option that names how many draws training runs on (`training_draws`), not how the market is drawn."""
TOY_IC = 0.1
"""A planted signal's IC from which its market is a toy: real daily stocks show next-day cross-stock correlations of
about 0.02 (docs/data.md's facts), and a realistic planted signal is 0.03-0.05."""
MAX_TRAINING_DRAWS = 256
_FORMS = "synthetic, synthetic:k=v,..., csv:PATH, parquet:PATH, alpaca"  # what an unknown source is told to use


def _options(text: str) -> list[tuple[str, str]]:
    """ "tickers=10, days=1000" -> [("tickers", "10"), ("days", "1000")]; UserError on an item without a value."""
    items = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise UserError(f"synthetic option {item!r} must look like key=value")
        items.append((key.strip().lower(), value.strip()))
    return items


def synthetic_version(text: str) -> int:
    """The generator version the options ``text`` (after ``synthetic:``) name: ``generator=N``, else the current."""
    named = [value for key, value in _options(text) if key == "generator"]
    if not named:
        return GENERATOR_VERSION
    try:
        version = int(named[-1])
    except ValueError:
        version = -1
    if version not in GENERATOR_VERSIONS:
        raise UserError(
            f"synthetic generator={named[-1]!r} is unknown; versions: {', '.join(map(str, GENERATOR_VERSIONS))}"
        )
    return version


def default_signal_kind(version: int) -> str:
    """The kind of signal generator ``version`` plants where its options name none: its ``generate_market``'s
    default (``momentum`` for generator 1, ``lead_lag`` for 2 and 3)."""
    argument = SYNTHETIC_OPTIONS[version]["signal_kind"][0]
    return inspect.signature(GENERATORS[version]).parameters[argument].default


def parse_synthetic_options(text: str) -> dict[str, Any]:
    """ "tickers=10,days=1000,signal_ic=0.04" -> keyword arguments of the ``generate_market`` of the generator
    version the options name (`synthetic_version`; ``generator`` itself is not among them); UserError on bad options."""
    version = synthetic_version(text)
    accepted = SYNTHETIC_OPTIONS[version]
    kwargs: dict[str, Any] = {}
    for key, value in _options(text):
        if key == "generator" or (key == TRAINING_OPTION and version >= 3):
            continue
        if key == "signal" and version != 1:
            raise UserError(
                "synthetic option signal= is generator 1's strength; give signal_ic=IC, the predictor's correlation "
                "with the next open-to-open return in [0, 0.5) (0.02-0.05 realistic, 0.3 a toy), or add generator=1"
            )
        if key not in accepted:
            raise UserError(
                f"unknown synthetic option {key!r} for generator {version}; accepted: {', '.join(accepted)}, "
                + ("train_draws, " if version >= 3 else "")
                + "generator"
            )
        name, kind = accepted[key]
        try:
            kwargs[name] = kind(value)
        except ValueError:
            raise UserError(f"synthetic option {key}={value!r} is not a valid {kind.__name__}") from None
    return kwargs


def training_draws(text: str) -> int:
    """K of ``train_draws=K`` in the synthetic options ``text`` (after ``synthetic:``; 1 when absent): training runs on
    the market's own training days and on those of K - 1 more draws of the same generator and options, each from its own
    seed (`training_pool`), so a policy cannot learn one path by heart; validation and test days are the market's own.
    UserError for a value that is not a whole number in [1, `MAX_TRAINING_DRAWS`], or on generator 1 or 2."""
    named = [value for key, value in _options(text) if key == TRAINING_OPTION]
    if not named:
        return 1
    if synthetic_version(text) < 3:
        raise UserError(f"synthetic option {TRAINING_OPTION} needs generator 3 (drop generator=, or the option)")
    try:
        draws = int(named[-1])
    except ValueError:
        draws = 0
    if not 1 <= draws <= MAX_TRAINING_DRAWS:
        raise UserError(
            f"synthetic option {TRAINING_OPTION}={named[-1]!r} must be a whole number in [1, {MAX_TRAINING_DRAWS}]"
        )
    return draws


def training_pool(
    source: str, seed: int, *, tickers: list[str] | None = None, start: str | None = None, end: str | None = None
) -> list[MarketData]:
    """The ``train_draws - 1`` more markets a synthetic ``source`` trains on (`training_draws`), with its filters:
    the same options but ``train_draws``, each drawn from its own seed, derived from the market's own (its ``seed=``
    option, else ``seed``) and the draw's number k = 1, 2, ... by `numpy.random.SeedSequence`, so no two draws share
    noise; drawn together (`envs.synthetic.markets_of_seeds`). Empty for any other source, or one draw."""
    if not is_synthetic(source):
        return []
    options = source.strip().partition(":")[2]
    draws = training_draws(options)
    if draws == 1:
        return []
    kwargs = parse_synthetic_options(options)
    own = int(kwargs.pop("seed", seed))
    seeds = [
        int(np.random.SeedSequence([own, k]).generate_state(1, np.uint64)[0] >> np.uint64(1)) for k in range(1, draws)
    ]
    pool = synthetic.markets_of_seeds(seeds, **kwargs)
    if start is not None or end is not None:
        pool = [data.select_dates(start, end) for data in pool]
    return pool if tickers is None else [data.select_tickers(tickers) for data in pool]


def generate_synthetic(text: str, seed: int = 0) -> MarketData:
    """The market of the synthetic options ``text`` (after ``synthetic:``), drawn from ``seed`` unless they name one."""
    training_draws(text)  # a bad value is named before anything is drawn
    return GENERATORS[synthetic_version(text)](**{"seed": seed, **parse_synthetic_options(text)})


def is_synthetic(source: str) -> bool:
    """Does the data-source string name the synthetic generator?"""
    return source.strip().partition(":")[0].strip().lower() == "synthetic"


def pin_synthetic(source: str, **options: int) -> str:
    """``source`` with the synthetic ``options`` it does not name yet appended (unchanged when it is not synthetic):
    ``pin_synthetic("synthetic:tickers=3", generator=1)`` is what an old checkpoint's string meant when no version was
    recorded, and a study pins the market's ``seed`` (its cells train with other seeds) and ``generator``."""
    if not is_synthetic(source):
        return source
    _, _, rest = source.strip().partition(":")
    named = {key for key, _ in _options(rest)}
    added = [f"{key}={value}" for key, value in options.items() if key not in named]
    parts = ([rest.strip()] if rest.strip() else []) + added
    return f"synthetic:{','.join(parts)}"


def names_option(source: str, key: str) -> bool:
    """Whether the synthetic ``source`` names the option ``key`` (``seed``, ``generator``, ...); False otherwise."""
    return is_synthetic(source) and any(k == key for k, _ in _options(source.strip().partition(":")[2]))


def data_record(source: str, data: MarketData) -> dict[str, Any]:
    """What identifies the data a run was trained on, for its checkpoint: the data's `data_fingerprint`, its first and
    last day, and for a synthetic source the generator version the source string meant and its `market_witness`
    (`envs.fingerprint.recorded_data_matches` reads them)."""
    record: dict[str, Any] = {
        "fingerprint": data_fingerprint(data),
        "first": data.date_str(0),
        "last": data.date_str(-1),
    }
    if is_synthetic(source):  # generated again for a backtest, maybe on a CPU that rounds exp's last bit otherwise
        record["generator"] = synthetic_version(source.strip().partition(":")[2])
        record["witness"] = market_witness(data)
    return record


def _filter_frame(
    frame: pd.DataFrame, tickers: list[str] | None, start: str | None, end: str | None, what: str
) -> pd.DataFrame:
    """Keep the given tickers and dates of a standardised long frame, before alignment."""
    attrs = dict(frame.attrs)
    if tickers is not None:
        wanted = [str(t).strip() for t in tickers]
        have = sorted(frame["tic"].unique().tolist())
        unknown = [t for t in wanted if t not in set(have)]
        if unknown:
            raise UserError(f"unknown tickers {', '.join(unknown)} in {what}; it has {shown_list(have, 10)}")
        frame = frame[frame["tic"].isin(wanted)]
    dates = frame["date"].to_numpy()
    keep = date_mask(dates, start, end)
    if not keep.any():
        first, last = (str(pd.Timestamp(x).date()) for x in (dates.min(), dates.max()))
        raise UserError(
            f"no rows of {what} between {start or 'the start'} and {end or 'the end'}; it covers {first} .. {last}"
        )
    frame = frame.loc[keep].reset_index(drop=True)
    frame.attrs.update(attrs)
    return frame


def load_market_data(
    source: str,
    *,
    tickers: list[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    seed: int = 0,
    gap_policy: str = "fail",
    max_price_ratio: float = MAX_PRICE_RATIO,
    **alpaca_kwargs: Any,
) -> MarketData:
    """Load and validate market data from a source string (the module docstring's forms).

    :param tickers: keep only these tickers (in this order); UserError naming unknown ones.
    :param start: first date kept (inclusive, YYYY-MM-DD); for alpaca, the first date fetched.
    :param end: last date kept (inclusive); for alpaca, the last date fetched.
    :param seed: seed of the synthetic generator (a ``seed=`` option in the source wins).
    :param gap_policy: "fail" | "intersect" | "ffill" for tickers missing some dates (files and alpaca).
    :param max_price_ratio: refuse a close beyond this multiple of the previous one (files and alpaca; 0: any).
    :param alpaca_kwargs: passed to envs.alpaca.fetch_bars (timeframe, adjustment, feed, cache_dir, ...).
    :returns: MarketData, tickers sorted by name unless ``tickers`` gives an order.
    """
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"empty data source; use one of {_FORMS}")
    source = source.strip()
    scheme, sep, rest = source.partition(":")
    scheme = scheme.strip().lower()
    if alpaca_kwargs and scheme != "alpaca":
        raise UserError(f"options {', '.join(sorted(alpaca_kwargs))} only apply to the alpaca source, not {source!r}")

    if scheme == "synthetic":
        data = generate_synthetic(rest, seed)
        if start is not None or end is not None:
            data = data.select_dates(start, end)
        if tickers is not None:
            data = data.select_tickers(tickers)
        return data

    if scheme == "alpaca":
        options = alpaca_options(source)  # an unknown option or value is named before anything else
        if not tickers:
            raise UserError("the alpaca source needs tickers (e.g. --tickers AAPL,MSFT)")
        if start is None or end is None:
            raise UserError("the alpaca source needs a start and an end date (YYYY-MM-DD)")
        from envs.alpaca import fetch_bars  # lazy: alpaca-py is slow to import and needs keys

        frame = fetch_bars(list(tickers), start, end, **{**options, **alpaca_kwargs})
        frame = _filter_frame(standardize_frame(frame), tickers, start, end, "the Alpaca bars")
        data = MarketData.from_frame(frame, gap_policy=gap_policy, max_price_ratio=max_price_ratio)
        return data.select_tickers(tickers)

    if scheme in ("csv", "parquet") and sep:
        path, kind = Path(rest.strip()), scheme
        if not rest.strip():
            raise UserError(f"{scheme}: needs a path, e.g. {scheme}:data/prices.{scheme}")
    elif source.lower().endswith((".csv", ".csv.gz", ".parquet", ".pq")):
        path, kind = Path(source), None
    else:
        raise UserError(f"unknown data source {source!r}; use one of {_FORMS}")
    frame = standardize_frame(read_frame(path, kind=kind))
    frame = _filter_frame(frame, tickers, start, end, str(path))
    data = MarketData.from_frame(frame, gap_policy=gap_policy, max_price_ratio=max_price_ratio)
    return data.select_tickers(tickers) if tickers is not None else data


def describe_source(source: str) -> str:
    """What a data source is, in words for a console line: ``synthetic market, no planted signal``, ``synthetic
    market, planted lead_lag signal of IC 0.04``, ``CSV file prices.csv``, ``Alpaca 1Day bars (iex feed, all
    adjustment)``. A synthetic source's signal kind defaults to its generator's (`default_signal_kind`)."""
    scheme, options = split_source(source)
    if scheme == "synthetic":
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
