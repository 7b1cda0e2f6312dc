"""Table-wise: a whole table on one rank, looked up there for the global batch; its ids travel
unchanged and its pooled columns land as they are."""

from __future__ import annotations

from dlrmkit.parallel.sharding import Shard, Strategy


class TableWise(Strategy):
    name = "table_wise"

    def shards(self, rows: int, dim: int, ranks: list[int]) -> list[Shard]:
        return [Shard(ranks[0], 0, rows, 0, dim)]

    def check(self, rows: int, dim: int, shards: list[Shard], world_size: int) -> str | None:
        if len(shards) != 1:
            return (
                "a table_wise table is one shard holding all of it (column slices: column_wise, row ranges: row_wise)"
            )
        return None


STRATEGY = TableWise()
