"""ShardingPlan: for each table its strategy and its shards (rank, rows, columns). It is data:
printed as a report, saved as JSON, edited by hand and reloaded; training and checkpointing
obey it. The greedy planner balances memory over ranks (largest shard first onto the emptiest
rank, as NVIDIA's DLRM places tables) and splits tables that do not fit or would leave ranks idle.

Contract for other modules: `plan.tables[t].shards` lists Shard(rank, row_start, row_end,
col_start, col_end); model-parallel shards of a table tile [0, rows) x [0, dim) exactly once;
data-parallel tables have one full-size shard on every rank (identical replicas)."""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from dlrmkit.data.synthetic_shapes import KAGGLE_TABLE_SIZES
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.plan_cost import CostModel, TablePlan
from dlrmkit.parallel.plan_file import MAX_PLAN_BYTES, MAX_SHARDS, plan_fields
from dlrmkit.parallel.sharding import STRATEGIES, Shard, column_wise, data_parallel, strategy as strategy_named

GiB = 1 << 30


@dataclass
class ShardingPlan:
    world_size: int
    tables: list[TablePlan]
    batch_size: int = 65536
    device_memory: int | None = None  # bytes per rank the plan was made for
    bytes_per_value: int = 4
    optimizer_state: float = 0  # optimizer values per weight value (sgd 0, adagrad 1, row-wise adagrad 1/dim)
    notes: list[str] = field(default_factory=list)

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> "ShardingPlan":
        """A plan from its JSON form, every field checked (dlrmkit.parallel.plan_file), then validated."""
        plan = cls(**plan_fields(d, source))
        plan.validate(source)
        return plan

    def save(self, path: str) -> None:
        from dlrmkit.atomic_io import write_json

        write_json(path, self.to_dict(), indent=1)

    @classmethod
    def load(cls, path: str) -> "ShardingPlan":
        """A plan file, read as untrusted: a regular file of bounded size, strict JSON."""
        from dlrmkit.untrusted import load_json

        return cls.from_dict(load_json(path, "sharding plan", MAX_PLAN_BYTES), path)

    def validate(self, source: str = "plan") -> None:
        """Every model-parallel table tiled exactly once, every table's shards a layout of its
        strategy (Strategy.check: e.g. replicas full and on every rank)."""
        for t, tp in enumerate(self.tables):
            where = f"{source}: table {t}"
            if tp.strategy not in STRATEGIES:
                raise DlrmkitError(f"{where}: unknown strategy '{tp.strategy}' (choose {', '.join(STRATEGIES)})")
            for s in tp.shards:
                if not (0 <= s.rank < self.world_size):
                    raise DlrmkitError(f"{where}: shard on rank {s.rank}, outside world size {self.world_size}")
                if not (0 <= s.row_start < s.row_end <= tp.rows and 0 <= s.col_start < s.col_end <= tp.dim):
                    raise DlrmkitError(f"{where}: shard {s} outside the table's {tp.rows} rows x {tp.dim} columns")
            if tp.model_parallel and (
                sum(s.rows * s.cols for s in tp.shards) != tp.rows * tp.dim or not _disjoint(tp.shards)
            ):
                raise DlrmkitError(f"{where}: shards do not cover its {tp.rows} x {tp.dim} entries exactly once")
            problem = strategy_named(tp.strategy).check(tp.rows, tp.dim, tp.shards, self.world_size)
            if problem:
                raise DlrmkitError(f"{where}: {problem}")

    def check_matches(self, table_sizes: list[int], dim: int, world_size: int, source: str = "plan") -> None:
        if self.world_size != world_size:
            raise DlrmkitError(f"{source}: made for world size {self.world_size}, this job has {world_size}")
        if len(self.tables) != len(table_sizes):
            raise DlrmkitError(f"{source}: {len(self.tables)} tables, but the model has {len(table_sizes)}")
        for t, (tp, rows) in enumerate(zip(self.tables, table_sizes)):
            if (tp.rows, tp.dim) != (rows, dim):
                raise DlrmkitError(f"{source}: table {t} is {tp.rows} x {tp.dim}, but the model's is {rows} x {dim}")

    def check_row_state(self, source: str = "plan") -> None:
        """For tables whose optimizer keeps one value per row (row-wise Adagrad): no table cut
        into column slices, which would each keep and update their own value (unlike one process)."""
        for t, tp in enumerate(self.tables):
            if tp.model_parallel and any(s.cols != tp.dim for s in tp.shards):
                raise DlrmkitError(
                    f"{source}: table {t} is cut into column slices, but the tables' row-wise Adagrad keeps "
                    f"one value per row, which each slice would keep apart; use row_wise or table_wise "
                    f"for it, or an element-wise optimizer"
                )

    # ---- accounting ----------------------------------------------------------------------
    @property
    def cost(self) -> CostModel:
        """The cost model of this plan's batch, value size and optimizer state."""
        return CostModel(self.batch_size, self.bytes_per_value, self.optimizer_state)

    def rank_stats(self) -> list[dict]:
        """Per rank: shards, memory, lookups and bytes sent per step (plan_cost.CostModel)."""
        return self.cost.rank_stats(self.world_size, self.tables)

    def report(self) -> str:
        """A table: per rank its shards, memory, lookups and bytes sent per step."""
        lines = [
            f"sharding plan: {len(self.tables)} tables on {self.world_size} ranks, global batch {self.batch_size}"
            + (f", {fmt_bytes(self.device_memory)} per device" if self.device_memory else "")
        ]
        counts = {s: sum(t.strategy == s for t in self.tables) for s in STRATEGIES}
        lines.append("strategies: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
        lines.append(f"{'rank':>4}  {'memory':>10}  {'lookups/step':>12}  {'sent/step':>10}  shards (table[rows,cols])")
        for st in self.rank_stats():
            desc = []
            for t, s in st["shards"]:
                tp = self.tables[t]
                if not tp.model_parallel:
                    continue
                part = ""
                if (s.rows, s.cols) != (tp.rows, tp.dim):
                    part = f"[{s.row_start}:{s.row_end},{s.col_start}:{s.col_end}]"
                desc.append(f"t{t}{part}")
            dp = sum(1 for t, _ in st["shards"] if not self.tables[t].model_parallel)
            if dp:
                desc.append(f"+{dp} replicated")
            lines.append(
                f"{st['rank']:>4}  {fmt_bytes(st['memory']):>10}  {st['lookups']:>12,}  "
                f"{fmt_bytes(st['sent_bytes']):>10}  {' '.join(desc) or '-'}"
            )
        lines += self.notes
        return "\n".join(lines)


def _disjoint(shards: list[Shard]) -> bool:
    """No two shards overlap. Plans are grids (column slices, each cut into row ranges): checked
    in O(k log k) by sorting; any other layout falls back to comparing pairs (bounded)."""
    columns: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in shards:
        columns.setdefault((s.col_start, s.col_end), []).append((s.row_start, s.row_end))
    cols = sorted(columns)
    if all(a[1] <= b[0] for a, b in zip(cols, cols[1:])):
        for rows in columns.values():
            rows.sort()
            if any(a[1] > b[0] for a, b in zip(rows, rows[1:])):
                return False
        return True
    if len(shards) > 4096:
        raise DlrmkitError(f"{len(shards)} shards of one table in an irregular (non-grid) layout: too many to check")
    for i, a in enumerate(shards):
        for b in shards[i + 1 :]:
            if (
                a.row_start < b.row_end
                and b.row_start < a.row_end
                and a.col_start < b.col_end
                and b.col_start < a.col_end
            ):
                return False
    return True


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# ---- presets ---------------------------------------------------------------------------------
_MLPERF_ROWS = [40_000_000] * 4 + [40_790_948, 3_067_956, 590_152, 405_282, 39_060, 20_265, 17_295, 12_973, 11_938]
_MLPERF_ROWS += [7_424, 7_122, 2_209, 1_543, 976, 155, 108, 63, 36, 14, 10, 4, 3]


def _rows_113b() -> list[int]:
    """882M rows in 26 tables, largest 292M (the 113B-parameter variant of the MLPerf model;
    its exact per-table sizes are not published here, so the middle tables are a reconstruction
    with the published total and maximum)."""
    big = [292_000_000, 150_000_000, 150_000_000, 80_000_000, 80_000_000]
    small = _MLPERF_ROWS[5:]  # 21 tables
    rest = 882_000_000 - sum(big) - sum(small[1:])
    return big + [rest] + small[1:]


PRESET_TABLES: dict[str, tuple[list[int], int]] = {
    "criteo-kaggle": (KAGGLE_TABLE_SIZES, 16),
    "criteo-1tb-mlperf": (_MLPERF_ROWS, 128),
    "criteo-1tb-113b": (_rows_113b(), 128),
}


# ---- the planner -----------------------------------------------------------------------------
# per-rank batch at or below which auto replicates every table that fits (2 CPU ranks, Criteo
# Kaggle's shape: replicated steps were faster up to this batch, model-parallel ones from 1,024:
# docs/BENCHMARKS.md)
REPLICATE_MAX_LOCAL_BATCH = 256


def host_replica_budget(local_ranks: int) -> int:
    """Bytes of tables one rank may replicate on this host: half its memory, shared by the
    ranks on it (a fixed fraction of the total, so every rank and `plan` compute the same)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // (2 * max(local_ranks, 1))


def make_plan(
    table_sizes: list[int],
    dim: int,
    world_size: int,
    strategy: str = "auto",
    device_memory: int | None = None,
    batch_size: int = 65536,
    optimizer_state: float = 0,
    min_rows_sharded: int = data_parallel.MIN_ROWS_SHARDED,
    bytes_per_value: int = 4,
    replicate_memory: int | None = None,
    bags: list[int] | None = None,
    row_state: bool = False,
) -> ShardingPlan:
    """Greedy plan. `strategy` auto: tables under `min_rows_sharded` rows and under the global
    batch replicated (then their gradients' all-reduce moves fewer bytes than the pooled
    all-to-all that sharding them would add: rows x dim against batch x dim each way), others
    table-wise, split column-wise (then row-wise) when a table is larger than a rank's fair
    share or there are fewer shards than ranks; any other strategy applies to every table.
    With `replicate_memory` (bytes per rank for tables on a CPU host: host_replica_budget), auto
    replicates every table when the per-rank batch is at most REPLICATE_MAX_LOCAL_BATCH and the
    tables with their optimizer state fit: below that batch model parallelism does not pay on CPU
    (its exchanges cost more than looking every table up locally; docs/BENCHMARKS.md).
    `bags`: ids per sample of each table (multi-hot). Placement then balances the bytes of table
    rows each rank reads per step (CostModel.lookup_bytes) as well as memory, and auto splits a
    table whose lookups exceed a rank's fair share row-wise, so its ids spread over several ranks
    (balance_lookups); the plan's notes say which. `row_state`: the tables' optimizer keeps one
    value per row (row-wise Adagrad), so auto cuts tables into row ranges, never column slices."""
    if world_size < 1:
        raise DlrmkitError(f"--world-size must be at least 1, got {world_size}")
    if strategy not in STRATEGIES + ("auto",):
        raise DlrmkitError(f"unknown sharding '{strategy}' (choose auto, {', '.join(STRATEGIES)})")
    n, b, opt = world_size, bytes_per_value, optimizer_state
    most = sum(min(n, max(int(r), 1)) if strategy == "row_wise" else n for r in table_sizes)
    if most > MAX_SHARDS:  # memory and time grow with the shards: bound them before building any
        raise DlrmkitError(
            f"{len(table_sizes):,} tables on {n:,} ranks could need {most:,} shards, more than the "
            f"planner handles ({MAX_SHARDS:,}); use fewer ranks (--world-size) or tables"
        )
    plan = ShardingPlan(n, [], batch_size, device_memory, b, opt)
    cost = plan.cost
    weight = cost.weight_bytes
    cap = device_memory if device_memory is not None else math.inf
    kinds: list[str] = []
    whole = sum(cost.shard_memory(Shard(0, 0, int(r), 0, dim)) for r in table_sizes) if n > 1 else 0
    if (
        strategy == "auto"
        and n > 1
        and replicate_memory is not None
        and batch_size <= REPLICATE_MAX_LOCAL_BATCH * n
        and whole <= replicate_memory
    ):
        strategy = "data_parallel"
        plan.notes.append(
            f"note: every table replicated: the per-rank batch ({batch_size / n:g}) is at most "
            f"{REPLICATE_MAX_LOCAL_BATCH}, where model parallelism does not pay on CPU, and the tables "
            f"({fmt_bytes(whole)} per rank) fit the {fmt_bytes(replicate_memory)} budget per rank "
            f"(--sharding table_wise keeps them sharded)"
        )
    for rows in table_sizes:
        if strategy == "auto":
            kinds.append("data_parallel" if rows < min(min_rows_sharded, batch_size) else "table_wise")
        else:
            kinds.append(strategy)
    # split counts for model-parallel tables
    mp = [t for t, k in enumerate(kinds) if strategy_named(k).model_parallel]
    splits = {t: 1 for t in mp}
    if strategy != "auto":
        for t in mp:
            splits[t] = strategy_named(strategy).split_count(table_sizes[t], dim, n)
    elif mp:
        dp_mem = sum(weight(table_sizes[t], dim) + cost.step_buffers(dim) for t in range(len(kinds)) if t not in splits)
        share = sum(weight(table_sizes[t], dim) for t in mp) / n
        room = cap - dp_mem
        for t in mp:
            size = weight(table_sizes[t], dim)
            target = min(room * 0.95, max(share, 1))
            k = max(1, math.ceil(size / target)) if target > 0 else column_wise.max_slices(dim)
            if k > column_wise.max_slices(dim) or (row_state and k > 1):
                kinds[t] = "row_wise"
                splits[t] = min(n, max(k, 1))
            else:
                kinds[t] = "column_wise" if k > 1 else "table_wise"
                splits[t] = min(k, n)
        # give every rank work: split the largest slices further while there are too few shards
        while sum(splits[t] for t in mp) < n:
            if row_state:
                cands = [t for t in mp if splits[t] < min(n, table_sizes[t])]
            else:
                cands = [t for t in mp if kinds[t] != "row_wise" and splits[t] < min(n, column_wise.max_slices(dim))]
            if not cands:
                break
            t = max(cands, key=lambda t: (weight(table_sizes[t], dim) / splits[t], -t))
            splits[t] += 1
            kinds[t] = "row_wise" if row_state else "column_wise"
        if bags:
            balance_lookups(plan, table_sizes, dim, bags, kinds, splits)
        if sum(splits[t] for t in mp) < n:
            plan.notes.append(
                f"note: only {sum(splits[t] for t in mp)} shards for {n} ranks; some ranks hold no sharded table"
            )

    # shard shapes, then placement: largest first onto the least-loaded rank that can hold it,
    # a table's shards on distinct ranks where possible
    load = [0.0] * n
    shapes: dict[int, list[Shard]] = {}
    for t, kind in enumerate(kinds):
        rows = table_sizes[t]
        tp = TablePlan(rows, dim, kind, [], bags[t] if bags else 1)
        plan.tables.append(tp)
        if not tp.model_parallel:  # on every rank
            tp.shards = strategy_named(kind).shards(rows, dim, list(range(n)))
            for s in tp.shards:
                load[s.rank] += cost.shard_memory(s)
        else:
            shapes[t] = strategy_named(kind).shards(rows, dim, list(range(splits[t])))
    for r in range(n):
        if load[r] > cap:
            raise DlrmkitError(
                f"replicated tables need {fmt_bytes(load[r])} per rank, more than the {fmt_bytes(cap)} available"
            )
    # with bags, a rank's load is the larger of its memory and its lookup bytes, each over its fair
    # share (largest such shard first); without, its memory alone
    work = [0.0] * n
    mem_share = max(sum(load) + sum(cost.shard_memory(s) for ss in shapes.values() for s in ss), 1) / n
    lookup_share = max(sum(shard_work(plan, t, s) for t, ss in shapes.items() for s in ss), 1) / n

    def size(t: int, s: Shard) -> float:  # noqa: E306
        return max(cost.shard_memory(s) / mem_share, shard_work(plan, t, s) / lookup_share) if bags else 0.0

    order = sorted(
        ((t, s) for t, ss in shapes.items() for s in ss),
        key=lambda ts: (-size(*ts), -cost.shard_memory(ts[1]), ts[0], ts[1].col_start, ts[1].row_start),
    )
    used: dict[int, set[int]] = {t: set() for t in shapes}
    heap = [(load[r], r) for r in range(n)]  # (load, rank): the least-loaded rank in O(log n), so
    heapq.heapify(heap)  # planning time grows as shards x log(ranks), not shards x ranks
    for t, s in order:
        tp = plan.tables[t]
        need = cost.shard_memory(s)
        least = min(range(n), key=lambda r: load[r]) if bags else heap[0][1]
        if load[least] + need > cap:
            free = cap - load[least]
            raise DlrmkitError(
                f"table {t} ({tp.rows:,} rows x {tp.dim}, {fmt_bytes(weight(tp.rows, tp.dim))}) does not fit: "
                f"a {s.rows:,} x {s.cols} shard needs {fmt_bytes(need)}, at most {fmt_bytes(max(free, 0))} of "
                f"{fmt_bytes(cap)} is free on any of the {n} ranks"
            )
        if bags:  # the rank whose larger share grows least, among those that fit (and hold no piece of t)
            w = shard_work(plan, t, s)
            fits = [r for r in range(n) if load[r] + need <= cap]
            r = min(
                [r for r in fits if r not in used[t]] or fits,
                key=lambda r: (max((load[r] + need) / mem_share, (work[r] + w) / lookup_share), load[r], r),
            )
            load[r] += need
            work[r] += w
        else:  # the least-loaded rank that fits and holds no shard of this table yet (among the 64
            # least loaded: exact up to 64 ranks, bounded work beyond), else the least-loaded one
            skipped, chosen = [], None
            while heap and len(skipped) < 64:
                item = heapq.heappop(heap)
                if item[0] + need > cap or item[1] not in used[t]:
                    chosen = item if item[0] + need <= cap else None
                    if chosen is None:
                        skipped.append(item)
                    break
                skipped.append(item)
            if chosen is None:
                chosen = skipped.pop(0)
            for item in skipped:
                heapq.heappush(heap, item)
            r = chosen[1]
            load[r] = chosen[0] + need
            heapq.heappush(heap, (load[r], r))
        used[t].add(r)
        tp.shards.append(Shard(r, s.row_start, s.row_end, s.col_start, s.col_end))
    for tp in plan.tables:
        tp.shards.sort(key=lambda s: (s.row_start, s.col_start, s.rank))
    plan.validate()
    if row_state:
        plan.check_row_state(f"--sharding {strategy}")
    return plan


def shard_work(plan: ShardingPlan, t: int, s: Shard) -> float:
    """Bytes of table rows model-parallel shard `s` of table `t` reads per step."""
    return plan.cost.lookup_bytes(plan.tables[t], s, plan.batch_size)


def balance_lookups(
    plan: ShardingPlan, table_sizes: list[int], dim: int, bags: list[int], kinds: list[str], splits: dict[int, int]
) -> None:
    """Auto with bags: a model-parallel table whose lookups (batch x bag x dim row bytes) exceed a
    rank's fair share of all model-parallel tables' is cut row-wise into enough ranges that each
    takes at most about that share (ids are bucketed by range, so each range looks up only its
    ids), never fewer pieces than memory asked for. Row ranges rather than column slices: a column
    slice looks up every id of the bag (the rank's lookups do not fall) and each slice receives all
    of them; a row range receives only its ids, at the price of a partial pooled sum per range."""
    n = plan.world_size
    work = {t: plan.batch_size * bags[t] * dim for t in splits}
    share = sum(work.values()) / n
    for t in sorted(splits):
        want = min(n, table_sizes[t], math.ceil(work[t] / share - 1e-9)) if share else 1
        if want <= 1 or want <= splits[t] and kinds[t] == "row_wise":
            continue
        pieces = max(want, splits[t])
        plan.notes.append(
            f"note: table {t} ({bags[t]} ids per sample, {plan.batch_size * bags[t]:,} lookups per step) "
            f"row-wise over {pieces} ranks: its lookups are {work[t] / share:.1f}x a rank's fair share "
            f"(placement balances lookups and memory)"
        )
        kinds[t], splits[t] = "row_wise", pieces
