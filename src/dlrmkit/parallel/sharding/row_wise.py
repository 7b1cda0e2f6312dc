"""Row-wise: a table cut into row ranges. Ids are bucketed: each range owner receives, for the
global batch, only the ids in its range (with bag lengths, as a bag may fall in several ranges),
and returns partial pooled sums that the receiving rank adds up. That sum is a reduce-scatter
built from one all-to-all (gloo has no reduce-scatter); see dlrmkit.parallel.sharded_embedding."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard, even_ranges


def shards(rows: int, dim: int, ranks: list[int]) -> list[Shard]:
    """One non-empty row range per rank (fewer when the table has fewer rows than ranks)."""
    n = max(1, min(len(ranks), rows))
    return [Shard(r, a, b, 0, dim) for r, (a, b) in zip(ranks[:n], even_ranges(rows, n))]
