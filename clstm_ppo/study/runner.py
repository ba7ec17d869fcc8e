"""Running a study: prepare the data once, run its cells in parallel processes, survive crashes and kills, report.

Each job, a batch of cells (`clstm_ppo.study.batch.batches`) or one cell, runs in its own process (``clstm-ppo study
_cell DIR CELL[,CELL...]``: a crash, an out-of-memory kill or a hang touches no other job): ``workers`` at a time on CPU
cores, or ``cells_per_gpu`` per visible GPU (each process sees one through CUDA_VISIBLE_DEVICES). Finished cells are
skipped on a re-run; SIGINT/SIGTERM is passed on to the running jobs, which save and stop (docs/study.md, "Scale and
resumption"). The trials ledger gets the study's record before the first cell runs and each cell's trial as soon as the
runner sees it done, so a killed study leaves its finished cells counted.
"""

from __future__ import annotations

import heapq
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clstm_ppo.config import TrainConfig
from clstm_ppo.evaluation.holdout import describe, guard, iso_days
from clstm_ppo.evaluation.ledger import Ledger
from clstm_ppo.market import load_data
from clstm_ppo.study.batch import batches, cell_cost
from clstm_ppo.study.cell import read_status, write_status
from clstm_ppo.study.config import ReportSettings, StudyConfig
from clstm_ppo.study.grid import Cell, format_seeds, shard
from clstm_ppo.study.jobs import Running, job_command, job_env
from clstm_ppo.study.markets import load_markets, market_key, prepare_markets, same_market, save_markets
from clstm_ppo.study.ray_jobs import Cluster, RayJobs
from clstm_ppo.study.report import build_report, verdict_lines
from clstm_ppo.study.schedule import WalkPeriod, walk_forward
from clstm_ppo.study.spec import SPEC_FILE, StudySpec
from clstm_ppo.study.trials import record_cells, record_study, study_key
from clstm_ppo.training.run_folder import check_writable
from envs.data import MarketData
from envs.errors import UserError
from envs.fingerprint import data_fingerprint

STOP_GRACE_S = 60.0


@dataclass
class Layout:
    """How the cells are spread on this machine."""

    workers: int  # jobs (a batch of cells, or one cell) at once
    gpus: int  # visible GPUs used (0: CPU)
    threads: int  # torch threads per CPU job
    batch_cells: int = 1  # the most cells trained as one batch (0: automatic, `clstm_ppo.study.batch.batches`)
    cells_per_gpu: int = 1  # jobs sharing one GPU
    ray: str = ""  # the Ray cluster's address the jobs run on (`clstm_ppo.study.ray_jobs`); "": this machine


def plan_layout(workers: int, cells_per_gpu: int, threads: int, use_gpus: bool, batch_cells: int = 0) -> Layout:
    """``workers`` (0: all it is given): GPUs x cells_per_gpu, or CPU cores / threads (the flags as
    `clstm_ppo.study.config.StudyConfig` validated them)."""
    gpus = torch.cuda.device_count() if use_gpus and torch.cuda.is_available() else 0
    cores = os.cpu_count() or 1
    threads = threads or (1 if gpus else max(1, cores // max(1, workers or cores)))
    if not workers:
        workers = gpus * cells_per_gpu if gpus else max(1, cores // threads)
    return Layout(workers=workers, gpus=gpus, threads=threads, batch_cells=batch_cells, cells_per_gpu=cells_per_gpu)


def ray_layout(
    cluster: Cluster, workers: int, cells_per_gpu: int, threads: int, use_gpus: bool, batch_cells: int = 0
) -> Layout:
    """`plan_layout` on a Ray cluster: its GPUs x cells_per_gpu, or its CPUs / threads (1 thread unless given); a
    job may ask for no more CPUs than one node has."""
    gpus = cluster.gpus if use_gpus else 0
    threads = threads or 1
    if threads > cluster.largest_node_cpus:
        raise UserError(
            f"--threads {threads}: the largest node of the Ray cluster at {cluster.address} has "
            f"{cluster.largest_node_cpus} CPU(s), and a job runs on one node"
        )
    if not workers:
        workers = gpus * cells_per_gpu if gpus else max(1, cluster.cpus // threads)
    return Layout(workers, gpus, threads, batch_cells, cells_per_gpu, ray=cluster.address)


def plan(spec: StudySpec, cells: list[Cell], data: MarketData) -> list[WalkPeriod]:
    """The walk-forward schedule of ``cells`` on ``data`` (nothing is written)."""
    base = spec.base_config
    return walk_forward(
        data.dates,
        window=max([base.data.window, *[c.config(base).data.window for c in cells]]),
        trade_start=spec.trade_start,
        trade_end=spec.trade_end or None,
        retrain=spec.retrain,
        validation_days=spec.validation_days,
    )


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


def run_cells(
    study_dir: Path,
    groups: list[list[Cell]],
    layout: Layout,
    *,
    log: Any = print,
    on_done: Callable[[Cell], None] | None = None,
    cell_episodes: int = 0,
    costs: dict[str, float] | None = None,
) -> dict[str, int]:
    """Run the cells of ``groups`` (`batches`; each group's cells not done yet, in one process) ``layout.workers``
    groups at a time; print progress with an ETA.

    :param on_done: called with each cell that finishes done (the study records it in the trials ledger).
    :param cell_episodes: training episodes per cell (`episodes_per_cell`): with it, the estimated wall time is
        printed as soon as the first cell has trained a tenth of them; without, when the first job finishes.
    :param costs: each cell's work by name (`clstm_ppo.study.batch.cell_cost`): the ETA times a waiting job by the
        seconds per unit of work its policy family has measured (without: every cell alike).
    :return: counts {"done", "failed", "interrupted"} of the cells run now, and "signal", the first stop's signal
        number, when a signal stopped the running cells (gracefully).
    """
    cells = [c for g in groups for c in g]
    todo = [c for c in cells if read_status(study_dir / "cells" / c.name)["status"] != "done"]
    if len(todo) < len(cells):
        log(f"[study] {len(cells) - len(todo)} of {len(cells)} cells already done (kept)")
    jobs = [job for job in ([c for c in group if c in todo] for group in groups) if job]
    pool = _CellPool(
        study_dir,
        layout,
        jobs,
        total=len(cells),
        log=log,
        on_done=on_done,
        cell_episodes=cell_episodes,
        costs=costs,
        start=_starter(study_dir, layout, log) if jobs else None,
    )
    previous = {sig: signal.signal(sig, pool.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        pool.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pool.stop:
        pool.counts["signal"] = pool.stop[0][0]
    return pool.counts


def _starter(study_dir: Path, layout: Layout, log: Any) -> Callable[[list[Cell], int], Running]:
    """What starts a job of cells in a worker slot: a process here (`_start_job`), or a Ray task on the cluster
    (`clstm_ppo.study.ray_jobs.RayJobs`: the study's inputs go to the object store now, once)."""
    if not layout.ray:
        return lambda cells, slot: _start_job(study_dir, cells, slot, layout)
    remote = RayJobs(study_dir, layout.threads, layout.gpus, layout.cells_per_gpu, log)
    return lambda cells, _slot: remote.start(cells)


@dataclass
class _Job:
    """A process running one cell, or a batch of cells, while it runs (here, or a Ray task)."""

    proc: Running
    cells: list[Cell]
    slot: int  # the worker slot it holds (which GPU it sees)
    began: float  # time.perf_counter() when it started
    episodes_before: int  # episodes its first cell had logged when it started (a resumed cell's): not timed
    tail: float | None = None  # seconds it ran besides training (start, trading, reports), once a cell of it is done
    measured: bool = False  # its seconds went into its family's rate (`_CellPool.measure`), at its first done cell


def _start_job(study_dir: Path, cells: list[Cell], slot: int, layout: Layout) -> subprocess.Popen:
    """Start the process of ``cells`` in worker ``slot`` on this machine (`job_command`)."""
    env = job_env("cuda" if layout.gpus else "cpu")
    if layout.gpus:  # the job sees one GPU; slots go round the GPUs
        env["CUDA_VISIBLE_DEVICES"] = str(slot % layout.gpus)
    argv, log = job_command(study_dir, [c.name for c in cells], layout.threads)
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _settled_status(cell_dir: Path, code: int) -> tuple[str, dict[str, Any]]:
    """A finished cell's state (done, failed, interrupted) and status; recorded failed if it died without a word."""
    status = read_status(cell_dir)
    state = status["status"] if status["status"] in ("done", "failed", "interrupted") else "failed"
    if state == "failed" and status["status"] != "failed":  # died without a word: killed, OOM
        error = f"the cell's process exited with status {code} (killed, or out of memory?); see its log.txt"
        write_status(cell_dir, "failed", error=error)
        status = read_status(cell_dir)
    return state, status


class _CellPool:
    """The jobs of one `run_cells` call: those waiting, those running, what their cells came to, the time they take."""

    def __init__(
        self,
        study_dir: Path,
        layout: Layout,
        jobs: list[list[Cell]],
        *,
        total: int,
        log: Any,
        on_done: Callable[[Cell], None] | None,
        cell_episodes: int,
        costs: dict[str, float] | None = None,
        start: Callable[[list[Cell], int], Running] | None = None,
    ) -> None:
        self.study_dir = study_dir
        self.start = start
        self.layout = layout
        self.jobs = jobs
        self.todo = [c for job in jobs for c in job]
        self.total = total  # cells in the study (or shard), the done ones included
        self.log = log
        self.on_done = on_done
        self.cell_episodes = cell_episodes
        self.counts = {"done": 0, "failed": 0, "interrupted": 0}
        self.running: dict[int, _Job] = {}  # by pid
        self.free_slots = list(range(layout.workers))
        self.stop: list[tuple[int, float]] = []  # (signal, when)
        self.tails: list[float] = []  # each finished job's seconds besides training (`_Job.tail`)
        self.estimated = False
        self.next_look = 0.0
        self.trained: dict[int, int] = {}  # running jobs' episodes trained, read once per finished job (by pid)
        self.costs = costs or {}
        self.rates: dict[str, list[float]] = {}  # by policy family: measured seconds per unit of work (`cost`)
        self.queue: list[list[Cell]] = list(jobs)

    def on_signal(self, signum: int, _frame: Any) -> None:
        """Note the stop and ask each running cell to stop."""
        self.stop.append((signum, time.perf_counter()))
        for job in self.running.values():
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGTERM)  # the cell's trainer finishes its update, saves, exits

    def run(self) -> None:
        """Start jobs as workers free up until all have run (or a stop lets the running ones end)."""
        while self.queue or self.running:
            while self.queue and self.free_slots and not self.stop:  # the next jobs on the free slots
                cells, slot = self.queue.pop(0), self.free_slots.pop(0)
                before = _episodes_done(self.study_dir / "cells" / cells[0].name)  # a resumed cell's, not timed
                proc = self.start(cells, slot)
                self.running[proc.pid] = _Job(proc, cells, slot, time.perf_counter(), before)
            if not self.running:
                break
            time.sleep(0.2)
            self.estimate_from_first_episodes()
            self.collect_finished()

    def estimate_from_first_episodes(self) -> None:
        """Print the wall-time estimate once the first running cell has trained a tenth of the episodes it had left."""
        if self.estimated or not self.cell_episodes or time.perf_counter() < self.next_look:
            return
        self.next_look = time.perf_counter() + 2.0
        first = next(iter(self.running.values()))
        left = max(self.cell_episodes - first.episodes_before, 1)  # a resumed cell's episodes still to train
        episodes = _episodes_done(self.study_dir / "cells" / first.cells[0].name) - first.episodes_before
        if episodes >= max(1, left // 10):
            took = time.perf_counter() - first.began
            self.estimated = True
            self.measure(first.cells, took / episodes * left)
            self.log_estimate(first.cells, f": {episodes} episodes in {took:,.0f} s")

    def cost(self, cells: list[Cell]) -> float:
        """A job's work (its cells' `cell_cost`s; 1 a cell without them)."""
        return sum(self.costs.get(c.name, 1.0) for c in cells)

    def measure(self, cells: list[Cell], seconds: float) -> None:
        """Note that a job of ``cells`` takes ``seconds``: its family's seconds per unit of work."""
        self.rates.setdefault(cells[0].policy, []).append(seconds / max(self.cost(cells), 1e-12))

    def predicted(self, cells: list[Cell]) -> float:
        """Seconds a job of ``cells`` takes: its work at its family's measured rate, else at the mean of the
        families measured (NaN before any)."""
        rates = self.rates.get(cells[0].policy) or [r for rs in self.rates.values() for r in rs]
        return self.cost(cells) * sum(rates) / len(rates) if rates else math.nan

    def log_estimate(self, cells: list[Cell], what: str) -> None:
        """Print what the first job, of ``cells``, did (``what``, after its name), the estimated time per cell of its
        family and for all the cells to run."""
        per_job = self.predicted(cells)
        batched = f" (in batches of up to {max(len(j) for j in self.jobs)})" if len(cells) > 1 else ""
        first = "first cell" if len(cells) == 1 else f"first batch of {len(cells)} cells"
        self.log(
            f"[study] {first}{what}: about {_duration(per_job / len(cells))} per {cells[0].policy} cell{batched}, "
            f"{_duration(self.eta())} for the {len(self.todo)} cell(s) on {self.layout.workers} worker(s)"
        )

    def eta(self) -> float:
        """Seconds until the last job ends (`_eta`): running jobs by `seconds_left`, waiting ones by `predicted`."""
        running = [self.seconds_left(job, self.predicted(job.cells)) for job in self.running.values()]
        queued = [self.predicted(cells) for cells in self.queue]
        return _eta(running, queued, self.layout.workers)

    def collect_finished(self) -> None:
        """Settle each cell whose process has exited; kill those a stop waits on too long."""
        for pid, job in list(self.running.items()):
            code = job.proc.poll()
            if code is None:
                if self.stop and (len(self.stop) > 1 or time.perf_counter() - self.stop[0][1] > STOP_GRACE_S):
                    job.proc.kill()  # a second signal, or a stop taking longer than `STOP_GRACE_S`
                continue
            del self.running[pid]
            self.free_slots.append(job.slot)
            self.trained.clear()  # each of its cells' progress lines reads the running jobs' files once, not K times
            for cell in job.cells:
                self.finish(job, cell, code)

    def finish(self, job: _Job, cell: Cell, code: int) -> None:
        """Count a cell of ``job``, whose process exited with ``code``, record it when done, print the progress."""
        state, status = _settled_status(self.study_dir / "cells" / cell.name, code)
        if self.stop and state != "done":
            state = "interrupted"
        self.counts[state] += 1
        if state == "done":
            self.record_done(job, cell, status)
        self.log_progress(job, cell, state, status)

    def record_done(self, job: _Job, cell: Cell, status: dict[str, Any]) -> None:
        """Hand a done cell to ``on_done``; note its job's time (its family's rate) and its time besides training;
        estimate the wall time from its job if nothing has yet."""
        seconds = time.perf_counter() - job.began
        if not job.measured:
            job.measured = True
            self.measure(job.cells, seconds)
        if job.tail is None and "train_seconds" in status:
            job.tail = max(seconds - float(status["train_seconds"]), 0.0)
            self.tails.append(job.tail)
        if self.on_done is not None:
            self.on_done(cell)
        if not self.estimated:
            self.estimated = True
            self.log_estimate(job.cells, f" done in {seconds:,.0f} s")

    def log_progress(self, job: _Job, cell: Cell, state: str, status: dict[str, Any]) -> None:
        """Print how a cell ended, the counts so far and the ETA of the cells left (`eta`)."""
        counts = self.counts
        left = len(self.todo) - counts["done"] - counts["failed"] - counts["interrupted"]
        eta = self.eta() if left > 0 else math.nan
        what = {
            "done": f"done in {time.perf_counter() - job.began:,.0f} s",
            "failed": f"FAILED: {status.get('error', '')}",
            "interrupted": "interrupted",
        }[state]
        node = getattr(job.proc, "node", "")  # a Ray task's node
        where = f" on {node}" if node else ""
        self.log(
            f"[study] {cell.name} {what}{where} | {self.total - len(self.todo) + counts['done']}/{self.total} done, "
            f"{counts['failed']} failed, {max(left, 0)} left" + ("" if math.isnan(eta) else f" | ETA {_duration(eta)}")
        )

    def seconds_left(self, job: _Job, per_job: float) -> float:
        """A running job's seconds to go (`_job_seconds_left`), from its first cell's episodes trained so far."""
        todo = max(self.cell_episodes - job.episodes_before, 1) if self.cell_episodes else 0
        pid = job.proc.pid
        if todo and pid not in self.trained:
            self.trained[pid] = _episodes_done(self.study_dir / "cells" / job.cells[0].name)
        done = self.trained[pid] - job.episodes_before if todo else 0
        tail = sum(self.tails) / len(self.tails) if self.tails else 0.0
        return _job_seconds_left(time.perf_counter() - job.began, done, todo, per_job, tail)


def _job_seconds_left(ran: float, done: int, todo: int, per_job: float, tail: float = 0.0) -> float:
    """Seconds a job that has run ``ran`` seconds has to go: once it has trained ``done`` of its ``todo`` episodes,
    the rest at its own pace (jobs started together need not end together) and then ``tail`` seconds besides
    training (trading, reports; what finished jobs took); before that, the mean job's ``per_job`` less what it has
    run (now, at the earliest)."""
    if done > 0 and todo > 0:
        return ran / done * max(todo - done, 0) + tail
    return max(per_job - ran, 0.0)


def _eta(running_left: list[float], queued: list[float], workers: int) -> float:
    """Seconds until the last job ends: the running ones end in ``running_left`` seconds, and each ``queued`` job, in
    order, taking its seconds, starts on the first of the ``workers`` to come free. NaN where a time is unknown."""
    free = list(running_left) + [0.0] * max(workers - len(running_left), 0)
    heapq.heapify(free)
    for seconds in queued:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return math.nan if any(math.isnan(x) for x in free) else max(free, default=0.0)


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def run_study(spec: StudySpec, settings: StudyConfig, *, layout: Layout, log: Any = print) -> int:
    """The whole study (or the shard of it ``settings.shard_of`` names) in ``settings.out``, its trials in
    ``settings.ledger``; returns the exit status (0, 1 when cells failed, 128 + signal when stopped).

    Before anything is written: the ledger must be writable, and days a seal covers are trained on or traded only
    with ``settings.unseal`` (recorded in the ledger)."""
    study_dir, ledger, cells = Path(settings.out), Ledger(settings.ledger), spec.cells()
    _check_before_writing(study_dir, spec, cells, ledger, settings.max_cells, log)
    t0 = time.perf_counter()
    base = spec.base_config
    data = load_data(base.data, seed=base.run.seed)
    groups = _batches_to_run(cells, base, data, layout, settings.shard_of)
    mine = [c for group in groups for c in group]
    periods = plan(spec, mine, data)
    _guard_holdout(study_dir, spec, ledger, data, periods, unseal=settings.unseal, log=log)
    prepare(study_dir, spec, mine, data, periods)
    spec.save(study_dir)
    entry = record_study(ledger, study_dir, spec)
    _log_plan(spec, layout, groups, len(cells), periods, settings.shard_of, time.perf_counter() - t0, log)
    counts = run_cells(
        study_dir,
        groups,
        layout,
        log=log,
        on_done=lambda cell: record_cells(ledger, study_dir, spec, entry, [cell]),
        cell_episodes=episodes_per_cell(spec, len(periods)),
        costs={c.name: cell_cost(c, base, data.num_tickers) for c in mine},
    )
    if "signal" in counts:
        log("[study] stopped: finished cells are kept (and in the ledger); run the same command again to continue")
        return 128 + counts["signal"]
    return _report_study(study_dir, ledger, settings.report_settings, log)


def _check_before_writing(
    study_dir: Path, spec: StudySpec, cells: list[Cell], ledger: Ledger, max_cells: int, log: Any
) -> None:
    """Refuse a grid over ``max_cells``, an unwritable folder or ledger, or a folder holding another study (one that
    ``spec`` only adds seeds to is the same study, grown)."""
    if len(cells) > max_cells:
        raise UserError(
            f"the grid has {len(cells)} cells ({len(spec.policies)} policies x {len(spec.seeds)} seeds x "
            f"{len(spec.variants)} variants), more than --max_cells {max_cells}; raise --max_cells or "
            f"shrink the grid"
        )
    check_writable(study_dir)
    ledger.check_writable()
    if (study_dir / SPEC_FILE).is_file():
        before = StudySpec.load(study_dir)
        if before.check_same(spec, study_dir, more_seeds=True):
            log(
                f"[study] adds seeds {format_seeds(sorted(set(spec.seeds) - set(before.seeds)))} to the study in "
                f"{study_dir} (seeds {format_seeds(before.seeds)}: its finished cells are kept)"
            )


def _batches_to_run(
    cells: list[Cell], base: TrainConfig, data: MarketData, layout: Layout, shard_of: tuple[int, int] | None
) -> list[list[Cell]]:
    """The batches of ``cells`` this run trains (`clstm_ppo.study.batch.batches`), each in one process. They are
    formed over the whole grid, as if every shard's workers were here, and a shard takes whole batches: a cell trains
    with the same batch mates, so to the same numbers, in a shard as in the whole study."""
    shards = shard_of[1] if shard_of else 1
    groups = batches(
        cells, base, layout.batch_cells, layout.workers * shards, num_tickers=data.num_tickers, gpus=bool(layout.gpus)
    )
    return shard(groups, *shard_of) if shard_of else groups


def _guard_holdout(
    study_dir: Path,
    spec: StudySpec,
    ledger: Ledger,
    data: MarketData,
    periods: list[WalkPeriod],
    *,
    unseal: bool,
    log: Any,
) -> None:
    """Refuse sealed days the study would train on or trade (unless ``unseal``: then say which are unsealed). A day
    trained on is as spent as a day traded: the guarded days run from the first training day on."""
    days = iso_days(data)
    for seal in guard(
        ledger,
        data,
        str(days[periods[0].train.start]),
        str(days[periods[-1].trade.stop - 1]),
        unseal=unseal,
        command="study",
        look=study_key(spec, data_fingerprint(data)),
        what=str(study_dir.resolve()),
    ):
        log(f"[study] --unseal: {describe(seal)}")


def _log_plan(
    spec: StudySpec,
    layout: Layout,
    groups: list[list[Cell]],
    grid_cells: int,
    periods: list[WalkPeriod],
    shard_of: tuple[int, int] | None,
    prepare_s: float,
    log: Any,
) -> None:
    """Print what is about to run: this run's cells of ``groups`` (of ``grid_cells`` in the grid, when a shard), the
    windows and episodes, and on what."""
    where = (
        f"{layout.gpus} GPU(s) x {layout.workers // layout.gpus}"
        if layout.gpus
        else f"{layout.workers} CPU process(es) x {layout.threads} thread(s)"
    )
    if layout.ray:
        where = f"the Ray cluster at {layout.ray}, {where} at once"
    batch = max(len(g) for g in groups)
    if batch > 1:
        where += f", up to {batch} cells trained as one batch per process"
    mine = sum(len(g) for g in groups)
    log(
        f"[study] {mine} cell(s){f' (shard {shard_of[0]}/{shard_of[1]} of {grid_cells})' if shard_of else ''}, "
        f"{len(periods)} walk-forward window(s), {episodes_per_cell(spec, len(periods)):,} training episodes per "
        f"cell, on {where}; data prepared in {prepare_s:.1f} s"
    )


def _report_study(study_dir: Path, ledger: Ledger, settings: ReportSettings, log: Any) -> int:
    """Write the study's report, print its verdicts; return 1 when cells failed, else 0."""
    t1 = time.perf_counter()
    report = build_report(study_dir, ledger=ledger, confidence=settings.confidence, n_boot=settings.bootstrap)
    c = report["cells"]
    log(
        f"[study] report: {study_dir / 'study.md'} ({c['done']}/{c['total']} cells done, {c['failed']} failed; "
        f"statistics and report in {time.perf_counter() - t1:.1f} s)"
    )
    for line in verdict_lines(report):
        log(f"  {line}")
    return 1 if c["failed"] else 0


def merge_shards(out: Path, shards: list[Path], settings: ReportSettings, *, log: Any = print) -> int:
    """Join the finished cells of shard folders into ``out`` (all of one study) and write the report there, as
    ``settings`` say (its trials in ``settings.ledger``)."""
    ledger = Ledger(settings.ledger)
    specs = [StudySpec.load(s) for s in shards]
    for s, other in zip(shards[1:], specs[1:], strict=True):
        specs[0].check_same(other, s)
    check_writable(out)
    ledger.check_writable()
    if (out / SPEC_FILE).is_file():  # shards of the study with more seeds merge into it: it grows
        StudySpec.load(out).check_same(specs[0], out, more_seeds=True)
    specs[0].save(out)
    copied = 0
    for folder in shards:
        if folder.resolve() == out.resolve():
            continue
        for f in (folder / "prepared").glob("*"):
            (out / "prepared").mkdir(parents=True, exist_ok=True)
            if not (out / "prepared" / f.name).exists():
                shutil.copy2(f, out / "prepared" / f.name)
        for cell_dir in (folder / "cells").glob("*"):
            if (
                read_status(cell_dir)["status"] == "done"
                and read_status(out / "cells" / cell_dir.name)["status"] != "done"
            ):
                shutil.copytree(cell_dir, out / "cells" / cell_dir.name, dirs_exist_ok=True)
                copied += 1
    report = build_report(out, ledger=ledger, confidence=settings.confidence, n_boot=settings.bootstrap)
    c = report["cells"]
    log(
        f"[study] merged {copied} cell(s) from {len(shards)} folder(s): {c['done']}/{c['total']} done; "
        f"report: {out / 'study.md'}"
    )
    missing = c["total"] - c["done"]
    if not missing:
        return 0
    log(f"[study] {missing} cell(s) not finished in any shard (listed in study.md)")
    return 1
