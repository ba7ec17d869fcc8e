"""The actor-critic interface every policy family implements, and what rebuilds one from a checkpoint.

Shapes: B environments, L consecutive trading days (L = 1 in a rollout step, n_steps in an update), T window days,
F state numbers per day, N tickers, A numbers per action (`ModelSpec.action_dim`). Observations arrive as dense
windows ``[L, B, T, F]`` or as `Windows` (distinct rows + row numbers, what the rollout buffer keeps).

`ModelSpec` rebuilds a network (stored in checkpoints); `RecurrentState` is stage 2's LSTM state; `Policy` is the
interface (``initial_state``, ``evaluate``, ``act``, ``value``) and `ActorCritic` what every family shares: the Gaussian
over actions with a state-independent learned log-std, the observation normaliser and the two parameter groups. A family
gives ``forward_cells``: L days of B envs -> action means ``[L, B, A]``, values ``[L, B]`` and the new state. The
families are `clstm_ppo.agent.clstm`, `lstm`, `mlp` and `shared`; `clstm_ppo.agent.build` makes the one a spec names.

``obs_norm`` (``--norm_obs``) standardises every state number with a running mean and variance over the training
rollouts, as SB3's VecNormalize does. The statistics are float64 buffers (``obs_count``, ``obs_mean [F]``,
``obs_var [F]``), part of the weights, so evaluation, backtest and trade apply the ones training ended with.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.distributions import Normal

from clstm_ppo.agent.moments import merge_moments
from clstm_ppo.agent.net import Net
from clstm_ppo.agent.spec import ModelSpec, RecurrentState
from clstm_ppo.agent.window_lstm import window_last_output
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import ACTION_DISTS, POLICIES

LOG_STD_MIN = -5.0  # lower bound of a bounded log-std
OBS_CLIP = 10.0  # normalised state numbers are clipped to +-this (obs_norm)
OBS_EPS = 1e-8  # variance floor of the observation normaliser


def gaussian(mean: Tensor, std: Tensor) -> Normal:
    """The policy's Gaussian over ``[..., A]`` actions, built without torch.distributions' argument checks: each
    check is a ``bool(tensor)``, a host synchronisation on a GPU (8 per rollout step and 5 per minibatch, measured),
    and the std is ``exp`` of the learned log-std, so the checks could only fail on NaN weights, which the update's
    non-finite-gradient skip already keeps out."""
    return Normal(mean, std, validate_args=False)


def bounded_std(log_std: Tensor, log_std_max: float | None) -> Tensor:
    """The Gaussian's standard deviation from its learned log-std (any shape, e.g. ``[A]``, or ``[K, A]`` for K
    stacked cells) as float32, the log-std clamped to [`LOG_STD_MIN`, ``log_std_max``] when a bound is set."""
    log_std = log_std.float()
    if log_std_max is not None:
        log_std = log_std.clamp(LOG_STD_MIN, log_std_max)
    return log_std.exp()


def log_prob(dist: Normal, u: Tensor, action_dist: str) -> Tensor:
    """log pi of pre-squash samples ``u [..., A]`` under ``dist``, summed over the action numbers. For ``tanh``, the
    change of variables a = tanh(u) subtracts sum log(1 - tanh(u)^2) = sum 2 (log 2 - u - softplus(-2u)) (stable
    form); it is the same for the old and the new policy, so PPO's ratio is the Gaussian's."""
    out = dist.log_prob(u).sum(-1)
    if action_dist == "tanh":
        out = out - (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)
    return out


def normalized_rows(rows: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """State rows ``[..., F]`` standardised by running statistics (float64 ``mean`` and ``var`` broadcastable to
    the rows: ``[F]``, or ``[K, 1, F]`` for K stacked cells) and clipped to +-`OBS_CLIP`."""
    scale = (var + OBS_EPS).rsqrt().to(rows.dtype)
    return ((rows - mean.to(rows.dtype)) * scale).clamp(-OBS_CLIP, OBS_CLIP)


class PolicyOutput(NamedTuple):
    """What `ActorCritic.evaluate` computes for L days of B envs (float32)."""

    log_prob: Tensor  # [L, B] log pi of the scored actions, summed over the A action numbers
    entropy: Tensor  # [L, B]
    value: Tensor  # [L, B]
    mean: Tensor  # [L, B, A] the Gaussian's mean (before any tanh)
    state: RecurrentState  # after day L-1


class ActOutput(NamedTuple):
    """One rollout step of `ActorCritic.act` for B envs."""

    action: Tensor  # [B, A] the Gaussian sample u before any squashing (what PPO scores; `env_action` maps it)
    log_prob: Tensor  # [B]
    value: Tensor  # [B]
    state: RecurrentState


# ------------------------------------------------------------------------------ K >= 1 networks' columns
def to_cells(t: Tensor, cells: int) -> Tensor:
    """``[L, K x M, ...]`` (cell-major columns) -> ``[K, L x M, ...]`` (each network's rows step-major)."""
    steps, cols = t.shape[:2]
    return t.reshape(steps, cells, cols // cells, *t.shape[2:]).transpose(0, 1).reshape(cells, -1, *t.shape[2:])


def from_cells(t: Tensor, steps: int) -> Tensor:
    """The inverse of `to_cells`: ``[K, L x M, ...]`` -> ``[L, K x M, ...]``."""
    cells, rows = t.shape[:2]
    return t.reshape(cells, steps, rows // steps, *t.shape[2:]).transpose(0, 1).reshape(steps, -1, *t.shape[2:])


def score(mean: Tensor, std: Tensor, actions: Tensor | None, action_dist: str) -> tuple[Tensor, Tensor]:
    """log pi and the entropy ``[L, E]`` of actions ``[L, E, A]`` (None: the means) under K networks' Gaussians.

    :param mean: ``[L, E, A]`` float32, E = K x M columns (cell-major); :param std: ``[K, A]`` (or ``[K, 1]``, one
        number for every ticker) each network's standard deviation.
    For ``tanh`` the entropy, which has no closed form, is the sample estimate ``-log pi`` at the scored actions.
    """
    steps, envs, width = mean.shape
    cells = std.shape[0]
    by_cell = mean.view(steps, cells, envs // cells, width)  # [L, K, M, A]
    dist = gaussian(by_cell, std.view(1, cells, 1, -1).expand_as(by_cell))
    scored = by_cell if actions is None else actions.float().view_as(by_cell)
    lp = log_prob(dist, scored, action_dist)
    entropy = -lp if action_dist == "tanh" else dist.entropy().sum(-1)
    return lp.view(steps, envs), entropy.view(steps, envs)


def sample(
    mean: Tensor, std: Tensor, generators: list[torch.Generator | None], action_dist: str
) -> tuple[Tensor, Tensor]:
    """Gaussian samples ``u [E, A]`` (before any squashing) around ``mean [E, A]`` and their log pi ``[E]``: network
    k's M columns drawn from ``generators[k]`` on its own device (a CPU generator gives the same noise whatever
    device the network is on; None: torch's global generator on the means' device)."""
    envs, width = mean.shape
    cells = len(generators)
    per = envs // cells
    noise = torch.cat(
        [
            torch.randn((per, width), device=mean.device if g is None else g.device, generator=g, dtype=mean.dtype)
            for g in generators
        ]
    )
    by_cell = mean.view(cells, per, width)
    std = std.view(cells, 1, -1)  # [K, 1, A]
    action = by_cell + std * noise.to(mean.device, mean.dtype).view_as(by_cell)
    lp = log_prob(gaussian(by_cell, std.expand_as(by_cell)), action, action_dist)
    return action.view(envs, width), lp.view(envs)


class Policy:
    """The interface of a policy network (``initial_state``, ``evaluate``, ``act``, ``value``, ``env_action``),
    written once for K >= 1 networks of one family: `ActorCritic` is K = 1, `clstm_ppo.agent.stacked.CellPolicy`
    K seeds stacked, their E = K x M env columns cell-major. What differs is what gives the means and values
    (``_means_and_values``: the family's forward, `ActorCritic.forward_cells`, on each one's kernels), each
    network's standard deviation (``std``) and observation normaliser (``normalize``)."""

    spec: ModelSpec
    cells: int = 1  # K

    def std(self) -> Tensor:
        """Each network's standard deviation per action number ``[K, A]`` (``[K, 1]`` for ``shared``), float32."""
        raise NotImplementedError

    def normalize(self, windows: Windows) -> Windows:
        raise NotImplementedError

    def _means_and_values(
        self, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """L days of E columns -> action means ``[L, E, A]``, values ``[L, E]`` and the state after day L-1."""
        raise NotImplementedError

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        """Zero recurrent state for ``batch_size`` env columns (zero width without recurrence across days)."""
        return RecurrentState.zeros(batch_size, self.spec.recurrent_width, device)

    def evaluate(
        self,
        obs: Tensor | Windows,
        state: RecurrentState,
        starts: Tensor,
        actions: Tensor | None = None,
        host_starts: Tensor | None = None,
    ) -> PolicyOutput:
        """Score L days of E env columns.

        :param obs: ``[L, E, T, F]`` float observations, or the same as `Windows`.
        :param state: recurrent state before day 0 (see `initial_state`).
        :param starts: ``[L, E]`` bool episode-start flags (the state is zeroed before such a day).
        :param actions: ``[L, E, A]`` actions to score; None scores the mean.
        :param host_starts: optional CPU copy of ``starts`` (where to cut the sequence, found without a device sync).
        :return: a `PolicyOutput`.
        """
        windows = self.normalize(obs if isinstance(obs, Windows) else Windows.from_dense(obs))
        mean, value, state = self._means_and_values(windows, state, starts, host_starts)
        mean = mean.float()
        lp, entropy = score(mean, self.std(), actions, self.spec.action_dist)
        return PolicyOutput(lp, entropy, value.float(), mean, state)

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        state: RecurrentState,
        starts: Tensor,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        generators: list[torch.Generator] | None = None,
    ) -> ActOutput:
        """One rollout step for E env columns.

        :param obs: ``[E, T, F]``; :param starts: ``[E]`` bool.
        :return: an `ActOutput`: the Gaussian sample ``u`` before any squashing (what the rollout stores and PPO
            scores; `env_action` turns it into the env's action), its log-probability, the value and the new state.
            ``deterministic`` returns the mean. Network k's noise comes from ``generators[k]`` (K = 1: or
            ``generator``) on its own device (training passes ones on the model's device, the backtest a CPU one so
            sampled backtests match across devices).
        """
        out = self.evaluate(obs.unsqueeze(0), state, starts.unsqueeze(0))
        mean, value = out.mean[0], out.value[0]
        if deterministic:
            return ActOutput(mean, out.log_prob[0], value, out.state)
        action, lp = sample(mean, self.std(), generators or [generator], self.spec.action_dist)
        return ActOutput(action, lp, value, out.state)

    @torch.no_grad()
    def value(self, obs: Tensor, state: RecurrentState, starts: Tensor) -> Tensor:
        """Value ``[E]`` of observations ``[E, T, F]`` from ``state`` (used to bootstrap)."""
        return self.evaluate(obs.unsqueeze(0), state, starts.unsqueeze(0)).value[0]

    def env_action(self, u: Tensor) -> Tensor:
        """What the env receives for a policy sample (or mean) ``u [E, A]``: ``tanh(u)`` for the tanh distribution,
        ``u`` itself for the Gaussian (the env clips it to [-1, 1])."""
        return torch.tanh(u) if self.spec.action_dist == "tanh" else u


# --------------------------------------------------------------------------------------- one network
class ActorCritic(nn.Module, Policy):
    """A recurrent Gaussian actor-critic over windowed market observations, one network (K = 1 of `Policy`): what
    every policy family shares (see the module docstring). A family builds its layers in ``__init__`` (then calls
    `_finish`) and gives `forward_cells` (its forward, written once for K >= 1 networks through the kernels a
    `clstm_ppo.agent.net.Net` offers) and `stage1_parameters`. As a `Net` of one it offers its own layers
    (``layers``), its window LSTMs (``window_summary``, for the families that have one) and stage-2 LSTMs
    (``stage2``, for the families recurrent across days), on torch's kernels."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.policy not in POLICIES:
            raise ValueError(f"unknown policy family {spec.policy!r}")
        if spec.action_dist not in ACTION_DISTS:
            raise ValueError(f"unknown action distribution {spec.action_dist!r}")
        self.spec = spec
        # how the window LSTMs (clstm's stage 1, shared's tickers) run: auto | shared | fused; not part of the weights
        self.window_kernel = "auto"

    def _finish(self, log_std_width: int) -> None:
        """The parts every family has, registered after its own layers (parameter order is initialisation order):
        the log-std ``[log_std_width]`` and, with ``obs_norm``, the observation statistics."""
        spec = self.spec
        self.log_std = nn.Parameter(torch.full((log_std_width,), float(spec.init_log_std)))
        if spec.obs_norm:
            f64 = torch.float64
            self.register_buffer("obs_count", torch.zeros((), dtype=f64))
            self.register_buffer("obs_mean", torch.zeros(spec.num_features, dtype=f64))
            self.register_buffer("obs_var", torch.ones(spec.num_features, dtype=f64))

    # ------------------------------------------------------------------ what a family gives
    @classmethod
    def forward_cells(
        cls, net: Net, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """The family's forward for the K >= 1 networks ``net`` (this network, or a `CellPolicy` of K): L days of
        E = K x M columns -> action means ``[L, E, A]``, values ``[L, E]`` and the state after day L-1. It reads the
        weights only through the `Net`'s members (``net.cells``, ``net.layers(name, x [K, R, in])``, and the
        family's ``net.window_summary`` / ``net.stage2``), so the arithmetic exists once whatever K."""
        raise NotImplementedError

    def stage1_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``learning_rate_clstm`` (stage 1: what reads one observation)."""
        raise NotImplementedError

    def stage2_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``learning_rate_actor_critic``: everything not in stage 1."""
        stage1 = {id(p) for p in self.stage1_parameters()}
        return [p for p in self.parameters() if id(p) not in stage1]

    # ------------------------------------------------------------------ K = 1 of the interface
    def _means_and_values(
        self, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        return type(self).forward_cells(self, windows, state, starts, host_starts)

    def layers(self, name: str, x: Tensor) -> Tensor:
        """The module ``name`` on ``x [1, R, in]`` (a `Net`'s layer of one network: torch's own)."""
        return self.get_submodule(name)(x)

    def window_summary(self, windows: Windows, name: str = "window_lstm") -> Tensor:
        """The window LSTM ``name`` of this network (K = 1) through ``window_kernel``: ``[1, L x E, H]``."""
        return window_last_output(self.get_submodule(name), windows, self.window_kernel).unsqueeze(0)

    def stage2(
        self, feats: Tensor, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """Stage 2's LSTMs across days of this network (`Net.stage2`, K = 1): only the families recurrent across
        days have them (`clstm_ppo.agent.lstm.LSTMPolicy`, which overrides this); the others' forwards never ask."""
        raise NotImplementedError(f"{type(self).__name__} has no stage-2 LSTMs across days")

    def forward(self, *args: Any, **kwargs: Any) -> PolicyOutput:
        """`evaluate` (the loss forward, which goes through the DDP wrapper when distributed)."""
        return self.evaluate(*args, **kwargs)

    def std(self) -> Tensor:
        """The Gaussian's standard deviation per action number ``[1, A]`` (``[1, 1]``: one shared number for
        ``shared``) float32, bounded when ``log_std_max`` is set."""
        return bounded_std(self.log_std, self.spec.log_std_max).unsqueeze(0)

    # ------------------------------------------------------------------ observation statistics
    @torch.no_grad()
    def update_obs_stats(self, sums: Tensor) -> None:
        """Merge one batch of state rows into the running statistics (`merge_moments`).

        :param sums: ``[2F + 1]`` float64: the batch's row count, then per state number the sum and the sum of
            squares (all workers' rollouts added up, so every rank merges the same numbers).
        """
        stats = (self.obs_count, self.obs_mean, self.obs_var)
        for stat, merged in zip(stats, merge_moments(*stats, sums), strict=True):
            stat.copy_(merged)

    def normalize(self, windows: Windows) -> Windows:
        """The windows with every state number standardised by the running statistics and clipped to +-10
        (``obs_norm``; before any statistics: mean 0, variance 1)."""
        if not self.spec.obs_norm:
            return windows
        return Windows(normalized_rows(windows.rows, self.obs_mean, self.obs_var), windows.index)
