"""Row-wise: a table cut into row ranges. Every range owner sees the table's ids for the global
batch, looks up those in its range and contributes zero for the rest; the receiving rank sums
the partial results. The sum happens after one all-to-all (gloo has no reduce-scatter)."""

from __future__ import annotations

import torch

from dlrmkit.parallel.sharding import Shard, even_ranges


def shards(rows: int, dim: int, ranks: list[int]) -> list[Shard]:
    """One non-empty row range per rank (fewer when the table has fewer rows than ranks)."""
    n = max(1, min(len(ranks), rows))
    return [Shard(r, a, b, 0, dim) for r, (a, b) in zip(ranks[:n], even_ranges(rows, n))]


def local_ids(ids: torch.Tensor, row_start: int, row_end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids relative to the range, clamped to a valid row; 1.0/0.0 mask of ids in range)."""
    inside = (ids >= row_start) & (ids < row_end)
    local = torch.where(inside, ids - row_start, torch.zeros_like(ids))
    return local, inside.to(torch.float32)
