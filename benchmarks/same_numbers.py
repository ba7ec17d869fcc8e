"""Does a change to the training stack leave the numbers alone? Seeded CPU runs of this checkout beside a commit.

    python benchmarks/same_numbers.py --before 7e1f2c3                     # paper preset and the default, 3 updates
    python benchmarks/same_numbers.py --before 7e1f2c3 --presets tiny      # test_cells' tiny network, the strict rule
    python benchmarks/same_numbers.py --before 7e1f2c3 --presets tiny --seeds 1-2   # a batch: each seed's folder

Each run is the train script itself (its command line is the one interface every commit shares), seeded, on one CPU
process, with ``--episode_length`` equal to ``--n_steps`` so that every update ends each env's episode and
``--num_episodes = updates x num_envs`` runs exactly ``--updates`` updates. The commit ``--before`` runs from a git
worktree (its own code on ``PYTHONPATH``), twice: with ``--threads 1`` and ``--threads 2``, whose difference is the
float rounding the old code itself shows with the same epochs run (issue 59's yardstick for a change that
reorders arithmetic: the paper preset's difference after the change may be no larger). This checkout runs with
``--threads 1``. The table gives, per pair, the largest |weight difference| over the network's largest |weight|,
the entries outside ``rtol 1e-4 / atol 1e-6``, and whether the counters and the last update's logged losses agree
to 4 significant figures (`tests/test_cells.py`'s rule, which the tiny network must meet).

``--seeds 1-2`` (any ``--seed`` list of several) trains each preset as that batch instead of the single seed 1, on
each side, and compares each seed's folder (``seed-1``, ``seed-2``) with its namesake the same way: a guard for
changes to how a batch carries its seeds (issue 71 point 7). The commit ``--before`` must take a seed list
(``37533fb`` does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PRESETS: dict[str, list[str]] = {
    "paper": ["--preset", "paper", "--num_envs", "8"],
    "default": ["--num_envs", "8"],
    "tiny": (
        "--data synthetic:tickers=4,days=400 --window 5 --stage1_hidden 8 --feature_dim 8 --stage2_hidden 16 "
        "--num_envs 4 --n_steps 16 --batch_size 32 --epochs 2"
    ).split(),
}
STEPS = {"paper": 128, "default": 128, "tiny": 16}  # n_steps of each (the preset's own, or the flags above)
LOSSES = ("policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm")
COLUMNS = (
    "preset",
    "pair",
    "updates",
    "max abs diff / max abs weight",
    "entries outside rtol 1e-4, atol 1e-6",
    "counters",
    "last losses (4 figures)",
)


def train(code: Path, name: str, threads: int, updates: int, out: Path, seeds: str) -> Path:
    """One seeded run of the train script in ``code`` (a checkout), ``--seed seeds`` (several: one batch); returns
    its run folder."""
    flags = PRESETS[name]
    envs = int(flags[flags.index("--num_envs") + 1])
    steps = STEPS[name]
    command = [sys.executable, str(code / "train_distributed_clstm_ppo.py"), *flags, "--seed", seeds, "--num_gpus", "0"]
    command += ["--threads", str(threads), "--episode_length", str(steps), "--num_episodes", str(updates * envs)]
    command += ["--checkpoint_dir", str(out), "--run_name", f"{name}-t{threads}", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(code), "CLSTM_PPO_LEDGER": str(out / "ledger.jsonl")}
    proc = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{code.name} {name} --threads {threads} failed:\n{proc.stderr[-2000:]}")
    return out / f"{name}-t{threads}"


def seed_folders(run: Path) -> dict[str, Path]:
    """What to compare of a run folder: each seed's ``seed-<s>`` folder of a batch by name, else the run itself
    (named "")."""
    batch = sorted(run.glob("seed-*"), key=lambda folder: int(folder.name.removeprefix("seed-")))
    return {folder.name: folder for folder in batch} or {"": run}


def compare_seeds(a: Path, b: Path) -> dict[str, dict[str, Any]]:
    """`compare` of each seed folder of run ``a`` with its namesake in run ``b`` (one entry, "", for single runs)."""
    fa, fb = seed_folders(a), seed_folders(b)
    if fa.keys() != fb.keys():
        sys.exit(f"{a} holds {', '.join(fa) or 'one run'} but {b} holds {', '.join(fb) or 'one run'}")
    return {seed: compare(fa[seed], fb[seed]) for seed in fa}


def last_losses(run: Path) -> dict[str, float]:
    """The last update's logged losses (metrics.jsonl)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    updates = [line for line in lines if "policy_loss" in line]
    return {k: float(updates[-1][k]) for k in LOSSES if k in updates[-1]}


def compare(a: Path, b: Path) -> dict[str, Any]:
    """How far run ``b``'s weights, counters and last losses are from run ``a``'s."""
    ka = torch.load(a / "latest.pt", map_location="cpu", weights_only=True)
    kb = torch.load(b / "latest.pt", map_location="cpu", weights_only=True)
    weights = {k: v for k, v in ka["model_state"].items() if v.dtype == torch.float32 and v.numel()}
    scale = max(float(w.abs().max()) for w in weights.values())
    worst = max(float((w - kb["model_state"][k]).abs().max()) for k, w in weights.items())
    outside = sum(
        int((~torch.isclose(kb["model_state"][k], w, rtol=1e-4, atol=1e-6)).sum()) for k, w in weights.items()
    )
    skip = {"elapsed", "best_score"}
    counters = {k: v for k, v in ka["counters"].items() if k not in skip} == {
        k: v for k, v in kb["counters"].items() if k not in skip
    }
    la, lb = last_losses(a), last_losses(b)
    losses = la.keys() == lb.keys() and all(math.isclose(la[k], lb[k], rel_tol=1e-4, abs_tol=1e-6) for k in la)
    return {
        "relative": worst / scale,
        "outside": outside,
        "entries": sum(w.numel() for w in weights.values()),
        "counters": counters,
        "losses": losses,
        "update": ka["counters"]["update"],
    }


def checkout_label() -> str:
    """This checkout's commit, with "+" when tracked files hold uncommitted changes (what then runs)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    edited = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head + ("+" if edited.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. the one before a change)")
    parser.add_argument("--presets", default="paper,default", help="comma-separated: paper, default, tiny")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument(
        "--seeds",
        default="1",
        help="the --seed to train (default 1); several (1-2): each preset as that batch, each seed's folder compared",
    )
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args()
    names = [n.strip() for n in args.presets.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PRESETS))
    if unknown:
        sys.exit(f"unknown preset(s) {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    head = checkout_label()
    rows = []
    with tempfile.TemporaryDirectory(prefix="same_numbers.") as tmp:
        work = Path(tmp)
        old = work / "before"
        worktree = ["git", "worktree", "add", "--detach", str(old), args.before]
        subprocess.run(worktree, cwd=ROOT, check=True, capture_output=True)
        try:
            for name in names:
                t1 = train(old, name, 1, args.updates, work / "runs-before", args.seeds)
                t2 = train(old, name, 2, args.updates, work / "runs-before", args.seeds)
                now = train(ROOT, name, 1, args.updates, work / "runs-now", args.seeds)
                pairs = {
                    f"{args.before} threads 1 vs 2": (t1, t2),
                    f"{args.before} vs {head} (threads 1)": (t1, now),
                }
                for pair, (a, b) in pairs.items():
                    for seed, row in compare_seeds(a, b).items():
                        rows.append({"preset": f"{name} {seed}".strip(), "pair": pair, **row})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    print(f"{args.updates} updates, --seed {args.seeds}, one CPU process; weights of latest.pt")
    print(f"| {' | '.join(COLUMNS)} |")
    print("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r['preset']} | {r['pair']} | {r['update']} | {r['relative']:.2e} | {r['outside']:,} of "
            f"{r['entries']:,} | {'same' if r['counters'] else 'DIFFER'} | {'same' if r['losses'] else 'differ'} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
