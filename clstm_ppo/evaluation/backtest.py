"""Backtest saved checkpoints: `backtest` (one checkpoint or ensemble, one period, a report folder) and `compare`
(several checkpoints on one period); `clstm_ppo.cli.backtest` holds their flags, docs/backtesting.md the whole story.

Everything goes through the training's own code: its data loader, the market spec fitted on the training split
(nothing is refitted on backtest data, but with ``new_universe``: then on the new data's days of the checkpoint's
training split), the training env (`clstm_ppo.agent.evaluate.evaluate_policy`), and equal-weight buy-and-hold with
the same costs and capital as the baseline. Days sealed in the trials ledger are refused unless ``unseal``
(`clstm_ppo.evaluation.holdout.guard`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from clstm_ppo.agent.ensemble import Ensemble
from clstm_ppo.agent.evaluate import PolicyRun, evaluate_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.holdout import guard, iso_days, parse_day
from clstm_ppo.evaluation.ledger import Ledger
from clstm_ppo.evaluation.oracle import ReferenceRun, reference_run, reference_words
from clstm_ppo.evaluation.report import (
    BacktestResult,
    Report,
    compare_table,
    summarize_curve,
    write_comparison,
    write_json,
    write_report,
)
from clstm_ppo.evaluation.statistics import BOOTSTRAP_DRAWS, paired_sharpe_difference, sharpe_interval, t_interval
from clstm_ppo.market import is_alpaca, load_data
from clstm_ppo.threads import torch_threads
from clstm_ppo.training.checkpoint import Checkpoint, open_checkpoint, refit_market, restore_market, restore_policy
from clstm_ppo.training.own_market import check_regenerated, own_source
from clstm_ppo.training.seeds import RunPlan, expand_members
from envs.config import TRAINING_ONLY
from envs.data import DayRange, MarketData
from envs.errors import UserError, first_line, shown_list
from envs.execution import Terms, describe_execution, resolve_execution
from envs.features import PreparedMarket
from envs.oracle import planted_rule
from envs.sources import describe_source

SPLITS = ("test", "validation", "train")
# Metrics whose spread over sampled episodes is summarised (and printed) for --stochastic.
EPISODE_METRICS: tuple[str, ...] = (
    "cumulative_return",
    "annual_return",
    "sharpe",
    "sortino",
    "max_drawdown",
    "final_value",
    "num_trades",
    "total_costs",
)


# ------------------------------------------------------------------------------------------- loading


def load_backtest_data(
    ck: Checkpoint,
    *,
    data: str | None = None,
    start: str | None = None,
    end: str | None = None,
    new_universe: bool = False,
) -> MarketData:
    """The market data to backtest ``ck`` on: its own source (or ``data``) with the run's own settings
    (`clstm_ppo.market.load_data`), its tickers checked (with ``new_universe``: all the source's tickers, unchecked;
    Alpaca, which needs the tickers named, is refused).

    The checkpoint's first date is kept so indicators and turbulence warm up exactly as in training; ``end`` (the
    period's last day) replaces the checkpoint's. Another source (``data``) is read whole up to ``end``. Alpaca needs
    explicit dates, so a ``start`` before the checkpoint's first date is fetched with room for the lookback.
    """
    cfg = ck.cfg
    if not data:
        check_regenerated(ck)  # its own synthetic market must still be the one it was trained on
    source = data or own_source(ck)
    alpaca = is_alpaca(source)
    if new_universe and alpaca:
        raise UserError(
            "--new_universe takes its tickers from the data, and the alpaca source needs them named: download the "
            "bars first (clstm-ppo data download --tickers ... --out bars.csv) and pass --data csv:bars.csv"
        )
    load_start: str | None = None if data and not alpaca else (cfg.data.start or None)
    if start and (load_start is None or pd.Timestamp(start) < pd.Timestamp(load_start)):
        # Trading days are ~5/7 of calendar days; the margin covers holidays. Non-Alpaca sources read all.
        margin = dt.timedelta(days=int(ck.window * 1.6) + 14)
        load_start = (pd.Timestamp(start) - margin).strftime("%Y-%m-%d") if alpaca else None
    load_end = end or (None if data and not alpaca else (cfg.data.end or None))
    market_data = load_data(
        cfg.data,
        seed=cfg.run.seed,
        source=source,
        start=load_start or "",
        end=load_end or "",
        tickers=ck.tickers,
        every_ticker=True,
    )
    if new_universe:
        return market_data
    want, have = ck.tickers, [str(t) for t in market_data.tickers]
    missing = [t for t in want if t not in have]
    extra = [] if cfg.data.ticker_list else [t for t in have if t not in want]  # --tickers picked from more
    if missing or extra:
        what = "; ".join(f"{w} {shown_list(n, 8)}" for w, n in (("missing", missing), ("unexpected", extra)) if n)
        hint = "; its policy is shared: `clstm-ppo backtest --new_universe` trades it on the data's own tickers"
        raise UserError(
            f"data {source!r} does not hold the tickers {ck.path} was trained on: {what} "
            f"(it trades {len(want)}: {shown_list(want, 8)}){hint if ck.policy == 'shared' else ''}"
        )
    return market_data if have == want else market_data.select_tickers(want)


# -------------------------------------------------------------------------------------------- period


@dataclass(frozen=True)
class Period:
    """The days a backtest covers: ``days`` indexes the market data; ``label`` names output folders."""

    days: DayRange
    label: str  # "test" | "validation" | "train" | "YYYY-MM-DD_YYYY-MM-DD"
    source: str  # how it was chosen, for the report: "test split" or "--start/--end"


def _day(text: str, flag: str) -> np.datetime64:
    return np.datetime64(parse_day(text, flag).date(), "D")


def _iso(day: Any) -> str:
    return str(np.datetime_as_string(np.datetime64(day, "D"), unit="D"))


def resolve_period(
    market: PreparedMarket,
    *,
    split: str = "test",
    start: str | None = None,
    end: str | None = None,
    spec_splits: dict[str, Any] | None = None,
) -> Period:
    """The backtest period on ``market``: the ``split`` (by the checkpoint's dates) or ``[start, end]``.

    A custom period runs from the first trading day on/after ``start`` (default: the first day with a
    full lookback) to the last on/before ``end`` (default: the data's last day); it needs ``window - 1``
    earlier days in the data for its first observation and at least 2 days (one trade and its result).
    """
    dates = np.asarray(market.data.dates).astype("datetime64[D]")
    lookback = market.window - 1
    if start is None and end is None:
        r = market.splits.as_dict().get(split)
        stored = (spec_splits or {}).get(split)
        if r is None:
            when = f" ({stored['start']} .. {stored['end']})" if isinstance(stored, dict) else ""
            raise UserError(
                f"the data has fewer than 2 days of the checkpoint's {split} split{when} "
                f"({_iso(dates[0])} .. {_iso(dates[-1])} loaded); pass --start/--end for another period"
            )
        return Period(days=r, label=split, source=f"{split} split")
    lo = int(np.searchsorted(dates, _day(start, "--start"), side="left")) if start else lookback
    hi = int(np.searchsorted(dates, _day(end, "--end"), side="right")) if end else len(dates)
    if start and lo < lookback:
        first_ok = _iso(dates[lookback]) if lookback < len(dates) else "none"
        raise UserError(
            f"--start {start}: the window needs {lookback} trading days of lookback before the first day "
            f"and the data has {lo} (it begins {_iso(dates[0])}); the earliest --start is {first_ok}"
        )
    if hi - lo < 2:
        raise UserError(
            f"the period {start or 'start'} .. {end or 'end'} has {max(hi - lo, 0)} trading day(s) in the data "
            f"({_iso(dates[0])} .. {_iso(dates[-1])}); a backtest needs at least 2"
        )
    return Period(days=DayRange(lo, hi), label=f"{_iso(dates[lo])}_{_iso(dates[hi - 1])}", source="--start/--end")


def check_holdout(
    market: PreparedMarket, period: Period, checkpoints: list[Path], *, ledger: Ledger, unseal: bool, command: str
) -> list[dict[str, Any]]:
    """`clstm_ppo.evaluation.holdout.guard` for a backtest (or comparison) of ``checkpoints`` over ``period``: one look
    per set of checkpoint files (sha256 of their bytes) and period, so the same backtest again is not another unseal."""
    days = iso_days(market.data)
    first, last = str(days[period.days.start]), str(days[period.days.stop - 1])
    digests = sorted(hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in checkpoints)
    look, what = ",".join(digests) + f"@{first}..{last}", ", ".join(str(p) for p in checkpoints)
    return guard(ledger, market.data, first, last, unseal=unseal, command=command, look=look, what=what)


# ----------------------------------------------------------------------------------------------- runs


def run_policy(
    ck: Checkpoint,
    model: ActorCritic | Ensemble,
    market: PreparedMarket,
    period: Period,
    device: torch.device | str,
    *,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
) -> PolicyRun:
    """One pass of the policy over ``period`` with the run's env settings (full period, fixed start)."""
    return evaluate_policy(
        model, market, period.days, ck.cfg.env, device=device, deterministic=deterministic, generator=generator
    )


def with_risk_free(ck: Checkpoint, risk_free: float | None) -> Checkpoint:
    """``ck`` with another ``--risk_free`` (cash interest and the excess in Sharpe/Sortino), or as it is."""
    return ck if risk_free is None else dataclasses.replace(ck, config={**ck.config, "risk_free": float(risk_free)})


def result_of(
    ck: Checkpoint,
    run: PolicyRun,
    market: PreparedMarket,
    period: Period,
    *,
    metadata: dict[str, Any],
    index_values: np.ndarray | None = None,
) -> BacktestResult:
    """The backtest result of ``run`` over ``period``, its baseline on the same days and terms."""
    env = ck.cfg.env
    terms = Terms.of(market.data, env.execution, env.risk_free).days(period.days.start, period.days.stop)
    return BacktestResult.from_run(run, env, terms, metadata=metadata, index_values=index_values)


def read_index(path: str | Path, dates: np.ndarray) -> np.ndarray:
    """``[D] float64`` index levels on ``dates`` from a CSV with columns date, value.

    A trading day missing from the file takes the latest earlier level (holidays differ between
    markets); a period day before the file's first date is an error, as is a non-positive level.
    """
    path = Path(path)
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"--index: file not found: {path}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserError(f"--index {path}: not a readable CSV ({first_line(err)})") from None
    cols = {str(c).strip().lower(): c for c in frame.columns}
    if "date" not in cols or "value" not in cols:
        raise UserError(f"--index {path}: needs columns date,value; it has {', '.join(map(str, frame.columns))}")
    try:
        when = pd.to_datetime(frame[cols["date"]]).dt.normalize()
        level = pd.to_numeric(frame[cols["value"]]).astype("float64")
    except (ValueError, TypeError) as err:
        raise UserError(f"--index {path}: unreadable date or value ({err})") from None
    series = pd.Series(level.to_numpy(), index=pd.DatetimeIndex(when)).sort_index()
    series = series[~series.index.duplicated(keep="last")]
    want = pd.DatetimeIndex(pd.to_datetime(np.asarray(dates))).normalize()
    aligned = series.reindex(series.index.union(want)).ffill().reindex(want)
    if aligned.isna().any():
        raise UserError(f"--index {path}: no level on or before {want[aligned.isna().to_numpy()][0].date()}")
    values = aligned.to_numpy(dtype=np.float64)
    if not (np.isfinite(values) & (values > 0)).all():
        raise UserError(f"--index {path}: levels must be finite and positive")
    return values


def _episode_summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for key in EPISODE_METRICS:
        x = np.array([r[key] for r in rows], dtype=np.float64)
        out[key] = {
            "mean": float(x.mean()),
            "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "min": float(x.min()),
            "max": float(x.max()),
        }
    return out


def distribution_table(summary: dict[str, dict[str, float]]) -> str:
    """Console table of `_episode_summary`: one row per metric, columns mean / std / min / max."""
    stats = ("mean", "std", "min", "max")
    return compare_table({s: {key: row[s] for key, row in summary.items()} for s in stats}, keys=list(summary))


# ------------------------------------------------------------------------------------------ backtests


def _metadata(ck: Checkpoint, market: PreparedMarket, period: Period, source: str) -> dict[str, Any]:
    counters = ck.counters if isinstance(ck.counters, dict) else {}
    return {
        "checkpoint": str(ck.path),
        "run_name": ck.cfg.run.run_name or None,
        "policy": ck.policy,
        "data": source,
        "period_source": period.source,
        "tickers": list(market.data.tickers),
        "window": market.window,
        "turbulence_threshold": market.turbulence_threshold,
        "initial_amount": ck.cfg.env.initial_amount,
        "buy_cost_pct": ck.cfg.env.buy_cost_pct,
        "sell_cost_pct": ck.cfg.env.sell_cost_pct,
        "hmax": ck.cfg.env.hmax,
        "execution": resolve_execution(ck.cfg.env.execution, market.data),
        "trained": {k: counters.get(k) for k in ("episodes", "global_step", "update") if k in counters},
    }


def new_universe_metadata(ck: Checkpoint, market: PreparedMarket) -> dict[str, Any]:
    """report.json's record of a backtest on another universe: its tickers, the checkpoint's, and the days the
    normalisation and turbulence threshold were refitted on (`refit_market`)."""
    days, fit = iso_days(market.data), market.splits.train
    return {
        "new_universe": True,
        "tickers": list(market.data.tickers),
        "trained_tickers": ck.tickers,
        "refitted": {
            "what": ["normalisation statistics", "turbulence threshold"],
            "on": "the new data's days of the checkpoint's training split",
            "start": str(days[fit.start]),
            "end": str(days[fit.stop - 1]),
            "days": fit.num_days,
        },
    }


@dataclass
class Backtest:
    """What `backtest` produced: the report files and what the console shows."""

    checkpoint: Checkpoint
    period: Period
    dates: np.ndarray  # [D] the period's trading days
    num_tickers: int
    mode: str  # "deterministic (mean action)" or "stochastic: ..."
    report: Report
    stochastic: dict[str, Any] | None  # seed, episodes, per-episode metrics and their summary
    holdout: list[dict[str, Any]] = field(default_factory=list)  # sealed days traded with --unseal (holdout_summary)
    new_universe: dict[str, Any] | None = None  # with --new_universe: `new_universe_metadata`
    oracle: str | None = None  # on a planted synthetic market: `reference_words` (the reference trader, same days)


def open_members(paths: list[str | Path]) -> list[Checkpoint]:
    """The checkpoints of an ensemble (one or more; a folder of seeds stands for its seeds' deployed checkpoints,
    `clstm_ppo.training.seeds.seed_members`), checked to act on one market the same way: the same tickers, market
    spec (window, state, normalisation, threshold) and env settings; UserError naming what differs."""
    cks = [open_checkpoint(p) for p in expand_members(paths)]
    first = cks[0]
    for ck in cks[1:]:
        spec_diff = _differing_keys(first.market_spec, ck.market_spec)
        env_diff = first.cfg.env.differences(ck.cfg.env, skip=TRAINING_ONLY)  # how actions trade, what they cost
        if spec_diff or env_diff:
            what = ", ".join([*(f"its market's {k}" for k in spec_diff), *(f"--{k}" for k in env_diff)])
            raise UserError(f"{ck.path} cannot join {first.path} in an ensemble: they differ in {what}")
    return cks


def _differing_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys, sorted, whose values differ between ``a`` and ``b`` (a key one of them lacks is None there)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def restore_acting(
    cks: list[Checkpoint], market: PreparedMarket, device: torch.device | str, *, resize: bool = False
) -> Any:
    """The one policy of ``cks``, or their `Ensemble` when there are several (`open_members`); ``resize``: built for
    ``market``'s tickers (`restore_policy`)."""
    return acting([restore_policy(ck, market, device, resize=resize) for ck in cks], cks[0].cfg.env.action_mode)


def acting(models: list[ActorCritic], action_mode: str) -> Any:
    """The one policy of ``models``, or their `Ensemble` (acting under ``action_mode``) when there are several."""
    return models[0] if len(models) == 1 else Ensemble(models, action_mode)


def _sampled_episodes(
    ck: Checkpoint,
    model: torch.nn.Module,
    market: PreparedMarket,
    period: Period,
    device: torch.device | str,
    *,
    episodes: int,
    seed: int,
) -> tuple[PolicyRun, list[PolicyRun], dict[str, Any]]:
    """``episodes`` runs with sampled actions (seeded on the CPU, so the same draws on cpu and cuda): the median
    episode by cumulative return (it stands for them in the report files), every run, and the "stochastic"
    section of report.json."""
    generator = torch.Generator().manual_seed(seed)
    runs = [
        run_policy(ck, model, market, period, device, deterministic=False, generator=generator) for _ in range(episodes)
    ]
    rows = [
        {
            "episode": k + 1,
            **summarize_curve(r.values, result_of(ck, r, market, period, metadata={}).trades, ck.cfg.env.risk_free),
        }
        for k, r in enumerate(runs)
    ]
    order = np.argsort([row["cumulative_return"] for row in rows], kind="stable")
    median = int(order[(len(order) - 1) // 2])
    summary = {
        "episodes": episodes,
        "seed": seed,
        "episode_shown": median + 1,
        "summary": _episode_summary(rows),
        "runs": rows,
    }
    return runs[median], runs, summary


def backtest(
    checkpoint: str | Path | list[str | Path],
    *,
    data: str | None = None,
    split: str = "test",
    start: str | None = None,
    end: str | None = None,
    out: str | Path | None = None,
    stochastic: bool = False,
    episodes: int = 1,
    seed: int = 0,
    index: str | Path | None = None,
    risk_free: float | None = None,
    device: torch.device | str = "cpu",
    ledger: str | Path | None = None,
    unseal: bool = False,
    new_universe: bool = False,
) -> Backtest:
    """Run one checkpoint (or an ensemble of several: `clstm_ppo.agent.ensemble`) over one period and write its
    report folder (see the module docstring).

    :param episodes: with ``stochastic``, sampled episodes to run; the one with the median cumulative return
        stands for them in the report files, and report.json gains a "stochastic" section.
    :param out: report folder (default: ``backtest-<checkpoint>-<period>`` next to the checkpoint).
    :param risk_free: annual rate that cash earns and Sharpe/Sortino are in excess of (default: the checkpoint's
        ``--risk_free``).
    :param ledger: the trials ledger holding the seals (None: `clstm_ppo.evaluation.ledger.ledger_path`'s default).
    :param unseal: trade sealed days anyway (recorded in the ledger); without it, sealed days are refused.
    :param new_universe: trade a ``shared`` policy on all of the data's tickers, the market refitted on the data's
        training days (module docstring).
    """
    if episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {episodes}")
    if episodes > 1 and not stochastic:
        raise UserError("--episodes > 1 needs --stochastic (the deterministic policy gives the same run every time)")
    paths = list(checkpoint) if isinstance(checkpoint, list | tuple) else [checkpoint]
    if stochastic and len(paths) > 1:
        raise UserError("--stochastic samples one policy's actions; an ensemble acts on its members' mean actions")
    cks = [with_risk_free(c, risk_free) for c in open_members(paths)]
    ck = cks[0]
    risk_free = ck.cfg.env.risk_free
    for c in cks if new_universe else []:  # only a shared policy's weights fit any number of tickers
        if c.policy != "shared":
            raise UserError(
                f"--new_universe needs a --policy shared checkpoint; {c.path} holds a {c.policy} policy, whose "
                f"weights are sized by the {len(c.tickers)} tickers it was trained on"
            )
    market_data = load_backtest_data(ck, data=data, start=start, end=end, new_universe=new_universe)
    market = refit_market(ck, market_data) if new_universe else restore_market(ck, market_data)
    period = resolve_period(market, split=split, start=start, end=end, spec_splits=ck.market_spec.get("splits"))
    holdout = check_holdout(
        market, period, [c.path for c in cks], ledger=Ledger(ledger), unseal=unseal, command="backtest"
    )
    model = restore_acting(cks, market, device, resize=new_universe)
    metadata = _metadata(ck, market, period, data or ck.cfg.data.source)
    universe = new_universe_metadata(ck, market) if new_universe else None
    metadata.update(universe or {})
    if len(cks) > 1:
        metadata["ensemble"] = [str(c.path) for c in cks]
    if holdout:
        metadata["holdout"] = holdout
    reference = None if (data or new_universe) else checkpoint_reference(ck, market, period.days)
    if reference is not None:  # the reference trader of the planted signal on the same days and terms
        metadata["reference"] = {
            "member": reference.member._asdict(),
            **{
                k: getattr(reference.figures, k) for k in ("sharpe", "cumulative_return", "annual_turnover", "exposure")
            },
        }
    dates = np.asarray(market.data.dates)[period.days.start : period.days.stop]
    index_values = read_index(index, dates) if index else None
    stem = ck.path.stem if len(cks) == 1 else f"ensemble{len(cks)}"
    folder = Path(out) if out else ck.path.parent / f"backtest-{stem}-{period.label}"
    summary: dict[str, Any] | None = None
    fills = describe_execution(ck.cfg.env.execution, market.data)
    if not stochastic:
        acting = "deterministic (mean action)" if len(cks) == 1 else f"ensemble of {len(cks)} (mean target)"
        metadata["mode"] = f"{acting}, {fills}"
        run = run_policy(ck, model, market, period, device)
    else:
        run, runs, summary = _sampled_episodes(ck, model, market, period, device, episodes=episodes, seed=seed)
        metadata["mode"] = f"stochastic: {episodes} sampled episode(s), seed {seed}, {fills}"
        metadata["episode_shown"] = summary["episode_shown"]
    report = write_report(
        result_of(ck, run, market, period, metadata=metadata, index_values=index_values), folder, risk_free=risk_free
    )
    if summary is not None:  # report.json's "stochastic" section; equity_episodes.csv: [D] dollars per episode
        payload = json.loads(report.paths["report"].read_text(encoding="utf-8"))
        payload["stochastic"] = summary
        payload["files"]["episodes"] = "equity_episodes.csv"
        write_json(report.paths["report"], payload)
        values = {f"episode_{k + 1}": r.values for k, r in enumerate(runs)}
        pd.DataFrame({"date": pd.to_datetime(dates).strftime("%Y-%m-%d"), **values}).to_csv(
            folder / "equity_episodes.csv", index=False
        )
    return Backtest(
        checkpoint=ck,
        period=period,
        dates=dates,
        num_tickers=len(market.data.tickers),
        mode=metadata["mode"],
        report=report,
        stochastic=summary,
        holdout=holdout,
        new_universe=universe,
        oracle=None if reference is None else reference_words(reference, report.metrics["policy"]["sharpe"]),
    )


def report_held_out(plan: RunPlan, market: PreparedMarket) -> None:
    """The train command's last line: the deployed policy (``--deploy``: best.pt or latest.pt) on the held-out test
    days against buy-and-hold (`held_out_line`); with several seeds, their mean and their ensemble
    (`seeds_held_out_line`), after their manifest ``seeds.json`` (`RunPlan.finish`). On ``--threads`` torch threads,
    one by default: the held-out days are one env's, and a parent after several workers would otherwise take torch's
    default, every core, whose threads spin-wait on a busy box (1.5-4.5 s for a line of 0.2 s)."""
    deployed = plan.finish(market.splits.validation is not None)
    with torch_threads(plan.cfg.system.threads or 1):
        if plan.batch:
            line, prefix = seeds_held_out_line(deployed, market, plan.folder), "[seeds]"
        else:
            line, prefix = held_out_line(deployed[0], market) if deployed[0].is_file() else None, "[Rank 0]"
    if line is not None:
        print(f"{prefix} {line}", flush=True)


def held_out_line(checkpoint: str | Path, market: PreparedMarket, n_boot: int = BOOTSTRAP_DRAWS) -> str | None:
    """One line for the end of a training run: the deterministic policy of ``checkpoint`` on the held-out test split
    of ``market`` (the run's own: nothing is loaded again, no file is written) beside buy-and-hold (and the reference
    trader, on a planted market), its Sharpe's 95% interval over days and the paired difference from ``n_boot``
    draws, and its Sharpe on as many of the last training days (a policy that learned its training path by heart
    shows a far higher one there). None without a test split."""
    test = market.splits.test
    if test is None:
        return None
    ck = open_checkpoint(checkpoint)
    period = Period(days=test, label="test", source="test split")
    model, cpu = restore_policy(ck, market), torch.device("cpu")
    run = run_policy(ck, model, market, period, cpu)
    last = market.splits.train  # its last training days, as many as the test's (the market's own, not a pool's)
    last = DayRange(max(last.start, last.stop - test.num_days), last.stop)
    trained_days = run_policy(ck, model, market, Period(days=last, label="train", source="training split"), cpu)
    on_training_days = M.summarize(trained_days.values, risk_free=ck.cfg.env.risk_free)["sharpe"]
    held = HeldOut.of(ck, run, market, period, n_boot)
    policy, reference = held.policy, checkpoint_reference(ck, market, test)
    return (
        f"{held.where}: {ck.path.name} Sharpe {policy['sharpe']:.2f}{held.interval} (95% over days; {on_training_days:.2f} on its last "
        f"{last.num_days} training days), return {policy['cumulative_return']:+.2%}, exposure {held.exposure:.0%}, turnover {policy['annual_turnover']:.1f}x a "
        f"year | {held.baseline_words} | "
        f"{versus_buy_and_hold(held.diff)}{'' if reference is None else ' | ' + reference_words(reference, policy['sharpe'])} | "
        f"full report: clstm-ppo backtest --checkpoint {ck.path}"
    )


@dataclass
class HeldOut:
    """A policy's run on the held-out days beside buy-and-hold on the same days and terms: what a run's last line
    says of it (`held_out_line`, `seeds_held_out_line`)."""

    where: str  # held-out test FIRST .. LAST (N days) on SOURCE, EXECUTION
    policy: dict[str, Any]  # `metrics.summarize` of the policy's values (with its trades)
    baseline: dict[str, Any]  # the same of buy-and-hold's
    exposure: float  # mean invested share of the portfolio
    interval: str  # " [lo, hi]": the policy's Sharpe, 95% over days ("" with one day)
    diff: dict[str, Any] | None  # the paired Sharpe difference against buy-and-hold (None with one day)

    @classmethod
    def of(cls, ck: Checkpoint, run: PolicyRun, market: PreparedMarket, period: Period, n_boot: int) -> HeldOut:
        rf = ck.cfg.env.risk_free
        result = result_of(ck, run, market, period, metadata={})
        returns, bench = M.excess_returns(result.values, rf), M.excess_returns(result.baseline_values, rf)
        interval = sharpe_interval(returns, n_boot=n_boot) if len(returns) > 1 else None
        return cls(
            where=(
                f"held-out test {_iso(run.dates[0])} .. {_iso(run.dates[-1])} ({len(run.dates)} days) on "
                f"{describe_source(ck.cfg.data.source)}, {describe_execution(ck.cfg.env.execution, market.data)}"
            ),
            policy=M.summarize(result.values, trades=result.trades, risk_free=rf),
            baseline=M.summarize(result.baseline_values, risk_free=rf),
            exposure=float(np.mean(result.holdings_value[1:] / result.values[1:])),
            interval="" if interval is None else f" [{interval['lo']:.2f}, {interval['hi']:.2f}]",
            diff=paired_sharpe_difference(returns[None], bench, n_boot=n_boot) if len(returns) > 1 else None,
        )

    @property
    def baseline_words(self) -> str:
        return f"buy-and-hold Sharpe {self.baseline['sharpe']:.2f}, return {self.baseline['cumulative_return']:+.2%}"


def _alone_sharpe(ck: Checkpoint, model: ActorCritic, market: PreparedMarket, period: Period, rf: float) -> float:
    """The Sharpe ratio (over the risk-free rate ``rf``, a year) of one member's policy ``model`` (on the CPU)
    trading ``period`` alone."""
    run = run_policy(ck, model, market, period, torch.device("cpu"))
    return M.summarize(run.values, risk_free=rf)["sharpe"]


def seeds_held_out_line(
    checkpoints: list[Path], market: PreparedMarket, folder: Path, n_boot: int = BOOTSTRAP_DRAWS
) -> str | None:
    """The last line of a run of several seeds (`clstm_ppo.training.seeds`) on ``market``'s held-out test split: the
    seeds' mean Sharpe with a 95% t-interval over them, then their ensemble (`clstm_ppo.agent.ensemble`) as
    `held_out_line` says one policy (without the training days). None without a test split."""
    test = market.splits.test
    if test is None:
        return None
    cks = open_members(checkpoints)
    models = [restore_policy(c, market) for c in cks]  # each seed's once: alone, then in their ensemble
    ck, cpu, rf = cks[0], torch.device("cpu"), cks[0].cfg.env.risk_free
    period = Period(days=test, label="test", source="test split")
    each = np.array([_alone_sharpe(c, m, market, period, rf) for c, m in zip(cks, models, strict=True)])
    lo, hi, _ = t_interval(each)
    ensemble_run = run_policy(ck, acting(models, ck.cfg.env.action_mode), market, period, cpu)
    held = HeldOut.of(ck, ensemble_run, market, period, n_boot)
    ensemble, reference = held.policy, checkpoint_reference(ck, market, test)
    names = "/".join(sorted({c.path.name for c in cks}))
    return (
        f"{held.where}: {len(cks)} seeds' {names} Sharpe {each.mean():.2f} [{lo:.2f}, "
        f"{hi:.2f}] (mean, 95% over seeds; each {', '.join(f'{x:.2f}' for x in each)}) | their ensemble Sharpe "
        f"{ensemble['sharpe']:.2f}{held.interval} (95% over days), return {ensemble['cumulative_return']:+.2%}, exposure "
        f"{held.exposure:.0%}, turnover {ensemble['annual_turnover']:.1f}x a year | {held.baseline_words} | the ensemble "
        f"{versus_buy_and_hold(held.diff)}{'' if reference is None else ' | ' + reference_words(reference, float(each.mean()))} | "
        f"full report: clstm-ppo backtest --checkpoint {folder}"
    )


def checkpoint_reference(ck: Checkpoint, market: PreparedMarket, days: DayRange) -> ReferenceRun | None:
    """The reference trader of ``ck``'s own synthetic market over ``days`` with its env settings (`reference_run`:
    chosen on the market's training days), or None where the market plants no signal (or the env trades shares,
    which the members do not speak)."""
    rule = planted_rule(own_source(ck))  # with the generator it was trained on
    if rule is None or ck.cfg.env.action_mode != "weights":
        return None
    return reference_run(market, days, ck.cfg.env, rule)


def versus_buy_and_hold(diff: dict[str, Any] | None) -> str:
    """The verdict of a paired Sharpe difference against buy-and-hold, in words, with its 95% interval."""
    if diff is None:
        return "too few days to compare with buy-and-hold"
    gap = f"{diff['difference']:+.2f} [{diff['lo']:+.2f}, {diff['hi']:+.2f}]"
    if diff["lo"] > 0:
        return f"beats buy-and-hold by {gap}"
    if diff["hi"] < 0:
        return f"trails buy-and-hold by {gap}"
    return f"not distinguishable from buy-and-hold ({gap})"


def comparison_labels(paths: list[Path], given: str | None) -> list[str]:
    """One unique label per checkpoint: ``given`` (comma-separated) or ``<run>/<file stem>``."""
    if given:
        labels = [s.strip() for s in given.split(",")]
        if len(labels) != len(paths) or not all(labels):
            raise UserError(f"--labels needs {len(paths)} non-empty comma-separated names, got {given!r}")
    else:
        labels = [f"{p.parent.name}/{p.stem}" if p.parent.name else p.stem for p in paths]
    if "buy-and-hold" in labels:
        raise UserError("'buy-and-hold' is the baseline's label; choose another")
    return [f"{label}#{n + 1}" if (n := labels[:i].count(label)) else label for i, label in enumerate(labels)]


@dataclass
class Comparison:
    """What `compare` produced."""

    num_checkpoints: int
    mode: str  # "deterministic (mean action), orders fill ..."
    num_tickers: int
    period: Period
    dates: np.ndarray  # [D]
    report: Report
    holdout: list[dict[str, Any]] = field(default_factory=list)  # sealed days traded with --unseal (holdout_summary)


def _check_comparable(cks: list[Checkpoint]) -> None:
    """Refuse, in one line, checkpoints that cannot share one table: other tickers, capital, fills or interest
    than the first one's."""
    first = cks[0]
    for ck in cks[1:]:
        if ck.tickers != first.tickers:
            missing = [t for t in first.tickers if t not in ck.tickers]
            extra = [t for t in ck.tickers if t not in first.tickers]
            parts = (("missing", missing), ("extra", extra))
            what = "; ".join(f"{w} {shown_list(n, 8)}" for w, n in parts if n) or "same names, other order"
            raise UserError(f"{ck.path} trades other tickers than {first.path}: {what}; compare needs one universe")
        if ck.cfg.env.initial_amount != first.cfg.env.initial_amount:
            raise UserError(
                f"{ck.path} starts with ${ck.cfg.env.initial_amount:,.0f}, {first.path} with "
                f"${first.cfg.env.initial_amount:,.0f}; compare needs the same capital"
            )
        if ck.cfg.env.execution != first.cfg.env.execution:
            raise UserError(
                f"{ck.path} fills orders with --execution {ck.cfg.env.execution}, {first.path} with "
                f"{first.cfg.env.execution}; compare needs the same fills (one would trade on prices the other cannot)"
            )
        if ck.cfg.env.risk_free != first.cfg.env.risk_free:
            raise UserError(
                f"{ck.path} was trained with --risk_free {ck.cfg.env.risk_free:g}, {first.path} with "
                f"{first.cfg.env.risk_free:g}; pass --risk_free to compare them at one rate"
            )


def _compared_runs(
    groups: list[list[Checkpoint]],
    names: list[str],
    market0: PreparedMarket,
    market_data: MarketData,
    period: Period,
    device: torch.device | str,
) -> tuple[dict[str, np.ndarray], dict[str, Any], list[dict[str, Any]]]:
    """Each entry (a checkpoint or an ensemble) through the period, then buy-and-hold with the first entry's costs
    and fills: ``{label: [D] dollar values}``, ``{label: trades}`` and each entry's metadata."""
    first = groups[0][0]
    curves: dict[str, np.ndarray] = {}
    trades: dict[str, Any] = {}
    baseline = None
    runs_meta = []
    for group, label in zip(groups, names, strict=True):
        ck = group[0]
        market = market0 if ck is first else restore_market(ck, market_data)
        run = run_policy(ck, restore_acting(group, market, device), market, period, device)
        res = result_of(ck, run, market, period, metadata={})
        curves[label], trades[label] = res.values, res.trades
        if baseline is None:
            baseline = res
        runs_meta.append(
            {
                "label": label,
                "checkpoint": "+".join(str(c.path) for c in group),
                "policy": ck.policy,
                "buy_cost_pct": ck.cfg.env.buy_cost_pct,
                "sell_cost_pct": ck.cfg.env.sell_cost_pct,
            }
        )
    assert baseline is not None
    curves["buy-and-hold"], trades["buy-and-hold"] = baseline.baseline_values, baseline.baseline_trades
    return curves, trades, runs_meta


def compare(
    checkpoints: list[str | Path],
    *,
    labels: str | None = None,
    data: str | None = None,
    split: str = "test",
    start: str | None = None,
    end: str | None = None,
    out: str | Path | None = None,
    risk_free: float | None = None,
    device: torch.device | str = "cpu",
    ledger: str | Path | None = None,
    unseal: bool = False,
) -> Comparison:
    """Several checkpoints of one universe, deterministic, on one period (the first one's data and split); cash
    earns ``risk_free`` (default: each checkpoint's own; given, the same for all). ``ledger`` and ``unseal``: as in
    `backtest` (sealed days are refused unless ``unseal``). An entry ``A.pt+B.pt+C.pt`` is an ensemble of those
    checkpoints (`open_members`), compared as one policy; so is a folder of seeds (labelled by its name)."""
    groups = [[with_risk_free(c, risk_free) for c in open_members(str(p).split("+"))] for p in checkpoints]
    cks = [g[0] for g in groups]
    named = [Path(p) if Path(p).is_dir() else c.path for p, c in zip(checkpoints, cks, strict=True)]  # a seeds folder
    names = comparison_labels(named, labels)
    names = [n if len(g) == 1 else f"{n} (ensemble of {len(g)})" for n, g in zip(names, groups, strict=True)]
    first = cks[0]
    _check_comparable(cks)
    market_data = load_backtest_data(first, data=data, start=start, end=end)
    market0 = restore_market(first, market_data)
    widest = max(cks, key=lambda c: c.window)  # the longest lookback: every policy's first observation is real data
    period = resolve_period(
        restore_market(widest, market_data) if widest is not first else market0,
        split=split,
        start=start,
        end=end,
        spec_splits=first.market_spec.get("splits"),
    )
    if start is None and end is None:  # the first checkpoint's split dates, for everyone
        period = dataclasses.replace(period, days=market0.splits.as_dict()[split] or period.days)
        if period.days.start < widest.window - 1:
            raise UserError(
                f"{widest.path} needs {widest.window - 1} lookback days before the period; pass a later --start"
            )
    holdout = check_holdout(
        market0, period, [c.path for g in groups for c in g], ledger=Ledger(ledger), unseal=unseal, command="compare"
    )
    curves, trades, runs_meta = _compared_runs(groups, names, market0, market_data, period, device)
    dates = np.asarray(market_data.dates)[period.days.start : period.days.stop]
    folder = Path(out) if out else first.path.parent / f"compare-{period.label}"
    metadata = {
        "checkpoints": runs_meta,
        "data": data or first.cfg.data.source,
        "period_source": period.source,
        "tickers": first.tickers,
        "mode": f"deterministic (mean action), {describe_execution(first.cfg.env.execution, market_data)}",
        "baseline": f"equal-weight buy-and-hold with {names[0]}'s costs and fills",
        **({"holdout": holdout} if holdout else {}),
    }
    report = write_comparison(
        dates,
        curves,
        folder,
        trades=trades,
        metadata=metadata,
        risk_free=first.cfg.env.risk_free,
        title=f"{len(cks)} checkpoint(s) vs buy-and-hold: {_iso(dates[0])} .. {_iso(dates[-1])}",
    )
    return Comparison(
        num_checkpoints=len(cks),
        mode=metadata["mode"],
        num_tickers=len(first.tickers),
        period=period,
        dates=dates,
        report=report,
        holdout=holdout,
    )
