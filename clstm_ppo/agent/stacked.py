"""K networks of one policy family and shape as one model: seeds (and settings that change no shape) as a batch
dimension, PureJaxRL's idea for a study's cells (docs/study.md "One model").

Columns: the E env columns the rollout and the update exchange are grouped by cell, E = K x M and columns
``k M .. (k + 1) M - 1`` cell k's (cell-major), so the rollout buffer, GAE and the minibatch selection are the single
path's and only the network knows there are K of it.

Weights: each parameter group (stage 1, and the rest: the two learning rates) is one buffer ``[K, N_g]``
(`CellPolicy.flat`); each parameter is a view ``[K, *shape]`` of it, and its gradient a view of a gradient buffer of
the same layout (autograd adds into an existing gradient in place; the ranks average it per seed in one all-reduce
per group). Cell k's own `ActorCritic` (`CellPolicy.cell`) has its parameters and buffers rebound to views of the
k-th rows, so its optimizer, checkpoints, validation and ``--norm_obs`` statistics read it as a single run's network,
and it always holds the current weights (a checkpoint copies them: `clstm_ppo.training.checkpoint.cpu_state`).

The forward is the family's own (`ActorCritic.forward_cells`) on stacked kernels: ``vmap`` has no batching rule for
``nn.LSTM`` (torch 2.13), so every ``nn.Linear`` is one ``baddbmm`` over the K cells (`CellPolicy.layers`), the
window LSTM `clstm_ppo.agent.window_lstm.WindowLSTM` over stacked ``W_hh``, stage 2 `clstm_ppo.agent.stacked_lstm`.
A cell's numbers equal those of the same network alone up to float rounding (``tests/test_stacked.py``), but their
last bits may depend on the cell's place in the batch (a vectorised kernel's body and tail round a transcendental
function differently), which is why a study forms its batches over the whole grid.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from clstm_ppo.agent.model import ActorCritic, Policy, PolicyOutput, bounded_std, normalized_rows
from clstm_ppo.agent.recurrence import cut_days
from clstm_ppo.agent.spec import RecurrentState
from clstm_ppo.agent.stacked_lstm import stacked_lstm
from clstm_ppo.agent.window_lstm import resolve_kernel, stacked_window_last_output
from clstm_ppo.agent.windows import Windows

# A cell's gradients are views of its row of the [K, N] gradient buffer, by design (the optimizer steps the buffer):
# autograd notes that such a view is not laid out as a lone tensor would be, which costs nothing here.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")

OBS_BUFFERS = ("obs_count", "obs_mean", "obs_var")  # --norm_obs's running statistics (`ActorCritic._finish`)
# a one-layer nn.LSTM's weights, in stacked_lstm's order
LSTM_WEIGHTS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")


def _rebind(model: nn.Module, name: str, value: Tensor, parameter: bool) -> None:
    """Put ``value`` where ``model``'s parameter (or buffer) ``name`` (dotted) was."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    if parameter:
        setattr(module, leaf, value)  # nn.LSTM's __setattr__ also updates its _flat_weights
    else:
        module.register_buffer(leaf, value)


class CellPolicy(Policy):
    """K networks of one family and shape trained together (see the module docstring for the layout), and the
    `clstm_ppo.agent.net.Net` of K their family's forward runs on (``layers``, ``window_summary``, ``stage2``).

    :param models: the cells' networks, each initialised as its run alone would be; their parameters and buffers
        are rebound to views of the stacked storage (so keep using them: `cell`).
    """

    def __init__(self, models: list[ActorCritic]) -> None:
        first = models[0]
        shape = {n: p.shape for n, p in first.state_dict().items()}
        for model in models[1:]:
            same = {n: p.shape for n, p in model.state_dict().items()} == shape
            if type(model) is not type(first) or not same or model.spec.action_dist != first.spec.action_dist:
                raise ValueError("stacked cells need networks of one family, shape and distribution")
        self.models, self.cells = models, len(models)
        self._joined: tuple[tuple[int, ...], list[Tensor]] | None = None  # (weights' versions, their join), no grad
        self._loss_forward: Any = None  # `evaluate` through torch.compile (`compile`)
        self.spec = first.spec  # shapes and distribution (a cell's own spec: `cell(k).spec`)
        names = {id(p): n for n, p in first.named_parameters()}
        groups = (first.stage1_parameters(), first.stage2_parameters())
        self.group_names = [[names[id(p)] for p in group] for group in groups]
        self.params: dict[str, Tensor] = {}
        self.flat: list[Tensor] = []  # per group [K, N_g]: every cell's parameters
        self.grad: list[Tensor] = []  # per group [K, N_g]: their gradients
        for group in self.group_names:
            rows = [torch.cat([m.get_parameter(n).detach().reshape(-1) for n in group]) for m in models]
            flat = torch.stack(rows)
            grad = torch.zeros_like(flat)
            offset = 0
            for name in group:
                size, dims = first.get_parameter(name).numel(), first.get_parameter(name).shape
                stacked = nn.Parameter(flat[:, offset : offset + size].view(self.cells, *dims))
                stacked.grad = grad[:, offset : offset + size].view(self.cells, *dims)
                self.params[name] = stacked
                for k, model in enumerate(models):
                    own = nn.Parameter(stacked.detach()[k])
                    own.grad = stacked.grad[k]
                    _rebind(model, name, own, parameter=True)
                offset += size
            self.flat.append(flat)
            self.grad.append(grad)
        self.buffers: dict[str, Tensor] = {}
        for name in OBS_BUFFERS if first.spec.obs_norm else ():
            stacked = torch.stack([m.get_buffer(name) for m in models])
            self.buffers[name] = stacked
            for k, model in enumerate(models):
                _rebind(model, name, stacked[k], parameter=False)

    # ------------------------------------------------------------------ the cells
    def cell(self, k: int) -> ActorCritic:
        """Cell k's own network: its parameters and buffers are views of the stacked ones."""
        return self.models[k]

    @property
    def device(self) -> torch.device:
        return self.flat[0].device

    def stepped(self) -> None:
        """The seeds' optimizers moved the weights in place: zero the gradients (views of the stacked buffers, kept)
        and forget the joined stage-2 weights (torch's fused Adam leaves the version counters where they were)."""
        for grad in self.grad:
            grad.zero_()
        self._joined = None

    # ------------------------------------------------------------------ K of the interface (`Policy`)
    def forward(self, *args, **kwargs) -> PolicyOutput:
        """`evaluate` (the loss forward, as `ActorCritic`'s), compiled after `compile`."""
        return (self._loss_forward or self.evaluate)(*args, **kwargs)

    def compile(self, **options: Any) -> None:
        """``--compile``: the loss forward (`forward`) through ``torch.compile(evaluate, **options)``, as a run's is
        through its compiled module; acting stays eager, as a run's does."""
        self._loss_forward = torch.compile(self.evaluate, **options)

    __call__ = forward

    def _means_and_values(
        self, windows: Windows, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """The family's own forward (`ActorCritic.forward_cells`) on the stacked kernels below."""
        return type(self.models[0]).forward_cells(self, windows, state, starts, host_starts)

    def std(self) -> Tensor:
        """Each cell's standard deviation per action number ``[K, A]`` (`bounded_std`)."""
        return bounded_std(self.params["log_std"], self.spec.log_std_max)

    def normalize(self, windows: Windows) -> Windows:
        """`ActorCritic.normalize` with each cell's statistics on its columns."""
        if not self.spec.obs_norm:
            return windows
        rows = windows.rows
        envs, per_env, features = rows.shape
        by_cell = rows.reshape(self.cells, -1, features)
        mean, var = self.buffers["obs_mean"].unsqueeze(1), self.buffers["obs_var"].unsqueeze(1)
        return Windows(normalized_rows(by_cell, mean, var).view(envs, per_env, features), windows.index)

    # ------------------------------------------------------------------ the kernels, stacked
    def linear(self, name: str, x: Tensor) -> Tensor:
        """The K cells' ``nn.Linear`` ``name``: ``[K, R, in] -> [K, R, out]``, one ``baddbmm``."""
        weight, bias = self.params[f"{name}.weight"], self.params[f"{name}.bias"]
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    def layers(self, name: str, x: Tensor) -> Tensor:
        """The K cells' module ``name`` (a Linear, or a Sequential of Linear and Tanh layers, as the single network
        has it) on ``x [K, R, in]``."""
        module = self.models[0].get_submodule(name)
        children = list(module.named_children()) if isinstance(module, nn.Sequential) else [("", module)]
        for child, layer in children:
            if isinstance(layer, nn.Linear):
                x = self.linear(f"{name}.{child}" if child else name, x)
            elif isinstance(layer, nn.Tanh):
                x = torch.tanh(x)
            else:
                raise TypeError(f"no stacked form of {type(layer).__name__} ({name}.{child})")
        return x

    def window_summary(self, windows: Windows, name: str = "window_lstm") -> Tensor:
        """The K cells' window LSTM ``name``: ``[K, L x M, H]``. On the CPU the kernel is chosen as a run's is
        (`resolve_kernel` of the cells' ``window_kernel``): ``fused`` (``auto`` for windows that share no rows, a
        rollout step's and ``shared``'s tickers') runs each cell's own ``nn.LSTM``, oneDNN; ``shared`` one stacked
        kernel (`stacked_window_last_output`), which is also what runs on CUDA."""
        kernel = resolve_kernel(self.models[0].window_kernel, self.device, windows.rows_shared)
        if self.device.type != "cpu" or kernel == "shared":
            weights = [self.params[f"{name}.{w}"] for w in LSTM_WEIGHTS]
            return stacked_window_last_output(*weights, windows, self.cells)
        per = windows.envs // self.cells
        dense = windows.dense()  # [L, E, T, F]
        mine = [Windows.from_dense(dense[:, k * per : (k + 1) * per]) for k in range(self.cells)]
        return torch.cat([model.window_summary(w, name) for model, w in zip(self.models, mine, strict=True)])

    def stage2(
        self, feats: Tensor, state: RecurrentState, starts: Tensor, host_starts: Tensor | None
    ) -> tuple[Tensor, Tensor, RecurrentState]:
        """Stage 2 of the K cells: their actors' and critics' LSTMs as 2K networks in one `stacked_lstm`.
        Features ``[K, L, M, D]`` -> the actors' and the critics' outputs ``[K, L x M, H]`` and the state."""
        cells, steps, per = feats.shape[:3]
        both = torch.cat([feats, feats])  # [2K, L, M, D]: actors, then critics

        def pair(actor: Tensor, critic: Tensor) -> Tensor:
            return torch.cat([actor.view(cells, per, -1), critic.view(cells, per, -1)])

        by_cell = starts.view(steps, cells, per)
        out, (h, c) = stacked_lstm(
            both,
            *self.stage2_weights(),
            (pair(state.actor_h, state.critic_h), pair(state.actor_c, state.critic_c)),
            torch.cat([by_cell, by_cell], dim=1),
            cut_days(starts if host_starts is None else host_starts),
        )  # out [2K, L, M, H]
        hidden = out.shape[-1]
        new = RecurrentState(*(t.reshape(1, cells * per, hidden) for t in (h[:cells], c[:cells], h[cells:], c[cells:])))
        return out[:cells].reshape(cells, steps * per, -1), out[cells:].reshape(cells, steps * per, -1), new

    def stage2_weights(self) -> list[Tensor]:
        """The 2K stage-2 LSTMs' weights, the K actors' then the K critics': ``W_ih [2K, 4H, D]``, ``W_hh [2K, 4H,
        H]``, ``b_ih`` and ``b_hh [2K, 4H]``. Joined afresh under autograd (the gradients flow back to each cell's
        parameters); without it, kept until a weight changes in place (`stepped`, or a load, which moves the version
        counters), so a backtest's or a rollout's forward a day does not copy them every day (the paper network's
        seed ensemble: 13 of a report's 24 s, in the allocator)."""
        parts = [(self.params[f"actor_lstm.{w}"], self.params[f"critic_lstm.{w}"]) for w in LSTM_WEIGHTS]
        if torch.is_grad_enabled():
            return [torch.cat(pair) for pair in parts]
        versions = tuple(t._version for pair in parts for t in pair)
        if self._joined is None or self._joined[0] != versions:
            self._joined = (versions, [torch.cat(pair) for pair in parts])
        return self._joined[1]
