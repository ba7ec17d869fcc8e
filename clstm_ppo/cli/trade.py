"""`clstm-ppo trade` (paper-trade a checkpoint on Alpaca) and `clstm-ppo trade report`: flags -> `clstm_ppo.trading`.

clstm-ppo trade --checkpoint checkpoints/run/best.pt             # plan for today's close, sends nothing
clstm-ppo trade --checkpoint checkpoints/run/best.pt --submit    # sends the orders to the paper account
clstm-ppo trade report --checkpoint checkpoints/run/best.pt      # paper equity vs the backtest, same days
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clstm_ppo.cli.backtest import device_flag
from clstm_ppo.cli.main import OneLineParser
from clstm_ppo.trading.broker import Endpoint
from clstm_ppo.trading.report import report_table, trade_report
from clstm_ppo.trading.run import TradeOptions, default_journal, run_trade

DESCRIPTION = """\
Trade a checkpoint on Alpaca, one decision per session, exactly as its backtest decides: run it once a day
after the close (16:00 New York, 13:00 on early-close days; it refuses before the close and on days without
a session). It downloads the checkpoint's tickers' daily bars, replays the policy from the replay start to
today, reads cash and shares from the account, and turns today's action into orders with the env's rules
(sells first, hmax, costs, cash never negative, the turbulence stop). Without --submit it prints and
journals the plan and sends nothing. Orders are market day orders: sent after the close, they fill at the
next open, not at the close the plan priced them at.

Keys: ALPACA_API_KEY/ALPACA_SECRET_KEY (or APCA_API_KEY_ID/APCA_API_SECRET_KEY) in the environment or
./.env; ALPACA_TRADING_URL and ALPACA_DATA_URL override the endpoints; ALPACA_TIMEOUT_SECONDS,
ALPACA_MAX_RETRIES and ALPACA_RETRY_WAIT_SECONDS tune the HTTP timeout and 429/504 retries.
`clstm-ppo trade report --help` compares the paper account with the backtest."""


def build_parser() -> argparse.ArgumentParser:
    """The flags of `clstm-ppo trade`, each with its help."""
    parser = OneLineParser(
        prog="clstm-ppo trade", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="checkpoint file (.pt), e.g. checkpoints/run/best.pt; several: one ensemble acting on the mean of their "
        "target weights, exactly as `clstm-ppo backtest --checkpoint A B C` (its own journal and order ids)",
    )
    parser.add_argument(
        "--submit",
        action="store_true",
        help="send the orders (market, time in force day); without it: show and journal the plan only",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="use Alpaca's live endpoint (real money) instead of paper; needs --confirm_live_trading",
    )
    parser.add_argument(
        "--confirm_live_trading",
        dest="confirm_live",
        action="store_true",
        help="the second flag --live needs: without both, live trading is refused",
    )
    parser.add_argument(
        "--journal",
        default=None,
        help="folder of trades.jsonl and equity.csv (default: trading-paper/ or trading-live/ next to the checkpoint)",
    )
    parser.add_argument(
        "--replay_start",
        default=None,
        help="first day the policy is replayed from to build its recurrent state (YYYY-MM-DD; "
        "default: the checkpoint's test-split start, where its backtest starts)",
    )
    parser.add_argument(
        "--history_start",
        default=None,
        help="first date of bars to download (default: the checkpoint's start date, so indicators "
        "and turbulence equal the backtest's)",
    )
    parser.add_argument(
        "--wait_seconds",
        type=float,
        default=10.0,
        help="with --submit: seconds to wait for fills before journaling each order's state (default "
        "%(default)g; orders queued after the close are not waited for: they fill at the next "
        "open and the next run records them)",
    )
    parser.add_argument(
        "--poll_seconds",
        type=float,
        default=1.0,
        help="with --submit: seconds between fill checks (default %(default)g)",
    )
    parser.add_argument(
        "--order_tag",
        default=None,
        help="name in the client order ids (default: the run's name); two commands with the same "
        "tag never send two orders for one ticker on one day",
    )
    parser.add_argument(
        "--trading_url",
        default=None,
        help="trading endpoint override (default: ALPACA_TRADING_URL, else Alpaca's paper API)",
    )
    parser.add_argument(
        "--data_url",
        default=None,
        help="market-data endpoint override (default: the run's, else ALPACA_DATA_URL, else Alpaca's)",
    )
    parser.add_argument("--data_cache_dir", default=None, help="where bars are cached (default: the run's setting)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda: where the policy runs")
    parser.add_argument(
        "--features",
        default=None,
        help="CSV or Parquet file with date, tic and the columns a policy trained with --indicators col:NAME reads, "
        "up to the decision day (Alpaca's bars hold none; docs/trading.md)",
    )
    return parser


def main(argv: list[str]) -> int:
    """`clstm-ppo trade`: plan (and with --submit send) today's orders; `trade report` compares."""
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    args = build_parser().parse_args(argv)
    checkpoint = args.checkpoint if len(args.checkpoint) > 1 else args.checkpoint[0]
    device = str(device_flag(args.device))
    result = run_trade(TradeOptions(**{**vars(args), "checkpoint": checkpoint, "device": device}))  # a flag per field
    return 2 if result.problems else 0


def build_report_parser() -> argparse.ArgumentParser:
    """The flags of `clstm-ppo trade report`."""
    parser = OneLineParser(
        prog="clstm-ppo trade report",
        description="Compare the paper account's equity with the backtest's value for the same sessions, from the "
        "journal alone (no keys, no network): day returns, total returns, tracking error, and the "
        "dollars fills lost against the decision closes. Writes report.csv into the journal folder.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--checkpoint",
        default=None,
        nargs="+",
        help="the traded checkpoint (or an ensemble's checkpoints): its journal is trading-paper/ (trading-live/ "
        "with --live; -ensemble<N> for an ensemble) beside the first one",
    )
    where.add_argument("--journal", default=None, help="the journal folder (holding trades.jsonl and equity.csv)")
    parser.add_argument("--live", action="store_true", help="with --checkpoint: the live journal, trading-live/")
    parser.add_argument("--out", default=None, help="CSV to write (default: report.csv in the journal folder)")
    return parser


def report_main(argv: list[str]) -> int:
    """`clstm-ppo trade report`: the journal's paper equity vs the backtest's values, day by day."""
    args = build_report_parser().parse_args(argv)
    folder = args.journal or default_journal(Path(args.checkpoint[0]), Endpoint("", args.live), len(args.checkpoint))
    report = trade_report(str(folder), args.out)
    print(report_table(report))
    print(f"\nreport: {report.path}")
    return 0


if __name__ == "__main__":
    from clstm_ppo.cli.main import run_command

    sys.exit(run_command(main))
