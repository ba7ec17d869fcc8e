"""The signal-recovery curve: how much of a planted forecast's value a trained policy keeps, at each strength.

    PYTHONPATH=. python benchmarks/signal_recovery.py --plan docs/studies/signal-recovery/plan.json --phase report \
        --candidate shared-1000 --dir /work/recovery --workers 2 --out docs/studies/signal-recovery/curve.json

On one price file (the plan's ``data``), for each IC of the phase and each seed k of the plan (fixed in the plan file
before their first run): ``clstm-ppo data plant`` writes the file with a column ``forecast`` of that IC (half-life
from the plan, forecast seed k), the real training script trains the candidate's settings on it with ``--indicators
col:forecast --seed k`` (training seed k: forecast and training seeds pair, so seeds are replications), and this
process reads the deployed checkpoint on the phase's test days beside its untrained self, equal-weight buy-and-hold
and the reference trader of the column (the best member of `envs.oracle.family`, chosen on the run's training days),
all after costs (`benchmarks/demo_seeds.figures`).

Per IC the table gives the means, the share of the reference's excess kept with its 95% t interval over seeds (delta
method) and the paired test of share >= 50%, trained - untrained and trained - buy-and-hold paired over seeds (95% t),
and trained - buy-and-hold with days resampled (stationary block bootstrap over the test days, the seeds held fixed).
The intervals over seeds are conditional on the one price path of the file: the days' interval says how much that
path's own luck could move the figures. ``--phase choose`` runs every candidate of the plan on its choice days and
prints the plan's choice rule's pick; ``--phase report`` runs one candidate on the report days and writes the JSON
(``--out``) and a PNG beside it. Runs already in ``--dir`` are read, not trained again (resumable).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # demo_seeds, beside this script

from demo_seeds import figures  # noqa: E402

from clstm_ppo.evaluation.oracle import seed_share_words, share_over_seeds  # noqa: E402
from clstm_ppo.evaluation.statistics import paired_sharpe_difference, t_interval  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO_LIKE: dict[str, Any] = {
    "window": 5,
    "stage1_hidden": 32,
    "feature_dim": 32,
    "stage2_hidden": 64,
    "num_envs": 64,
    "n_steps": 16,
    "batch_size": 512,
    "epochs": 4,
    "episode_length": 63,
    "gamma": 0.9,
    "learning_rate_clstm": 1e-3,
    "learning_rate_actor_critic": 1e-3,
    "log_every": 500,
    "threads": 1,
    "turnover_penalty": 0.0,
    "target_kl": 0.0,
    "rebalance_band": 0.01,
    "init_log_std": -1.0,
    "portfolio_features": "weights",
}
"""The demo preset's network and PPO settings (`clstm_ppo.config.PRESETS`), without its data and episodes: what every
candidate starts from."""
COLUMN = "forecast"


def run_name(candidate: str, ic: float, seed: int) -> str:
    return f"{candidate}-ic{ic:g}-s{seed}"


def plant(data: str, ic: float, seed: int, halflife: float, phase: dict[str, Any], folder: Path) -> tuple[Path, str]:
    """The planted file of (ic, seed) in ``folder/planted`` (written once by ``clstm-ppo data plant``) and what the
    command printed (the IC per split)."""
    out = folder / "planted" / f"ic{ic:g}-s{seed}.csv"
    log = out.with_suffix(".log")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "clstm_ppo.cli", "data", "plant", data.partition(":")[2] or data]
        command += ["--ic", str(ic), "--halflife", str(halflife), "--seed", str(seed), "--name", COLUMN]
        command += ["--out", str(out), "--train_end", phase["train_end"], "--validation_end", phase["validation_end"]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"planting ic {ic} seed {seed} failed: {done.stderr.strip()}")
        log.write_text(done.stdout, encoding="utf-8")
    return out, log.read_text(encoding="utf-8")


def train(planted: Path, settings: Path, name: str, seed: int, phase: dict[str, Any], folder: Path) -> float:
    """Train one run into ``folder/runs/name`` unless it finished before; its wall time in seconds (0: read)."""
    run_dir = folder / "runs" / name
    if (run_dir / "latest.pt").is_file() and (run_dir / "done").is_file():
        return 0.0
    shutil.rmtree(run_dir, ignore_errors=True)  # a run cut short: trained again from the start
    command = [sys.executable, str(ROOT / "train_distributed_clstm_ppo.py"), "--config", str(settings)]
    command += ["--data", f"csv:{planted}", "--indicators", f"col:{COLUMN}", "--seed", str(seed)]
    command += ["--train_end", phase["train_end"], "--validation_end", phase["validation_end"]]
    command += ["--test_end", phase["test_end"], "--run_name", name, "--checkpoint_dir", str(folder / "runs")]
    command += ["--num_gpus", "0", "--no-progress"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    (folder / "runs" / f"{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    seconds = time.perf_counter() - start
    (run_dir / "done").write_text(f"{seconds:.1f}\n", encoding="utf-8")
    return seconds


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One IC's figures over its seeds (module docstring)."""
    col = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in ("trained", "untrained", "buy_and_hold")}
    col["reference"] = np.array([r["oracle"] for r in rows], dtype=np.float64)
    share = share_over_seeds(col["trained"], col["buy_and_hold"], col["reference"])
    out: dict[str, Any] = {k: float(v.mean()) for k, v in col.items()}
    out["reference_excess"] = out["reference"] - out["buy_and_hold"]
    out["trained_excess"] = out["trained"] - out["buy_and_hold"]
    out["share"] = share._asdict()
    out["share_words"] = seed_share_words(share)
    for name, other in (("minus_untrained", "untrained"), ("minus_buy_and_hold", "buy_and_hold")):
        diff = col["trained"] - col[other]
        lo, hi, lower = t_interval(diff)
        out[name] = {"mean": float(diff.mean()), "lo": lo, "hi": hi, "lower": lower, "ahead": int((diff > 0).sum())}
    days = paired_sharpe_difference(
        np.array([r["trained_returns"] for r in rows]),
        np.asarray(rows[0]["buy_and_hold_returns"]),
        resample_seeds=False,
    )
    out["minus_buy_and_hold_days"] = {k: days[k] for k in ("difference", "lo", "hi")}
    out["turnover"] = float(np.mean([r["trained_turnover"] for r in rows]))
    out["exposure"] = float(np.mean([r["trained_exposure"] for r in rows]))
    out["reference_members"] = [r["oracle_member"] for r in rows]
    out["seeds"] = len(rows)
    return out


def table(curve: dict[str, dict[str, Any]]) -> str:
    """The curve as a markdown table."""
    head = (
        "| IC | reference - B&H | trained - B&H [t, seeds] | trained - B&H [days] | share of the reference's excess "
        "[t] | trained - untrained [t] | turnover/yr | exposure |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for ic, s in curve.items():
        share, mb, mu, days = s["share"], s["minus_buy_and_hold"], s["minus_untrained"], s["minus_buy_and_hold_days"]
        shown = "n/a" if share["share"] is None else f"{share['share']:.0%} [{share['lo']:.0%}, {share['hi']:.0%}]"
        lines.append(
            f"| {ic} | {s['reference_excess']:+.2f} | {mb['mean']:+.2f} [{mb['lo']:+.2f}, {mb['hi']:+.2f}] "
            f"({mb['ahead']}/{s['seeds']}) | {days['difference']:+.2f} [{days['lo']:+.2f}, {days['hi']:+.2f}] | {shown} "
            f"| {mu['mean']:+.2f} [{mu['lo']:+.2f}, {mu['hi']:+.2f}] ({mu['ahead']}/{s['seeds']}) "
            f"| {s['turnover']:.1f}x | {s['exposure']:.0%} |"
        )
    return "\n".join(lines)


def plot(curve: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Reference and trained excess over buy-and-hold against the IC, with the trained one's t interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ics = [float(ic) for ic in curve]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(
        ics, [s["reference_excess"] for s in curve.values()], "o-", label="reference trader (chosen on training days)"
    )
    mean = np.array([s["minus_buy_and_hold"]["mean"] for s in curve.values()])
    lo = np.array([s["minus_buy_and_hold"]["lo"] for s in curve.values()])
    hi = np.array([s["minus_buy_and_hold"]["hi"] for s in curve.values()])
    ax.errorbar(ics, mean, yerr=[mean - lo, hi - mean], fmt="s-", capsize=3, label="trained network (95% t, seeds)")
    ax.plot(ics, [s["untrained"] - s["buy_and_hold"] for s in curve.values()], "x--", label="untrained network")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(ics, [f"{ic:g}" for ic in ics])
    ax.set_xlabel("planted forecast's IC (per ticker, with the next-close fill return)")
    ax.set_ylabel("Sharpe minus buy-and-hold's, after costs")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default=str(ROOT / "docs/studies/signal-recovery/plan.json"))
    parser.add_argument("--phase", choices=("choose", "report"), required=True)
    parser.add_argument("--candidate", default=None, help="report: the chosen candidate of the plan")
    parser.add_argument("--dir", default="signal-recovery", help="where the planted files and runs go")
    parser.add_argument("--workers", type=int, default=2, help="training processes at a time")
    parser.add_argument("--out", default=None, help="JSON of every figure (report: a PNG beside it)")
    parser.add_argument("--train_only", action="store_true", help="plant and train, read nothing")
    args = parser.parse_args()
    plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    phase = plan[args.phase]
    data = plan["data"]
    if not data.startswith("csv:/"):  # relative to the repository, as the plan names it
        data = f"csv:{(ROOT / data.partition(':')[2]).resolve()}"
    candidates = (
        phase["candidates"]
        if args.phase == "choose"
        else {args.candidate: plan["choose"]["candidates"][args.candidate]}
    )
    folder = Path(args.dir) / args.phase
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(c, ic, seed) for c in candidates for ic in phase["ics"] for seed in phase["seeds"]]
    planted = {(ic, s): plant(data, ic, s, plan["halflife"], phase, folder) for _, ic, s in jobs}
    settings = {}
    for c, extra in candidates.items():
        settings[c] = folder / f"{c}.json"
        settings[c].write_text(json.dumps({**DEMO_LIKE, **extra}, indent=1), encoding="utf-8")
    start = time.perf_counter()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        seconds = list(
            pool.map(lambda j: train(planted[j[1], j[2]][0], settings[j[0]], run_name(*j), j[2], phase, folder), jobs)
        )
    wall = time.perf_counter() - start
    if args.train_only:
        print(f"trained {len(jobs)} runs in {wall:.0f} s ({sum(seconds):.0f} s of training)")
        return
    rows: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for (c, ic, seed), took in zip(jobs, seconds, strict=True):
        row = figures(
            seed, folder / "runs", run_name(c, ic, seed), signal=f"col:{COLUMN}", returns=True, stretches=False
        )
        row["train_seconds"] = took
        rows.setdefault((c, ic), []).append(row)
    result: dict[str, Any] = {
        "plan": plan,
        "phase": args.phase,
        "wall_seconds": wall,
        "cpu_train_seconds": sum(seconds),
    }
    result["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    result["planted"] = {f"ic{ic:g}-s{s}": text for (ic, s), (_, text) in planted.items()}
    result["candidates"] = {}
    for c in candidates:
        curve = {f"{ic:g}": summary(rows[c, ic]) for ic in phase["ics"]}
        result["candidates"][c] = {"curve": curve, "rows": {f"{ic:g}": rows[c, ic] for ic in phase["ics"]}}
        print(f"\n{c} ({args.phase} days: test to {phase['test_end']}, {len(phase['seeds'])} seeds)\n{table(curve)}")
        for ic, s in curve.items():
            print(f"  IC {ic}: {s['share_words']}")
    if args.phase == "choose":
        gains = {
            c: result["candidates"][c]["curve"][f"{phase['ics'][0]:g}"]["minus_untrained"]["mean"] for c in candidates
        }
        print("\nchoice (trained - untrained at the first IC): " + ", ".join(f"{c} {g:+.2f}" for c, g in gains.items()))
    for row_list in rows.values():
        for row in row_list:
            row.pop("trained_returns", None)
            row.pop("buy_and_hold_returns", None)
    print(f"\nwall {wall:.0f} s, training CPU {sum(seconds):.0f} s over {len(jobs)} runs ({args.workers} workers)")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")
        if args.phase == "report":
            curve = result["candidates"][args.candidate]["curve"]
            title = (
                f"{args.candidate}, us20 2000-2007, {len(phase['seeds'])} seeds, half-life {plan['halflife']:g} days"
            )
            plot(curve, out.with_suffix(".png"), title)
            out.with_suffix(".md").write_text(table(curve) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
