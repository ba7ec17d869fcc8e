"""Several cells of a study in one process, trained as one batch (`clstm_ppo.training.trainer`): the groups `batches`
forms, and `run_batch`, which walks them forward together (docs/study.md, "Seeds as a batch dimension").

Groups are formed from the whole grid in its order, whatever is done, and a shard takes whole groups: a re-run and
every shard put each cell beside the same batch mates in the same place, so an interrupted cell continues as it would
have, and a sharded study gives the whole study's numbers bit for bit. A cell's folder is exactly a cell's folder. A
cell that fails (an error in its training, NaN for ``max_bad_updates`` updates) is recorded failed and the others go
on; an error outside any one cell fails the group's unfinished cells.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from clstm_ppo.agent.evaluate import PolicyRun
from clstm_ppo.agent.flops import training_flops_per_step
from clstm_ppo.config import TrainConfig
from clstm_ppo.study.cell import (
    finish_cell,
    keep_traded_weights,
    load_run,
    period_config,
    period_dir,
    read_status,
    save_run,
    selected,
    stitch,
    trade_window,
    trade_windows,
    traded_terms,
    trained,
    write_status,
)
from clstm_ppo.study.grid import Cell
from clstm_ppo.study.markets import load_markets, market_key
from clstm_ppo.study.spec import StudySpec
from clstm_ppo.training.callbacks import Callback
from clstm_ppo.training.distributed import Comm
from clstm_ppo.training.signals import StoppedBySignal
from clstm_ppo.training.trainer import Trainer, batch_key
from envs.errors import describe_exception

AUTO_MAX = 64
"""The largest batch `batches` forms by itself (``--batch_cells 0``): enough to fill a GPU with small cells, and a
crash or a kill costs at most this many cells' progress since their last checkpoints."""


STEP_OVERHEAD = 1e7
"""What one env step of a job costs besides its cells' matmuls, in FLOP-equivalents (the env, Python, small kernels),
once per job however many cells it batches: fitted to the 2-core box's figures (8 demo cells, 2.5 MFLOP of training a
step each, 2.4x faster as two batches of 4 than alone)."""
BATCHED_SLOWDOWN = {"cpu": 1.12, "cuda": 1.0}
"""A batched cell's matmuls against its run alone (stacked weights against one network's kernels): on the CPU 4
paper-sized clstm cells (400 MFLOP of training a step) as one batch on one core took 56 min where each alone takes
about 12.5 (issue 59)."""


def cell_cost(cell: Cell, base: TrainConfig, num_tickers: int) -> float:
    """A cell's training work alone: its first window's env steps x (`STEP_OVERHEAD` + its training matmul FLOPs per
    step, `clstm_ppo.agent.flops.training_flops_per_step`). What the scheduler balances, not a time."""
    return _cost([_work(cell.config(base), num_tickers)], "cpu")


def _work(cfg: TrainConfig, num_tickers: int) -> tuple[float, float]:
    """A cell's env steps (its first window's) and its training matmul FLOPs over them."""
    days = cfg.env.episode_length if isinstance(cfg.env.episode_length, int) else 252
    steps = float(cfg.ppo.num_episodes * days)
    return steps, steps * training_flops_per_step(cfg, num_tickers)


def _cost(works: list[tuple[float, float]], device: str) -> float:
    """The work of cells whose `_work` is ``works`` trained as one batch: one `STEP_OVERHEAD` a step for the job and
    each cell's matmuls, slower by `BATCHED_SLOWDOWN` when batched."""
    slowdown = BATCHED_SLOWDOWN[device] if len(works) > 1 else 1.0
    return max(steps for steps, _ in works) * STEP_OVERHEAD + slowdown * sum(flops for _, flops in works)


def makespan(costs: list[float], workers: int) -> float:
    """The work of the busiest of ``workers`` when jobs of ``costs`` start costliest first, each on the least busy
    worker (LPT)."""
    loads = [0.0] * max(1, workers)
    for cost in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += cost
    return max(loads)


def batches(
    cells: list[Cell], base: TrainConfig, size: int, workers: int, *, num_tickers: int = 20, gpus: bool = False
) -> list[list[Cell]]:
    """``cells`` in groups that train as one batch each, the costliest first (`_cost`: the longest jobs start
    first, and no worker waits on one started last). Each set of cells that may share a batch (`batch_key`) is split
    evenly: into groups of at most ``size``; 1: every cell alone; 0: automatic, sized by cost. Then each set in turn
    takes the number of groups (of at most `AUTO_MAX` cells) that gives the busiest worker the least work
    (`makespan`), the fewest on a tie, until none changes. So a batch is split rather than leave a worker idle, small
    cells share a job's overhead, and large ones on the CPU train alone. ``num_tickers``: the networks' widths.
    """
    device = "cuda" if gpus else "cpu"
    configs = {cell: cell.config(base) for cell in cells}
    work = {cell: _work(cfg, num_tickers) for cell, cfg in configs.items()}
    compatible: dict[Any, list[Cell]] = {}
    for cell in cells:
        compatible.setdefault(batch_key(configs[cell]), []).append(cell)
    sets = list(compatible.values())

    def split(members: list[Cell], count: int) -> list[list[Cell]]:  # consecutive, sizes differing by one at most
        return [members[i * len(members) // count : (i + 1) * len(members) // count] for i in range(count)]

    def cost(group: list[Cell]) -> float:
        return _cost([work[c] for c in group], device)

    counts = [math.ceil(len(members) / (size or AUTO_MAX)) for members in sets]
    if not size:
        costs: dict[tuple[int, int], list[float]] = {}  # (set, groups) -> its groups' costs

        def group_costs(k: int, count: int) -> list[float]:
            if (k, count) not in costs:
                costs[k, count] = [cost(g) for g in split(sets[k], count)]
            return costs[k, count]

        scale = sum(cost([c]) for c in cells) or 1.0
        changed = True
        while changed:
            changed = False
            for k, members in enumerate(sets):
                others = [c for j, n in enumerate(counts) if j != k for c in group_costs(j, n)]
                options = sorted({math.ceil(len(members) / n) for n in range(1, min(len(members), AUTO_MAX) + 1)})
                best = min(options, key=lambda n: (round(makespan(others + group_costs(k, n), workers) / scale, 9), n))
                if best != counts[k]:
                    counts[k], changed = best, True
    groups = [group for members, count in zip(sets, counts, strict=True) for group in split(members, count)]
    return sorted(groups, key=lambda g: -cost(g))  # stable: equal costs keep the grid's order


class _Member:
    """One cell of the group as `run_batch` walks it forward: its settings, windows so far, failure, and when its
    process started."""

    def __init__(self, study_dir: Path, cell: Cell, cfg: TrainConfig, started: float) -> None:
        self.cell, self.cfg = cell, cfg
        self.folder = study_dir / "cells" / cell.name
        self.policy_runs: list[PolicyRun] = []
        self.untrained_runs: list[PolicyRun] = []
        self.train_seconds: list[float] = []
        self.previous: Path | None = None
        self.error: BaseException | None = None
        self.started = started

    def window(self, k: int) -> Path:
        return period_dir(self.folder, k)


def run_batch(
    study_dir: Path,
    cells: list[Cell],
    device: torch.device | str,
    started: float,
    *,
    callbacks: dict[str, list[Callback]] | None = None,
) -> dict[str, dict[str, Any] | BaseException]:
    """Walk ``cells`` (one group of `batches`, or one cell) forward together; each cell's result.json content, or the
    error it failed with.

    :param started: when the process started (`time.time()`), for the status.json of a cell that fails.
    :param callbacks: per cell name, hooks on its training (tests: a fault injector on one cell).
    :raises StoppedBySignal: on SIGINT/SIGTERM, after every training cell saved (`run_batch_guarded` records it).
    :raises Exception: whatever one cell alone raises (a run of one seed raises, `clstm_ppo.training.trainer`).
    """
    device = torch.device(device)
    spec = StudySpec.load(study_dir)
    members = [_Member(study_dir, cell, cell.config(spec.base_config), started) for cell in cells]
    markets = load_markets(study_dir / "prepared", market_key(members[0].cfg))
    tickers = markets[0].data.tickers
    for k, market in enumerate(markets):
        live = [m for m in members if m.error is None]
        to_trade = [m for m in live if not (m.window(k) / "trade.npz").is_file()]
        for m in live:
            if m not in to_trade:
                policy, untrained, seconds = load_run(m.window(k) / "trade.npz", tickers)
                m.policy_runs.append(policy)
                m.untrained_runs.append(untrained)
                m.train_seconds.append(seconds)
        configs = {m.cell.name: period_config(m.cfg, spec, m.window(k), k, m.previous) for m in to_trade}
        to_train = [m for m in to_trade if not trained(configs[m.cell.name], m.window(k))]
        seconds = _train_together(to_train, configs, market, k, device, callbacks or {})
        if any(m.error is None for m in to_trade):
            # every live cell trades, those a killed run had traded too (their records stay as saved): the batch's
            # composition fixes its last bits
            traders = [m for m in live if m.error is None]
            traded = _trade_together(traders, market, k, device, alone=len(members) == 1)
            for m in to_trade:
                if m.error is None:
                    policy, untrained = traded[m.cell.name]
                    keep_traded_weights(m.window(k))
                    save_run(m.window(k) / "trade.npz", policy, untrained, seconds if m in to_train else 0.0)
                    m.policy_runs.append(policy)
                    m.untrained_runs.append(untrained)
                    m.train_seconds.append(seconds if m in to_train else 0.0)
        for m in members:
            if m.error is None:
                m.previous = selected(m.window(k), market, m.cfg)
    terms = traded_terms(markets, members[0].cfg)
    out: dict[str, dict[str, Any] | BaseException] = {}
    for m in members:
        if m.error is None:
            with _alone(m):
                runs = stitch(m.policy_runs), stitch(m.untrained_runs)
                out[m.cell.name] = finish_cell(study_dir, m.cell, m.cfg, *runs, m.train_seconds, terms)
        if m.error is not None:
            out[m.cell.name] = m.error
    return out


@contextmanager
def _alone(member: _Member) -> Iterator[None]:
    """An error in the block fails ``member`` (recorded), not the group."""
    try:
        yield
    except StoppedBySignal:
        raise
    except Exception as err:  # a cell fails alone
        _fail(member, err, traceback.format_exc()[-4000:])


def _fail(member: _Member, err: BaseException, trace: str, batch: int = 1) -> None:
    """Record ``member``'s failure (in a batch of ``batch`` cells) in memory and in its status.json."""
    member.error = err
    error = describe_exception(err, 500) + _smaller_batches_hint(err, batch)
    write_status(member.folder, "failed", started=member.started, finished=time.time(), error=error, traceback=trace)


def _train_together(
    members: list[_Member],
    configs: dict[str, TrainConfig],
    market: Any,
    k: int,
    device: torch.device,
    callbacks: dict[str, list[Callback]],
) -> float:
    """Train window ``k`` of ``members`` as one batch; record each cell's failure on it; the batch's seconds."""
    if not members:
        return 0.0
    for m in members:
        m.window(k).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    trainer = Trainer(
        [configs[m.cell.name] for m in members],
        market,
        Comm(device=device),
        [m.window(k) for m in members],
        [callbacks.get(m.cell.name, []) for m in members],
    )
    trainer.train()
    for m, seed in zip(members, trainer.seeds, strict=True):
        if seed.error is not None:
            _fail(m, seed.error, "".join(traceback.format_exception(seed.error))[-4000:], len(members))
    return time.perf_counter() - start


def _trade_together(
    members: list[_Member], market: Any, k: int, device: torch.device, *, alone: bool
) -> dict[str, tuple[PolicyRun, PolicyRun]]:
    """Window ``k``'s traded days of ``members`` (`trade_windows`; each from the portfolios its window k - 1 left);
    when that fails, each cell on its own (`trade_window`), where an error fails that cell alone. A group of one
    cell (``alone``) trades through `trade_window` (the single network's code: bit for bit its backtest); the
    survivor of a batch whose other cells failed still trades through `trade_windows`, as the batch did."""
    befores = [
        (m.policy_runs[k - 1], m.untrained_runs[k - 1]) if k else None for m in members
    ]  # a cell whose window k was traded already holds k + 1 records
    if alone:
        return {members[0].cell.name: trade_window(members[0].cfg, market, members[0].window(k), device, befores[0])}
    try:
        runs = trade_windows([m.cfg for m in members], market, [m.window(k) for m in members], device, befores)
        return {m.cell.name: run for m, run in zip(members, runs, strict=True)}
    except StoppedBySignal:
        raise
    except Exception:  # one cell's checkpoint, say: find it, and let the others trade
        out = {}
        for m, before in zip(members, befores, strict=True):
            with _alone(m):
                out[m.cell.name] = trade_window(m.cfg, market, m.window(k), device, before)
        return out


def run_batch_guarded(
    study_dir: Path,
    cells: list[Cell],
    device: torch.device | str = "cpu",
    *,
    callbacks: dict[str, list[Callback]] | None = None,
) -> int:
    """`run_batch` with each cell's status kept in its status.json: running, then done, failed (with the error), or
    interrupted; a cell of a batch of several names them all (``batch``).

    :return: exit status for the group's process: 0 all done, 1 some failed, 128 + signal when stopped.
    """
    started = time.time()
    folders = {c.name: study_dir / "cells" / c.name for c in cells}
    batch = {"batch": [c.name for c in cells]} if len(cells) > 1 else {}
    for cell in cells:
        write_status(folders[cell.name], "running", started=started, pid=os.getpid(), **batch)
    try:
        results = run_batch(study_dir, cells, device, started, callbacks=callbacks)
    except StoppedBySignal as stop:
        _settle_unfinished(folders, "interrupted", started=started, stopped=time.time())
        return 128 + stop.signum
    except Exception as err:  # outside any one cell: the group's unfinished cells fail
        _settle_unfinished(
            folders,
            "failed",
            started=started,
            finished=time.time(),
            error=describe_exception(err, 500) + _smaller_batches_hint(err, len(cells)),
            traceback=traceback.format_exc()[-4000:],
        )
        return 1
    for name, result in results.items():
        if isinstance(result, BaseException):
            continue  # its failed status was written when it failed
        write_status(
            folders[name],
            "done",
            started=started,
            finished=time.time(),
            seconds=time.time() - started,
            train_seconds=float(sum(result["train_seconds"])),
            **batch,
        )
    return 1 if any(isinstance(r, BaseException) for r in results.values()) else 0


def _smaller_batches_hint(err: BaseException, cells: int) -> str:
    """What to do when a batch of ``cells`` ran out of memory together (nothing for other errors, or one cell)."""
    if not isinstance(err, torch.OutOfMemoryError) or cells < 2:
        return ""
    return (
        f" (a batch of {cells} cells: run the study again with --batch_cells {cells // 2} or fewer; finished cells "
        f"are kept and these continue from their last checkpoints)"
    )


def _settle_unfinished(folders: dict[str, Path], status: str, **extra: Any) -> None:
    """Write ``status`` for each cell whose status.json does not already say done or failed."""
    for folder in folders.values():
        if read_status(folder)["status"] not in ("done", "failed"):
            write_status(folder, status, **extra)
