"""The factorization-machine term (Rendle, 2010; DeepFM's FM component): the sum over field pairs
of the dot products of their pooled embeddings, computed in O(fields x dim) as
0.5 * sum_d [(sum_i v_id)^2 - sum_i v_id^2], times one learned weight, added to the logit. With the
wide term it is a factorization machine inside the DLRM; the dot interaction feeds the same
products to the top MLP, this puts their sum on the logit directly."""

from __future__ import annotations

import torch
from torch import nn


class FMTerm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # one weight on the pairwise sum: it starts at 1 (the plain FM); the temperature a run
        # fits on its validation rows is folded into it (dlrmkit.train.calibration)
        self.weight = nn.Parameter(torch.ones(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled [B, T, D] -> [B]."""
        pooled = pooled.float()
        pairs = 0.5 * (pooled.sum(1).square() - pooled.square().sum(1)).sum(1)
        return self.weight * pairs
