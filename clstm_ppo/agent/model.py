"""The CLSTM actor-critic (Zou et al. 2022) and its ablation variants, on one code path.

Shapes: B environments, L consecutive trading days (L = 1 in a rollout step, n_steps in an update),
T window days, F state numbers per day, N tickers. Observations arrive as dense windows
``[L, B, T, F]`` or as `Windows` (distinct rows + row numbers, what the rollout buffer keeps).

- ``clstm`` (the paper): stage 1 runs an LSTM(F -> stage1_hidden) over each observation's T-day
  window and maps its last output through two tanh linear layers to ``feature_dim`` features
  (``window_kernel`` picks how the window LSTM is computed: see `clstm_ppo.agent.window_lstm`). With
  ``stage1="conv"`` (``--stage1 conv``) a causal convolution whose kernel spans the window replaces the window LSTM:
  one linear map of the flattened ``[T x F]`` window to stage1_hidden, then tanh, so a fixed lag in the window is
  one weight away instead of T recurrent steps away.
  Stage 2 runs separate actor and critic LSTMs (stage2_hidden, one layer) across days over those
  features. A Gaussian head (state-independent learned log-std) gives actions, a linear head values.
- ``lstm`` (RecurrentPPO in the paper's tables): no window LSTM; the current day's state (the last
  window row) goes through the tanh layers, then the same stage 2.
- ``mlp`` (PPO in the paper's tables): the current day's state through the tanh layers, then
  two-layer tanh MLPs for actor and critic; no recurrent state.

- ``shared``: one encoder for every ticker's window (weights shared across tickers) and a cross-sectional stage, no
  recurrence across days, one log-std: no parameter depends on N (`clstm_ppo.agent.shared` has its shapes).

``skip`` (default on; off in the paper's preset and in checkpoints older than the setting) adds two shortcuts
around the recurrences: stage 1 of ``clstm`` sees the current day's state ``[F]`` next to the window LSTM's
output, and the actor and critic heads of ``clstm``/``lstm`` see the stage-1 features ``[feature_dim]`` next to
the stage-2 LSTM's output. The network can then use today's state as directly as the ``mlp`` does and still
read the window and the past days, instead of having to carry today's numbers through two LSTMs.

``obs_norm`` (``--norm_obs``) standardises every state number with a running mean and variance over the training
rollouts (buffers ``obs_count``, ``obs_mean [F]``, ``obs_var [F]``, float64, updated by `update_obs_stats` after each
update, clipped to +-10 as SB3's VecNormalize does). They are part of the weights, so evaluation, backtest and
trade apply the statistics training ended with, unchanged. Before any statistics (count 0) it only clips at +-10.

``next_day_head`` (built when training with ``--aux_coef`` > 0) is a linear map from the actor's latent (what
``actor_mean`` sees) to tomorrow's price column ``[N]``; the auxiliary loss that fits it lives in
`clstm_ppo.training.ppo` (``next_day_targets``). Acting uses it only with ``forecast_skip`` (``--forecast_skip``):
then each stock's action mean gets ``g x`` the head's prediction for that stock (``g`` = ``forecast_gain``, one
learned number, 0 at the start so the untrained network acts as without it). The prediction is detached there, so
only the next-day loss fits the head and PPO learns how far to follow it. With ``forecaster="linear"``
(``--forecaster linear``) the prediction followed is instead one linear map of the window's price columns
``[T x N] -> [N]`` (``linear_forecast``, zero at the start), fitted by its own next-day loss term (weight 1, with or
without the head and ``--aux_coef``): N x T x N weights that cannot memorise the training days the way the
network's head can (docs/learning.md section 16). With ``forecast_only`` (``--forecast_only``) the stocks' means
are ``g x`` the forecast plus a learned bias per stock (``stock_bias``) alone: the network's part, which adds what
it learned of the training days, is dropped; it keeps the trade gates and the critic. ``forecast_threshold``
(``--forecast_threshold D``) lowers those means by D in deterministic actions only (`ActorCritic.deployed_mean`):
a no-trade threshold for the deployed policy that training's samples never see (section 18).

Recurrent state is a `RecurrentState`: the actor's and the critic's LSTM ``(h, c)``, each ``[1, B, stage2_hidden]``
(zero width for ``mlp``, so every caller selects, clones and stores it the same way). Episode starts reset the
state to zeros before that day is processed. `ActorCritic.forward` returns a `PolicyOutput`, `ActorCritic.act` an
`ActOutput`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.distributions import Normal

from clstm_ppo.agent.layers import orthogonal as _orthogonal
from clstm_ppo.agent.moments import merge_moments
from clstm_ppo.agent.shared import SharedTickerNet
from clstm_ppo.agent.window_lstm import window_last_output
from clstm_ppo.agent.windows import Windows
from clstm_ppo.config import FORECASTERS, LEGACY, POLICIES, ModelConfig, TrainConfig
from envs.config import action_dim
from envs.features import PreparedMarket
from envs.state import StateLayout

ACTION_DISTS = ("gaussian", "tanh")
LOG_STD_MIN = -5.0  # lower bound of a bounded log-std
OBS_CLIP = 10.0  # normalised state numbers are clipped to +-this (obs_norm)
OBS_EPS = 1e-8  # variance floor of the observation normaliser


def gaussian(mean: Tensor, std: Tensor) -> Normal:
    """The policy's Gaussian over ``[..., A]`` actions (A = `ModelSpec.action_dim`), built without torch.distributions'
    argument checks: each check is a ``bool(tensor)``, a host synchronisation on a GPU (8 per rollout step and 5 per
    minibatch, measured), and the std is ``exp`` of the learned log-std, so the checks could only fail on NaN weights,
    which the update's non-finite-gradient skip already keeps out."""
    return Normal(mean, std, validate_args=False)


class RecurrentState(NamedTuple):
    """Stage 2's LSTM state for B envs: the actor's and the critic's ``(h, c)``, each ``[1, B, H]`` float32
    (H = 0 for ``mlp``, which has no recurrence)."""

    actor_h: Tensor
    actor_c: Tensor
    critic_h: Tensor
    critic_c: Tensor

    @classmethod
    def zeros(cls, batch_size: int, hidden: int, device: torch.device | str = "cpu") -> RecurrentState:
        return cls(*(torch.zeros(1, batch_size, hidden, device=device) for _ in range(4)))

    @property
    def actor(self) -> tuple[Tensor, Tensor]:
        return self.actor_h, self.actor_c

    @property
    def critic(self) -> tuple[Tensor, Tensor]:
        return self.critic_h, self.critic_c

    def map(self, fn: Any) -> RecurrentState:
        """``fn`` applied to each of the four tensors (``state.map(Tensor.clone)``, ``state.map(lambda t: t.cpu())``)."""
        return RecurrentState(*(fn(t) for t in self))

    def envs(self, index: Tensor) -> RecurrentState:
        """The state of the envs ``index`` ``[k]`` (int64, or a bool mask ``[B]``)."""
        return self.map(lambda t: t[:, index])


class PolicyOutput(NamedTuple):
    """What `ActorCritic.forward` computes for L days of B envs (float32)."""

    log_prob: Tensor  # [L, B] log pi of the scored actions, summed over tickers
    entropy: Tensor  # [L, B]
    value: Tensor  # [L, B]
    mean: Tensor  # [L, B, A] the Gaussian's mean (before any tanh)
    state: RecurrentState  # after day L-1
    next_day: Tensor | None  # [L, B, N] the next-day head's prediction (``predict_next`` or ``forecast_skip`` only)
    forecast: Tensor | None = None  # [L, B, N] the linear forecaster's prediction (``forecaster="linear"`` only)


class ActOutput(NamedTuple):
    """One rollout step of `ActorCritic.act` for B envs."""

    action: Tensor  # [B, A] the Gaussian sample u before any squashing (what PPO scores; `env_action` maps it)
    log_prob: Tensor  # [B]
    value: Tensor  # [B]
    state: RecurrentState


@dataclass(frozen=True)
class ModelSpec:
    """What is needed to rebuild a policy, stored in checkpoints (``model_config``): the model settings
    (`clstm_ppo.config.ModelConfig`), the market's sizes and the heads training added."""

    policy: str  # clstm | lstm | mlp
    num_features: int  # F, numbers per day's state
    num_tickers: int  # N
    window: int  # T
    stage1: str  # lstm | conv: how clstm's stage 1 reads the window
    stage1_hidden: int
    feature_dim: int
    stage2_hidden: int
    init_log_std: float
    action_dist: str  # gaussian (the env clips samples to [-1, 1]) | tanh (samples squashed by tanh)
    log_std_max: float | None  # upper bound of the policy's log-std (None: unbounded)
    skip: bool  # shortcuts around the LSTMs (module docstring)
    next_day_head: bool  # a linear head predicting tomorrow's price column from the actor's latent (aux loss)
    obs_norm: bool  # running mean / std of each state number (module docstring)
    trade_gate: bool = False  # the env's --trade_gate: N gate actions after the N weight logits
    cross_section: str = "mean"  # mean | attention: how shared's tickers see each other
    forecast_skip: bool = False  # the stocks' action means also get g x the next-day head's (detached) prediction
    forecaster: str = "head"  # head | linear: what forecast_skip follows (module docstring)
    forecast_only: bool = False  # the stocks' means are g x the forecast + a bias per stock, no network part
    forecast_threshold: float = 0.0  # deterministic actions only: the stocks' means lowered by this (forecast_only)
    # deterministic actions only, set at deploy (`--forecast_gain`): the stocks' means first become
    # forecast_scale x (mean - forecast_centre), each stock's [N] usual level taken off (None: as they are)
    forecast_centre: tuple[float, ...] | None = None
    forecast_scale: float = 1.0

    @property
    def action_dim(self) -> int:
        """A: numbers in one action, N (2N with ``trade_gate``)."""
        return action_dim(self.num_tickers, self.trade_gate)

    @classmethod
    def of(
        cls,
        model: ModelConfig,
        *,
        num_features: int,
        num_tickers: int,
        window: int,
        next_day_head: bool = False,
        trade_gate: bool = False,
    ) -> ModelSpec:
        """The network of the settings ``model`` for states of F numbers, N tickers and a T-day window (and N gate
        actions with ``trade_gate``). The forecast settings' defaults resolve for the policy
        (`clstm_ppo.config.ModelConfig.resolved`)."""
        model = model.resolved()
        return cls(
            policy=model.policy,
            num_features=num_features,
            num_tickers=num_tickers,
            window=window,
            stage1=model.stage1,
            stage1_hidden=model.stage1_hidden,
            feature_dim=model.feature_dim,
            stage2_hidden=model.stage2_hidden,
            init_log_std=model.init_log_std,
            action_dist=model.action_dist,
            log_std_max=model.log_std_max if math.isfinite(model.log_std_max) else None,
            skip=model.skip,
            next_day_head=next_day_head,
            obs_norm=model.norm_obs,
            trade_gate=trade_gate,
            cross_section=model.cross_section,
            forecast_skip=model.forecast_skip,
            forecaster=model.forecaster,
            forecast_only=model.forecast_only,
            forecast_threshold=model.forecast_threshold,
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelSpec:
        """From a checkpoint's ``model_config``: fields a newer version added take the meaning older checkpoints
        were trained with (`clstm_ppo.config.LEGACY`), not today's defaults, so old files keep their meaning."""
        legacy = TrainConfig.from_dict(LEGACY)
        sizes = {k: values.get(k, 0) for k in ("num_features", "num_tickers", "window")}
        then = cls.of(legacy.model, **sizes, next_day_head=legacy.ppo.aux_coef > 0)
        spec = {**asdict(then), **values}
        if spec.get("forecast_centre") is not None:  # JSON keeps a list; the frozen spec holds a tuple
            spec["forecast_centre"] = tuple(float(x) for x in spec["forecast_centre"])
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_spec(cfg: TrainConfig, market: PreparedMarket) -> ModelSpec:
    """The ActorCritic of ``cfg`` sized for ``market`` (its F features, N tickers and T window), with the next-day
    head when training uses it (``--aux_coef`` > 0)."""
    return ModelSpec.of(
        cfg.model,
        num_features=market.num_features,
        num_tickers=market.num_tickers,
        window=market.window,
        next_day_head=cfg.ppo.aux_coef > 0,
        trade_gate=cfg.env.trade_gate,
    )


def build_model(cfg: TrainConfig, market: PreparedMarket) -> ActorCritic:
    """The ActorCritic for ``cfg`` sized for ``market``, its stage-1 kernel set from ``--window_kernel``."""
    model = ActorCritic(model_spec(cfg, market))
    model.window_kernel = cfg.system.window_kernel
    return model


def cut_days(starts: Tensor) -> list[int]:
    """Days ``d >= 1`` of ``starts [L, B]`` where some env starts an episode (where `run_lstm` cuts).

    On a GPU tensor this synchronises the stream; `ppo_update` passes host copies instead.
    """
    if starts.shape[0] <= 1:
        return []
    return torch.nonzero(starts[1:].any(dim=1)).flatten().add(1).tolist()


def run_lstm(
    lstm: nn.LSTM, x: Tensor, state: tuple[Tensor, Tensor], starts: Tensor, cuts: list[int] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Run ``lstm`` over days with state resets at episode starts.

    :param x: ``[L, B, D]`` inputs, day-major.
    :param state: ``(h, c)`` each ``[1, B, H]``: the state before day 0 (not yet masked).
    :param starts: ``[L, B]`` bool, True where an episode starts on that day (state zeroed first).
    :param cuts: ``cut_days(starts)`` when the caller already has it (computed from a host copy, so
        no device synchronisation here); None computes it from ``starts``.
    :return: outputs ``[L, B, H]`` and the state after day L-1.

    The sequence is cut only at days where some env starts an episode, and each piece runs as one
    fused LSTM call; a one-day call on the CPU (a rollout step) runs ``torch.lstm_cell`` instead, ~2x
    faster there. A rollout step and an update over L days give the same numbers up to float rounding.
    """
    keep = (~starts).to(x.dtype).unsqueeze(-1)  # [L, B, 1]
    if x.shape[0] == 1 and x.device.type == "cpu":  # a rollout step: the plain cell is ~2x faster on a CPU
        h, c = torch.lstm_cell(
            x[0],
            (state[0][0] * keep[0], state[1][0] * keep[0]),
            lstm.weight_ih_l0,
            lstm.weight_hh_l0,
            lstm.bias_ih_l0,
            lstm.bias_hh_l0,
        )
        return h.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0))
    cut_days_ = cut_days(starts) if cuts is None else cuts
    bounds = [0, *cut_days_, x.shape[0]]
    h, c = state
    outputs = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        h, c = h * keep[lo], c * keep[lo]
        out, (h, c) = lstm(x[lo:hi], (h, c))
        outputs.append(out)
    return torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0], (h, c)


def _today(windows: Windows) -> Tensor:
    """Each window's last day, the current state: ``[L x E, F]`` (step-major)."""
    return windows.last_rows().reshape(windows.steps * windows.envs, -1)


class ActorCritic(nn.Module):
    """Recurrent Gaussian actor-critic over windowed market observations (see module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.policy not in POLICIES:
            raise ValueError(f"unknown policy variant {spec.policy!r}")
        if spec.action_dist not in ACTION_DISTS:
            raise ValueError(f"unknown action distribution {spec.action_dist!r}")
        if spec.forecast_skip and spec.forecaster == "head" and not spec.next_day_head:
            raise ValueError("forecast_skip needs the next-day head (training with --aux_coef > 0)")
        if spec.forecaster not in FORECASTERS:
            raise ValueError(f"unknown forecaster {spec.forecaster!r}")
        if spec.forecaster == "linear" and (not spec.forecast_skip or spec.policy == "shared"):
            raise ValueError("the linear forecaster is what forecast_skip follows (clstm, lstm or mlp)")
        if spec.forecast_only and (not spec.forecast_skip or spec.policy == "shared"):
            raise ValueError("forecast_only sets the stocks' means from forecast_skip's forecast (clstm, lstm or mlp)")
        if spec.forecast_threshold and not spec.forecast_only:
            raise ValueError("forecast_threshold lowers the means forecast_only sets")
        if spec.forecast_centre is not None and (
            not spec.forecast_only or len(spec.forecast_centre) != spec.num_tickers
        ):
            raise ValueError("forecast_centre is one level per stock of the means forecast_only sets")
        self.spec = spec
        self.window_kernel = "auto"  # how stage 1 runs (auto | shared | fused); not part of the weights
        if spec.forecast_skip:  # g: how far the stocks' action means follow the next-day prediction
            self.forecast_gain = nn.Parameter(torch.zeros(()))
        if spec.forecast_only:  # [N] the stocks' means without the network's part: g x forecast + this
            self.stock_bias = nn.Parameter(torch.zeros(spec.num_tickers))
        if spec.forecaster == "linear":  # [T x N] price columns -> [N], zero at the start (predicts 0)
            self.price_columns = StateLayout.of_width(spec.num_features, spec.num_tickers).prices
            self.linear_forecast = nn.Linear(spec.window * spec.num_tickers, spec.num_tickers)
            nn.init.zeros_(self.linear_forecast.weight)
            nn.init.zeros_(self.linear_forecast.bias)
        if spec.policy == "shared":
            self._build_shared(spec)
            return
        f_in = spec.num_features
        if spec.policy == "clstm":
            if spec.stage1 == "conv":  # one output position: the kernel spans the whole window
                self.window_conv = _orthogonal(nn.Linear(spec.window * f_in, spec.stage1_hidden), 1.0)
            else:
                self.window_lstm = _orthogonal(nn.LSTM(f_in, spec.stage1_hidden, batch_first=True), 1.0)
            f_in = spec.stage1_hidden + (spec.num_features if spec.skip else 0)
        self.features = nn.Sequential(
            _orthogonal(nn.Linear(f_in, spec.feature_dim)),
            nn.Tanh(),
            _orthogonal(nn.Linear(spec.feature_dim, spec.feature_dim)),
            nn.Tanh(),
        )
        hidden = spec.stage2_hidden
        if spec.policy == "mlp":
            self.actor_body = nn.Sequential(_orthogonal(nn.Linear(spec.feature_dim, hidden)), nn.Tanh())
            self.critic_body = nn.Sequential(_orthogonal(nn.Linear(spec.feature_dim, hidden)), nn.Tanh())
        else:
            self.actor_lstm = _orthogonal(nn.LSTM(spec.feature_dim, hidden), 1.0)
            self.critic_lstm = _orthogonal(nn.LSTM(spec.feature_dim, hidden), 1.0)
        self.head_skip = spec.skip and spec.policy != "mlp"  # heads also see the stage-1 features
        head_in = hidden + (spec.feature_dim if self.head_skip else 0)
        self.actor_mean = _orthogonal(nn.Linear(head_in, spec.action_dim), 0.01)
        self.critic = _orthogonal(nn.Linear(head_in, 1), 1.0)
        if spec.next_day_head:  # tomorrow's price column per ticker, from what the actor head sees
            self.next_day = _orthogonal(nn.Linear(head_in, spec.num_tickers), 1.0)
        self.log_std = nn.Parameter(torch.full((spec.action_dim,), float(spec.init_log_std)))
        if spec.obs_norm:
            f64 = torch.float64
            self.register_buffer("obs_count", torch.zeros((), dtype=f64))
            self.register_buffer("obs_mean", torch.zeros(spec.num_features, dtype=f64))
            self.register_buffer("obs_var", torch.ones(spec.num_features, dtype=f64))

    def _build_shared(self, spec: ModelSpec) -> None:
        """``shared``: `SharedTickerNet` and one log-std for every ticker: no parameter is N wide."""
        if spec.obs_norm:
            raise ValueError("--norm_obs keeps statistics per state number, which ties a network to N tickers")
        if spec.trade_gate:
            raise ValueError("--policy shared has one output per ticker; --trade_gate needs two")
        layout = StateLayout.of_width(spec.num_features, spec.num_tickers)
        self.shared = SharedTickerNet(
            layout.num_indicators,
            spec.stage1_hidden,
            spec.feature_dim,
            spec.stage2_hidden,
            spec.skip,
            spec.next_day_head,
            spec.cross_section,
            spec.window,
        )
        self.log_std = nn.Parameter(torch.full((1,), float(spec.init_log_std)))

    # ------------------------------------------------------------------ parameter groups
    def stage1_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``learning_rate_clstm``: the window LSTM and the feature layers."""
        if self.spec.policy == "shared":
            return self.shared.stage1_parameters()
        mods = [self.features] + [getattr(self, name) for name in ("window_lstm", "window_conv") if hasattr(self, name)]
        return [p for m in mods for p in m.parameters()]

    def stage2_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``learning_rate_actor_critic``: everything not in stage 1."""
        stage1 = {id(p) for p in self.stage1_parameters()}
        return [p for p in self.parameters() if id(p) not in stage1]

    # ------------------------------------------------------------------ state
    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        """Zero recurrent state for ``batch_size`` envs (zero width for mlp)."""
        hidden = 0 if self.spec.policy in ("mlp", "shared") else self.spec.stage2_hidden
        return RecurrentState.zeros(batch_size, hidden, device)

    # ------------------------------------------------------------------ observation statistics
    @torch.no_grad()
    def update_obs_stats(self, sums: Tensor) -> None:
        """Merge one batch of state rows into the running statistics (`merge_moments`).

        :param sums: ``[2F + 1]`` float64: the batch's row count, then per state number the sum and the sum of
            squares (all workers' rollouts added up, so every rank merges the same numbers).
        """
        count, mean, var = merge_moments(self.obs_count, self.obs_mean, self.obs_var, sums)
        self.obs_count.copy_(count)
        self.obs_mean.copy_(mean)
        self.obs_var.copy_(var)

    def normalize(self, windows: Windows) -> Windows:
        """The windows with every state number standardised by the running statistics and clipped to +-10
        (``obs_norm``; before any statistics: mean 0, variance 1)."""
        if not self.spec.obs_norm:
            return windows
        rows = windows.rows
        mean = self.obs_mean.to(rows.dtype)
        scale = (self.obs_var + OBS_EPS).rsqrt().to(rows.dtype)
        return Windows(((rows - mean) * scale).clamp(-OBS_CLIP, OBS_CLIP), windows.index)

    # ------------------------------------------------------------------ forward pieces
    def encode(self, windows: Windows) -> Tensor:
        """Stage 1: L x E windows -> features ``[L x E, feature_dim]`` (step-major)."""
        if self.spec.policy != "clstm":
            return self.features(_today(windows))
        if self.spec.stage1 == "conv":  # [L x E, T x F] -> [L x E, stage1_hidden]
            dense = windows.dense()
            summary = torch.tanh(self.window_conv(dense.reshape(-1, dense.shape[-2] * dense.shape[-1])))
        else:
            summary = window_last_output(self.window_lstm, windows, self.window_kernel)  # [L x E, stage1_hidden]
        if self.spec.skip:
            summary = torch.cat([summary, _today(windows).to(summary.dtype)], dim=-1)
        return self.features(summary)

    def core(
        self, feats: Tensor, state: RecurrentState, starts: Tensor, host_starts: Tensor | None = None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """Stage 2: features ``[L, B, D]`` -> actor and critic latents ``[L, B, H]`` and the new state.

        ``host_starts``: optional CPU copy of ``starts`` (where to cut the sequence, found without
        a device synchronisation).
        """
        if self.spec.policy == "mlp":
            return self.actor_body(feats), self.critic_body(feats), state
        cuts = cut_days(starts if host_starts is None else host_starts)  # once for both LSTMs
        actor_out, actor = run_lstm(self.actor_lstm, feats, state.actor, starts, cuts)
        critic_out, critic = run_lstm(self.critic_lstm, feats, state.critic, starts, cuts)
        return actor_out, critic_out, RecurrentState(*actor, *critic)

    def forward(
        self,
        obs: Tensor | Windows,
        state: RecurrentState,
        starts: Tensor,
        actions: Tensor | None = None,
        host_starts: Tensor | None = None,
        predict_next: bool = False,
    ) -> PolicyOutput:
        """Evaluate L days of B envs.

        :param obs: ``[L, B, T, F]`` float observations, or the same as `Windows`.
        :param state: recurrent state before day 0 (see `initial_state`).
        :param starts: ``[L, B]`` bool episode-start flags.
        :param actions: ``[L, B, A]`` actions to score; None samples nothing and scores the mean.
        :param host_starts: optional CPU copy of ``starts`` (no device sync to find episode cuts).
        :param predict_next: also return the next-day head's prediction (needs ``next_day_head``).
        :return: a `PolicyOutput`; its ``next_day`` (the predicted price column of tomorrow's state) only with
            ``predict_next`` or ``forecast_skip`` (which always computes it).
        """
        windows = self.normalize(obs if isinstance(obs, Windows) else Windows.from_dense(obs))
        predict = predict_next or (self.spec.forecast_skip and self.spec.forecaster == "head")
        if self.spec.policy == "shared":
            mean, value, next_day = self._shared_heads(windows, predict)
        else:
            mean, value, next_day, state = self._heads(windows, state, starts, host_starts, predict)
        forecast = self.forecast_linear(windows) if self.spec.forecaster == "linear" else None
        if self.spec.forecast_skip:
            mean = self.follow_forecast(mean, next_day if forecast is None else forecast)
        std = self.policy_std().expand_as(mean)
        scored = mean.float() if actions is None else actions.float()
        log_prob = self._log_prob(gaussian(mean.float(), std), scored)
        if self.spec.action_dist == "tanh":  # no closed form: the sample estimate -log pi(a) at the scored actions
            entropy = -log_prob
        else:
            entropy = gaussian(mean.float(), std).entropy().sum(-1)
        return PolicyOutput(log_prob, entropy, value.float(), mean.float(), state, next_day, forecast)

    def forecast_linear(self, windows: Windows) -> Tensor:
        """``forecaster="linear"``: tomorrow's price column ``[L, B, N]`` (float32) as one linear map of each
        window's price columns ``[T x N]`` (after ``obs_norm`` when on), fitted by its own next-day loss term."""
        prices = windows.columns(self.price_columns)
        return self.linear_forecast(prices.flatten(-2).to(self.linear_forecast.weight.dtype)).float()

    def follow_forecast(self, mean: Tensor, next_day: Tensor) -> Tensor:
        """``forecast_skip``: the first N action means ``[L, B, A]`` (the stocks' weight logits) plus
        ``forecast_gain x`` the next-day prediction ``[L, B, N]`` (the head's or the linear forecaster's), detached;
        float32. With ``forecast_only`` the stocks' means are ``stock_bias [N]`` plus that, the network's part
        dropped (its trade-gate means ``[..., N:]`` stay)."""
        n, mean = self.spec.num_tickers, mean.float()
        base = self.stock_bias.float().expand_as(mean[..., :n]) if self.spec.forecast_only else mean[..., :n]
        return torch.cat([base + self.forecast_gain * next_day.detach(), mean[..., n:]], dim=-1)

    def _heads(
        self, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None, predict_next: bool
    ) -> tuple[Tensor, Tensor, Tensor | None, RecurrentState]:
        """clstm, lstm and mlp: stage 1, stage 2 and the heads -> means ``[L, B, A]``, values ``[L, B]``, the
        next-day prediction ``[L, B, N]`` (or None) and the new state."""
        feats = self.encode(windows).reshape(windows.steps, windows.envs, -1)
        actor_out, critic_out, state = self.core(feats, state, starts, host_starts)
        if self.head_skip:  # [L, B, H + D]
            actor_out = torch.cat([actor_out, feats.to(actor_out.dtype)], dim=-1)
            critic_out = torch.cat([critic_out, feats.to(critic_out.dtype)], dim=-1)
        next_day = self.next_day(actor_out).float() if predict_next else None
        return self.actor_mean(actor_out), self.critic(critic_out).squeeze(-1), next_day, state

    def _shared_heads(self, windows: Windows, predict_next: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """shared: `SharedTickerNet` over the dense windows -> means ``[L, B, A]``, values ``[L, B]``, next-day."""
        dense = windows.dense()  # [L, B, T, F]
        steps, envs = dense.shape[:2]
        mean, value, next_day = self.shared(dense.reshape(steps * envs, *dense.shape[2:]), predict_next)
        mean, value = mean.reshape(steps, envs, -1), value.reshape(steps, envs)
        return mean, value, None if next_day is None else next_day.reshape(steps, envs, -1).float()

    def policy_std(self) -> Tensor:
        """The Gaussian's standard deviation per action number ``[A]`` float32 (bounded when ``log_std_max`` is set)."""
        log_std = self.log_std.float()
        if self.spec.log_std_max is not None:
            log_std = log_std.clamp(LOG_STD_MIN, self.spec.log_std_max)
        return log_std.exp()

    def _log_prob(self, dist: Normal, u: Tensor) -> Tensor:
        """log pi of pre-squash samples ``u [..., A]``, summed over tickers. For tanh, the change of variables
        a = tanh(u) subtracts sum log(1 - tanh(u)^2) = sum 2 (log 2 - u - softplus(-2u)) (stable form); it is the
        same for the old and the new policy, so PPO's ratio is the Gaussian's."""
        log_prob = dist.log_prob(u).sum(-1)
        if self.spec.action_dist == "tanh":
            log_prob = log_prob - (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)
        return log_prob

    def env_action(self, u: Tensor) -> Tensor:
        """What the env receives for a policy sample (or mean) ``u [B, A]``: ``tanh(u)`` for the tanh distribution,
        ``u`` itself for the Gaussian (the env clips it to [-1, 1])."""
        return torch.tanh(u) if self.spec.action_dist == "tanh" else u

    def deployed_mean(self, mean: Tensor) -> Tensor:
        """The deterministic action of means ``[B, A]``: the stocks' ``[..., :N]`` lowered by ``forecast_threshold``
        (a no-trade threshold on ``forecast_only``'s forecast; the gates stay), after ``forecast_scale x (mean -
        forecast_centre)`` where a centre is set (``--forecast_gain``), or ``mean`` itself when neither is."""
        centre = self.spec.forecast_centre
        if not self.spec.forecast_threshold and centre is None:
            return mean
        n = self.spec.num_tickers
        stocks = mean[..., :n]
        if centre is not None:
            stocks = self.spec.forecast_scale * (stocks - torch.as_tensor(centre, dtype=mean.dtype, device=mean.device))
        return torch.cat([stocks - self.spec.forecast_threshold, mean[..., n:]], dim=-1)

    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        state: RecurrentState,
        starts: Tensor,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> ActOutput:
        """One rollout step for B envs.

        :param obs: ``[B, T, F]``; :param starts: ``[B]`` bool.
        :return: an `ActOutput`: the Gaussian sample ``u`` before any squashing (what the rollout stores and PPO
            scores; `env_action` turns it into the env's action), its log-probability, the value and the new state.
            ``deterministic`` returns the mean. Sampling noise comes from ``generator`` on its own device
            (training passes one on the model's device, the backtest a CPU one so sampled backtests match
            across devices). ``noise`` ``[B, A]``: the standard-normal draws to use instead (held exploration noise,
            `clstm_ppo.training.exploration`).
        """
        out = self.forward(obs.unsqueeze(0), state, starts.unsqueeze(0))
        mean, value = out.mean, out.value[0]
        if deterministic:
            return ActOutput(self.deployed_mean(mean[0]), out.log_prob[0], value, out.state)
        std = self.policy_std()
        # Drawn on the generator's device: a CPU generator gives the same noise whatever device the model is on.
        if noise is None:
            noise_device = generator.device if generator is not None else mean.device
            noise = torch.randn(mean.shape[1:], device=noise_device, generator=generator, dtype=mean.dtype)
        action = mean[0] + std * noise.to(mean.device, mean.dtype)
        log_prob = self._log_prob(gaussian(mean[0], std.expand_as(mean[0])), action)
        return ActOutput(action, log_prob, value, out.state)

    @torch.no_grad()
    def value(self, obs: Tensor, state: RecurrentState, starts: Tensor) -> Tensor:
        """Value ``[B]`` of observations ``[B, T, F]`` from ``state`` (used to bootstrap)."""
        return self.forward(obs.unsqueeze(0), state, starts.unsqueeze(0)).value[0]


def unwrap(model: nn.Module) -> ActorCritic:
    """The raw ActorCritic under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "module"):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model  # type: ignore[return-value]
