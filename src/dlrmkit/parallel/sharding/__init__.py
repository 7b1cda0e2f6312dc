"""Sharding strategies, one per module of this package, each a `Strategy` (the module's
`STRATEGY`) holding what makes it different: how the planner cuts a table (`split_count`,
`shards`, `check`), which ids a shard receives (`buckets`, `select_ids`), where its pooled
columns land in the [local batch, table, dim] output (`columns`), and, for a strategy that is
not model-parallel, the lookup done where the samples are (`local_lookup`). What all share, the
id all-to-all, the lookups, the pooled all-to-all and adding every shard's columns into the
output, is dlrmkit.parallel.sharded_embedding's; the planner's policy (which strategy a table
gets under `auto`) is dlrmkit.parallel.plan's.

A new strategy is a module here defining STRATEGY, with its name in STRATEGIES (the only names
`strategy` loads: a plan file names strategies, and a file never chooses what is imported).
This package's own module imports no torch, so option parsers can list STRATEGIES cheaply."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

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


class Strategy:
    """The defaults are a model-parallel strategy whose shards hold whole row ranges of ids they
    receive unchanged (every id of the table for the global batch) and whose pooled columns
    land at their own columns of the table."""

    name = ""
    model_parallel = True  # False: every rank looks its tables up for its own samples (local_lookup)

    # ---- planning -------------------------------------------------------------------------
    def split_count(self, rows: int, dim: int, world_size: int) -> int:
        """Shards of a table when every table takes this strategy (`--sharding NAME`)."""
        return 1

    def shards(self, rows: int, dim: int, ranks: list[int]) -> list[Shard]:
        """A rows x dim table cut into shards, shard i on ranks[i] (placement moves them later)."""
        raise NotImplementedError

    def check(self, rows: int, dim: int, shards: list[Shard], world_size: int) -> str | None:
        """Why `shards` are not a layout of this strategy, or None (ShardingPlan.validate also
        checks that a model-parallel table's shards tile it exactly once)."""
        return None

    # ---- ids -------------------------------------------------------------------------------
    def buckets(self, row_start: int, row_end: int, rows: int) -> bool:
        """Whether the shards of rows [row_start, row_end) receive only some of each bag's ids,
        so bag lengths travel with them (the sharded module's general, jagged path)."""
        return False

    def select_ids(
        self, values: Any, lengths: Any, one_hot: bool, row_start: int, row_end: int, rows: int
    ) -> tuple[Any, Any]:
        """(ids, bag lengths [B]) that the shards of rows [row_start, row_end) receive from bags
        `values`, `lengths` of one table (ids relative to row_start; `one_hot`: one id per bag)."""
        return values, lengths

    # ---- output ----------------------------------------------------------------------------
    def columns(self, table: int, shard: Shard, dim: int) -> range:
        """Columns of the flat [local batch, tables * dim] output that `shard`'s pooled columns
        are added to: shards of distinct columns sit side by side, shards of the same sum."""
        return range(table * dim + shard.col_start, table * dim + shard.col_end)

    def local_lookup(self, tables: list[int], table_sizes: list[int], dim: int) -> Any:
        """For a strategy that is not model-parallel: the module that looks `tables` up for the
        local batch (see data_parallel.ReplicatedTables for what it provides)."""
        raise NotImplementedError(f"{self.name} is model-parallel")


@functools.cache  # a lookup of modules already imported (sys.modules): planning asks per shard
def strategy(name: str) -> Strategy:
    """The strategy called `name` (one of STRATEGIES)."""
    if name not in STRATEGIES:
        raise KeyError(f"unknown sharding strategy '{name}'")
    return importlib.import_module(f"{__name__}.{name}").STRATEGY
