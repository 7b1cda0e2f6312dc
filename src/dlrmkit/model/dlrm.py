"""The DLRM, written once for one device. Parallel training swaps `embeddings` for a sharded
module with the same input and output (dlrmkit.parallel); nothing here knows about ranks."""

from __future__ import annotations

import torch
from torch import nn

from dlrmkit.model.config import ModelConfig  # noqa: F401  (re-exported: the model and its config)
from dlrmkit.model.embedding import EmbeddingCollection, Ids
from dlrmkit.model.fm import FMTerm
from dlrmkit.model.interaction import (
    CatInteraction,
    CrossInteraction,
    DotInteraction,
    ParallelCrossInteraction,
    cross_flops,
)
from dlrmkit.model.mlp import MLP


class DLRM(nn.Module):
    def __init__(self, cfg: ModelConfig, embedding_device: torch.device | str | None = None):
        """embedding_device "meta": tables without storage, for a caller that swaps in sharded
        embeddings before initializing (so no process ever allocates the whole model)."""
        super().__init__()
        cfg.check()
        self.cfg = cfg
        d = cfg.embedding_dim
        self.bottom_mlp = MLP(cfg.num_numerical, cfg.bottom_mlp, final_relu=True, dropout=cfg.dropout)
        self.embeddings = EmbeddingCollection(cfg.table_sizes, [cfg.table_dim] * len(cfg.table_sizes), embedding_device)
        # wide: the numerical features' first-order term (the ids' is the tables' last column)
        self.linear = nn.Linear(cfg.num_numerical, 1) if cfg.wide and cfg.num_numerical else None
        self.has_dense = cfg.num_numerical > 0
        num_features = len(cfg.table_sizes) + int(self.has_dense)
        if cfg.interaction == "dot":
            self.interaction: nn.Module = DotInteraction(num_features, cfg.self_interaction, self.has_dense)
        elif cfg.parallel_cross:
            # the top MLP's hidden layers run beside the cross network; its last layer reads both
            self.interaction = ParallelCrossInteraction(
                num_features, d, cfg.dcn_layers, cfg.dcn_rank, cfg.top_mlp[:-1], cfg.dropout
            )
        elif cfg.interaction == "dcn":
            self.interaction = CrossInteraction(num_features, d, cfg.dcn_layers, cfg.dcn_rank)
        else:
            self.interaction = CatInteraction(num_features)
        top = cfg.top_mlp[-1:] if cfg.parallel_cross else cfg.top_mlp
        self.top_mlp = MLP(self.interaction.output_size(d), top, final_relu=False, dropout=cfg.dropout)
        self.fm = FMTerm() if cfg.fm else None
        if cfg.numerical_mean is not None:  # from the config, not the state dict: a checkpoint's tensors stay as they were
            self.register_buffer("numerical_mean", torch.tensor(cfg.numerical_mean, dtype=torch.float32), persistent=False)
            self.register_buffer("numerical_std", torch.tensor(cfg.numerical_std, dtype=torch.float32), persistent=False)

    def reset_parameters(self, seed: int) -> None:
        """Deterministic initialization from `seed` (the same on every rank and world size)."""
        gen = torch.Generator().manual_seed(seed)
        self.bottom_mlp.reset_parameters(gen)
        self.top_mlp.reset_parameters(gen)
        self.embeddings.reset_parameters(gen)
        if self.cfg.embedding_init_scale != 1.0:  # element-wise: the same under any sharding
            with torch.no_grad():
                for p in self.embeddings.parameters():
                    p.mul_(self.cfg.embedding_init_scale)
        if self.linear is not None:
            with torch.no_grad():
                self.linear.weight.zero_()
                self.linear.bias.zero_()
        if self.fm is not None:
            self.fm.reset_parameters()
        # last: other models' draws stay as they were
        if isinstance(self.interaction, (CrossInteraction, ParallelCrossInteraction)):
            self.interaction.reset_parameters(gen)

    def forward(self, dense: torch.Tensor, ids: Ids) -> torch.Tensor:
        """Click logits [B] for numerical features [B, F] and categorical ids."""
        return self.score(dense, self.embeddings(ids))

    def score(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Click logits [B] for numerical features [B, F] and the pooled embeddings [B, T, table_dim]."""
        if self.cfg.numerical_transform == "signed-log":
            dense = signed_log(dense)
        if self.cfg.numerical_mean is not None:
            dense = (dense.float() - self.numerical_mean) / self.numerical_std
        emb = pooled[..., :-1] if self.cfg.wide else pooled
        out = None
        if self.cfg.deep:
            x = self.bottom_mlp(dense) if self.has_dense else None
            out = self.top_mlp(self.interaction(x, emb)).squeeze(1)
        if self.cfg.wide:
            first_order = pooled[..., -1].sum(1)
            if self.linear is not None:
                first_order = first_order + self.linear(dense).squeeze(1)
            out = first_order if out is None else out + first_order
        if self.fm is not None:
            out = self.fm(emb) if out is None else out + self.fm(emb)
        return out

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters trained with dense gradients (everything but the embedding tables)."""
        sparse = {id(p) for p in self.embeddings.parameters()}
        return [p for p in self.parameters() if id(p) not in sparse]


def signed_log(x: torch.Tensor) -> torch.Tensor:
    """sign(x) log(1 + |x|), NaN -> 0 and infinities (float16 overflow of raw counts) clamped."""
    x = torch.nan_to_num(x.float(), nan=0.0, posinf=65504.0, neginf=-65504.0)
    return torch.sign(x) * torch.log1p(x.abs())


def flops_per_sample(cfg: ModelConfig, backward: bool = True) -> int:
    """Multiply-add FLOPs of the MLPs and the interaction for one sample (x3 with backward)."""
    flops = mlp_flops([cfg.num_numerical] + cfg.bottom_mlp)
    has_dense = cfg.num_numerical > 0
    t = len(cfg.table_sizes) + int(has_dense)
    if cfg.interaction == "dot":
        flops += 2 * t * t * cfg.embedding_dim
        pairs = t * (t + 1) // 2 if cfg.self_interaction else t * (t - 1) // 2
        top_in = cfg.embedding_dim * int(has_dense) + pairs
    elif cfg.interaction == "dcn":
        top_in = cfg.embedding_dim * t
        flops += cross_flops(top_in, cfg.dcn_layers, cfg.dcn_rank)
    else:
        top_in = cfg.embedding_dim * t
    top = cfg.top_mlp
    if cfg.parallel_cross:  # the hidden layers beside the cross network
        hidden = [top_in] + top[:-1]
        flops += mlp_flops(hidden)
        top_in, top = top_in + hidden[-1], top[-1:]
    flops += mlp_flops([top_in] + top)
    return flops * (3 if backward else 1)


def mlp_flops(sizes: list[int]) -> int:
    """Multiply-add FLOPs of linear layers of these sizes (input first) on one sample."""
    return sum(2 * a * b for a, b in zip(sizes[:-1], sizes[1:]))
