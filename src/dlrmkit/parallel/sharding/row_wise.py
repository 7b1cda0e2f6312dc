"""Row-wise: a table cut into row ranges (each range may also be cut into column slices, which
share its ids). Ids are bucketed: each range owner receives, for the global batch, only the ids
in its range, relative to its start, with bag lengths (a bag may fall in several ranges), and
returns partial pooled sums; the receiving rank adds the ranges' sums at the same columns. That
sum is a reduce-scatter built from one all-to-all (gloo has none); see
dlrmkit.parallel.sharded_embedding."""

from __future__ import annotations

import torch

from dlrmkit.parallel.sharding import Shard, Strategy, even_ranges


class RowWise(Strategy):
    name = "row_wise"

    def split_count(self, rows: int, dim: int, world_size: int) -> int:
        return max(1, min(world_size, rows))

    def shards(self, rows: int, dim: int, ranks: list[int]) -> list[Shard]:
        """One non-empty row range per rank (fewer when the table has fewer rows than ranks)."""
        n = max(1, min(len(ranks), rows))
        return [Shard(r, a, b, 0, dim) for r, (a, b) in zip(ranks[:n], even_ranges(rows, n))]

    def buckets(self, row_start: int, row_end: int, rows: int) -> bool:
        return row_start != 0 or row_end != rows

    def select_ids(
        self, values: torch.Tensor, lengths: torch.Tensor, one_hot: bool, row_start: int, row_end: int, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids in [row_start, row_end) and how many of them each bag holds (vectorized)."""
        if not self.buckets(row_start, row_end, rows):
            return values, lengths
        b = len(lengths)
        inside = (values >= row_start) & (values < row_end)
        bag = torch.arange(b) if one_hot else torch.repeat_interleave(torch.arange(b), lengths)
        return values[inside] - row_start, torch.bincount(bag[inside], minlength=b)


STRATEGY = RowWise()
