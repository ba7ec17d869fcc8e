"""Running mean and variance, merged batch by batch: the statistics behind ``--norm_obs`` and ``--norm_reward``."""

from __future__ import annotations

import torch
from torch import Tensor


def moment_sums(rows: Tensor) -> Tensor:
    """What `merge_moments` takes from a batch ``rows [M, K]`` (or ``[M]``): ``[2K + 1]`` float64, the row count,
    the per-column sums and sums of squares (sums of several workers' batches add up)."""
    x = rows.double().reshape(rows.shape[0], -1)
    count = torch.full((1,), float(x.shape[0]), dtype=torch.float64, device=x.device)
    return torch.cat([count, x.sum(0), x.square().sum(0)])


def merge_moments(count: Tensor, mean: Tensor, var: Tensor, sums: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Running ``(count, mean, var)`` after one more batch (Chan et al.'s parallel update; population variance).

    :param count: 0-dim float64, rows seen so far; :param mean: ``[K]`` (or 0-dim); :param var: same shape.
    :param sums: ``[2K + 1]`` float64: the batch's row count, then per statistic the sum and the sum of squares
        (workers' batches can be added up before merging).
    :return: the merged ``(count, mean, var)``, float64; the inputs unchanged when the batch is empty.
    """
    k = mean.numel()
    sums = sums.to(mean.device, torch.float64)
    n_b = sums[0]
    if float(n_b) <= 0:
        return count, mean, var
    mean_b = (sums[1 : 1 + k] / n_b).view_as(mean)
    var_b = (sums[1 + k :] / n_b).view_as(mean) - mean_b.square()
    total = count + n_b
    delta = mean_b - mean
    new_mean = mean + delta * n_b / total
    new_var = (var * count + var_b.clamp_min(0.0) * n_b + delta.square() * count * n_b / total) / total
    return total, new_mean, new_var
