"""The planner's cost model on its own: a shard's memory and each rank's lookups and bytes sent,
against figures worked out by hand."""

from __future__ import annotations

from dlrmkit.parallel.plan import ShardingPlan, TablePlan
from dlrmkit.parallel.plan_cost import CostModel
from dlrmkit.parallel.sharding import Shard


def test_shard_memory_counts_weights_state_and_step_buffers():
    cost = CostModel(batch_size=10, bytes_per_value=4, optimizer_state=1.0)
    # 100 x 8 weights with as much optimizer state (6,400 B), pooled output + gradient + ids per sample
    assert cost.shard_memory(Shard(0, 0, 100, 0, 8)) == 100 * 8 * 4 * 2 + 10 * (2 * 8 * 4 + 8)
    assert cost.weight_bytes(100, 8) == 6400
    # row-wise Adagrad's one value per row (1/dim per weight) is rounded down to whole bytes
    assert CostModel(3, 2, 1 / 3).shard_memory(Shard(1, 0, 1, 0, 3)) == int(1 * 3 * 2 * (1 + 1 / 3)) + 3 * (
        2 * 3 * 2 + 8
    )


def test_replica_sync_is_a_ring_all_reduce():
    cost = CostModel(batch_size=8)
    assert cost.replica_sync_bytes(10, 8, 1) == 0
    assert cost.replica_sync_bytes(10, 8, 2) == 10 * 8 * 4  # 2 (n-1)/n of the gradient
    assert cost.replica_sync_bytes(10, 8, 4) == int(1.5 * 10 * 8 * 4)


def test_rank_stats_by_hand():
    """Table 0 (1,000 x 8) whole on rank 0, table 1 (10 x 8) replicated, global batch 4 (2 per rank)."""
    tables = [
        TablePlan(1000, 8, "table_wise", [Shard(0, 0, 1000, 0, 8)]),
        TablePlan(10, 8, "data_parallel", [Shard(0, 0, 10, 0, 8), Shard(1, 0, 10, 0, 8)]),
    ]
    cost = CostModel(batch_size=4)
    stats = cost.rank_stats(2, tables)
    replica = 10 * 8 * 4 + 4 * (2 * 8 * 4 + 8)
    assert [s["memory"] for s in stats] == [1000 * 8 * 4 + 4 * (2 * 8 * 4 + 8) + replica, replica]
    assert [s["lookups"] for s in stats] == [4 + 2, 2]  # the global batch for the shard, the local one per replica
    # rank 0: replica all-reduce 320 B + its pooled columns for rank 1's 2 samples (2 x 8 x 4 B);
    # rank 1: 320 B + its 2 samples' ids for table 0 (2 x 8 B) + the pooled gradient back (2 x 8 x 4 B)
    assert [s["sent_bytes"] for s in stats] == [320 + 64, 320 + 64 + 16]
    assert [[t for t, _ in s["shards"]] for s in stats] == [[0, 1], [1]]
    plan = ShardingPlan(2, tables, batch_size=4)
    assert plan.rank_stats() == stats and plan.cost == cost
