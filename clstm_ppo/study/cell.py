"""One cell of a study: a full walk-forward run of one policy, seed and variant, through the real trainer
(`clstm_ppo.study.batch.run_batch` walks it, alone or beside its batch mates). Each window (`clstm_ppo.study.schedule`)
trains, selects its checkpoint (``--deploy``) and trades its days from the portfolio the previous window left, and so
does the untrained network (the seed's initial weights); stitched, they are the cell's out-of-sample record.

A cell's folder (``cells/<name>/``)::

    status.json          running | done | failed | interrupted, the error, timings
    periods/<k>/         the trainer's run folder of window k (checkpoints, metrics.jsonl, config.json)
    periods/<k>/trade.npz  what window k's model did on its days (and the untrained network)
    result.npz           the stitched record: values, cash, holdings value, the untrained network's values
    result.json          the cell's metrics (policy and untrained) and timings
    report/              the backtest report of the stitched record (report.json, equity.csv, trades.csv, equity.png)

Every file is written when its step finishes, so a killed cell restarts where it stopped: finished windows are
read back, an interrupted training resumes from its latest.pt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clstm_ppo.agent.build import build_model
from clstm_ppo.agent.ensemble import Ensemble
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_cells, evaluate_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.config import TrainConfig
from clstm_ppo.evaluation.metrics import trades_from_holdings
from clstm_ppo.evaluation.report import BacktestResult, write_report
from clstm_ppo.migrate import traded_record
from clstm_ppo.study.analysis import curve_metrics
from clstm_ppo.study.grid import Cell
from clstm_ppo.study.markets import load_markets, market_key
from clstm_ppo.study.spec import StudySpec
from clstm_ppo.threads import torch_threads
from clstm_ppo.training.checkpoint import keep_weights_only, load_checkpoint, restore_policy
from clstm_ppo.training.run_folder import BEST, LATEST, deployed_checkpoint
from envs.config import EnvConfig
from envs.execution import Terms
from envs.features import PreparedMarket

RECORD_FIELDS = ("values", "cash", "holdings", "prices", "costs", "fill_prices", "fill_dates")


def period_dir(cell_dir: Path, k: int) -> Path:
    """Window k's run folder in a cell's folder (the layout above)."""
    return cell_dir / "periods" / f"{k:03d}"


def write_status(folder: Path, status: str, **extra: Any) -> None:
    """``folder/status.json`` (written whole: a reader never sees half a status)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".status.json.tmp"
    tmp.write_text(json.dumps({"status": status, **extra}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / "status.json")


def read_status(folder: Path) -> dict[str, Any]:
    """The cell's status (``{"status": "new"}`` when it never started)."""
    path = folder / "status.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"status": "new"}


def save_run(path: Path, policy: PolicyRun, untrained: PolicyRun, train_seconds: float) -> None:
    """A window's (or an ensemble's) record as ``path`` (.npz, written whole)."""
    arrays = {
        f"{who}_{f}": _stored(getattr(run, f))
        for who, run in (("policy", policy), ("untrained", untrained))
        for f in RECORD_FIELDS
    }
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, dates=policy.dates.astype("datetime64[ns]").astype(np.int64), train_seconds=train_seconds, **arrays)
    os.replace(tmp, path)


def _stored(array: np.ndarray) -> np.ndarray:
    """An array as the .npz keeps it (dates as int64 nanoseconds: no pickled objects)."""
    return array.astype("datetime64[ns]").astype(np.int64) if np.issubdtype(array.dtype, np.datetime64) else array


def load_run(path: Path, tickers: tuple[str, ...]) -> tuple[PolicyRun, PolicyRun, float]:
    """What `save_run` wrote: the policy's record, the untrained network's and the training seconds."""
    with np.load(path, allow_pickle=False) as z:
        dates = z["dates"].astype("datetime64[ns]")
        runs = []
        for who in ("policy", "untrained"):
            fields = traded_record({f: z[f"{who}_{f}"] for f in RECORD_FIELDS if f"{who}_{f}" in z}, dates)
            fields["fill_dates"] = fields["fill_dates"].astype("datetime64[ns]")
            runs.append(PolicyRun(dates=dates, tickers=tickers, **fields))
        return runs[0], runs[1], float(z["train_seconds"])


def stitch(runs: list[PolicyRun]) -> PolicyRun:
    """One record from consecutive periods' records (each period's first day is the previous one's last)."""
    parts = {f: [getattr(runs[0], f)] + [getattr(r, f)[1:] for r in runs[1:]] for f in ("dates", *RECORD_FIELDS)}
    return PolicyRun(tickers=runs[0].tickers, **{f: np.concatenate(v) for f, v in parts.items()})


def _portfolio(run: PolicyRun) -> tuple[float, np.ndarray]:
    return float(run.cash[-1]), run.holdings[-1].copy()


def period_config(cfg: TrainConfig, spec: StudySpec, pdir: Path, k: int, previous: Path | None) -> TrainConfig:
    """Window ``k``'s training settings of a cell whose settings are ``cfg``: its run folder ``pdir``, quiet, its
    episodes, the warm start from the previous window's selected checkpoint, and resuming an interrupted training
    from its latest.pt."""
    warm = k > 0 and spec.retrain_from == "warm" and previous is not None
    return cfg.with_settings(
        run_name=pdir.name,
        checkpoint_dir=str(pdir.parent),
        progress=False,
        tensorboard=False,
        track="none",
        log_every=1 << 30,
        num_episodes=cfg.ppo.num_episodes if k == 0 else spec.retrain_episodes or cfg.ppo.num_episodes,
        init_weights=str(previous) if warm else "",
        resume="latest" if (pdir / LATEST).is_file() else "",
    )


def keep_traded_weights(folder: Path) -> None:
    """A traded window's checkpoints (``folder``'s latest.pt and best.pt) without what only resuming their training
    reads (`clstm_ppo.training.checkpoint.keep_weights_only`): the study never trains a traded window again. Called
    before its record (trade.npz, which marks it traded) is saved; a run killed between the two trades the window
    again from the kept weights."""
    for name in (LATEST, BEST):
        if (folder / name).is_file():
            keep_weights_only(folder / name)


def trained(cfg: TrainConfig, folder: Path) -> bool:
    """Whether the window in ``folder`` trained to the end (before an interruption hit its trading step)."""
    latest = folder / LATEST
    return latest.is_file() and load_checkpoint(latest).counters.get("episodes", 0) >= cfg.ppo.num_episodes


def selected(folder: Path, market: PreparedMarket, cfg: TrainConfig) -> Path:
    """The window's checkpoint under ``--deploy`` (`clstm_ppo.training.run_folder.deployed_checkpoint`)."""
    return deployed_checkpoint(folder, market.splits.validation is not None, cfg.run.deploy)


def deployed_network(cfg: TrainConfig, market: PreparedMarket, pdir: Path, device: torch.device | str) -> ActorCritic:
    """The network window ``pdir`` trades: its checkpoint that ``--deploy`` selects (`selected`), restored."""
    return restore_policy(load_checkpoint(selected(pdir, market, cfg)), market, device)


def untrained_network(cfg: TrainConfig, market: PreparedMarket, device: torch.device | str) -> ActorCritic:
    """The cell's untrained network: the initial weights its trainer draws (after ``torch.manual_seed(seed)``)."""
    torch.manual_seed(cfg.run.seed)
    return build_model(cfg, market).to(device)


def trade_window(
    cfg: TrainConfig,
    market: PreparedMarket,
    pdir: Path,
    device: torch.device,
    before: tuple[PolicyRun, PolicyRun] | None,
) -> tuple[PolicyRun, PolicyRun]:
    """Window ``pdir``'s traded days: its selected checkpoint, and the untrained network (the seed's initial
    weights), each from the portfolio its previous window (``before``: policy's, untrained's) left."""
    starts = [_portfolio(b) for b in before] if before else [None, None]

    def trade(network: ActorCritic, start: tuple[float, np.ndarray] | None) -> PolicyRun:
        return evaluate_policy(network, market, market.splits.test, cfg.env, device=device, start_portfolio=start)

    policy = trade(deployed_network(cfg, market, pdir, device), starts[0])  # before untrained_network reseeds torch
    return policy, trade(untrained_network(cfg, market, device), starts[1])


def trade_windows(
    cfgs: list[TrainConfig],
    market: PreparedMarket,
    pdirs: list[Path],
    device: torch.device,
    befores: list[tuple[PolicyRun, PolicyRun] | None],
) -> list[tuple[PolicyRun, PolicyRun]]:
    """`trade_window` of the cells of one batch (settings ``cfgs``, window folders ``pdirs``) at once, as one stacked
    network (`clstm_ppo.agent.evaluate.evaluate_cells`; `clstm_ppo.study.batch` says what its records are); the
    batch's composition and order fix their last bits, so a batch trades alike on a re-run."""
    trained_nets = [deployed_network(c, market, p, device) for c, p in zip(cfgs, pdirs, strict=True)]
    untrained_nets = [untrained_network(c, market, device) for c in cfgs]
    starts = [_portfolio(b[0]) if b else None for b in befores] + [_portfolio(b[1]) if b else None for b in befores]
    runs = evaluate_cells(
        trained_nets + untrained_nets, market, market.splits.test, cfgs[0].env, device=device, start_portfolios=starts
    )
    return list(zip(runs[: len(cfgs)], runs[len(cfgs) :], strict=True))


def traded_terms(markets: list[PreparedMarket], cfg: TrainConfig) -> Terms:
    """The fills, dividends and interest of a study's traded days: every window's test split, first to last."""
    return Terms.of(markets[0].data, cfg.env.execution, cfg.env.risk_free).days(
        markets[0].splits.test.start, markets[-1].splits.test.stop
    )


def walk_windows(
    markets: list[PreparedMarket], env: EnvConfig, acting: Callable[[int, PreparedMarket], Any]
) -> PolicyRun:
    """``acting(k, market)`` (a policy on the CPU) traded on each window k's days through ``env``, the portfolio
    carried from window to window as a cell's is; the windows stitched into one record."""
    runs: list[PolicyRun] = []
    for k, market in enumerate(markets):
        policy, start = acting(k, market), _portfolio(runs[-1]) if runs else None
        runs.append(evaluate_policy(policy, market, market.splits.test, env, start_portfolio=start))
    return stitch(runs)


def run_ensemble(study_dir: Path, cells: list[Cell]) -> PolicyRun:
    """The ensemble of ``cells`` (the seeds of one configuration, all finished): in each window their checkpoints
    that the study's ``--deploy`` selects act as one (`clstm_ppo.agent.ensemble`; one cell's network alone) on the
    window's traded days (`walk_windows`). Kept in ``ensembles/<digest>.npz``, the digest of the member cells' names
    (12 seeds of a varied configuration outgrow a file name)."""
    spec = StudySpec.load(study_dir)
    cfg = cells[0].config(spec.base_config)
    markets = load_markets(study_dir / "prepared", market_key(cfg))
    path = study_dir / "ensembles" / f"{hashlib.sha256('+'.join(c.name for c in cells).encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        return load_run(path, markets[0].data.tickers)[0]

    def acting(k: int, market: PreparedMarket) -> Any:
        nets = [deployed_network(cfg, market, period_dir(study_dir / "cells" / c.name, k), "cpu") for c in cells]
        return nets[0] if len(nets) == 1 else Ensemble(nets, cfg.env.action_mode)

    with torch_threads(1):  # in the study's own process, beside its cells or other jobs (`torch_threads`)
        run = walk_windows(markets, cfg.env, acting)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_run(path, run, run, 0.0)
    return run


def record_metrics(run: PolicyRun, cfg: TrainConfig, benchmark: np.ndarray) -> dict[str, float]:
    trades = trades_from_holdings(
        run.fill_dates[1:],
        run.tickers,
        run.holdings[1:],
        run.fill_prices[1:],
        buy_cost_pct=cfg.env.buy_cost_pct,
        sell_cost_pct=cfg.env.sell_cost_pct,
        initial_holdings=run.holdings[0],
    )
    return curve_metrics(run.values, run.holdings_value, benchmark, trades=trades, risk_free=cfg.env.risk_free)


LAST_EPISODES = 20  # training episodes whose costs describe where training ended


def training_diagnostics(periods: Path) -> dict[str, float]:
    """How the cell's training ended, from its windows' metrics.jsonl (means over the windows): the last update's
    approx KL and clip fraction (what CleanRL/SB3 runs that learn well keep near 0.01-0.02 and 0.1-0.2), and the
    transaction costs of a training episode (dollars, the last `LAST_EPISODES`), which the policy's own exploration
    noise pays. Empty when no window logged an update.

    A window interrupted and resumed (or trained again) logs the updates after its last checkpoint again: each update
    and episode counts once, as it was last logged, so the figures are those of an uninterrupted run."""
    kl, clip, costs = [], [], []
    for path in sorted(periods.glob("*/metrics.jsonl")):
        last: dict[str, dict[int, dict[str, Any]]] = {"update": {}, "episode": {}}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:  # a blank line, or one a killed process cut short (its run, resumed, logged that update again)
                row = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("kind") in last:
                last[row["kind"]][int(row[row["kind"]])] = row
        updates = [last["update"][n] for n in sorted(last["update"])]
        episodes = [last["episode"][n] for n in sorted(last["episode"])]
        if updates:
            kl.append(float(updates[-1]["approx_kl"]))
            clip.append(float(updates[-1]["clip_fraction"]))
        if episodes:
            costs.append(float(np.mean([e["costs"] for e in episodes[-LAST_EPISODES:]])))
    out = {}
    if kl:
        out.update(final_kl=float(np.mean(kl)), final_clip_fraction=float(np.mean(clip)))
    if costs:
        out["train_episode_costs"] = float(np.mean(costs))
    return out


def finish_cell(
    study_dir: Path,
    cell: Cell,
    cfg: TrainConfig,
    policy: PolicyRun,
    untrained: PolicyRun,
    train_seconds: list[float],
    terms: Terms,
) -> dict[str, Any]:
    """Write the cell's stitched record, its metrics and its backtest report; return result.json's content.

    :param terms: the traded days' fills, dividends and interest (the baseline trades on them too).
    """
    folder = study_dir / "cells" / cell.name
    result = BacktestResult.from_run(policy, cfg.env, terms, metadata={"cell": cell.to_dict()})
    write_report(
        result,
        folder / "report",
        risk_free=cfg.env.risk_free,
        title=f"study cell {cell.name}: out-of-sample walk-forward vs buy-and-hold",
    )
    benchmark = np.asarray(result.baseline_values)
    payload = {
        "cell": cell.to_dict(),
        "policy": record_metrics(policy, cfg, benchmark),
        "untrained": record_metrics(untrained, cfg, benchmark),
        "train_seconds": train_seconds,
        "num_days": int(len(policy.values)),
        "training": training_diagnostics(folder / "periods"),
    }
    np.savez(
        folder / "result.npz",
        values=policy.values,
        cash=policy.cash,
        holdings_value=policy.holdings_value,
        untrained_values=untrained.values,
        untrained_holdings_value=untrained.holdings_value,
    )
    (folder / "result.json").write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return payload
