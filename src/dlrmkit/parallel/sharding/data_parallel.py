"""Data-parallel tables: small tables replicated on every rank and looked up there for the local
batch, with no id or pooled exchange; their gradients are summed over ranks with the MLPs'
(bucketed all-reduce: ShardedEmbedding.replicated_parameters)."""

from __future__ import annotations

import torch
from torch import nn

from dlrmkit.model.embedding import FusedTable, Ids, JaggedIds, TablePiece, fused_pieces, select_tables
from dlrmkit.parallel.sharding import Shard, Strategy

MIN_ROWS_SHARDED = 2048  # auto plans replicate tables with fewer rows than this (and than the global batch)


class ReplicatedTables(nn.Module):
    """This rank's full copy of the replicated tables `tables`, fused in one weight."""

    def __init__(self, tables: list[int], table_sizes: list[int], dim: int):
        super().__init__()
        self.tables = list(tables)
        self.table = FusedTable([table_sizes[t] for t in tables], dim)
        self.register_buffer("cols", torch.tensor(self.tables, dtype=torch.int64), persistent=False)
        self.in_order = self.tables == list(range(len(self.tables)))  # tables 0..k-1: ids need no selection
        # where each pooled column goes in the flat [local batch, tables * dim] output
        target = [t * dim + c for t in self.tables for c in range(dim)]
        self.register_buffer("target", torch.tensor(target, dtype=torch.int64), persistent=False)

    def forward(self, local: Ids) -> torch.Tensor:
        """Pooled [local batch, len(tables), dim] of the local samples' ids of every table."""
        if isinstance(local, JaggedIds) and local.batch_size == 0:  # an empty slice of a short last batch
            return self.table(torch.zeros(0, len(self.tables), dtype=torch.int64, device=self.cols.device))
        count = local.num_tables if isinstance(local, JaggedIds) else local.shape[1]
        if self.in_order and count == len(self.tables):  # every table, in order: no selection
            return self.table(local.to(self.cols.device))
        if isinstance(local, JaggedIds):
            return self.table(select_tables(local, self.tables).to(self.cols.device))
        return self.table(local.to(self.cols.device).index_select(1, self.cols))

    @torch.no_grad()
    def init_tables(self, base: int) -> None:
        """The single-device init of these tables (base: EmbeddingCollection's base seed)."""
        self.table.init_tables(base, self.tables)

    def logical_shards(self) -> list[TablePiece]:
        """Each table whole, in this rank's weight (every rank holds the same)."""
        return fused_pieces(self.tables, self.table)


class DataParallel(Strategy):
    name = "data_parallel"
    model_parallel = False

    def shards(self, rows: int, dim: int, ranks: list[int]) -> list[Shard]:
        """One full copy per rank."""
        return [Shard(r, 0, rows, 0, dim) for r in ranks]

    def check(self, rows: int, dim: int, shards: list[Shard], world_size: int) -> str | None:
        if sorted(s.rank for s in shards) != list(range(world_size)) or any(
            (s.rows, s.cols) != (rows, dim) for s in shards
        ):
            return "a data_parallel table needs one full shard on every rank"
        return None

    def local_lookup(self, tables: list[int], table_sizes: list[int], dim: int) -> ReplicatedTables:
        return ReplicatedTables(tables, table_sizes, dim)


STRATEGY = DataParallel()
