"""Embedding tables, fused by width: all tables of one width live in one weight matrix with
row offsets, so a forward pass does one lookup per width instead of one per table.

Gradients are sparse (one row per lookup, never a dense [rows, dim] tensor); the sparse
optimizers in dlrmkit.optim apply them to the touched rows only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class JaggedIds:
    """Multi-hot ids, table-major (torchrec's KeyedJaggedTensor layout without the keys):
    the bag of table t, sample b is values[offsets[t*B + b] : offsets[t*B + b + 1]]."""

    values: torch.Tensor  # int64 [nnz]
    offsets: torch.Tensor  # int64 [T*B + 1]
    batch_size: int

    @classmethod
    def from_dense(cls, ids: torch.Tensor) -> "JaggedIds":
        """One id per (sample, table) from a [B, T] tensor."""
        b, t = ids.shape
        return cls(ids.t().reshape(-1), torch.arange(b * t + 1, dtype=torch.int64), b)

    @property
    def num_tables(self) -> int:
        return (len(self.offsets) - 1) // self.batch_size

    def table_lengths(self) -> torch.Tensor:
        """Number of ids per table, [T]."""
        bounds = self.offsets[:: self.batch_size]
        return bounds[1:] - bounds[:-1]


Ids = torch.Tensor | JaggedIds  # [B, T] one-hot ids, or multi-hot jagged ids


class FusedTable(nn.Module):
    """Tables of one width in one [sum(rows), dim] weight; `row_offsets` maps table-local ids."""

    def __init__(self, table_sizes: list[int], dim: int):
        super().__init__()
        self.table_sizes, self.dim = list(table_sizes), dim
        offsets = torch.tensor([0] + table_sizes, dtype=torch.int64).cumsum(0)
        self.register_buffer("row_offsets", offsets[:-1].clone(), persistent=False)
        self.weight = nn.Parameter(torch.empty(int(offsets[-1]), dim))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """Each table uniform in +-sqrt(1/rows), as the DLRM reference initializes it."""
        for offset, rows in zip(self.row_offsets.tolist(), self.table_sizes):
            bound = math.sqrt(1.0 / rows)
            self.weight[offset : offset + rows].uniform_(-bound, bound, generator=generator)

    def forward(self, ids: Ids) -> torch.Tensor:
        """Pooled (sum) embeddings [B, T, dim] of these tables."""
        if isinstance(ids, torch.Tensor):
            return F.embedding(ids + self.row_offsets, self.weight, sparse=True)
        fused = ids.values + torch.repeat_interleave(self.row_offsets, ids.table_lengths())
        pooled = F.embedding_bag(fused, self.weight, ids.offsets[:-1], mode="sum", sparse=True)
        return pooled.view(-1, ids.batch_size, self.dim).transpose(0, 1)


def select_tables(ids: Ids, tables: list[int]) -> Ids:
    """The ids of a subset of tables, in the given order."""
    if isinstance(ids, torch.Tensor):
        return ids[:, tables]
    b = ids.batch_size
    starts, ends = ids.offsets[:-1].view(-1, b), ids.offsets[1:].view(-1, b)
    pieces, lengths = [], []
    for t in tables:
        lo, hi = int(starts[t, 0]), int(ends[t, -1])
        pieces.append(ids.values[lo:hi])
        lengths.append(ends[t] - starts[t])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(lengths).cumsum(0)])
    return JaggedIds(torch.cat(pieces), offsets, b)


class EmbeddingCollection(nn.Module):
    """All categorical tables of a model. forward(ids) -> [B, T, dim] when every table has the
    same width (what the dot interaction needs), else the concatenation [B, sum(dims)]."""

    def __init__(self, table_sizes: list[int], dims: list[int]):
        super().__init__()
        if len(table_sizes) != len(dims):
            raise ValueError("one dim per table is needed")
        self.table_sizes, self.dims = list(table_sizes), list(dims)
        widths = sorted(set(dims))
        self.groups = [[t for t, d in enumerate(dims) if d == w] for w in widths]
        self.tables = nn.ModuleList(
            FusedTable([table_sizes[t] for t in group], w) for group, w in zip(self.groups, widths)
        )

    @property
    def uniform(self) -> bool:
        return len(self.groups) == 1

    def reset_parameters(self, generator: torch.Generator) -> None:
        for table in self.tables:
            table.reset_parameters(generator)

    def forward(self, ids: Ids) -> torch.Tensor:
        if self.uniform:
            return self.tables[0](ids)
        outputs: list[torch.Tensor | None] = [None] * len(self.dims)
        for group, table in zip(self.groups, self.tables):
            pooled = table(select_tables(ids, group))
            for i, t in enumerate(group):
                outputs[t] = pooled[:, i]
        return torch.cat(outputs, dim=1)  # type: ignore[arg-type]
