"""The planner's cost model, apart from its partitioning (dlrmkit.parallel.plan): what a shard
costs the rank holding it in memory, and what each rank does per step (lookups, bytes sent).
The planner sizes and places shards with these figures; `dlrmkit plan` prints them per rank,
and the trainer compares the memory figure with what it holds (TrainerParallel.held_bytes).

Memory counts weights, the tables' optimizer state (values per weight value) and the per-step
buffers of a shard (pooled output and its gradient for the batch it looks up, and its ids).
Bytes sent count the id all-to-all, the pooled all-to-all forward and backward, and the
all-reduce of replicated tables; the MLPs' all-reduce is the same on every plan and left out.
A multi-hot table (`bag` ids per sample, MLPerf DCNv2's 1..100) looks up and sends `bag` ids per
sample, plus one bag length per sample (the id exchange's general path), and buffers them."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit.parallel.dist import batch_split
from dlrmkit.parallel.sharding import Shard, strategy as strategy_named

ID_BYTES = 8  # an id on the wire and in a shard's id buffer (int64)
# replicated tables fused in a weight of more rows than this exchange the rows their lookups
# touched, not a dense gradient (parallel/replica_grads.py): Criteo Kaggle's 3,187 small-table
# rows stay dense, a whole replicated model travels as its lookups
DENSE_REPLICA_ROWS = 65536


@dataclass
class TablePlan:
    """One table's place in a plan: its shape, its strategy and its shards (what costs are of)."""

    rows: int
    dim: int
    strategy: str
    shards: list[Shard]
    bag: int = 1  # ids per sample (a multi-hot table's fixed bag size)

    @property
    def model_parallel(self) -> bool:
        return strategy_named(self.strategy).model_parallel


@dataclass(frozen=True)
class CostModel:
    """Costs for a global batch of `batch_size`, weights of `bytes_per_value` bytes, and
    `optimizer_state` optimizer values per weight value (sgd 0, adagrad 1, row-wise adagrad 1/dim)."""

    batch_size: int
    bytes_per_value: int = 4
    optimizer_state: float = 0

    def weight_bytes(self, rows: int, cols: int) -> float:
        """Weights and optimizer state of a rows x cols block (not rounded: sizes compared)."""
        return rows * cols * self.bytes_per_value * (1 + self.optimizer_state)

    def step_buffers(self, cols: int) -> int:
        """Per-step buffers of a shard `cols` wide: pooled output and its gradient, and its ids."""
        return self.batch_size * (2 * cols * self.bytes_per_value + ID_BYTES)

    def shard_memory(self, s: Shard) -> int:
        """Bytes a rank holds for shard `s`: weights, optimizer state and per-step buffers."""
        b, cols = self.bytes_per_value, s.cols  # called per shard, several times: kept to one call
        return int(s.rows * cols * b * (1 + self.optimizer_state)) + self.batch_size * (2 * cols * b + ID_BYTES)

    def replica_sync_bytes(self, rows: int, dim: int, world_size: int) -> int:
        """Bytes a rank sends to all-reduce a replicated table's gradient (ring algorithm)."""
        return int(2 * (world_size - 1) / world_size * rows * dim * self.bytes_per_value) if world_size > 1 else 0

    def replica_lookup_bytes(self, local: int, bag: int, dim: int, world_size: int) -> int:
        """Bytes a rank sends to exchange a replicated table's lookups instead, to every other rank
        (parallel/replica_grads.py): for its `local` samples, one gradient row per bag, and per id
        its row id, plus its bag when bags hold several ids."""
        ids = local * bag
        return (local * dim * self.bytes_per_value + ids * (8 if bag == 1 else 16)) * (world_size - 1)

    @staticmethod
    def shard_lookups(tp: TablePlan, s: Shard, batch: int) -> int:
        """Ids shard `s` of table `tp` looks up per step for `batch` samples: `bag` per sample, times
        the shard's share of the table's rows (a row range receives only the ids inside it: ids
        spread evenly over rows, as uniform ids do)."""
        return batch * tp.bag * s.rows // tp.rows

    def lookup_bytes(self, tp: TablePlan, s: Shard, batch: int) -> int:
        """Bytes of table rows shard `s` reads per step (its lookups at its width): the work the
        planner balances beside memory."""
        return self.shard_lookups(tp, s, batch) * s.cols * self.bytes_per_value

    def rank_stats(self, world_size: int, tables: list[TablePlan]) -> list[dict]:
        """Per rank: its shards [(table, Shard)], memory, lookups, bytes of table rows read
        (`lookup_bytes`) and bytes sent per step. A model-parallel shard looks up the global
        batch's ids in its rows and sends its pooled columns to the other ranks' samples (and
        receives theirs, and their ids, for its own samples); a replica looks up the local batch
        and all-reduces its gradient (or, in a large replicated weight, sends its lookups'
        gradient rows)."""
        n, g, b = world_size, self.batch_size, self.bytes_per_value
        local = batch_split(g, n)
        stats = [dict(rank=r, shards=[], memory=0, lookups=0, lookup_bytes=0, sent_bytes=0) for r in range(n)]
        widths = [0] * n  # pooled columns each rank sends
        id_rows: list[dict[int, set[tuple[int, int]]]] = [{} for _ in range(n)]  # row ranges whose ids a rank takes
        exchanged = sum(tp.rows for tp in tables if not tp.model_parallel) > DENSE_REPLICA_ROWS
        jagged = any(tp.bag != 1 for tp in tables)  # bags travel with their lengths
        for t, tp in enumerate(tables):
            model_parallel = tp.model_parallel
            for s in tp.shards:
                st = stats[s.rank]
                st["shards"].append((t, s))
                st["memory"] += self.shard_memory(s) + (tp.bag - 1) * g * ID_BYTES  # a bag's ids buffered
                batch = g if model_parallel else local[s.rank]
                st["lookups"] += self.shard_lookups(tp, s, batch)
                st["lookup_bytes"] += self.lookup_bytes(tp, s, batch)
                if model_parallel:
                    widths[s.rank] += s.cols
                    id_rows[s.rank].setdefault(t, set()).add((s.row_start, s.row_end))
                else:
                    st["sent_bytes"] += (
                        self.replica_lookup_bytes(local[s.rank], tp.bag, tp.dim, n)
                        if exchanged
                        else self.replica_sync_bytes(tp.rows, tp.dim, n)
                    )
        # ids each rank's tables take per sample (one per table one-hot; bag + its length multi-hot),
        # a row range only the ids inside it (column slices of one range share them)
        per_sample = [
            sum(
                tables[t].bag * sum(e - a for a, e in ranges) / tables[t].rows + int(jagged)
                for t, ranges in c.items()
            )
            for c in id_rows
        ]
        total_w, total_ids = sum(widths), sum(per_sample)  # O(ranks), not O(ranks^2)
        for r, st in enumerate(stats):
            others_w = total_w - widths[r]
            others_ids = total_ids - per_sample[r]
            st["sent_bytes"] += int(
                (g - local[r]) * widths[r] * b + local[r] * others_w * b + round(local[r] * others_ids * ID_BYTES)
            )
        return stats
