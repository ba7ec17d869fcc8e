"""`clstm-ppo data ...`: generate a synthetic market, inspect a data file, or download Alpaca bars.

clstm-ppo data generate --out data/syn.csv --seed 1 --tickers 30 --days 2520 --signal_ic 0.04
clstm-ppo data generate --out data/like.csv --like examples/data/stocks_daily_6_ohlcv.csv
clstm-ppo data inspect examples/data/stocks_daily_6_ohlcv.csv
clstm-ppo data inspect --facts csv:examples/data/stocks_daily_6_ohlcv.csv synthetic:tickers=20
clstm-ppo data oracle synthetic:tickers=6,signal_ic=0.3,signal_halflife=5 --seed 3
clstm-ppo data oracle examples/data/stocks_daily_6_ohlcv.csv --signal momentum,halflife=20
clstm-ppo data oracle planted.csv --signal col:forecast
clstm-ppo data plant examples/data/stocks_daily_6_ohlcv.csv --ic 0.05 --halflife 10 --seed 1 --out planted.csv
clstm-ppo data download --tickers AAPL,MSFT --start 2015-01-01 --end 2024-12-31 --out bars.csv
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from clstm_ppo.cli.main import OneLineParser
from envs.atomic import atomic_write
from envs.data import GAP_POLICIES, MarketData, coverage_gaps, read_frame, standardize_frame
from envs.errors import UserError
from envs.factor_market import DEFAULT_MODEL, PER_TICKER, MarketModel, SignalSpec
from envs.facts import FACT_LABELS, market_facts
from envs.predictor import SIGNALS
from envs.source_spec import ALPACA_OPTIONS
from envs.sources import GENERATORS, default_signal_kind, load_market_data
from envs.synthetic import GENERATOR_VERSION, GENERATOR_VERSIONS
from envs.text import text_table


def build_parser() -> argparse.ArgumentParser:
    """The `clstm-ppo data` argument parser."""
    parser = OneLineParser(
        prog="clstm-ppo data",
        description="Generate, inspect or download daily OHLCV market data "
        "in the long format date, tic, open, high, low, close, volume.",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{generate,inspect,oracle,plant,download}", parser_class=OneLineParser
    )

    gen = sub.add_parser(
        "generate",
        help="write a seeded synthetic market to CSV or Parquet",
        description="Write a seeded synthetic market in the long format: daily stocks with fat tails, volatility "
        "clustering, a leverage effect, correlations that rise in sell-offs and an overnight gap (docs/data.md), "
        "optionally a planted signal of a given information coefficient; or, with --like FILE, a market fitted to "
        "FILE's. Same flags, same bytes.",
    )
    gen.add_argument("--out", required=True, help="output file; .csv or .parquet (folders are created)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument(
        "--tickers", type=int, default=None, help="number of tickers SYN00, SYN01, ... (default 30; --like: FILE's)"
    )
    gen.add_argument(
        "--days", type=int, default=None, help="number of business days (default 2520, ten years; --like: FILE's)"
    )
    gen.add_argument("--start", default="2014-01-02", help="first business day, YYYY-MM-DD (default 2014-01-02)")
    gen.add_argument(
        "--like",
        default=None,
        metavar="FILE",
        help="fit the generator to FILE (CSV/Parquet, or any --data source): volatilities, drifts, correlations, "
        "tails, clustering, leverage, the overnight share where it has opens; then generate with those",
    )
    gen.add_argument(
        "--signal_ic",
        type=float,
        default=0.0,
        help="plant a signal: the predictor's correlation with the next open-to-open return, in [0, 0.5) "
        "(default 0: none; 0.02-0.05 is realistic, 0.3 a toy that a small network learns quickly)",
    )
    gen.add_argument(
        "--signal_kind",
        default=None,
        choices=SIGNALS,
        help="lead_lag (default): in pairs, ticker 0's moves predict ticker 1's, ticker 2's ticker 3's, ...; "
        "momentum: a ticker's own moves predict it (docs/data.md)",
    )
    gen.add_argument(
        "--signal_halflife", type=float, default=20.0, help="days for the predictor to lose half its memory (20)"
    )
    gen.add_argument(
        "--signal_overnight",
        type=float,
        default=0.3,
        help="share of a planted move in the next overnight gap, before a next-open fill (default 0.3)",
    )
    gen.add_argument(
        "--generator",
        type=int,
        default=GENERATOR_VERSION,
        choices=GENERATOR_VERSIONS,
        help=f"generator version (default {GENERATOR_VERSION}); 1 and 2 are kept for old checkpoints (1: the old "
        "Gaussian market, whose signal is --signal; 2: its planted predictor is hidden from the prices)",
    )
    gen.add_argument(
        "--signal", type=float, default=0.0, help="--generator 1 only: strength in [0, 1) of its planted signal"
    )

    ins = sub.add_parser(
        "inspect",
        help="validate a CSV/Parquet file and summarise it",
        description="Validate a long-format CSV/Parquet file (the same checks training uses) and "
        "print its tickers, dates, gaps per ticker and per-ticker return statistics.",
    )
    ins.add_argument(
        "file",
        nargs="+",
        help="a .csv or .parquet file (columns date, tic, open, high, low, close, volume; "
        "aliases such as symbol/ticker and timestamp are accepted); with --facts one or two data sources "
        "(FILE, csv:PATH, parquet:PATH or synthetic:k=v,...)",
    )
    ins.add_argument(
        "--facts",
        action="store_true",
        help="print the stylized facts of daily returns instead (excess kurtosis, volatility clustering, leverage, "
        "correlations, the overnight share, drift, volatility), side by side for one or two sources",
    )
    ins.add_argument(
        "--gap_policy",
        default="report",
        choices=("report",) + GAP_POLICIES,
        help="report (default): list gaps and exit 0; fail: exit 2 on gaps, as training does; "
        "intersect / ffill: also show what that policy would load",
    )
    ins.add_argument("--max_ffill_days", type=int, default=5, help="longest gap ffill fills (default 5)")
    ins.add_argument(
        "--use_adjusted", action="store_true", help="rescale OHLC by the adjusted-close column (adjusted / adj_close)"
    )

    orc = sub.add_parser(
        "oracle",
        help="the reference trader of a signal: the best of a family of signal traders, chosen on the training days",
        description='The reference trader a policy\'s result is read against (docs/data.md, "The reference trader"): '
        "take the signal a (a rule's predictor recomputed from the closes, envs/predictor.py, or a forecast column of "
        "the file, standardised per ticker on the training days), measure its information coefficient with the "
        "return the fills earn, run every member of the family (target weights from clip(scale x a, -1, 1) over a "
        "grid of scales, 0 the equal-weight book, x a grid of no-trade bands) through the backtest's env, costs and "
        "fills on the training days, keep the best Sharpe, and trade it on the days asked for, beside equal-weight "
        "buy-and-hold. It is a reference, not a bound: a policy may beat it.",
    )
    orc.add_argument("source", help="a data source: FILE, csv:PATH, parquet:PATH or synthetic:k=v,...")
    orc.add_argument(
        "--signal",
        default=None,
        metavar="SIGNAL",
        help="a rule KIND[,halflife=DAYS][,lag=DAYS] (KIND lead_lag or momentum) computed from the closes, or "
        "col:NAME, a forecast column of the file (its value on date t known at t's close); default: a generated "
        "market's own planted rule, read from its synthetic options",
    )
    orc.add_argument("--seed", type=int, default=0, help="seed of a synthetic source that names none (default 0)")
    orc.add_argument(
        "--split",
        default="test",
        choices=("train", "validation", "test"),
        help="the days traded: the default splits' (70 / 15 / 15 %% of the days, as training's; the member is "
        "always chosen on the training days); default test",
    )

    plant = sub.add_parser(
        "plant",
        help="write a file's rows back with a planted forecast column of an exact information coefficient",
        description="Write FILE's rows and columns unchanged plus one column: a forecast of the return the fills earn "
        "(next open to the open after where FILE has opens, next close to the close after where it has closes only), "
        "a forward exponential average of the winsorised fill returns plus AR(1) noise of the same half-life, "
        "calibrated so that its IC (Pearson per ticker, averaged) on FILE is exactly --ic. The rule: docs/data.md, "
        '"Planting a forecast".',
    )
    plant.add_argument("file", help="a long-format .csv or .parquet file of daily bars (as training reads it)")
    plant.add_argument("--out", required=True, help="the new file, of FILE's format (.csv or .parquet); never FILE")
    plant.add_argument("--ic", type=float, required=True, help="the IC to plant, in (0, 1); 0.02-0.05 is realistic")
    plant.add_argument(
        "--halflife", type=float, default=10.0, help="days for the forecast to lose half its memory (10)"
    )
    plant.add_argument("--seed", type=int, default=0, help="seed of the noise (default 0): a replication's forecast")
    plant.add_argument("--name", default="forecast", help="the new column's name (default forecast)")
    plant.add_argument(
        "--gap_policy",
        default="fail",
        choices=("fail", "ffill"),
        help="tickers with missing dates: fail (default) | ffill (short gaps as flat bars, as training's ffill)",
    )
    plant.add_argument("--train_end", default="", help="the IC printed per split: last training day (default 70%%)")
    plant.add_argument("--validation_end", default="", help="last validation day (default 85%% of the days)")

    dl = sub.add_parser(
        "download",
        help="download Alpaca bars into the local cache (optionally write the long table)",
        description="Download daily (or intraday) stock bars from Alpaca into the local cache.",
        epilog="Keys: ALPACA_API_KEY and ALPACA_SECRET_KEY (or APCA_API_KEY_ID and APCA_API_SECRET_KEY) "
        "from the environment or ./.env; see .env.example. A cached request needs no keys or network.",
    )
    dl.add_argument("--tickers", required=True, help="comma-separated symbols, e.g. AAPL,MSFT")
    dl.add_argument("--start", required=True, help="first calendar day, New York time (YYYY-MM-DD)")
    dl.add_argument("--end", required=True, help="last calendar day, included (YYYY-MM-DD)")
    dl.add_argument("--timeframe", default="1Day", help="bar length: 1Day, 1Hour, 15Min, 1Week, ...")
    dl.add_argument(
        "--adjustment",
        default="all",
        choices=ALPACA_OPTIONS["adjustment"],
        help="corporate-action adjustment (default all)",
    )
    dl.add_argument(
        "--feed",
        default="iex",
        choices=ALPACA_OPTIONS["feed"],
        help="iex (free plan, default) or sip (all US exchanges; paid for recent data)",
    )
    dl.add_argument("--cache_dir", default="data_cache/alpaca", help="folder of cached Parquet files")
    dl.add_argument("--refresh", action="store_true", help="download again even when cached")
    dl.add_argument("--data_url", default=None, help="data endpoint override (else ALPACA_DATA_URL)")
    dl.add_argument("--out", default=None, help="also write the long table here (.csv or .parquet)")
    return parser


def main(argv: Sequence[str]) -> int:
    """Entry point of `clstm-ppo data`; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    commands = {"generate": _generate, "inspect": _inspect, "oracle": _oracle, "plant": _plant, "download": _download}
    return commands[args.command](args)


def _oracle(args: argparse.Namespace) -> int:
    from clstm_ppo.config import TrainConfig
    from clstm_ppo.evaluation.oracle import reference_run
    from clstm_ppo.market import build_market
    from envs.execution import describe_execution
    from envs.oracle import describe_family, parse_signal, require_planted_rule, signal_predictor
    from envs.predictor import fill_returns, information_coefficient
    from envs.text import text_table

    signal = parse_signal(args.signal) if args.signal else require_planted_rule(args.source)
    cfg = TrainConfig.from_dict({"data": args.source, "seed": args.seed}, source="data oracle")
    market = build_market(cfg.data, seed=args.seed)
    days, train = market.split_range(args.split), market.splits.train
    data = market.data
    predictor = signal_predictor(data, signal, train)
    ahead = fill_returns(None if data.close_only else data.open, data.close)
    rows = slice(days.start, days.stop)
    result = reference_run(market, days, cfg.env, signal)
    choice, figures = result.choice, result.figures
    followed = int((np.abs(predictor).sum(axis=0) > 0).sum())
    print(
        f"market: {args.source} ({data.num_tickers} tickers x {data.num_days} days); {args.split} days "
        f"{data.date_str(days.start)} .. {data.date_str(days.stop - 1)} ({days.num_days} days), "
        f"{describe_execution(cfg.env.execution, data)}, {cfg.env.buy_cost_pct:.1%} a side"
    )
    print(
        f"signal: {signal.describe()}, known at each day's close: {followed} of {data.num_tickers} tickers have one; "
        f"its IC with the return the fills earn: {information_coefficient(predictor[rows], ahead[rows]):.3f} on "
        f"these days, {information_coefficient(predictor, ahead):.3f} on all"
    )
    print(
        f"family: {describe_family()}; each one's Sharpe after costs on the training days "
        f"{data.date_str(train.start)} .. {data.date_str(train.stop - 1)} ({train.num_days} days):"
    )
    print("\n".join(text_table(choice.table(), "l" + "r" * (len(choice.table()[0]) - 1))))
    print(
        f"chosen on the training days: {result.member.describe()} (Sharpe {choice.figures.sharpe:.2f} there, "
        f"buy-and-hold {choice.figures.buy_and_hold_sharpe:.2f})"
    )
    print(
        f"reference trader: Sharpe {figures.sharpe:.2f} after costs, return {figures.cumulative_return:+.2%}, turnover "
        f"{figures.annual_turnover:.1f}x a year, exposure {figures.exposure:.0%} on the {args.split} days"
        f"{' (the days it was chosen on)' if days == train else ''} | buy-and-hold Sharpe "
        f"{figures.buy_and_hold_sharpe:.2f}, return {figures.buy_and_hold_return:+.2%} | the reference's excess over "
        f"buy-and-hold: {figures.sharpe - figures.buy_and_hold_sharpe:+.2f}"
    )
    return 0


def _plant(args: argparse.Namespace) -> int:
    from clstm_ppo.config import DataConfig
    from clstm_ppo.market import data_splits
    from envs.plant import PlantRule, plant_forecast, row_cells

    rule = PlantRule(args.ic, args.halflife, args.seed)
    source, out = Path(args.file), Path(args.out)
    kind = _plant_paths(source, out)
    _plant_name(args.name, [])
    raw = read_frame(source)
    _plant_name(args.name, list(raw.columns))
    data = MarketData.from_frame(raw, gap_policy=args.gap_policy)
    splits = data_splits(data, DataConfig(train_end=args.train_end, validation_end=args.validation_end))
    planted = plant_forecast(data, rule)
    days, tickers = row_cells(raw, data)
    frame = _plant_write(source, out, kind, raw, args.name, planted.column[days, tickers])
    print(f'planted {args.name!r}: {rule.describe(planted.target)} (the rule: docs/data.md, "Planting a forecast")')
    ranges = [("all", slice(0, data.num_days))]
    ranges += [(name, slice(r.start, r.stop)) for name, r in splits.as_dict().items() if r is not None]
    print(_plant_ics(data, planted.column, planted.ahead, ranges))
    print(f"wrote {len(frame)} rows, {source}'s {len(frame.columns) - 1} columns and {args.name!r}, to {out}")
    return 0


def _plant_write(source: Path, out: Path, kind: str, raw: pd.DataFrame, name: str, values: np.ndarray) -> pd.DataFrame:
    """Write ``source``'s rows with the column ``name`` = ``values`` ``[rows]`` to ``out``, atomically; returns the
    frame written. A CSV's cells are written back as the text they were; a Parquet frame as read (index included)."""
    if kind == "csv":
        frame = pd.read_csv(source, dtype=str, keep_default_na=False, na_filter=False)
        if len(frame) != len(values):
            raise UserError(f"{source}: its rows read as text ({len(frame)}) are not the {len(values)} it holds")
        frame[name] = values
        atomic_write(out, lambda handle: frame.to_csv(handle, index=False))
    else:
        frame = raw.copy()
        frame[name] = values
        atomic_write(out, lambda handle: frame.to_parquet(handle))
    return frame


def _plant_ics(data: MarketData, column: np.ndarray, ahead: np.ndarray, ranges: list[tuple[str, slice]]) -> str:
    """Two lines: the IC of ``column`` ``[D, N]`` with the fill returns ``ahead`` ``[D, N]`` (per ticker, averaged),
    then its cross-sectional IC, on each of the named ``ranges`` of days."""
    from envs.plant import cross_sectional_ic
    from envs.predictor import information_coefficient

    lines = []
    for label, measure in (
        ("IC (Pearson over days per ticker, mean over tickers)", information_coefficient),
        ("cross-sectional IC (Pearson across tickers per day, mean over days)", cross_sectional_ic),
    ):
        parts = [f"{name}{_plant_days(data, rows)} {measure(column[rows], ahead[rows]):.4f}" for name, rows in ranges]
        lines.append(f"{label}: {' | '.join(parts)}")
    return "\n".join(lines)


def _plant_paths(source: Path, out: Path) -> str:
    """The input's kind, "csv" or "parquet", once ``out`` is a new file of that kind (else one `UserError`)."""
    kind = "parquet" if source.name.lower().endswith((".parquet", ".pq")) else "csv"
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise UserError(f"--out {out} must end in .csv or .parquet")
    if out.suffix.lower() != f".{kind}":
        raise UserError(f"--out {out} must be a .{kind} file, like {source}: planting writes its rows back as they are")
    if out.resolve() == source.resolve():
        raise UserError(f"--out {out} is the input file; planting never overwrites it: name a new file")
    if out.exists():
        raise UserError(f"--out {out} exists; planting writes a new file: remove it or name another")
    return kind


def _plant_name(name: str, columns: list[object]) -> None:
    """One `UserError` unless ``name`` is a new column's: not a bar's (or any alias the loader reads as one), and not
    one of ``columns`` (compared stripped and lower-cased, as the loader matches names)."""
    from envs.data import ALIASES

    if not name or name != name.strip():
        raise UserError(f"--name must be a column name without surrounding spaces, got {name!r}")
    bars = [canonical for canonical, spellings in ALIASES.items() if name.lower() in spellings]
    if bars:
        raise UserError(f"--name {name!r} is a name the loader reads as the {bars[0]} column; choose another")
    taken = [c for c in columns if str(c).strip().lower() == name.lower()]
    if taken:
        raise UserError(f"--name {name!r}: the file already has a column {str(taken[0])!r}; choose another name")


def _plant_days(data: MarketData, rows: slice) -> str:
    """`` 2001-01-02 .. 2003-12-31`` for a split's rows, nothing for all of them."""
    if rows.start == 0 and rows.stop == data.num_days:
        return ""
    return f" {data.date_str(rows.start)} .. {data.date_str(rows.stop - 1)}"


def _download(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).suffix.lower() not in (".csv", ".parquet"):
        # Checked before downloading, so a typo costs no request.
        raise UserError(f"--out {args.out} must end in .csv or .parquet")
    from envs.alpaca import fetch_bars

    tickers = [t for t in args.tickers.split(",") if t.strip()]
    frame = fetch_bars(
        tickers,
        args.start,
        args.end,
        timeframe=args.timeframe,
        adjustment=args.adjustment,
        feed=args.feed,
        cache_dir=args.cache_dir,
        refresh=args.refresh,
        data_url=args.data_url,
    )
    if args.out:
        out = Path(args.out)
        if out.suffix.lower() == ".csv":
            atomic_write(out, lambda handle: frame.to_csv(handle, index=False, date_format="%Y-%m-%d %H:%M:%S"))
        else:
            atomic_write(out, lambda handle: frame.to_parquet(handle, index=False))
    first, last = frame["date"].min(), frame["date"].max()
    fmt = "%Y-%m-%d" if (frame["date"] == frame["date"].dt.normalize()).all() else "%Y-%m-%d %H:%M"
    print(
        f"{len(frame)} bars for {frame['tic'].nunique()} tickers, {frame['date'].nunique()} dates "
        f"{first:{fmt}}..{last:{fmt}} ({args.timeframe}, {args.adjustment}, {args.feed}), "
        f"cache {args.cache_dir}{f'; wrote {args.out}' if args.out else ''}"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in (".csv", ".parquet"):  # before any fit, so a typo costs nothing
        raise UserError(f"cannot tell the format of {out} (use .csv or .parquet)")
    kind = args.signal_kind or default_signal_kind(args.generator)
    if args.generator != 1:  # checked before a fit, which takes seconds
        SignalSpec(args.signal_ic, kind, args.signal_halflife, args.signal_overnight)
    model, like = DEFAULT_MODEL, None
    if args.like:
        if args.generator != GENERATOR_VERSION:
            raise UserError(f"--like fits generator {GENERATOR_VERSION}; drop --generator {args.generator}")
        from envs.market_fit import fit_market

        like = load_market_data(args.like)
        model, _ = fit_market(like, what=args.like)
        if args.tickers is not None and args.tickers != like.num_tickers:  # the fitted tickers, taken in turn
            model = replace(
                model, **{k: tuple(v[i % like.num_tickers] for i in range(args.tickers)) for k, v in _per_ticker(model)}
            )
    tickers = args.tickers if args.tickers is not None else (like.num_tickers if like else 30)
    days = args.days if args.days is not None else (like.num_days if like else 2520)
    if args.generator == 1:
        if args.signal_ic:
            raise UserError("--signal_ic is generators 2 and 3's; generator 1 takes --signal (a strength in [0, 1))")
        options: dict[str, object] = {"signal_strength": args.signal, "signal": kind}
        signal = f"signal {kind} {args.signal:g}"
    else:
        if args.signal:
            raise UserError(
                "--signal is generator 1's strength; give --signal_ic, the predictor's correlation with the next "
                "open-to-open return in [0, 0.5) (0.02-0.05 realistic, 0.3 a toy), or add --generator 1"
            )
        options = {
            "signal_ic": args.signal_ic,
            "signal_kind": kind,
            "signal_halflife": args.signal_halflife,
            "signal_overnight": args.signal_overnight,
            **({"model": model} if args.generator == 3 else {}),  # generator 2 draws with its own
        }
        signal = f"signal {kind} IC {args.signal_ic:g}" if args.signal_ic else "no signal"
    data = GENERATORS[args.generator](num_tickers=tickers, num_days=days, start=args.start, seed=args.seed, **options)
    data.to_path(out)
    print(
        f"wrote {data.num_days * data.num_tickers} rows ({data.num_tickers} tickers x {data.num_days} days, "
        f"{data.date_str(0)} .. {data.date_str(-1)}, generator {args.generator}, seed {args.seed}, {signal}) to {out}"
    )
    if like is not None:
        shares = model.ticker_market_share or (model.market_share,)  # the per-ticker ones as their means
        print(
            f"fitted to {args.like}: market share {np.mean(shares):.2f} (mean over tickers), overnight share "
            f"{model.overnight_share:.2f}, vol of vol {model.vol_of_vol:.3f} (persistence "
            f"{model.vol_persistence:.3f}), leverage {model.leverage:.2f} (market {model.market_leverage:.2f}), "
            f"jumps {model.jump_size:.2f} sigmas at {model.jump_rate:g} a day"
        )
        print(facts_table([args.like, str(out)], [like, data]))
    return 0


def _per_ticker(model: MarketModel) -> list[tuple[str, tuple[float, ...]]]:
    return [(k, v) for k in PER_TICKER if (v := getattr(model, k)) is not None]


def facts_table(names: list[str], markets: list[MarketData]) -> str:
    """The stylized facts (`envs.facts`) of ``markets``, one column each, headed by ``names``."""
    facts = [market_facts(m) for m in markets]
    rows = [[label, *(_fact(getattr(f, key)) for f in facts)] for key, label in FACT_LABELS.items()]
    rows.insert(0, ["tickers x days", *(f"{m.num_tickers} x {m.num_days}" for m in markets)])
    return "\n".join(text_table([["fact", *names], *rows], "l" + "r" * len(names)))


def _fact(value: float) -> str:
    return "n/a (close only)" if math.isnan(value) else f"{value:.3f}"


def summarize(frame: pd.DataFrame) -> str:
    """Readable report of a standardised long frame: coverage, gaps, per-ticker statistics."""
    all_dates = np.unique(frame["date"].to_numpy())
    gaps = coverage_gaps(frame)
    rows = []
    for tic, g in frame.groupby("tic", sort=True):
        close = g["close"].to_numpy()
        ret = close[1:] / close[:-1] - 1 if len(close) > 1 else np.array([np.nan])
        first, last = (str(pd.Timestamp(x).date()) for x in (g["date"].iloc[0], g["date"].iloc[-1]))
        rows.append(
            [
                str(tic),
                first,
                last,
                str(len(g)),
                str(len(gaps.get(str(tic), []))),
                f"{100 * np.mean(ret):.3f}",
                f"{100 * np.std(ret):.2f}",
                f"{100 * np.sqrt(252) * np.std(ret):.1f}",
                f"{close.min():.2f}",
                f"{close.max():.2f}",
            ]
        )
    cols = frame.attrs.get("source_columns", {})
    header = ["ticker", "first", "last", "days", "missing", "mean_ret%", "vol%", "ann_vol%", "min_price", "max_price"]
    used = ", ".join(f"{v}->{k}" if str(v).strip().lower() != k else k for k, v in cols.items() if k != "adj_close")
    lines = [
        f"rows: {len(frame)}   tickers: {frame['tic'].nunique()}   dates: {pd.Timestamp(all_dates[0]).date()} .. "
        f"{pd.Timestamp(all_dates[-1]).date()} ({len(all_dates)} trading days)",
        f"bars: {'close only (open/high/low filled from close)' if frame.attrs.get('close_only') else 'OHLCV'}"
        f"   columns: {used}"
        + (
            f"   ({'OHLC rescaled by' if frame.attrs.get('adjusted') else 'dividends implied by'} {cols['adj_close']})"
            if "adj_close" in cols
            else ""
        ),
        "",
        *text_table([header, *rows], "l" + "r" * (len(header) - 1)),
        "",
    ]
    if gaps:
        lines.append(f"gaps: {len(gaps)} of {frame['tic'].nunique()} tickers miss some of the {len(all_dates)} dates")
        for tic, missing in gaps.items():
            shown = ", ".join(str(pd.Timestamp(m).date()) for m in missing[:5])
            lines.append(f"  {tic}: {len(missing)} missing ({shown}{', ...' if len(missing) > 5 else ''})")
    else:
        lines.append("gaps: none (every ticker has every date)")
    return "\n".join(lines)


def _inspect(args: argparse.Namespace) -> int:
    if args.facts:
        if len(args.file) > 2:
            raise UserError(f"--facts compares one or two data sources, got {len(args.file)}")
        policy = "fail" if args.gap_policy == "report" else args.gap_policy
        markets = [load_market_data(f, gap_policy=policy) for f in args.file]
        print(facts_table(list(args.file), markets))
        return 0
    if len(args.file) > 1:
        raise UserError(f"inspect reads one file ({len(args.file)} given); --facts compares two")
    path = args.file[0]
    frame = standardize_frame(read_frame(path), use_adjusted=args.use_adjusted)
    print(f"file: {path}")
    print(summarize(frame))
    if args.gap_policy != "report":
        data = MarketData.from_frame(frame, gap_policy=args.gap_policy, max_ffill_days=args.max_ffill_days)
        print(
            f"gap_policy {args.gap_policy}: loads {data.num_days} days x {data.num_tickers} tickers "
            f"({data.date_str(0)} .. {data.date_str(-1)})"
        )
    elif coverage_gaps(frame):
        print("note: training with gap_policy 'fail' (the default) refuses this file; use 'intersect' or 'ffill'")
    return 0


if __name__ == "__main__":
    from clstm_ppo.cli import run_command

    sys.exit(run_command(main))
