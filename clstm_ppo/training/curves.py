"""A training run's curves from RUN_DIR/metrics.jsonl to one PNG (what `clstm-ppo plot` draws): ten panels against
the global step (env steps across all ranks), from the two kinds of rows `clstm_ppo.training.run_log` lists (other
kinds are ignored). Episode panels show each episode as a dot and a rolling mean as a line.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clstm_ppo.training.run_folder import METRICS_FILE
from envs.errors import UserError


@dataclass
class TrainingLog:
    """Rows of a metrics.jsonl, each kind sorted by global step (a resumed run may repeat steps)."""

    path: Path
    episodes: list[dict[str, Any]] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # malformed lines

    def series(self, kind: str, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(global_step [K] float64, value [K] float64)`` of one field; NaN where a row lacks it."""
        rows = self.episodes if kind == "episode" else self.updates
        x = np.array([r["global_step"] for r in rows], dtype=np.float64)
        y = np.array([_number(r.get(key)) for r in rows], dtype=np.float64)
        return x, y


def _number(v: Any) -> float:
    """A logged value as a float; a per-stock list (e.g. action_mean) as its mean over stocks; NaN otherwise."""
    if isinstance(v, list) and v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        return float(np.mean(v))
    if isinstance(v, bool) or not isinstance(v, int | float):
        return math.nan
    return float(v)


def load_training_log(run_dir: str | Path) -> TrainingLog:
    """Read RUN_DIR/metrics.jsonl (or a metrics file given directly).

    A line that is not a JSON object, or an episode or update row without a numeric ``global_step``, is malformed:
    skipped and counted, with one ``UserWarning`` giving the count (a run killed mid-write leaves a truncated line).

    :raises UserError: the folder or file is missing, or it holds no episode or update row.
    """
    path = Path(run_dir)
    if not path.exists():
        raise UserError(f"run folder {path} does not exist")
    if not path.is_file():
        path = path / METRICS_FILE
        if not path.is_file():
            raise UserError(f"no {METRICS_FILE} in {path.parent} (is it a run folder written by `clstm-ppo train`?)")
    log = TrainingLog(path=path)
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            kind = row.get("kind") if isinstance(row, dict) else None
            if kind in ("episode", "update") and not math.isnan(_number(row.get("global_step"))):
                (log.episodes if kind == "episode" else log.updates).append(row)
            elif kind is None or kind in ("episode", "update"):  # rows of other kinds are ignored
                log.skipped += 1
    if log.skipped:
        warnings.warn(f"skipped {log.skipped} malformed line(s) in {path}", UserWarning, stacklevel=2)
    if not log.episodes and not log.updates:
        raise UserError(f"{path} has no episode or update rows yet")
    # stable: rows re-written after a resume stay in file order within a step
    log.episodes.sort(key=lambda r: r["global_step"])
    log.updates.sort(key=lambda r: r["global_step"])
    return log


def rolling_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` finite points (shorter at the start)."""
    ok = np.isfinite(y)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    n = np.concatenate([[0], np.cumsum(ok)])
    i = np.arange(1, y.size + 1)
    lo = np.maximum(i - window, 0)
    cnt = n[i] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[i] - c[lo]) / np.maximum(cnt, 1), np.nan)


def plot_training(log: TrainingLog, out_path: str | Path, *, title: str | None = None, smooth: int = 0) -> Path:
    """Draw the ten training panels of ``log`` into a PNG at ``out_path`` (folders created).

    :param smooth: rolling-mean window for episode panels, in episodes (0: about 1/20 of the episodes).
    :returns: the path written. Agg canvas: no display needed, no global pyplot state touched.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, FuncFormatter

    fig = Figure(figsize=(13, 15), dpi=100, layout="constrained")
    axes = fig.subplots(5, 2, sharex=True)
    n_ep = len(log.episodes)
    window = smooth if smooth > 0 else max(1, n_ep // 20)

    def no_data(ax: Any, what: str) -> None:
        ax.text(0.5, 0.5, f"no {what} rows yet", ha="center", va="center", transform=ax.transAxes, color="gray")

    def episodes(ax: Any, key: str, label: str) -> tuple[np.ndarray, np.ndarray] | None:
        ax.set_title(label)
        if not n_ep:
            no_data(ax, "episode")
            return None
        x, y = log.series("episode", key)
        ax.scatter(x, y, s=6, alpha=0.35, color="tab:blue", lw=0, label="episode")
        ax.plot(x, rolling_mean(y, window), color="tab:blue", lw=1.8, label=f"mean of last {window}")
        ax.legend(loc="best", fontsize=8)
        return x, y

    def updates(ax: Any, keys: Sequence[tuple[str, str]], label: str, *, twin: bool = False) -> None:
        ax.set_title(label)
        if not log.updates:
            no_data(ax, "update")
            return
        targets = [ax] + [ax.twinx()] * (len(keys) - 1) if twin else [ax] * len(keys)  # twin: the rest on the right
        handles = []
        for (key, name), target, color in zip(keys, targets, ["tab:red", "tab:green", "tab:purple"], strict=False):
            x, y = log.series("update", key)
            (h,) = target.plot(x, y, color=color, lw=1.4, label=name)
            handles.append(h)
            if twin:
                target.set_ylabel(
                    " / ".join(n for (_k, n), t in zip(keys, targets, strict=True) if t is target), color=color
                )
        ax.legend(handles=handles, loc="best", fontsize=8)

    episodes(axes[0, 0], "reward", "episode reward (scaled)")
    got = episodes(axes[0, 1], "final_value", "final portfolio value")
    if got is not None:
        axes[0, 1].yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"${v:,.0f}"))
        # the initial capital, recovered from final / (1 + return): the break-even line
        _, ret = log.series("episode", "return")
        start = got[1] / (1.0 + ret)
        if np.isfinite(start).any():
            axes[0, 1].axhline(float(np.nanmedian(start)), color="gray", ls="--", lw=1, label="initial value")
            axes[0, 1].legend(loc="best", fontsize=8)
    updates(axes[1, 0], [("policy_loss", "policy loss"), ("value_loss", "value loss")], "losses", twin=True)
    updates(axes[1, 1], [("entropy", "entropy"), ("approx_kl", "approx KL")], "entropy / approx KL", twin=True)
    updates(
        axes[2, 0],
        [("clip_fraction", "clip fraction"), ("explained_variance", "explained variance")],
        "clip fraction / explained variance",
    )
    updates(
        axes[2, 1],
        [("advantage_std", "advantage std (raw)"), ("return_std", "return std")],
        "scales of advantages and value targets",
        twin=True,
    )
    updates(
        axes[3, 0],
        [
            ("exposure", "exposure (in stock)"),
            ("clipped_fraction", "actions clipped at +-1"),
            ("refused_buy_fraction", "buys refused for cash"),
        ],
        "what the policy does (fractions)",
    )
    updates(
        axes[3, 1],
        [
            ("action_mean", "mean action (avg over stocks)"),
            ("action_std", "sampled action std"),
            ("policy_std", "policy std"),
        ],
        "actions",
    )
    updates(axes[4, 0], [("steps_per_second", "steps/s")], "throughput (env steps/s, all ranks)")
    updates(axes[4, 1], [("lr_clstm", "lr stage 1"), ("lr_actor_critic", "lr actor-critic")], "learning rates")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[4]:
        ax.set_xlabel("global step")
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    fig.suptitle(title or f"{log.path.parent.name}: {n_ep} episodes, {len(log.updates)} updates", fontsize=13)
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
