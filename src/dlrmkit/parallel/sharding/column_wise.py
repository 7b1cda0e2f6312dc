"""Column-wise ("vertical split"): a table cut into column slices of at least MIN_COLS columns
on different ranks. Every slice holds all rows, so the slices of a table receive the same ids
(sent once to a rank holding several); each is looked up for the global batch, and the receiving
rank places the slices side by side (their own columns, Strategy.columns). Lets N ranks share
fewer than N large tables."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard, Strategy, even_ranges

MIN_COLS = 4


def max_slices(dim: int) -> int:
    return max(1, dim // MIN_COLS)


class ColumnWise(Strategy):
    name = "column_wise"

    def split_count(self, rows: int, dim: int, world_size: int) -> int:
        return min(world_size, max_slices(dim))

    def shards(self, rows: int, dim: int, ranks: list[int]) -> list[Shard]:
        """len(ranks) slices (at most dim // MIN_COLS), slice i on ranks[i]."""
        n = min(len(ranks), max_slices(dim))
        return [Shard(r, 0, rows, c0, c1) for r, (c0, c1) in zip(ranks[:n], even_ranges(dim, n))]

    def check(self, rows: int, dim: int, shards: list[Shard], world_size: int) -> str | None:
        if any(s.rows != rows for s in shards):
            return "a column_wise table's shards each hold all its rows (row ranges: row_wise)"
        return None


STRATEGY = ColumnWise()
