"""Feature interactions between the bottom-MLP output and the pooled embeddings."""

from __future__ import annotations

import torch
from torch import nn


class DotInteraction(nn.Module):
    """Pairwise dot products of the T+1 feature vectors (one batched matmul), keeping the lower
    triangle, concatenated after the bottom-MLP output: out = [x, tril(F F^T)]."""

    def __init__(self, num_features: int, self_interaction: bool = False):
        super().__init__()
        rows, cols = torch.tril_indices(num_features, num_features, offset=0 if self_interaction else -1)
        self.register_buffer("flat_index", rows * num_features + cols, persistent=False)
        self.num_features = num_features

    @property
    def num_pairs(self) -> int:
        return int(self.flat_index.numel())

    def output_size(self, dim: int) -> int:
        return dim + self.num_pairs

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        # dense [B, D], pooled [B, T, D] -> [B, D + pairs]
        feats = torch.cat([dense.unsqueeze(1), pooled], dim=1)
        gram = torch.bmm(feats, feats.transpose(1, 2)).flatten(1)
        return torch.cat([dense, gram.index_select(1, self.flat_index)], dim=1)


class CatInteraction(nn.Module):
    """No interaction: the bottom-MLP output and all pooled embeddings, concatenated."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def output_size(self, dim: int) -> int:
        return dim * self.num_features

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return torch.cat([dense, pooled.flatten(1)], dim=1)
