"""`clstm-ppo data download`: fill the Alpaca bar cache, optionally write the long CSV/Parquet.

    clstm-ppo data download --tickers AAPL,MSFT --start 2015-01-01 --end 2024-12-31 \\
        [--timeframe 1Day] [--adjustment all] [--feed iex] [--cache_dir data_cache/alpaca] \\
        [--refresh] [--data_url URL] [--out FILE.csv|FILE.parquet]

Prints one summary line. Keys come from the environment or `.env` (see `.env.example`); they are
never printed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from envs.alpaca import ADJUSTMENTS, FEEDS, fetch_bars
from envs.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clstm-ppo data download",
        description="Download daily (or intraday) stock bars from Alpaca into the local cache.",
        epilog="Keys: ALPACA_API_KEY and ALPACA_SECRET_KEY (or APCA_API_KEY_ID and APCA_API_SECRET_KEY) "
        "from the environment or ./.env; see .env.example. A cached request needs no keys or network.",
    )
    parser.add_argument("--tickers", required=True, help="comma-separated symbols, e.g. AAPL,MSFT")
    parser.add_argument("--start", required=True, help="first calendar day, New York time (YYYY-MM-DD)")
    parser.add_argument("--end", required=True, help="last calendar day, included (YYYY-MM-DD)")
    parser.add_argument("--timeframe", default="1Day", help="bar length: 1Day, 1Hour, 15Min, 1Week, ...")
    parser.add_argument("--adjustment", default="all", choices=ADJUSTMENTS,
                        help="corporate-action adjustment (default all)")
    parser.add_argument("--feed", default="iex", choices=FEEDS,
                        help="iex (free plan, default) or sip (all US exchanges; paid for recent data)")
    parser.add_argument("--cache_dir", default="data_cache/alpaca", help="folder of cached Parquet files")
    parser.add_argument("--refresh", action="store_true", help="download again even when cached")
    parser.add_argument("--data_url", default=None, help="data endpoint override (else ALPACA_DATA_URL)")
    parser.add_argument("--out", default=None, help="also write the long table here (.csv or .parquet)")
    return parser


def _write_table(frame, out: Path) -> None:
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise UserError(f"--out {out} must end in .csv or .parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if suffix == ".csv":
            frame.to_csv(tmp, index=False, date_format="%Y-%m-%d %H:%M:%S")
        else:
            frame.to_parquet(tmp, index=False)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """Entry point for `clstm-ppo data download`; returns 0, raises UserError for user problems."""
    args = build_parser().parse_args(argv)
    if args.out and Path(args.out).suffix.lower() not in (".csv", ".parquet"):
        # Checked before downloading, so a typo costs no request.
        raise UserError(f"--out {args.out} must end in .csv or .parquet")
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
        _write_table(frame, Path(args.out))
    first, last = frame["date"].min(), frame["date"].max()
    fmt = "%Y-%m-%d" if (frame["date"] == frame["date"].dt.normalize()).all() else "%Y-%m-%d %H:%M"
    where = f"; wrote {args.out}" if args.out else ""
    print(
        f"{len(frame)} bars for {frame['tic'].nunique()} tickers, {frame['date'].nunique()} dates "
        f"{first:{fmt}}..{last:{fmt}} ({args.timeframe}, {args.adjustment}, {args.feed}), "
        f"cache {args.cache_dir}{where}"
    )
    return 0


if __name__ == "__main__":
    import sys

    from clstm_ppo.cli import run_guarded

    sys.exit(run_guarded(main, sys.argv[1:]))
