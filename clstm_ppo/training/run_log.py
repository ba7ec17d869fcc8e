"""Rank 0's record of a run: metrics.jsonl, TensorBoard scalars (and the same to a ``--track`` tracker), the
progress bar and the console lines.

metrics.jsonl holds one JSON object per line, of two kinds (`clstm-ppo plot` draws them):

    {"kind": "episode", "episode", "global_step", "rank", <EPISODE_KEYS: reward, final_value, return, trades,
     sharpe, max_drawdown, length, costs, exposure>, "time"}
    {"kind": "update", "update", "global_step", <UpdateStats fields>, <RolloutStats fields>, "lr_clstm",
     "lr_actor_critic", "steps_per_second", "rollout_seconds", "update_seconds", "time"}

Only rank 0 creates a `RunLog`; other ranks print nothing but errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from clstm_ppo.training.run_folder import METRICS_FILE
from envs.errors import UserError
from envs.vector_env import EPISODE_KEYS

if TYPE_CHECKING:
    from clstm_ppo.training.tracking import WandbTracker

TENSORBOARD_DIR = "tensorboard"
SCALAR_EPISODE_KEYS = ("reward", "final_value", "return", "sharpe", "max_drawdown", "trades", "exposure")
"""The episode fields drawn as scalars (``episode/<key>`` against the episode number)."""


class RunLog:
    """Appends a run's records to ``run_dir/metrics.jsonl`` (and TensorBoard), prints its console lines.

    :param run_dir: the run folder (exists).
    :param num_episodes: the run's episode budget (progress bar total, last logged episode).
    :param log_every: print a console line every this many finished episodes.
    :param episodes_done: episodes already finished (a resumed run's progress bar starts there).
    :param tracker: where the scalars go besides TensorBoard (`clstm_ppo.training.tracking.open_tracker`);
        closed with the log.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        num_episodes: int,
        log_every: int,
        episodes_done: int = 0,
        tensorboard: bool = False,
        progress: bool = True,
        tracker: WandbTracker | None = None,
        tag: str = "[Rank 0]",
    ) -> None:
        self.tag = tag  # the console lines' prefix: [Rank 0], or [seed s] for one seed of a batch
        self.num_episodes, self.log_every = num_episodes, max(1, log_every)
        self.file: TextIO | None = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UserError("--tensorboard needs the tensorboard package: pip install tensorboard") from None
            self.tb = SummaryWriter(str(run_dir / TENSORBOARD_DIR))
        self.tracker = tracker
        self.bar = None
        if progress and sys.stdout.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=num_episodes, initial=min(episodes_done, num_episodes), unit="ep", dynamic_ncols=True)
        self.recent_returns: list[float] = []  # returns of the last 100 training episodes

    def line(self, text: str) -> None:
        """One console line (above the progress bar when there is one)."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def record_update(
        self,
        rows: torch.Tensor,
        *,
        first_episode: int,
        global_step: int,
        update: dict[str, Any],
        sps: float,
        time: float,
    ) -> None:
        """Log the episodes that finished in one update and the update's statistics.

        :param rows: ``[k, len(EPISODE_KEYS) + 1]`` float64: each finished episode's `EPISODE_KEYS`, then its rank.
        :param first_episode: episodes finished before these (over all ranks).
        :param update: the update's record (counters, losses, rollout statistics, learning rates, timings).
        :param sps: env steps per second of this update, all ranks together.
        """
        lines = []
        for i, row in enumerate(rows.tolist()):
            episode = first_episode + i + 1
            record = {
                "kind": "episode",
                "episode": episode,
                "global_step": global_step,
                "rank": int(row[-1]),
                **dict(zip(EPISODE_KEYS, row[:-1], strict=True)),
                "time": time,
            }
            record["length"] = int(record["length"])
            lines.append(json.dumps(record))
            self.recent_returns = (self.recent_returns + [record["return"]])[-100:]
            self._scalars({f"episode/{key}": record[key] for key in SCALAR_EPISODE_KEYS}, "episode", episode)
            if (episode % self.log_every == 0 and episode <= self.num_episodes) or episode == self.num_episodes:
                self.line(
                    f"{self.tag} Episode {episode}/{self.num_episodes} | reward {record['reward']:.2f} | "
                    f"trades {record['trades']:.0f} | value ${record['final_value']:,.2f} | "
                    f"return {record['return']:+.2%} | exposure {record['exposure']:.0%} | "
                    f"sharpe {record['sharpe']:.2f} | {sps:,.0f} steps/s"
                )
        lines.append(json.dumps({"kind": "update", **update, "steps_per_second": sps, "time": time}))
        numbers = {f"train/{key}": value for key, value in update.items() if isinstance(value, float | int)}
        self._scalars(numbers, "global_step", global_step)
        if self.file is not None:
            self.file.write("\n".join(lines) + "\n")
            self.file.flush()
        if self.bar is not None:
            self.bar.n = min(first_episode + rows.shape[0], self.num_episodes)
            self.bar.set_postfix_str(f"{sps:,.0f} steps/s")
            self.bar.refresh()

    def _scalars(self, values: dict[str, float], step_name: str, step: int) -> None:
        """The same scalars at the same step to TensorBoard and to the tracker (one list, so they cannot differ)."""
        if self.tb is not None:
            for tag, value in values.items():
                self.tb.add_scalar(tag, value, step)
        if self.tracker is not None:
            self.tracker.log(values, step_name, step)

    def mean_recent_return(self) -> float | None:
        """Mean return of the last 100 training episodes (None before any finished)."""
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None

    def close(self) -> None:
        """Close the files and the tracker. Called from the trainer's ``finally``: an exception on its way out
        (other than a stop by signal, which ends a run cleanly and resumably) marks the tracked run failed."""
        if self.tracker is not None:
            from clstm_ppo.training.launch import StoppedBySignal

            err = sys.exc_info()[1]
            self.tracker.close(failed=err is not None and not isinstance(err, StoppedBySignal))
            self.tracker = None
        for name in ("bar", "file", "tb"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
                setattr(self, name, None)
