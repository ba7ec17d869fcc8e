"""Running a study: prepare the data once, run its cells in parallel processes, survive crashes and kills, report.

Each cell runs in its own process (``clstm-ppo study _cell DIR CELL``: a crash, an out-of-memory kill or a hang
of one cell touches no other), several at a time: ``workers`` processes on CPU cores (``threads`` torch threads
each), or ``cells_per_gpu`` per visible GPU (each process sees one GPU through CUDA_VISIBLE_DEVICES). Finished
cells are skipped on a re-run; an interrupted cell continues from its own files (see `clstm_ppo.study.cell`).
SIGINT/SIGTERM is passed on to the running cells, which save and stop; re-running the command continues.

The trials ledger (`clstm_ppo.evaluation.ledger`) gets the study's record before the first cell runs and each
cell's trial as soon as the runner sees it done, so a killed study leaves its finished cells counted. Days sealed
in the ledger (`clstm_ppo.evaluation.holdout`) are refused before anything is written unless ``unseal``.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clstm_ppo.evaluation.fingerprint import data_fingerprint
from clstm_ppo.evaluation.holdout import describe, guard, iso_days
from clstm_ppo.evaluation.ledger import Ledger
from clstm_ppo.market import load_data
from clstm_ppo.study.cell import read_status, write_status
from clstm_ppo.study.grid import Cell, shard
from clstm_ppo.study.markets import load_markets, market_key, prepare_markets, same_market, save_markets
from clstm_ppo.study.report import build_report, verdict_lines
from clstm_ppo.study.schedule import WalkPeriod, walk_forward
from clstm_ppo.study.spec import SPEC_FILE, StudySpec
from clstm_ppo.study.trials import record_cells, record_study, study_key
from clstm_ppo.training.run_folder import check_writable
from envs.data import MarketData
from envs.errors import UserError

STOP_GRACE_S = 60.0


@dataclass
class Layout:
    """How the cells are spread on this machine."""

    workers: int  # cells at once
    gpus: int  # visible GPUs used (0: CPU)
    threads: int  # torch threads per CPU cell


def plan_layout(workers: int, cells_per_gpu: int, threads: int, use_gpus: bool) -> Layout:
    """``workers`` (0: all it is given): GPUs x cells_per_gpu, or CPU cores / threads."""
    gpus = torch.cuda.device_count() if use_gpus and torch.cuda.is_available() else 0
    if cells_per_gpu < 1 or threads < 0 or workers < 0:
        raise UserError("--workers, --threads must be >= 0 and --cells_per_gpu >= 1")
    cores = os.cpu_count() or 1
    threads = threads or (1 if gpus else max(1, cores // max(1, workers or cores)))
    if not workers:
        workers = gpus * cells_per_gpu if gpus else max(1, cores // threads)
    return Layout(workers=workers, gpus=gpus, threads=threads)


def plan(spec: StudySpec, cells: list[Cell]) -> tuple[MarketData, list[WalkPeriod]]:
    """Load the data once and make the walk-forward schedule (nothing is written)."""
    base = spec.base_config
    data = load_data(base.data, seed=base.run.seed)
    periods = walk_forward(
        data.dates,
        window=max([base.data.window, *[c.config(base).data.window for c in cells]]),
        trade_start=spec.trade_start,
        trade_end=spec.trade_end or None,
        retrain=spec.retrain,
        validation_days=spec.validation_days,
    )
    return data, periods


def prepare(study_dir: Path, spec: StudySpec, cells: list[Cell], data: MarketData, periods: list[WalkPeriod]) -> None:
    """Prepare one market per window for each market setting the cells use (and the base settings', which the
    baselines use); reuse what an earlier run prepared."""
    base = spec.base_config
    folder = study_dir / "prepared"
    configs = {market_key(c): c for c in [base, *[cell.config(base) for cell in cells]]}
    for key, cfg in configs.items():
        markets = prepare_markets(data, cfg, periods)
        if (folder / f"{key}.json").is_file():
            stored = load_markets(folder, key)
            if len(stored) != len(markets) or not all(same_market(a, b) for a, b in zip(stored, markets, strict=False)):
                raise UserError(
                    f"{study_dir} was prepared from other data (the market of {key} differs); use a new "
                    f"--out for new data"
                )
            continue
        save_markets(folder, key, markets)


def episodes_per_cell(spec: StudySpec, windows: int) -> int:
    """Training episodes one cell runs over its ``windows`` walk-forward windows."""
    first = spec.base_config.ppo.num_episodes
    return first + (windows - 1) * (spec.retrain_episodes or first)


def _episodes_done(cell_dir: Path) -> int:
    """Training episodes a running cell has finished so far (its trainers' metrics.jsonl lines)."""
    done = 0
    for path in (cell_dir / "periods").glob("*/metrics.jsonl"):
        try:
            done += path.read_bytes().count(b'"kind": "episode"')
        except OSError:
            pass
    return done


def _cell_command(study_dir: Path, cell: Cell, threads: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "clstm_ppo.cli",
        "study",
        "_cell",
        str(study_dir),
        cell.name,
        "--threads",
        str(threads),
    ]


def run_cells(
    study_dir: Path,
    cells: list[Cell],
    layout: Layout,
    *,
    log: Any = print,
    on_done: Callable[[Cell], None] | None = None,
    cell_episodes: int = 0,
) -> dict[str, int]:
    """Run ``cells`` (those not done yet) ``layout.workers`` at a time; print progress with an ETA.

    :param on_done: called with each cell that finishes done (the study records it in the trials ledger).
    :param cell_episodes: training episodes per cell (`episodes_per_cell`): with it, the estimated wall time is
        printed as soon as the first cell has trained a tenth of them; without, when the first cell finishes.
    :return: counts {"done", "failed", "interrupted"} of the cells run now; raises KeyboardInterrupt-free: a
        signal stops the running cells gracefully and returns with "interrupted" counted.
    """
    todo = [c for c in cells if read_status(study_dir / "cells" / c.name)["status"] != "done"]
    skipped = len(cells) - len(todo)
    if skipped:
        log(f"[study] {skipped} of {len(cells)} cells already done (kept)")
    counts = {"done": 0, "failed": 0, "interrupted": 0}
    running: dict[int, tuple[subprocess.Popen, Cell, int, float]] = {}  # pid -> (process, cell, slot, start)
    free_slots = list(range(layout.workers))
    stop: list[tuple[int, float]] = []  # (signal, when)
    cell_seconds: list[float] = []
    estimated = False
    next_look = 0.0

    def estimate(seconds_per_cell: float, what: str) -> None:
        waves = math.ceil(len(todo) / layout.workers)
        log(
            f"[study] {what}: about {_duration(seconds_per_cell)} per cell, {_duration(waves * seconds_per_cell)} "
            f"for the {len(todo)} cell(s) on {layout.workers} worker(s)"
        )

    def on_signal(signum: int, _frame: Any) -> None:
        stop.append((signum, time.perf_counter()))
        for proc, *_ in running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the cell's trainer finishes its update, saves, exits

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        queue = list(todo)
        while queue or running:
            while queue and free_slots and not stop:
                cell, slot = queue.pop(0), free_slots.pop(0)
                env = {
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    "CLSTM_PPO_STUDY_DEVICE": "cuda" if layout.gpus else "cpu",
                }
                if layout.gpus:  # the cell sees one GPU; slots go round the GPUs
                    env["CUDA_VISIBLE_DEVICES"] = str(slot % layout.gpus)
                (study_dir / "cells" / cell.name).mkdir(parents=True, exist_ok=True)
                with open(study_dir / "cells" / cell.name / "log.txt", "ab") as out:
                    proc = subprocess.Popen(
                        _cell_command(study_dir, cell, layout.threads),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                running[proc.pid] = (proc, cell, slot, time.perf_counter())
            if not running:
                break
            time.sleep(0.2)
            if not estimated and cell_episodes and time.perf_counter() >= next_look:
                next_look = time.perf_counter() + 2.0
                _, first, _, began = next(iter(running.values()))
                episodes = _episodes_done(study_dir / "cells" / first.name)
                if episodes >= max(1, cell_episodes // 10):
                    took = time.perf_counter() - began
                    estimated = True
                    estimate(took / episodes * cell_episodes, f"first cell: {episodes} episodes in {took:,.0f} s")
            for pid, (proc, cell, slot, began) in list(running.items()):
                code = proc.poll()
                if code is None:
                    if stop and (len(stop) > 1 or time.perf_counter() - stop[0][1] > STOP_GRACE_S):
                        proc.kill()  # a second signal, or a stop taking too long
                    continue
                del running[pid]
                free_slots.append(slot)
                status = read_status(study_dir / "cells" / cell.name)
                state = status["status"] if status["status"] in ("done", "failed", "interrupted") else "failed"
                if state == "failed" and status["status"] != "failed":  # died without a word: killed, OOM
                    write_status(
                        study_dir / "cells" / cell.name,
                        "failed",
                        error=f"the cell's process exited with "
                        f"status {code} (killed, or out of memory?); see its log.txt",
                    )
                    status = read_status(study_dir / "cells" / cell.name)
                if stop and state != "done":
                    state = "interrupted"
                counts[state] += 1
                if state == "done":
                    cell_seconds.append(time.perf_counter() - began)
                    if on_done is not None:
                        on_done(cell)
                    if not estimated:
                        estimated = True
                        estimate(cell_seconds[0], f"first cell done in {cell_seconds[0]:,.0f} s")
                finished = counts["done"] + counts["failed"]
                left = len(todo) - finished - counts["interrupted"]
                # cells run layout.workers at a time: the left ones take their mean time per wave of workers
                per_cell = sum(cell_seconds) / len(cell_seconds) if cell_seconds else float("nan")
                eta = per_cell * left / min(layout.workers, max(left, 1))
                what = {
                    "done": f"done in {time.perf_counter() - began:,.0f} s",
                    "failed": f"FAILED: {status.get('error', '')}",
                    "interrupted": "interrupted",
                }[state]
                log(
                    f"[study] {cell.name} {what} | {skipped + counts['done']}/{len(cells)} done, {counts['failed']} failed, "
                    f"{max(left, 0)} left" + (f" | ETA {_duration(eta)}" if left > 0 and cell_seconds else "")
                )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop:
        counts["signal"] = stop[0][0]
    return counts


def _duration(seconds: float) -> str:
    if not seconds == seconds:  # NaN
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def run_study(
    study_dir: Path,
    spec: StudySpec,
    *,
    layout: Layout,
    ledger: Ledger,
    unseal: bool = False,
    shard_of: tuple[int, int] | None = None,
    max_cells: int = 1000,
    confidence: float = 0.95,
    n_boot: int = 5000,
    log: Any = print,
) -> int:
    """The whole study (or one shard of it) in ``study_dir``; returns the exit status (0, 1 when cells failed,
    128 + signal when stopped).

    Before anything is written: the ledger must be writable, and days a seal covers are trained on or traded only
    with ``unseal`` (recorded in the ledger). The study and each cell that finishes are appended to the ledger.
    """
    cells = spec.cells()
    if len(cells) > max_cells:
        raise UserError(
            f"the grid has {len(cells)} cells ({len(spec.policies)} policies x {len(spec.seeds)} seeds x "
            f"{len(spec.variants)} variants), more than --max_cells {max_cells}; raise --max_cells or "
            f"shrink the grid"
        )
    check_writable(study_dir)
    ledger.check_writable()
    if (study_dir / SPEC_FILE).is_file():
        StudySpec.load(study_dir).check_same(spec, study_dir)
    mine = shard(cells, *shard_of) if shard_of else cells
    t0 = time.perf_counter()
    data, periods = plan(spec, mine)
    days = iso_days(data)
    holdout = guard(  # a day trained on is as spent as a day traded: from the first training day on
        ledger,
        data,
        str(days[periods[0].train.start]),
        str(days[periods[-1].trade.stop - 1]),
        unseal=unseal,
        command="study",
        look=study_key(spec, data_fingerprint(data)),
        what=str(study_dir.resolve()),
    )
    for entry in holdout:
        log(f"[study] --unseal: {describe(entry)}")
    prepare(study_dir, spec, mine, data, periods)
    spec.save(study_dir)
    entry = record_study(ledger, study_dir, spec)
    prepare_s = time.perf_counter() - t0
    where = (
        f"{layout.gpus} GPU(s) x {layout.workers // max(layout.gpus, 1)}"
        if layout.gpus
        else f"{layout.workers} CPU process(es) x {layout.threads} thread(s)"
    )
    log(
        f"[study] {len(mine)} cell(s){f' (shard {shard_of[0]}/{shard_of[1]} of {len(cells)})' if shard_of else ''}, "
        f"{len(periods)} walk-forward window(s), {episodes_per_cell(spec, len(periods)):,} training episodes per "
        f"cell, on {where}; data prepared in {prepare_s:.1f} s"
    )
    counts = run_cells(
        study_dir,
        mine,
        layout,
        log=log,
        on_done=lambda cell: record_cells(ledger, study_dir, spec, entry, [cell]),
        cell_episodes=episodes_per_cell(spec, len(periods)),
    )
    if "signal" in counts:
        log("[study] stopped: finished cells are kept (and in the ledger); run the same command again to continue")
        return 128 + counts["signal"]
    t1 = time.perf_counter()
    report = build_report(study_dir, ledger=ledger, confidence=confidence, n_boot=n_boot)
    c = report["cells"]
    log(
        f"[study] report: {study_dir / 'study.md'} ({c['done']}/{c['total']} cells done, {c['failed']} failed; "
        f"statistics and report in {time.perf_counter() - t1:.1f} s)"
    )
    for line in verdict_lines(report):
        log(f"  {line}")
    return 1 if c["failed"] else 0


def merge_shards(
    out: Path,
    shards: list[Path],
    *,
    ledger: Ledger,
    confidence: float = 0.95,
    n_boot: int = 5000,
    log: Any = print,
) -> int:
    """Join the finished cells of shard folders into ``out`` (all of one study) and write the report there."""
    specs = [StudySpec.load(s) for s in shards]
    for s, other in zip(shards[1:], specs[1:], strict=True):
        specs[0].check_same(other, s)
    check_writable(out)
    ledger.check_writable()
    if (out / SPEC_FILE).is_file():
        StudySpec.load(out).check_same(specs[0], out)
    specs[0].save(out)
    copied = 0
    for folder in shards:
        if folder.resolve() == out.resolve():
            continue
        for name in ("prepared",):
            for f in (folder / name).glob("*"):
                (out / name).mkdir(parents=True, exist_ok=True)
                if not (out / name / f.name).exists():
                    shutil.copy2(f, out / name / f.name)
        for cell_dir in (folder / "cells").glob("*"):
            if (
                read_status(cell_dir)["status"] == "done"
                and read_status(out / "cells" / cell_dir.name)["status"] != "done"
            ):
                shutil.copytree(cell_dir, out / "cells" / cell_dir.name, dirs_exist_ok=True)
                copied += 1
    report = build_report(out, ledger=ledger, confidence=confidence, n_boot=n_boot)
    c = report["cells"]
    log(
        f"[study] merged {copied} cell(s) from {len(shards)} folder(s): {c['done']}/{c['total']} done; "
        f"report: {out / 'study.md'}"
    )
    missing = c["total"] - c["done"]
    if missing:
        log(f"[study] {missing} cell(s) not finished in any shard (listed in study.md)")
    return 0 if not missing else 1
