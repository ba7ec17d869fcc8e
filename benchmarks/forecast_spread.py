"""The spread ``s`` of a ``--forecast_only`` policy's stock means over its training days, or ``K x s``: the logits
that ``--forecast_threshold Ksd`` deploys with (`clstm_ppo.evaluation.forecast_spread`; docs/learning.md 20-21).

    python benchmarks/forecast_spread.py CHECKPOINT... [--sd K]    # prints s (or K x s), one line per checkpoint
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clstm_ppo.evaluation.backtest import with_forecast_threshold  # noqa: E402
from clstm_ppo.evaluation.forecast_spread import ForecastThreshold  # noqa: E402
from clstm_ppo.training.checkpoint import load_checkpoint  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", type=Path, nargs="+")
    p.add_argument("--sd", type=float, default=1.0, help="print K x s (default 1: s itself)")
    args = p.parse_args()
    torch.set_num_threads(1)
    for path in args.checkpoints:
        ck = with_forecast_threshold(load_checkpoint(path), ForecastThreshold(args.sd, in_spreads=True))
        print(f"{ck.model_config['forecast_threshold']:.6g}")


if __name__ == "__main__":
    main()
