"""Train CLSTM-PPO: `python train_distributed_clstm_ppo.py --num_gpus 8 --num_episodes 10000`.

Thin entry point: flags are parsed and workers launched by `clstm_ppo.cli.train` (`--help` lists them).
Works the same under torchrun: `torchrun --nproc_per_node 8 train_distributed_clstm_ppo.py ...`.
"""

import sys

from clstm_ppo.cli import run_command
from clstm_ppo.cli.train import main

if __name__ == "__main__":
    sys.exit(run_command(main))
