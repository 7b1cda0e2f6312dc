"""Table-wise: a whole table on one rank, looked up for the global batch."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard


def shards(rows: int, dim: int, rank: int) -> list[Shard]:
    return [Shard(rank, 0, rows, 0, dim)]
