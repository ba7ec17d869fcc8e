"""Layer initialisation shared by the policy networks."""

from __future__ import annotations

import math

from torch import nn


def orthogonal(layer: nn.Module, gain: float = math.sqrt(2.0)) -> nn.Module:
    """``layer`` with orthogonal weights of scale ``gain`` and zero biases (CleanRL's ``layer_init``)."""
    for name, param in layer.named_parameters():
        if "weight" in name:
            nn.init.orthogonal_(param, gain)
        elif "bias" in name:
            nn.init.zeros_(param)
    return layer
