"""Backtest saved checkpoints: `backtest` (one checkpoint, one period, a report folder) and `compare` (several
checkpoints on one period). The commands `clstm-ppo backtest` and `clstm-ppo compare` (`clstm_ppo.cli.backtest`)
are their flags.

How a backtest is put together (the same code paths as training, so nothing is re-implemented):

1. The checkpoint's config names the data (``data``, ``tickers``, ``start``, ``end`` and the Alpaca bar
   settings), loaded by the training's own loader (`clstm_ppo.market.load_data`); ``data`` swaps the
   source. Its market spec supplies the normalisation statistics and turbulence threshold fitted on
   the training split (`clstm_ppo.training.checkpoint.restore_market`): nothing is refitted on backtest data.
   The data must hold exactly the checkpoint's tickers (extra tickers are dropped only when the run
   itself selected tickers with ``--tickers``), otherwise one `UserError` names the difference.
2. The period is the checkpoint's test split (``--split`` picks another), mapped onto the data by date;
   ``--start``/``--end`` give a custom period instead, whose first observation looks back
   ``window - 1`` trading days before ``--start`` -- those days must be in the data.
3. The policy is rebuilt from the stored model config and weights and run through the period by
   `clstm_ppo.agent.evaluate.evaluate_policy` (the training env, recurrent state carried day to day):
   the mean action by default, or ``--episodes K`` sampled runs with ``--stochastic`` (seeded).
4. `clstm_ppo.evaluation.report` turns the day-by-day record into report.json, equity.csv, trades.csv and
   equity.png, with equal-weight buy-and-hold (same costs, same capital) as the baseline.

With ``--stochastic`` the report files describe the episode with the median cumulative return, and
report.json gains a ``"stochastic"`` section: the seed, every episode's metrics and the mean / std /
min / max of each metric over the episodes; equity_episodes.csv holds every episode's value series.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from clstm_ppo.agent.evaluate import PolicyRun, evaluate_policy
from clstm_ppo.agent.model import ActorCritic
from clstm_ppo.evaluation import metrics as M
from clstm_ppo.evaluation.report import (
    METRIC_ROWS,
    BacktestResult,
    Report,
    format_metric,
    jsonable,
    write_comparison,
    write_report,
)
from clstm_ppo.market import env_config, is_alpaca, load_data
from clstm_ppo.training.checkpoint import Checkpoint, open_checkpoint, restore_market, restore_policy
from envs.data import DayRange, MarketData
from envs.errors import UserError, first_line, shown_list
from envs.features import PreparedMarket

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
    ck: Checkpoint, *, data: str | None = None, start: str | None = None, end: str | None = None
) -> MarketData:
    """The market data to backtest ``ck`` on: its own source (or ``data``) through `clstm_ppo.market.load_data`
    with the run's own settings (Alpaca timeframe, adjustment, feed, cache), its tickers checked.

    The checkpoint's first date is kept so indicators and turbulence warm up exactly as in training;
    ``end`` (the period's last day) replaces the checkpoint's. With ``data`` (another source) the
    checkpoint's dates do not apply: the whole source is read up to ``end``. Alpaca needs explicit
    dates, so a ``start`` before the checkpoint's first date is fetched with room for the lookback.
    """
    cfg = ck.cfg
    source = data or cfg.data
    alpaca = is_alpaca(source)
    load_start: str | None = None if data and not alpaca else (cfg.start or None)
    if start and (load_start is None or pd.Timestamp(start) < pd.Timestamp(load_start)):
        # Trading days are ~5/7 of calendar days; the margin covers holidays. Non-Alpaca sources read all.
        margin = dt.timedelta(days=int(ck.window * 1.6) + 14)
        load_start = (pd.Timestamp(start) - margin).strftime("%Y-%m-%d") if alpaca else None
    load_end = end or (None if data and not alpaca else (cfg.end or None))
    market_data = load_data(
        cfg, data=source, start=load_start or "", end=load_end or "", tickers=ck.tickers, every_ticker=True
    )
    return match_tickers(market_data, ck.tickers, selected=bool(cfg.ticker_list), what=str(ck.path), source=source)


def match_tickers(data: MarketData, want: list[str], *, selected: bool, what: str, source: str) -> MarketData:
    """``data`` restricted to ``want`` in its order; UserError naming missing (and unexpected) tickers.

    :param selected: the run picked ``want`` out of a larger universe (``--tickers``), so other
        tickers in the data are expected and dropped; otherwise they mean a different universe.
    """
    have = [str(t) for t in data.tickers]
    missing = [t for t in want if t not in have]
    extra = [t for t in have if t not in want]
    if missing or (extra and not selected):
        parts = []
        if missing:
            parts.append(f"missing {shown_list(missing, 8)}")
        if extra and not selected:
            parts.append(f"unexpected {shown_list(extra, 8)}")
        raise UserError(
            f"data {source!r} does not hold the tickers {what} was trained on: {'; '.join(parts)} "
            f"(it trades {len(want)}: {shown_list(want, 8)})"
        )
    return data if have == want else data.select_tickers(want)


# -------------------------------------------------------------------------------------------- period


@dataclass(frozen=True)
class Period:
    """The days a backtest covers: ``days`` indexes the market data; ``label`` names output folders."""

    days: DayRange
    label: str  # "test" | "validation" | "train" | "YYYY-MM-DD_YYYY-MM-DD"
    source: str  # how it was chosen, for the report: "test split" or "--start/--end"


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
    data = market.data
    dates = np.asarray(data.dates).astype("datetime64[D]")
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
    lo = int(np.searchsorted(dates, _date(start, "--start"), side="left")) if start else lookback
    hi = int(np.searchsorted(dates, _date(end, "--end"), side="right")) if end else len(dates)
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
    days = DayRange(lo, hi)
    return Period(days=days, label=f"{_iso(dates[lo])}_{_iso(dates[hi - 1])}", source="--start/--end")


def _date(text: str, flag: str) -> np.datetime64:
    try:
        return np.datetime64(pd.Timestamp(text).date(), "D")
    except (ValueError, TypeError):
        raise UserError(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None


# ----------------------------------------------------------------------------------------------- runs


def run_policy(
    ck: Checkpoint,
    model: ActorCritic,
    market: PreparedMarket,
    period: Period,
    device: torch.device,
    *,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
) -> PolicyRun:
    """One pass of the policy over ``period`` with the run's env settings (full period, fixed start)."""
    return evaluate_policy(
        model,
        market,
        period.days,
        env_config(ck.cfg, full_episodes=True),
        device=device,
        deterministic=deterministic,
        generator=generator,
    )


def result_of(
    ck: Checkpoint, run: PolicyRun, *, metadata: dict[str, Any], index_values: np.ndarray | None = None
) -> BacktestResult:
    cfg = ck.cfg
    return BacktestResult.from_run(
        run,
        initial_amount=cfg.initial_amount,
        buy_cost_pct=cfg.buy_cost_pct,
        sell_cost_pct=cfg.sell_cost_pct,
        metadata=metadata,
        index_values=index_values,
    )


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
    header = ["metric", "mean", "std", "min", "max"]
    rows = []
    for key, stats in summary.items():
        label, kind = METRIC_ROWS.get(key, (key, "float"))
        rows.append([label, *[format_metric(stats[s], kind) for s in header[1:]]])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join([r[0].ljust(widths[0]), *[c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]])
        for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ backtests


def _metadata(ck: Checkpoint, market: PreparedMarket, period: Period, source: str) -> dict[str, Any]:
    counters = ck.counters if isinstance(ck.counters, dict) else {}
    return {
        "checkpoint": str(ck.path),
        "run_name": getattr(ck.cfg, "run_name", None),
        "policy": ck.policy,
        "data": source,
        "period_source": period.source,
        "tickers": list(market.data.tickers),
        "window": market.window,
        "turbulence_threshold": market.turbulence_threshold,
        "initial_amount": ck.cfg.initial_amount,
        "buy_cost_pct": ck.cfg.buy_cost_pct,
        "sell_cost_pct": ck.cfg.sell_cost_pct,
        "hmax": ck.cfg.hmax,
        "trained": {k: counters.get(k) for k in ("episodes", "global_step", "update") if k in counters},
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


def backtest(
    checkpoint: str | Path,
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
    risk_free: float = 0.0,
    device: torch.device | str = "cpu",
) -> Backtest:
    """Run one checkpoint over one period and write its report folder (see the module docstring).

    :param episodes: with ``stochastic``, sampled episodes to run; the one with the median cumulative return
        stands for them in the report files, and report.json gains a "stochastic" section.
    :param out: report folder (default: ``backtest-<checkpoint>-<period>`` next to the checkpoint).
    """
    if episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {episodes}")
    if episodes > 1 and not stochastic:
        raise UserError("--episodes > 1 needs --stochastic (the deterministic policy gives the same run every time)")
    ck = open_checkpoint(checkpoint)
    market = restore_market(ck, load_backtest_data(ck, data=data, start=start, end=end))
    period = resolve_period(market, split=split, start=start, end=end, spec_splits=ck.market_spec.get("splits"))
    model = restore_policy(ck, market, device)
    metadata = _metadata(ck, market, period, data or ck.cfg.data)
    dates = np.asarray(market.data.dates)[period.days.start : period.days.stop]
    index_values = read_index(index, dates) if index else None
    folder = Path(out) if out else ck.path.parent / f"backtest-{ck.path.stem}-{period.label}"
    summary: dict[str, Any] | None = None
    if not stochastic:
        metadata["mode"] = "deterministic (mean action)"
        run = run_policy(ck, model, market, period, device)
    else:
        generator = torch.Generator().manual_seed(seed)  # CPU: the same draws on --device cpu and cuda
        runs = [
            run_policy(ck, model, market, period, device, deterministic=False, generator=generator)
            for _ in range(episodes)
        ]
        rows = [
            {"episode": k + 1, **M.summarize(r.values, trades=pd.DataFrame(result_of(ck, r, metadata={}).trades))}
            for k, r in enumerate(runs)
        ]
        # The median episode by cumulative return stands for the distribution in the report files.
        order = np.argsort([row["cumulative_return"] for row in rows], kind="stable")
        median = int(order[(len(order) - 1) // 2])
        run = runs[median]
        metadata["mode"] = f"stochastic: {episodes} sampled episode(s), seed {seed}"
        metadata["episode_shown"] = median + 1
        summary = {
            "episodes": episodes,
            "seed": seed,
            "episode_shown": median + 1,
            "summary": _episode_summary(rows),
            "runs": rows,
        }
    report = write_report(result_of(ck, run, metadata=metadata, index_values=index_values), folder, risk_free=risk_free)
    if summary is not None:
        path = report.paths["report"]
        payload = json.loads(path.read_text(encoding="utf-8"))
        payload["stochastic"] = jsonable(summary)
        payload["files"]["episodes"] = "equity_episodes.csv"
        path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        frame = pd.DataFrame({"date": pd.to_datetime(dates).strftime("%Y-%m-%d")})
        for k, r in enumerate(runs):
            frame[f"episode_{k + 1}"] = r.values
        frame.to_csv(folder / "equity_episodes.csv", index=False)
    return Backtest(
        checkpoint=ck,
        period=period,
        dates=dates,
        num_tickers=len(market.data.tickers),
        mode=metadata["mode"],
        report=report,
        stochastic=summary,
    )


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
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return unique


@dataclass
class Comparison:
    """What `compare` produced."""

    num_checkpoints: int
    num_tickers: int
    period: Period
    dates: np.ndarray  # [D]
    report: Report


def compare(
    checkpoints: list[str | Path],
    *,
    labels: str | None = None,
    data: str | None = None,
    split: str = "test",
    start: str | None = None,
    end: str | None = None,
    out: str | Path | None = None,
    risk_free: float = 0.0,
    device: torch.device | str = "cpu",
) -> Comparison:
    """Several checkpoints of one universe, deterministic, on one period (the first one's data and split)."""
    cks = [open_checkpoint(p) for p in checkpoints]
    names = comparison_labels([c.path for c in cks], labels)
    first = cks[0]
    for ck in cks[1:]:
        if ck.tickers != first.tickers:
            missing = [t for t in first.tickers if t not in ck.tickers]
            extra = [t for t in ck.tickers if t not in first.tickers]
            what = (
                "; ".join(
                    p
                    for p in (
                        f"missing {shown_list(missing, 8)}" if missing else "",
                        f"extra {shown_list(extra, 8)}" if extra else "",
                    )
                    if p
                )
                or "same names, other order"
            )
            raise UserError(f"{ck.path} trades other tickers than {first.path}: {what}; compare needs one universe")
        if ck.cfg.initial_amount != first.cfg.initial_amount:
            raise UserError(
                f"{ck.path} starts with ${ck.cfg.initial_amount:,.0f}, {first.path} with "
                f"${first.cfg.initial_amount:,.0f}; compare needs the same capital"
            )
    # Longest lookback of all checkpoints, so every policy's first observation is real data.
    widest = max(cks, key=lambda c: c.window)
    market_data = load_backtest_data(first, data=data, start=start, end=end)
    market0 = restore_market(first, market_data)
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
    curves: dict[str, np.ndarray] = {}
    trades: dict[str, Any] = {}
    baseline = None
    runs_meta = []
    for ck, label in zip(cks, names, strict=True):
        market = market0 if ck is first else restore_market(ck, market_data)
        run = run_policy(ck, restore_policy(ck, market, device), market, period, device)
        res = result_of(ck, run, metadata={})
        curves[label], trades[label] = res.values, res.trades
        if baseline is None:
            baseline = res
        runs_meta.append(
            {
                "label": label,
                "checkpoint": str(ck.path),
                "policy": ck.policy,
                "buy_cost_pct": ck.cfg.buy_cost_pct,
                "sell_cost_pct": ck.cfg.sell_cost_pct,
            }
        )
    assert baseline is not None
    curves["buy-and-hold"], trades["buy-and-hold"] = baseline.baseline_values, baseline.baseline_trades
    dates = np.asarray(market_data.dates)[period.days.start : period.days.stop]
    folder = Path(out) if out else first.path.parent / f"compare-{period.label}"
    metadata = {
        "checkpoints": runs_meta,
        "data": data or first.cfg.data,
        "period_source": period.source,
        "tickers": first.tickers,
        "mode": "deterministic (mean action)",
        "baseline": f"equal-weight buy-and-hold with {names[0]}'s costs",
    }
    report = write_comparison(
        dates,
        curves,
        folder,
        trades=trades,
        metadata=metadata,
        risk_free=risk_free,
        title=f"{len(cks)} checkpoint(s) vs buy-and-hold: {_iso(dates[0])} .. {_iso(dates[-1])}",
    )
    return Comparison(
        num_checkpoints=len(cks), num_tickers=len(first.tickers), period=period, dates=dates, report=report
    )
