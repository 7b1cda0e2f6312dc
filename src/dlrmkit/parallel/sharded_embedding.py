"""The sharded replacement for `model.embeddings`: same input (one-hot [B, T] ids or multi-hot
JaggedIds) and output [local batch, tables, dim], computed by hybrid parallelism. This module
orchestrates; what differs between strategies (which ids a shard receives, where its columns
go, local lookups of replicated tables) is each strategy's (dlrmkit.parallel.sharding).

Forward on each rank: (1) all-to-all of ids: each rank receives, for the global batch, the bags
of ids of every (table, row range) it holds a shard of, as the table's strategy selects them
(row-wise: only the ids in the range, with bag lengths: Strategy.select_ids); (2) sum-pooled
lookups on local shards -> [global batch, local columns]; (3) one all-to-all that turns that
into [local batch, columns of every shard]; (4) index_add adds each shard's columns at the
output columns its strategy names (Strategy.columns: column slices side by side, row-range
partial sums add up, a reduce-scatter built from all-to-all, as gloo has none). Tables of a
strategy that is not model-parallel (replicated) are looked up on the local batch by that
strategy's module (Strategy.local_lookup). Backward is autograd's: the reverse all-to-all
(pooled_exchange.PooledAllToAll), then the lookups' sparse gradients, so sparse optimizers update
owned rows only. Every collective goes through a Transport (parallel/transport.py): `transport`
for the pooled embeddings, `ids_transport` for the ids (a gloo group of its own under NCCL).
One-hot ids with no bucketing strategy take a fast path: one id per (sample, table), no lengths.

On a GPU (the module moved there with .to), ids stay CPU tensors through step (1), on
`ids_transport`, and go to the device for the lookups; the pooled all-to-alls and the output
are device tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import (
    EmbeddingCollection,
    FusedTable,
    Ids,
    JaggedIds,
    TablePiece,
    draw_base_seed,
    init_table_block,
    regroup,
    to_offsets,
)
from dlrmkit.parallel.id_exchange import DistIds, IdExchange, Key
from dlrmkit.parallel.plan import ShardingPlan
from dlrmkit.parallel.plan_cost import DENSE_REPLICA_ROWS
from dlrmkit.parallel.pooled_exchange import PooledAllToAll
from dlrmkit.parallel.sharding import Shard, strategy
from dlrmkit.parallel.transport import AllReduce, AllToAll, CommStats, Transport, torch_collectives


def rank_layout(plan: ShardingPlan, rank: int) -> tuple[list[tuple[int, Shard]], list[int]]:
    """Model-parallel shards on `rank` in send order (by width, then table, rows, cols), and
    the tables whose ids the rank needs. Every rank computes every other rank's layout."""
    shards = [(t, s) for t, tp in enumerate(plan.tables) if tp.model_parallel for s in tp.shards if s.rank == rank]
    shards.sort(key=lambda ts: (ts[1].cols, ts[0], ts[1].row_start, ts[1].col_start))
    return shards, sorted({t for t, _ in shards})


def rank_keys(shards: list[tuple[int, Shard]]) -> list[Key]:
    """The distinct (table, row range)s of a rank's shards: column slices of one range share ids."""
    return sorted({(t, s.row_start, s.row_end) for t, s in shards})


def table_weight(emb: EmbeddingCollection, t: int) -> torch.Tensor:
    """View [rows, dim] of table t inside the fused weights of a single-device collection."""
    for piece in emb.logical_shards():
        if piece.table == t:
            return piece.data
    raise IndexError(t)


@dataclass
class NextIds:
    """The next batch's one-hot ids, to travel coalesced with this batch's pooled all-to-all
    (parallel/ids_ahead.py): `op` is their all-to-all, `received` its result once forward
    waited for the pooled one (None until then)."""

    ids: DistIds
    op: AllToAll
    received: torch.Tensor | None = None


class ShardedEmbedding(IdExchange, nn.Module):
    """This rank's shards of a ShardingPlan, and the exchanges that make their lookups the
    single-device EmbeddingCollection's (see the module docstring)."""

    def __init__(
        self,
        plan: ShardingPlan,
        rank: int,
        dense_replica_rows: int = DENSE_REPLICA_ROWS,
        transport: Transport | None = None,
        ids_transport: Transport | None = None,
    ):
        super().__init__()
        self.dense_replica_rows = dense_replica_rows
        dims = {tp.dim for tp in plan.tables}
        if len(dims) != 1:
            raise DlrmkitError("sharded embeddings need one width for all tables (the dot interaction's layout)")
        self.plan, self.rank, self.world_size = plan, rank, plan.world_size
        self.dim = dims.pop()
        self.num_tables = len(plan.tables)
        self.table_sizes = [tp.rows for tp in plan.tables]
        self.dims = [self.dim] * self.num_tables
        layouts = [rank_layout(plan, r) for r in range(self.world_size)]
        self.shards, self.id_tables = layouts[rank]
        self.all_id_tables = [ids for _, ids in layouts]
        self.all_keys = [rank_keys(shards) for shards, _ in layouts]
        self.keys = self.all_keys[rank]
        self.widths = [sum(s.cols for _, s in shards) for shards, _ in layouts]
        self.strategies = [strategy(tp.strategy) for tp in plan.tables]
        # a strategy that buckets ids by row range anywhere: the general, jagged path
        self.bucketed = any(
            self.strategies[t].buckets(a, b, self.table_sizes[t]) for keys in self.all_keys for t, a, b in keys
        )
        # local lookups: one FusedTable per shard width
        self.group_keys: list[tuple[int, list[int]]] = []  # (width, indices into self.shards)
        for i, (_, s) in enumerate(self.shards):
            if not self.group_keys or self.group_keys[-1][0] != s.cols:
                self.group_keys.append((s.cols, []))
            self.group_keys[-1][1].append(i)
        self.local_tables = nn.ModuleList(
            FusedTable([self.shards[i][1].rows for i in idx], w) for w, idx in self.group_keys
        )
        col = {t: j for j, t in enumerate(self.id_tables)}
        key_of = {k: j for j, k in enumerate(self.keys)}
        self.register_buffer(
            "id_cols", torch.tensor([col[t] for t, _ in self.shards], dtype=torch.int64), persistent=False
        )
        self.shard_key = [key_of[(t, s.row_start, s.row_end)] for t, s in self.shards]
        # where each received column goes in the [L, T*dim] output, senders in rank order
        target = [c for shards, _ in layouts for t, s in shards for c in self.strategies[t].columns(t, s, self.dim)]
        self.register_buffer("mp_target", torch.tensor(target, dtype=torch.int64), persistent=False)
        # tables looked up where their samples are (replicated): one module per such strategy
        local: dict[str, list[int]] = {}
        for t, st in enumerate(self.strategies):
            if not st.model_parallel:
                local.setdefault(st.name, []).append(t)
        self.local_lookups = nn.ModuleList(
            strategy(name).local_lookup(tables, self.table_sizes, self.dim) for name, tables in local.items()
        )
        # every table in one replicated lookup, in table order (auto at small per-rank batches)
        self.all_replicated = len(self.local_lookups) == 1 and getattr(self.local_lookups[0], "tables", None) == list(
            range(self.num_tables)
        )
        self.stats = transport.stats if transport is not None else CommStats()  # bytes and seconds, by kind
        self.transport = transport or torch_collectives(None, self.stats)  # the pooled embeddings'
        self.ids_transport = ids_transport or self.transport  # the ids' (CPU tensors)
        # whether ids may travel in the pooled embeddings' collectives (one group, CPU tensors)
        self.ids_with_pooled = ids_transport is None
        self.started: tuple | None = None  # (ids, started state) of start()
        self.next_ids: NextIds | None = None  # travels with start(ids) (IdsAhead.coalesce)
        self.overlap = True  # False: the pooled all-to-alls block (HybridParallel.set_overlap)

    @property
    def device(self) -> torch.device:
        """Where the shards, the lookups and the pooled output live."""
        return self.mp_target.device

    # ---- init ------------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """Exactly the single-device init (EmbeddingCollection.reset_parameters with the same
        generator state), produced shard-locally: each rank generates only the init chunks its
        row ranges fall in (dlrmkit.model.embedding.init_table_block)."""
        base = draw_base_seed(generator)
        for (_, idx), table in zip(self.group_keys, self.local_tables):
            for j, i in enumerate(idx):
                t, s = self.shards[i]
                off = int(table.row_offsets[j])
                init_table_block(
                    table.weight[off : off + s.rows], base, t, self.table_sizes[t], self.dim, s.row_start, s.col_start
                )
        for lookup in self.local_lookups:
            lookup.init_tables(base)

    # ---- weights ---------------------------------------------------------------------------
    def logical_shards(self) -> list[TablePiece]:
        """Every table's pieces, table by table, for checkpoints: a model-parallel table as every
        rank's shards (rank set; weight and offset on this rank's only), a replicated one whole
        (rank None), in this rank's weights."""
        here: dict[tuple[int, Shard], tuple[nn.Parameter, int]] = {}
        for (_, idx), table in zip(self.group_keys, self.local_tables):
            for j, i in enumerate(idx):
                here[self.shards[i]] = (table.weight, int(table.row_offsets[j]))
        whole = {p.table: p for lookup in self.local_lookups for p in lookup.logical_shards()}
        out = []
        for t, tp in enumerate(self.plan.tables):
            if t in whole:
                out.append(whole[t])
                continue
            for s in tp.shards:
                weight, offset = here.get((t, s), (None, 0))
                out.append(TablePiece(t, s.row_start, s.row_end, s.col_start, s.col_end, s.rank, weight, offset))
        return out

    @torch.no_grad()
    def load_from(self, emb: EmbeddingCollection) -> None:
        """Copy this rank's pieces out of a single-device collection (same init on any plan)."""
        full = {p.table: p.data for p in emb.logical_shards()}
        for p in self.logical_shards():
            if p.weight is not None:
                p.data.copy_(full[p.table][p.row_start : p.row_end, p.col_start : p.col_end])

    @torch.no_grad()
    def gather_tables(self) -> list[torch.Tensor]:
        """Every table as one logical [rows, dim] tensor, on every rank (small models only:
        tests, and checkpoints written in the single-process format)."""
        full = [torch.zeros(r, self.dim) for r in self.table_sizes]  # in host memory, summed on ids_transport
        pieces = self.logical_shards()
        for p in pieces:
            if p.rank is not None and p.weight is not None:
                full[p.table][p.row_start : p.row_end, p.col_start : p.col_end] = p.data.cpu()
        sharded = [t for t, st in enumerate(self.strategies) if st.model_parallel]
        summed = self.ids_transport.start([AllReduce(full[t]) for t in sharded]).wait()
        for t, total in zip(sharded, summed):
            full[t] = total
        for p in pieces:
            if p.rank is None:
                full[p.table] = p.data.cpu().clone()
        return full

    # ---- gradients -------------------------------------------------------------------------
    def replicated_parameters(self) -> list[nn.Parameter]:
        """Weights every rank holds a copy of whose gradients are summed densely over ranks
        (at most `dense_replica_rows` rows: small tables)."""
        return [
            p for lookup in self.local_lookups for p in lookup.parameters() if p.shape[0] <= self.dense_replica_rows
        ]

    def exchanged_replicas(self) -> list[tuple[nn.Parameter, int]]:
        """(weight, tables fused in it) of the larger replicated weights: their gradients travel
        as the rows each rank's lookups touched (dlrmkit.parallel.replica_grads)."""
        return [
            (lookup.table.weight, len(lookup.tables))
            for lookup in self.local_lookups
            if lookup.table.weight.shape[0] > self.dense_replica_rows
        ]

    # ---- forward ---------------------------------------------------------------------------
    # ---- forward: the id exchange is IdExchange's (dlrmkit.parallel.id_exchange) ----------------
    def lookup(self, global_ids: torch.Tensor) -> torch.Tensor:
        """Fast path: [G, local columns] pooled outputs of this rank's shards, one id per bag."""
        g = global_ids.shape[0]
        ids = global_ids.to(self.device).index_select(1, self.id_cols)  # [G, shards]
        outs = [
            table(ids[:, idx[0] : idx[-1] + 1]).reshape(g, -1)
            for (w, idx), table in zip(self.group_keys, self.local_tables)
        ]
        return torch.cat(outs, dim=1)

    def lookup_bags(
        self, values: torch.Tensor, lengths: torch.Tensor, order: torch.Tensor | None, g: int
    ) -> torch.Tensor:
        """General path: [G, local columns] sum-pooled outputs of this rank's shards."""
        outs = []
        for (w, idx), table in zip(self.group_keys, self.local_tables):
            bags = torch.cat([self.shard_key[i] * g + torch.arange(g) for i in idx])
            if order is not None:
                bags = order.index_select(0, bags)
            v, l = regroup(values, lengths, bags)  # on the CPU, where the exchange left them
            outs.append(table(JaggedIds(v, to_offsets(l), g).to(self.device)).reshape(g, -1))
        return torch.cat(outs, dim=1)

    def start(self, ids: DistIds | Ids) -> None:
        """Lookups and the pooled all-to-all of `ids` started now; forward(ids) (the same ids
        object) then only waits and places the columns. The hybrid-parallel step calls this
        before the model, so the exchange travels while the bottom MLP runs."""
        following, self.next_ids = self.next_ids, None
        self.started = (ids, self._start(ids, following))

    def forward(self, ids: DistIds | Ids) -> torch.Tensor:
        started, self.started = self.started, None
        if started is not None and started[0] is not ids:  # started for other ids: let it finish, unused
            if started[1][3] is not None:
                started[1][3].wait()
            started = None
        return self._finish(*(started[1] if started is not None else self._start(ids)))

    def _start(self, ids: DistIds | Ids, following: NextIds | None = None) -> tuple:
        """Id exchange (unless done ahead), local lookups, and the pooled all-to-all started,
        with `following`'s ids coalesced into it: (local ids, local batch, pooled lookups or
        None, the request, (send counts, receive counts, following))."""
        if not isinstance(ids, DistIds):
            b = ids.batch_size if isinstance(ids, JaggedIds) else ids.shape[0]
            ids = DistIds(ids, self._gather_sizes(b))
        local, sizes = ids.local, ids.batch_sizes
        me, n, l = self.rank, self.world_size, sizes[self.rank]
        g = sum(sizes)
        if not any(self.widths):
            return local, l, None, None, None
        fast = isinstance(local, torch.Tensor) and not self.bucketed
        if fast:
            global_ids = ids.global_ids if ids.global_ids is not None else self.exchange_ids(local, sizes)
        elif ids.bags is not None:
            bags = ids.bags
        elif ids.global_ids is not None:
            bags = self.dense_bags(ids.global_ids)
        else:
            bags = self.exchange_bags(local, sizes)
        t0 = time.perf_counter()
        if not self.shards:
            # a rank owning no table sends nothing, yet must join the exchange's backward as its
            # peers do: its (empty) input requires grad so autograd runs the backward here too
            pooled = torch.zeros(g, 0, device=self.device, requires_grad=torch.is_grad_enabled())
        else:
            pooled = self.lookup(global_ids) if fast else self.lookup_bags(*bags, g)
        self.stats.add("lookup", 0, time.perf_counter() - t0)
        send = [sizes[r] * self.widths[me] for r in range(n)]
        recv = [l * self.widths[r] for r in range(n)]
        ops = [AllToAll(pooled.detach(), send, recv, "pooled_fwd")] + ([following.op] if following else [])
        return local, l, pooled, self.transport.start(ops), (send, recv, following)

    def _finish(self, local: Ids, l: int, pooled: torch.Tensor | None, request, counts: tuple | None) -> torch.Tensor:
        """Waits for the pooled all-to-all, places every shard's columns, adds local lookups."""
        if self.all_replicated:  # the lookup is the output: no placing (a small-batch plan's step)
            return self.local_lookups[0](local).view(l, self.num_tables, self.dim)
        dtype = next((p.dtype for p in self.parameters()), torch.float32)  # bf16 tables under split-SGD
        out = torch.zeros(l, self.num_tables * self.dim, dtype=dtype, device=self.device)
        if pooled is not None:
            send, recv, following = counts
            results = request.wait()
            if following is not None:
                following.received = results[1]
            # one table group, all deferring: nothing reads the gradient between the backward
            # exchange and the tables' backward (views only), so it may still be in flight there
            deferred = self.overlap and len(self.local_tables) == 1 and all(t.deferred for t in self.local_tables)
            flat = PooledAllToAll.apply(pooled, results[0], self.transport, send, recv, deferred)
            blocks = torch.split(flat, recv)
            received = torch.cat([b.view(l, w) for b, w in zip(blocks, self.widths)], dim=1)
            out = out.index_add(1, self.mp_target, received)
        for lookup in self.local_lookups:
            out = out.index_add(1, lookup.target, lookup(local).reshape(l, len(lookup.target)))
        return out.view(l, self.num_tables, self.dim)

    def _gather_sizes(self, local: int) -> list[int]:
        sizes = self.ids_transport.all_gather_into_tensor(torch.tensor([local], dtype=torch.int64), "ids")
        return sizes.wait().tolist()
