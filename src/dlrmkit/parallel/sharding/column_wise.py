"""Column-wise ("vertical split"): a table cut into column slices of at least MIN_COLS columns
on different ranks; each slice is looked up for the global batch, and the receiving rank
concatenates slices. Lets N ranks share fewer than N large tables."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard, even_ranges

MIN_COLS = 4


def max_slices(dim: int) -> int:
    return max(1, dim // MIN_COLS)


def shards(rows: int, dim: int, ranks: list[int]) -> list[Shard]:
    """len(ranks) slices (at most dim // MIN_COLS), slice i on ranks[i]."""
    n = min(len(ranks), max_slices(dim))
    return [Shard(r, 0, rows, c0, c1) for r, (c0, c1) in zip(ranks[:n], even_ranges(dim, n))]
