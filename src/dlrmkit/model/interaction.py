"""Feature interactions between the bottom-MLP output and the pooled embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlrmkit.model.mlp import MLP, normal_


class PairDots(torch.autograd.Function):
    """tril(F F^T) with a one-GEMM backward. Autograd's backward of bmm(F, F^T) runs two bmms with
    transposed operands (F^T G and G F) and adds them; since F F^T is symmetric, the gradient is
    (G + G^T) F: the pair gradients are scattered to both triangles, then one bmm (what it saves a
    step: docs/BENCHMARKS.md)."""

    @staticmethod
    def forward(ctx, feats: torch.Tensor, flat_index: torch.Tensor, both_index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(feats, both_index)
        return torch.bmm(feats, feats.transpose(1, 2)).flatten(1).index_select(1, flat_index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        feats, both_index = ctx.saved_tensors
        b, t, _ = feats.shape
        # a diagonal pair (self-interaction) lands twice on its cell: d(x.x)/dx = 2x, as wanted
        sym = grad.new_zeros(b, t * t).index_add_(1, both_index, torch.cat([grad, grad], dim=1))
        # under autocast forward's bmm ran in the grad's dtype (bf16); so does this one, and the
        # gradient goes back in the input's dtype, as autocast's cast would return it
        return torch.bmm(sym.view(b, t, t), feats.to(sym.dtype)).to(feats.dtype), None, None


class DotInteraction(nn.Module):
    """Pairwise dot products of the feature vectors (one batched matmul), keeping the lower
    triangle, concatenated after the bottom-MLP output: out = [x, tril(F F^T)]. Without numerical
    features (`has_dense=False`) the features are the pooled embeddings alone."""

    def __init__(self, num_features: int, self_interaction: bool = False, has_dense: bool = True):
        super().__init__()
        self.has_dense = has_dense
        rows, cols = torch.tril_indices(num_features, num_features, offset=0 if self_interaction else -1)
        self.register_buffer("flat_index", rows * num_features + cols, persistent=False)
        # each pair's cell and its mirror, for PairDots' backward
        self.register_buffer(
            "both_index", torch.cat([rows * num_features + cols, cols * num_features + rows]), persistent=False
        )
        self.num_features = num_features

    @property
    def num_pairs(self) -> int:
        return int(self.flat_index.numel())

    def output_size(self, dim: int) -> int:
        return (dim if self.has_dense else 0) + self.num_pairs

    def forward(self, dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
        # dense [B, D] (or None), pooled [B, T, D] -> [B, D + pairs]
        feats = pooled if dense is None else torch.cat([dense.unsqueeze(1), pooled], dim=1)
        if feats.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing():
            pairs = PairDots.apply(feats, self.flat_index, self.both_index)
        else:  # inference and exports (TorchScript/ONNX tracing cannot record a Python autograd.Function)
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
        return concat_features(dense, pooled)


class CrossInteraction(nn.Module):
    """DCNv2's cross network (Wang et al. 2021; torchrec's CrossNet / LowRankCrossNet) over the
    concatenation x_0 = [bottom-MLP output, pooled embeddings]: layer by layer
    x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l, with V_l [rank, n] and U_l [n, rank], or one
    full [n, n] matrix W_l when `rank` is None. The output keeps x_0's width, n = dim x features."""

    def __init__(self, num_features: int, dim: int, layers: int, rank: int | None = None):
        super().__init__()
        self.num_features, self.rank = num_features, rank
        n = num_features * dim
        if rank is None:
            self.W = nn.ParameterList(nn.Parameter(torch.empty(n, n)) for _ in range(layers))
        else:
            self.V = nn.ParameterList(nn.Parameter(torch.empty(rank, n)) for _ in range(layers))
            self.U = nn.ParameterList(nn.Parameter(torch.empty(n, rank)) for _ in range(layers))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(n)) for _ in range(layers))
        self.layers = layers

    def output_size(self, dim: int) -> int:
        return dim * self.num_features

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """torchrec's initialization: Xavier-normal matrices, zero biases."""
        mats = list(self.W) if self.rank is None else [m for pair in zip(self.V, self.U) for m in pair]
        for m in mats:
            fan_out, fan_in = m.shape
            normal_(m, (2.0 / (fan_in + fan_out)) ** 0.5, generator)
        for b in self.bias:
            b.zero_()

    def forward(self, dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
        # dense [B, D] (or None), pooled [B, T, D] -> [B, (T + 1) D]
        return self.apply_layers(concat_features(dense, pooled))

    def apply_layers(self, x0: torch.Tensor) -> torch.Tensor:
        """The layers on x_0 [B, n] -> [B, n]."""
        x = x0
        for i in range(self.layers):
            if self.rank is None:
                mixed = F.linear(x, self.W[i], self.bias[i])
            else:
                mixed = F.linear(F.linear(x, self.V[i]), self.U[i], self.bias[i])
            x = x0 * mixed + x
        return x


class ParallelCrossInteraction(nn.Module):
    """DCNv2's parallel structure (Wang et al. 2021, FuxiCTR's DCNv2 `parallel`): the cross network
    and an MLP both read x_0 = [bottom-MLP output, pooled embeddings], and their outputs are
    concatenated for the layer that makes the logit. The DLRM gives this MLP its top MLP's hidden
    sizes, so the top MLP keeps only its last layer."""

    def __init__(self, num_features: int, dim: int, layers: int, rank: int | None, hidden: list[int], dropout: float):
        super().__init__()
        self.cross = CrossInteraction(num_features, dim, layers, rank)
        self.mlp = MLP(num_features * dim, hidden, final_relu=True, dropout=dropout)

    def output_size(self, dim: int) -> int:
        width = self.cross.output_size(dim)  # x_0's, which an MLP without hidden layers passes on
        return width + next((m.out_features for m in reversed(self.mlp) if isinstance(m, nn.Linear)), width)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        self.cross.reset_parameters(generator)
        self.mlp.reset_parameters(generator)

    def forward(self, dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
        x0 = concat_features(dense, pooled)
        return torch.cat([self.cross.apply_layers(x0), self.mlp(x0)], dim=1)


def concat_features(dense: torch.Tensor | None, pooled: torch.Tensor) -> torch.Tensor:
    """x_0 = [bottom-MLP output, pooled embeddings flattened]: [B, (T + 1) D] (the embeddings alone
    without numerical features)."""
    return pooled.flatten(1) if dense is None else torch.cat([dense, pooled.flatten(1)], dim=1)


def cross_flops(width: int, layers: int, rank: int | None) -> int:
    """Multiply-add FLOPs of a cross network on one sample (forward)."""
    per_layer = 2 * width * width if rank is None else 4 * width * rank
    return layers * (per_layer + 3 * width)
