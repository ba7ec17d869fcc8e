"""Adam for K stacked cells (`clstm_ppo.agent.stacked.CellPolicy`): per cell what `clstm_ppo.training.ppo`'s
`build_optimizer` and `optimizer_step` do for one run, on the two ``[K, N]`` parameter buffers at once.

Per cell k, as its run alone: the global gradient-norm clip at its own ``max_grad_norm`` (the norm over all its
parameters, both groups); the step skipped when that norm is NaN/inf (decided on the device, as the fused kernel's
``found_inf``); its own step count (bias corrections), its learning rate per group; AdamW-style decay of its weight
matrices after the step (`clstm_ppo.training.ppo.decay_weights`). An ``active`` mask leaves a cell alone entirely:
a cell whose epochs stopped early on the KL (`clstm_ppo.training.ppo.ppo_update`) or that has finished or failed takes no
step, its weights, moments and step count do not move.

Masking is arithmetic, with no host synchronisation: an inactive cell's gradient is replaced by 0, its moments are
mixed with weight 0, and its step size is 0, so every one of its numbers is left exactly as it was.

The update is torch's Adam (``torch.optim.Adam``, whose fused CPU kernel `build_optimizer` uses): m = lerp(m, g,
1 - beta1), v = beta2 v + (1 - beta2) g^2, p -= lr / (1 - beta1^t) x m / (sqrt(v) / sqrt(1 - beta2^t) + eps). Its
state converts to and from each cell's own ``torch.optim.Adam`` state dict (`cell_state_dict`,
`load_cell_state_dict`), so a cell's checkpoint holds what its run alone would write; ``tests/test_stacked.py``
checks the steps against ``torch.optim.Adam(fused=True)`` with `optimizer_step`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from clstm_ppo.agent.stacked import CellPolicy

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which `build_optimizer` keeps
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: clip coefficient max_norm / (norm + 1e-6)


class AdamLayout:
    """The ``state_dict()`` of the ``torch.optim.Adam(groups, **options)`` that `clstm_ppo.training.ppo.build_optimizer`
    builds over one network, written without building one: constructing any torch optimizer imports torch._dynamo,
    about 1.2 s of a batch's process on a CPU core, and a batch steps its cells with `CellAdam`. Each group records
    its own keys over Adam's defaults (read from its signature) and ``options``, and its parameters' indices;
    ``tests/test_stacked.py`` checks the whole against torch's.

    :param groups: `clstm_ppo.training.ppo.adam_groups` of a cell's network; :param options: `adam_options`.
    """

    def __init__(self, groups: list[dict[str, Any]], options: dict[str, Any]) -> None:
        signature = inspect.signature(torch.optim.Adam.__init__).parameters.items()
        defaults = {name: p.default for name, p in signature if name not in ("self", "params")}
        self.groups: list[dict[str, Any]] = []
        self.shapes: list[torch.Size] = []  # each parameter's, in torch's index order
        for group in groups:
            params = list(group["params"])
            first = len(self.shapes)
            self.shapes += [p.shape for p in params]
            record = {**defaults, **options, **{key: v for key, v in group.items() if key != "params"}}
            self.groups.append({**record, "params": list(range(first, len(self.shapes)))})

    @property
    def lrs(self) -> list[float]:
        """Each group's learning rate as built."""
        return [group["lr"] for group in self.groups]

    def param_groups(self, lrs: list[float]) -> list[dict[str, Any]]:
        """The groups as an optimizer's ``param_groups`` read for logging, at learning rates ``lrs``."""
        return [{**group, "lr": lr} for group, lr in zip(self.groups, lrs, strict=True)]

    def state_dict(self, state: dict[int, dict[str, Tensor]], lrs: list[float]) -> dict[str, Any]:
        """``{"state": state, "param_groups": ...}`` at learning rates ``lrs``, as ``torch.optim.Adam.state_dict``."""
        return {"state": state, "param_groups": [{**g, "params": list(g["params"])} for g in self.param_groups(lrs)]}


class CellAdam:
    """Adam over a `CellPolicy`'s stacked parameters (see the module docstring).

    :param policy: the cells' networks (its ``flat`` parameter and ``grad`` buffers, one per group).
    :param lrs: ``[K, G]`` each cell's learning rate per group (stage 1, the rest).
    :param eps: Adam's epsilon (the same for every cell); :param weight_decay: the decoupled decay (the same).
    """

    def __init__(self, policy: CellPolicy, lrs: list[list[float]], *, eps: float, weight_decay: float = 0.0) -> None:
        self.policy = policy
        self.params, self.grads = policy.flat, policy.grad
        device = self.params[0].device
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = torch.zeros(policy.cells, device=device)  # [K] float32: each cell's Adam step count
        self.started = torch.zeros(policy.cells, dtype=torch.bool, device=device)  # [K]: its state exists
        self.lr = torch.tensor(lrs, dtype=torch.float64, device=device)  # [K, G]
        self.eps, self.weight_decay = eps, weight_decay
        first = policy.cell(0)
        self.matrices = [  # per group [N_g] bool: the entries of weight matrices (AdamW decays only those)
            torch.cat(
                [torch.full((first.get_parameter(n).numel(),), first.get_parameter(n).dim() >= 2) for n in names]
            ).to(device)
            for names in policy.group_names
        ]

    @torch.no_grad()
    def step(self, max_grad_norm: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
        """Clip each cell's gradients, step the active cells whose gradients are finite, decay, zero the gradients.

        :param max_grad_norm: ``[K]`` float32, each cell's clip; :param active: ``[K]`` bool, the cells that step.
        :return: ``(grad_norm, skipped)``, ``[K]`` each on the device: each cell's gradient norm before clipping,
            and 1.0 where an active cell's step was skipped for non-finite gradients.
        """
        norms = torch.stack([torch.linalg.vector_norm(g, dim=1) for g in self.grads])  # [G, K]
        grad_norm = torch.linalg.vector_norm(norms, dim=0)  # [K]
        clip = (max_grad_norm / (grad_norm + CLIP_EPS)).clamp(max=1.0)
        finite = torch.isfinite(grad_norm)
        applied = active & finite
        self.steps += applied
        self.started |= active
        beta1, beta2 = BETAS
        t = self.steps.double()
        step_size = torch.where(applied.unsqueeze(1), self.lr / (1 - beta1**t).unsqueeze(1), 0.0).float()  # [K, G]
        root_bc2 = torch.where(applied, (1 - beta2**t).sqrt(), 1.0).float().unsqueeze(1)
        mix1 = ((1 - beta1) * applied).float().unsqueeze(1)
        keep2 = torch.where(applied, beta2, 1.0).float().unsqueeze(1)
        mix2 = ((1 - beta2) * applied).float().unsqueeze(1)
        decay = (1.0 - self.lr * self.weight_decay * applied.unsqueeze(1)).float()  # [K, G]
        for g, (param, grad, m, v) in enumerate(
            zip(self.params, self.grads, self.exp_avg, self.exp_avg_sq, strict=True)
        ):
            grad = torch.where(applied.unsqueeze(1), grad * clip.unsqueeze(1), 0.0)
            m.lerp_(grad, mix1)
            v.mul_(keep2).add_(grad.square_().mul_(mix2))
            denom = v.sqrt().div_(root_bc2).add_(self.eps)
            param.sub_(m.div(denom).mul_(step_size[:, g : g + 1]))
            if self.weight_decay > 0:
                param.mul_(torch.where(self.matrices[g], decay[:, g : g + 1], 1.0))
        self.policy.zero_grad()
        return grad_norm, (active & ~finite).float()

    # ------------------------------------------------------------------ one cell as torch.optim.Adam
    def _slots(self, k: int) -> list[tuple[int, int, int, int]]:
        """``(group, index in torch's state, start, end)`` of each of cell k's parameters in the flat buffers."""
        out, index = [], 0
        first = self.policy.cell(0)
        for g, names in enumerate(self.policy.group_names):
            start = 0
            for name in names:
                size = first.get_parameter(name).numel()
                out.append((g, index, start, start + size))
                start += size
                index += 1
        return out

    def cell_state_dict(self, k: int, layout: AdamLayout) -> dict[str, Any]:
        """Cell k's optimizer as its run alone would save it: the ``state_dict()`` of the ``torch.optim.Adam`` over
        its own network that ``layout`` describes, holding this state."""
        state = {}
        if bool(self.started[k]):
            for g, index, start, end in self._slots(k):
                shape = layout.shapes[index]
                state[index] = {
                    "step": self.steps[k].clone(),
                    "exp_avg": self.exp_avg[g][k, start:end].view(shape).clone(),
                    "exp_avg_sq": self.exp_avg_sq[g][k, start:end].view(shape).clone(),
                }
        return layout.state_dict(state, [float(lr) for lr in self.lr[k]])

    @torch.no_grad()
    def load_cell_state_dict(self, k: int, state: dict[str, Any]) -> None:
        """Cell k's optimizer from a ``torch.optim.Adam`` state dict of its network (a single run's checkpoint, or
        `cell_state_dict`'s): moments, step count and the learning rates it held."""
        for g, group in enumerate(state["param_groups"]):
            self.lr[k, g] = float(group["lr"])
        saved = state["state"]
        self.started[k] = bool(saved)
        for g, index, start, end in self._slots(k):
            entry = saved.get(index)
            if entry is None:
                continue
            self.exp_avg[g][k, start:end] = entry["exp_avg"].reshape(-1).to(self.exp_avg[g].device)
            self.exp_avg_sq[g][k, start:end] = entry["exp_avg_sq"].reshape(-1).to(self.exp_avg_sq[g].device)
            self.steps[k] = float(entry["step"])
