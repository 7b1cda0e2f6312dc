"""Data-parallel tables: small tables replicated on every rank, looked up on the local batch;
their gradients are summed over ranks with the MLPs' (bucketed all-reduce)."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard

MIN_ROWS_SHARDED = 2048  # auto plans replicate tables with fewer rows than this


def shards(rows: int, dim: int, world_size: int) -> list[Shard]:
    """One full copy per rank."""
    return [Shard(r, 0, rows, 0, dim) for r in range(world_size)]
