"""`clstm-ppo data ...`: generate a synthetic market, inspect a data file, or download Alpaca bars.

clstm-ppo data generate --out data/syn.csv --seed 1 --tickers 30 --days 2520 --signal 0.5
clstm-ppo data inspect examples/data/stocks_daily_6_ohlcv.csv
clstm-ppo data download ...     (delegates to clstm_ppo.cli.data_download)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from envs.atomic import atomic_write
from envs.data import GAP_POLICIES, MarketData, coverage_gaps, read_frame, standardize_frame
from envs.errors import UserError
from envs.synthetic import SIGNALS, generate_market


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags as a UserError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """The `clstm-ppo data` argument parser."""
    parser = _Parser(
        prog="clstm-ppo data",
        description="Generate, inspect or download daily OHLCV market data "
        "in the long format date, tic, open, high, low, close, volume.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{generate,inspect,download}", parser_class=_Parser)

    gen = sub.add_parser(
        "generate",
        help="write a seeded synthetic market to CSV or Parquet",
        description="Write a seeded synthetic market (correlated tickers, bull/bear/high-vol "
        "regimes, optional planted learnable signal) in the long format. Same flags, same bytes.",
    )
    gen.add_argument("--out", required=True, help="output file; .csv or .parquet (folders are created)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--tickers", type=int, default=30, help="number of tickers SYN00, SYN01, ... (default 30)")
    gen.add_argument("--days", type=int, default=2520, help="number of business days (default 2520, ten years)")
    gen.add_argument("--start", default="2014-01-02", help="first business day, YYYY-MM-DD (default 2014-01-02)")
    gen.add_argument(
        "--signal",
        type=float,
        default=0.0,
        help="strength in [0, 1) of the planted predictable signal (default 0: none; 0.5 is clearly exploitable)",
    )
    gen.add_argument(
        "--signal_kind",
        default="momentum",
        choices=SIGNALS,
        help="momentum: persistent per-ticker trends; lead_lag: ticker i leads ticker i+1 by a day",
    )

    ins = sub.add_parser(
        "inspect",
        help="validate a CSV/Parquet file and summarise it",
        description="Validate a long-format CSV/Parquet file (the same checks training uses) and "
        "print its tickers, dates, gaps per ticker and per-ticker return statistics.",
    )
    ins.add_argument(
        "file",
        help="a .csv or .parquet file (columns date, tic, open, high, low, close, volume; "
        "aliases such as symbol/ticker and timestamp are accepted)",
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

    from envs.alpaca import ADJUSTMENTS, FEEDS  # names only: alpaca-py itself is imported on download

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
        "--adjustment", default="all", choices=ADJUSTMENTS, help="corporate-action adjustment (default all)"
    )
    dl.add_argument(
        "--feed",
        default="iex",
        choices=FEEDS,
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
    return {"generate": _generate, "inspect": _inspect, "download": _download}[args.command](args)


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
    where = f"; wrote {args.out}" if args.out else ""
    print(
        f"{len(frame)} bars for {frame['tic'].nunique()} tickers, {frame['date'].nunique()} dates "
        f"{first:{fmt}}..{last:{fmt}} ({args.timeframe}, {args.adjustment}, {args.feed}), "
        f"cache {args.cache_dir}{where}"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    data = generate_market(
        num_tickers=args.tickers,
        num_days=args.days,
        start=args.start,
        seed=args.seed,
        signal_strength=args.signal,
        signal=args.signal_kind,
    )
    data.to_path(out)
    print(
        f"wrote {data.num_days * data.num_tickers} rows ({data.num_tickers} tickers x {data.num_days} days, "
        f"{data.date_str(0)} .. {data.date_str(-1)}, seed {args.seed}, signal {args.signal_kind} "
        f"{args.signal:g}) to {out}"
    )
    return 0


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).rjust(w) if i > 0 else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


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
        _table(
            rows,
            ["ticker", "first", "last", "days", "missing", "mean_ret%", "vol%", "ann_vol%", "min_price", "max_price"],
        ),
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
    frame = standardize_frame(read_frame(args.file), use_adjusted=args.use_adjusted)
    print(f"file: {args.file}")
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
    from clstm_ppo.cli import run_guarded

    sys.exit(run_guarded(main, sys.argv[1:]))
