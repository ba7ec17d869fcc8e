"""`clstm-ppo plot RUN_DIR [--out FILE] [--smooth N] [--title T]`: a run's training curves to PNG
(`clstm_ppo.training.curves` reads metrics.jsonl and draws)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from clstm_ppo.cli.main import OneLineParser
from clstm_ppo.training.curves import load_training_log, plot_training
from envs.errors import UserError


def main(argv: Sequence[str] | None = None) -> int:
    """``clstm-ppo plot RUN_DIR [--out FILE] [--smooth N] [--title T]``; prints the PNG's path."""
    parser = OneLineParser(prog="clstm-ppo plot", description="Plot a run's training curves to PNG.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder holding metrics.jsonl (or the file)")
    parser.add_argument("--out", metavar="FILE", default=None, help="PNG to write (default RUN_DIR/training.png)")
    parser.add_argument("--smooth", type=int, default=0, help="rolling-mean window in episodes (0: auto)")
    parser.add_argument("--title", default=None, help="figure title (default: run name and counts)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = load_training_log(args.run_dir)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    out = Path(args.out) if args.out else log.path.parent / "training.png"
    try:
        plot_training(log, out, title=args.title, smooth=args.smooth)
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror or err}") from err
    print(f"wrote {out} ({len(log.episodes)} episodes, {len(log.updates)} updates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
