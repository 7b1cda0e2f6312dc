"""Sharding strategies, one per file. Each says how a table is cut into shards; how ids reach
a shard and how its pooled output returns is common to all (dlrmkit.parallel.sharded_embedding):
ids of the global batch go to every shard of their table (to a row range only the ids in it),
shards look up their rows/columns, and the receiving rank adds shard outputs into
[local batch, table, columns]: concatenation for column slices, a sum for row ranges."""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("data_parallel", "table_wise", "column_wise", "row_wise")


@dataclass(frozen=True)
class Shard:
    """Rows [row_start, row_end) and columns [col_start, col_end) of a table, held by `rank`."""

    rank: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


def even_ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous ranges covering [0, total), sizes differing by at most one."""
    base, extra = divmod(total, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out
