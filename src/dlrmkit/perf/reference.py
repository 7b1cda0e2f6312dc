"""The plain-PyTorch baseline `dlrmkit bench --reference` measures side by side: what a user
writes without dlrmkit. One nn.EmbeddingBag(sparse=True) per table, torch.optim.SGD over sparse
and dense parameters, nn.Linear MLPs, the dot interaction, fp32. Same shapes, same batches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlrmkit.model.dlrm import ModelConfig


def _mlp(sizes: list[int], final_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or final_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class ReferenceDLRM(nn.Module):
    """The facebookresearch/dlrm structure: per-table EmbeddingBag, bottom/top nn.Linear MLPs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.embedding_dim
        self.bottom = _mlp([cfg.num_numerical] + cfg.bottom_mlp, final_relu=True)
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, d, mode="sum", sparse=True) for n in cfg.table_sizes)
        t = len(cfg.table_sizes) + 1
        rows, cols = torch.tril_indices(t, t, offset=-1)
        self.register_buffer("li", rows, persistent=False)
        self.register_buffer("lj", cols, persistent=False)
        self.top = _mlp([d + len(rows)] + cfg.top_mlp, final_relu=False)

    def forward(self, dense: torch.Tensor, values: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        feats = torch.stack([x] + [emb(v, o) for emb, v, o in zip(self.tables, values, offsets)], dim=1)
        z = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


def per_table(ids) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Table-major JaggedIds -> per table (values, bag offsets), as a plain loop would feed them."""
    b = ids.batch_size
    bounds = ids.offsets[::b].tolist()
    values, offsets = [], []
    for t in range(ids.num_tables):
        lo, hi = bounds[t], bounds[t + 1]
        values.append(ids.values[lo:hi])
        offsets.append(ids.offsets[t * b : (t + 1) * b] - lo)
    return values, offsets


def reference_step_fn(cfg: ModelConfig, lr: float, seed: int):
    """(step(batch), model): one fp32 SGD step of the reference model on a RandomBatch. The
    per-table split of the ids is done up front per batch object, outside the timed step."""
    if cfg.interaction != "dot" or cfg.num_numerical == 0:
        raise ValueError("the reference loop covers the dot interaction with numerical features")
    torch.manual_seed(seed)
    model = ReferenceDLRM(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    cache: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def step(batch) -> None:
        key = id(batch.ids)
        if key not in cache:
            cache[key] = per_table(batch.ids)
        values, offsets = cache[key]
        loss = F.binary_cross_entropy_with_logits(model(batch.dense, values, offsets), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, model
