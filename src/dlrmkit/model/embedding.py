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

    def sample_major(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, offsets) reordered so bag (b, t) comes at position b*T + t: a lookup in this
        order yields [B, T, dim] contiguously, with no transpose or copy of the pooled rows."""
        b, t = self.batch_size, self.num_tables
        lengths = self.offsets.diff()
        new_lengths = lengths.view(t, b).t().reshape(-1)
        new_offsets = torch.zeros(b * t + 1, dtype=torch.int64)
        torch.cumsum(new_lengths, 0, out=new_offsets[1:])
        # destination bag of each source bag (table-major k = t*B + b -> b*T + t)
        dest_bag = torch.arange(b * t).view(b, t).t().reshape(-1)
        shift = torch.repeat_interleave(new_offsets[:-1].index_select(0, dest_bag) - self.offsets[:-1], lengths)
        positions = torch.arange(len(self.values)) + shift
        values = torch.empty_like(self.values)
        values[positions] = self.values
        return values, new_offsets

    def table_lengths(self) -> torch.Tensor:
        """Number of ids per table, [T]."""
        bounds = self.offsets[:: self.batch_size]
        return bounds[1:] - bounds[:-1]


Ids = torch.Tensor | JaggedIds  # [B, T] one-hot ids, or multi-hot jagged ids


class PooledLookup(torch.autograd.Function):
    """Sum-pooled lookup whose weight gradient is sparse and sorted by row: one gradient row per
    lookup, ordered by id, so the optimizer's scatter walks the table in order (2x faster than
    random order on a large table, measured in docs/BENCHMARKS.md)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(values, offsets)
        ctx.weight_shape = weight.shape
        return F.embedding_bag(values, weight, offsets[:-1], mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        values, offsets = ctx.saved_tensors
        rows, order = values.sort()
        bags = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
        grad_rows = grad.index_select(0, bags.index_select(0, order))
        weight_grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad_rows, ctx.weight_shape, check_invariants=False)
        return weight_grad, None, None


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
        values, offsets = ids.sample_major()
        num_tables = len(self.table_sizes)
        bag_tables = self.row_offsets.repeat(ids.batch_size)  # row offset of bag (b, t)
        fused = values + torch.repeat_interleave(bag_tables, offsets.diff())
        return PooledLookup.apply(self.weight, fused, offsets).view(ids.batch_size, num_tables, self.dim)


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
