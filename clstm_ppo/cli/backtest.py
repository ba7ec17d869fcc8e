"""`clstm-ppo backtest` (one checkpoint) and `clstm-ppo compare` (several): flags -> `clstm_ppo.evaluation.backtest`.

Days sealed with `clstm-ppo study seal` are refused unless ``--unseal`` (recorded in the trials ledger).
``--new_universe`` trades a ``--policy shared`` checkpoint on all the tickers of ``--data`` (its market refitted on
that data's training days).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from clstm_ppo.cli.main import OneLineParser
from clstm_ppo.evaluation.backtest import SPLITS, backtest, compare, distribution_table
from clstm_ppo.evaluation.holdout import describe
from clstm_ppo.threads import torch_threads
from envs.errors import UserError


def _common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="report folder (default: next to the checkpoint)")
    parser.add_argument(
        "--data",
        default=None,
        help="data source instead of the checkpoint's (synthetic[:k=v] | csv:PATH | parquet:PATH | alpaca)",
    )
    parser.add_argument("--split", default="test", choices=SPLITS, help="the checkpoint's split to backtest")
    parser.add_argument("--start", default=None, help="custom period: first day (YYYY-MM-DD); overrides --split")
    parser.add_argument("--end", default=None, help="custom period: last day (YYYY-MM-DD); overrides --split")
    parser.add_argument(
        "--risk_free",
        type=float,
        default=None,
        help="annual risk-free rate: cash earns it and Sharpe/Sortino are in excess of it (default: the checkpoint's)",
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda: where the policy runs")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--ledger",
        default=None,
        help="the trials ledger holding the seals (default: $CLSTM_PPO_LEDGER, else ~/.clstm_ppo/ledger.jsonl)",
    )
    parser.add_argument(
        "--unseal",
        action="store_true",
        help="trade days sealed with `clstm-ppo study seal` anyway (the ledger records it)",
    )


def device_flag(name: str) -> torch.device:
    """A ``--device`` flag's device (backtest, compare, trade): cpu, or cuda where torch sees one."""
    if name not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible to torch (use --device cpu)")
    return torch.device(name)


def _device(args: argparse.Namespace) -> torch.device:
    """The ``--device`` to run on, after checking it and ``--threads``."""
    if args.threads < 0:
        raise UserError(f"--threads must be >= 0, got {args.threads}")
    return device_flag(args.device)


def main(argv: list[str]) -> int:
    """`clstm-ppo backtest`: one checkpoint over one period -> report folder + console table."""
    parser = OneLineParser(
        prog="clstm-ppo backtest", description="Backtest a saved checkpoint against equal-weight buy-and-hold."
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        nargs="+",
        help="checkpoint file (.pt), e.g. checkpoints/run/best.pt; several: an ensemble acting on the mean of their "
        "target weights (the seeds of one configuration, trained on one market)",
    )
    _common_flags(parser)
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of the mean action")
    parser.add_argument("--episodes", type=int, default=1, help="with --stochastic: sampled episodes to run")
    parser.add_argument("--seed", type=int, default=0, help="with --stochastic: seed of the action noise")
    parser.add_argument("--index", default=None, help="CSV (date,value) of a market index to plot and score too")
    parser.add_argument(
        "--new_universe",
        action="store_true",
        help="--policy shared only: trade all the data's tickers, not the checkpoint's; normalisation and turbulence "
        "threshold refitted on the data's days of the checkpoint's training split",
    )
    args = parser.parse_args(argv)
    device = _device(args)
    with torch_threads(args.threads or torch.get_num_threads()):
        done = backtest(
            args.checkpoint,
            **_period_options(args),
            stochastic=args.stochastic,
            episodes=args.episodes,
            seed=args.seed,
            index=args.index,
            device=device,
            new_universe=args.new_universe,
        )
    print(f"backtest {done.checkpoint.path} | {_said_period(done)}")
    if done.new_universe is not None:  # its tickers, the checkpoint's, and the refit's days
        fit = done.new_universe["refitted"]
        print(
            f"new universe: {len(done.new_universe['tickers'])} tickers (trained on "
            f"{len(done.new_universe['trained_tickers'])}); normalisation and turbulence threshold refitted on "
            f"{fit['start']} .. {fit['end']} ({fit['days']} days of the checkpoint's training split)"
        )
    if done.stochastic is not None:
        print(f"\nover {args.episodes} sampled episodes:")
        print(distribution_table(done.stochastic["summary"]))
        print(f"\nepisode {done.stochastic['episode_shown']} (median cumulative return) vs buy-and-hold:")
    print(done.report.table)
    if done.oracle is not None:
        print(f"\non this planted market, {done.oracle}")
    print(
        f"\nreport: {done.report.out_dir}  (report.json, equity.csv, trades.csv, equity.png"
        f"{', equity_episodes.csv' if done.stochastic is not None else ''})"
    )
    return 0


def _period_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flags `backtest` and `compare` share (`_common_flags`) as their keyword arguments."""
    return {
        name: getattr(args, name) for name in ("data", "split", "start", "end", "out", "risk_free", "ledger", "unseal")
    }


def _said_period(done: Any) -> str:
    """Print the recorded unseals, then say a run's period, tickers and mode (the tail of its first line)."""
    for entry in done.holdout:
        print(f"--unseal: {describe(entry)}")
    d0, d1 = (str(d)[:10] for d in (done.dates[0], done.dates[-1]))
    return f"{done.period.source} {d0} .. {d1} ({len(done.dates)} days) | {done.num_tickers} tickers | {done.mode}"


def compare_main(argv: list[str]) -> int:
    """`clstm-ppo compare`: several checkpoints, deterministic, on one period -> one table and one PNG."""
    parser = OneLineParser(
        prog="clstm-ppo compare", description="backtest several checkpoints (same tickers) on one period"
    )
    parser.add_argument(
        "checkpoints",
        nargs="+",
        help="checkpoint files; the first one's data and split are used; A.pt+B.pt+C.pt is one ensemble of those",
    )
    parser.add_argument("--labels", default=None, help="comma-separated names, one per checkpoint")
    _common_flags(parser)
    args = parser.parse_args(argv)
    device = _device(args)
    with torch_threads(args.threads or torch.get_num_threads()):
        done = compare(args.checkpoints, labels=args.labels, **_period_options(args), device=device)
    print(f"compare {done.num_checkpoints} checkpoint(s) | {_said_period(done)}")
    print(done.report.table)
    print(f"\nreport: {done.report.out_dir}  (compare.json, compare.csv, compare.png)")
    return 0


if __name__ == "__main__":
    from clstm_ppo.cli.main import run_command

    sys.exit(run_command(main))
