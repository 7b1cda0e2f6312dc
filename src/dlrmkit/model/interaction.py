"""Feature interactions between the bottom-MLP output and the pooled embeddings."""

from __future__ import annotations

import torch
from torch import nn


class DotInteraction(nn.Module):
    """Pairwise dot products of the feature vectors (one batched matmul), keeping the lower
    triangle, concatenated after the bottom-MLP output: out = [x, tril(F F^T)]. Without numerical
    features (`has_dense=False`) the features are the pooled embeddings alone."""

    def __init__(self, num_features: int, self_interaction: bool = False, has_dense: bool = True):
        super().__init__()
        self.has_dense = has_dense
        rows, cols = torch.tril_indices(num_features, num_features, offset=0 if self_interaction else -1)
        self.register_buffer("flat_index", rows * num_features + cols, persistent=False)
        self.num_features = num_features

    @property
    def num_pairs(self) -> int:
        return int(self.flat_index.numel())

    def output_size(self, dim: int) -> int:
        return (dim if self.has_dense else 0) + self.num_pairs

    def forward(self, dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
        # dense [B, D] (or None), pooled [B, T, D] -> [B, D + pairs]
        feats = pooled if dense is None else torch.cat([dense.unsqueeze(1), pooled], dim=1)
        pairs = torch.bmm(feats, feats.transpose(1, 2)).flatten(1).index_select(1, self.flat_index)
        return pairs if dense is None else torch.cat([dense, pairs], dim=1)


class CatInteraction(nn.Module):
    """No interaction: the bottom-MLP output and all pooled embeddings, concatenated."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def output_size(self, dim: int) -> int:
        return dim * self.num_features

    def forward(self, dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.flatten(1) if dense is None else torch.cat([dense, pooled.flatten(1)], dim=1)
