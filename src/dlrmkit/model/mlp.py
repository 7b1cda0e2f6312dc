"""Multi-layer perceptrons of the DLRM: Linear + ReLU stacks, with optional dropout."""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def normal_(t: torch.Tensor, std: float, generator: torch.Generator) -> None:
    """Fill `t` with N(0, std) drawn on the CPU from `generator` (a CPU generator): the same draws
    wherever `t` lives."""
    t.copy_(torch.empty(t.shape).normal_(0.0, std, generator=generator))


class MLP(nn.Sequential):
    """Linear layers of the given sizes with ReLU after each one (after the last only if
    `final_relu`): the bottom MLP ends in a ReLU, the top MLP ends in a logit. `dropout` > 0 puts
    a Dropout after each hidden layer's ReLU (not after the last layer), as FuxiCTR's DNNs do;
    without it the layers and their state-dict names are the plain stack's."""

    def __init__(self, in_features: int, sizes: list[int], final_relu: bool, dropout: float = 0.0):
        layers: list[nn.Module] = []
        for i, out in enumerate(sizes):
            layers.append(nn.Linear(in_features, out))
            if i < len(sizes) - 1 or final_relu:
                layers.append(nn.ReLU(inplace=True))
            if dropout and i < len(sizes) - 1:
                layers.append(nn.Dropout(dropout))
            in_features = out
        super().__init__(*layers)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """The DLRM reference initialization: N(0, sqrt(2/(fan_in+fan_out))) weights."""
        for layer in self:
            if isinstance(layer, nn.Linear):
                fan_out, fan_in = layer.weight.shape
                normal_(layer.weight, math.sqrt(2.0 / (fan_in + fan_out)), generator)
                normal_(layer.bias, math.sqrt(1.0 / fan_out), generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """nn.Sequential's own forward, defined here: torch.compile skips frames whose code lives in
        torch.nn, so a compiled MLP that inherited it ran eagerly (seen in the bench profile)."""
        for layer in self:
            x = layer(x)
        return x
