"""The sharded replacement for `model.embeddings`: same input (ids) and output
[local batch, tables, dim], computed by hybrid parallelism.

Forward on each rank: (1) all-to-all of ids, so each rank holds the global batch's ids of the
tables it has shards of; (2) lookups on local shards -> [global batch, local columns];
(3) one all-to-all that turns that into [local batch, columns of every shard]; (4) index_add
places each shard's columns at (table, col) of the output: column slices land side by side,
row-range partial sums add up. Replicated (data-parallel) tables are looked up on the local
batch. Backward is autograd's: index_select, then the reverse all-to-all (comm.AllToAll).
Local weights keep sparse gradients, so dlrmkit.optim's sparse optimizers update owned rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import EmbeddingCollection, FusedTable, JaggedIds
from dlrmkit.parallel import comm
from dlrmkit.parallel.plan import ShardingPlan
from dlrmkit.parallel.sharding import Shard


@dataclass
class DistIds:
    """Ids as a rank sees them: its local samples' ids of every table, the local batch size of
    every rank, and optionally the global batch's ids of this rank's sharded tables (when the
    loader already delivered them, so the id all-to-all is skipped)."""

    local: torch.Tensor  # int64 [L, T]
    batch_sizes: list[int]
    global_ids: torch.Tensor | None = None  # int64 [G, len(id_tables[rank])]


def rank_layout(plan: ShardingPlan, rank: int) -> tuple[list[tuple[int, Shard]], list[int]]:
    """Model-parallel shards on `rank` in send order (by width, then table, rows, cols), and
    the tables whose ids the rank needs. Every rank computes every other rank's layout."""
    shards = [(t, s) for t, tp in enumerate(plan.tables) if tp.model_parallel for s in tp.shards if s.rank == rank]
    shards.sort(key=lambda ts: (ts[1].cols, ts[0], ts[1].row_start, ts[1].col_start))
    return shards, sorted({t for t, _ in shards})


def table_weight(emb: EmbeddingCollection, t: int) -> torch.Tensor:
    """View [rows, dim] of table t inside the fused weights of a single-device collection."""
    for group, table in zip(emb.groups, emb.tables):
        if t in group:
            i = group.index(t)
            off = int(table.row_offsets[i])
            return table.weight[off : off + emb.table_sizes[t]]
    raise IndexError(t)


class ShardedEmbedding(nn.Module):
    def __init__(self, plan: ShardingPlan, rank: int, comm_dtype: torch.dtype | None = None):
        super().__init__()
        dims = {tp.dim for tp in plan.tables}
        if len(dims) != 1:
            raise DlrmkitError("sharded embeddings need one width for all tables (the dot interaction's layout)")
        self.plan, self.rank, self.world_size, self.comm_dtype = plan, rank, plan.world_size, comm_dtype
        self.dim = dims.pop()
        self.num_tables = len(plan.tables)
        self.table_sizes = [tp.rows for tp in plan.tables]
        self.dims = [self.dim] * self.num_tables
        layouts = [rank_layout(plan, r) for r in range(self.world_size)]
        self.shards, self.id_tables = layouts[rank]
        self.all_id_tables = [ids for _, ids in layouts]
        self.widths = [sum(s.cols for _, s in shards) for shards, _ in layouts]
        # local lookups: one FusedTable per shard width
        self.group_keys: list[tuple[int, list[int]]] = []  # (width, indices into self.shards)
        for i, (_, s) in enumerate(self.shards):
            if not self.group_keys or self.group_keys[-1][0] != s.cols:
                self.group_keys.append((s.cols, []))
            self.group_keys[-1][1].append(i)
        self.local_tables = nn.ModuleList(FusedTable([self.shards[i][1].rows for i in idx], w) for w, idx in self.group_keys)
        col = {t: j for j, t in enumerate(self.id_tables)}
        self.register_buffer("id_cols", torch.tensor([col[t] for t, _ in self.shards], dtype=torch.int64), persistent=False)
        self.register_buffer("row_start", torch.tensor([s.row_start for _, s in self.shards], dtype=torch.int64), persistent=False)
        self.register_buffer("row_end", torch.tensor([s.row_end for _, s in self.shards], dtype=torch.int64), persistent=False)
        self.partial = [any(self.shards[i][1].rows != plan.tables[self.shards[i][0]].rows for i in idx) for _, idx in self.group_keys]
        # where each received column goes in the [L, T*dim] output, senders in rank order
        target = [t * self.dim + c for shards, _ in layouts for t, s in shards for c in range(s.col_start, s.col_end)]
        self.register_buffer("mp_target", torch.tensor(target, dtype=torch.int64), persistent=False)
        # replicated tables
        self.dp_tables_idx = [t for t, tp in enumerate(plan.tables) if not tp.model_parallel]
        self.dp_table = FusedTable([self.table_sizes[t] for t in self.dp_tables_idx], self.dim) if self.dp_tables_idx else None
        dp_target = [t * self.dim + c for t in self.dp_tables_idx for c in range(self.dim)]
        self.register_buffer("dp_target", torch.tensor(dp_target, dtype=torch.int64), persistent=False)
        self.register_buffer("dp_cols", torch.tensor(self.dp_tables_idx, dtype=torch.int64), persistent=False)
        self.bytes_sent = 0  # all-to-all bytes this rank sent, forward and backward, since creation

    # ---- weights ---------------------------------------------------------------------------
    @torch.no_grad()
    def load_from(self, emb: EmbeddingCollection) -> None:
        """Copy this rank's shards out of a single-device collection (same init on any plan)."""
        for (w, idx), table in zip(self.group_keys, self.local_tables):
            for j, i in enumerate(idx):
                t, s = self.shards[i]
                off = int(table.row_offsets[j])
                table.weight[off : off + s.rows] = table_weight(emb, t)[s.row_start : s.row_end, s.col_start : s.col_end]
        if self.dp_table is not None:
            for j, t in enumerate(self.dp_tables_idx):
                off = int(self.dp_table.row_offsets[j])
                self.dp_table.weight[off : off + self.table_sizes[t]] = table_weight(emb, t)

    @torch.no_grad()
    def gather_tables(self) -> list[torch.Tensor]:
        """Every table as one logical [rows, dim] tensor, on every rank (small models only:
        tests, and checkpoints written in the single-process format)."""
        full = [torch.zeros(r, self.dim) for r in self.table_sizes]
        for (w, idx), table in zip(self.group_keys, self.local_tables):
            for j, i in enumerate(idx):
                t, s = self.shards[i]
                off = int(table.row_offsets[j])
                full[t][s.row_start : s.row_end, s.col_start : s.col_end] = table.weight[off : off + s.rows]
        mp = [full[t] for t, tp in enumerate(self.plan.tables) if tp.model_parallel]
        comm.all_reduce_sum(mp)
        if self.dp_table is not None:
            for j, t in enumerate(self.dp_tables_idx):
                off = int(self.dp_table.row_offsets[j])
                full[t] = self.dp_table.weight[off : off + self.table_sizes[t]].detach().clone()
        return full

    def single_device_state(self) -> EmbeddingCollection:
        """An EmbeddingCollection holding the gathered tables (for single-format checkpoints)."""
        emb = EmbeddingCollection(self.table_sizes, self.dims)
        with torch.no_grad():
            for t, w in enumerate(self.gather_tables()):
                table_weight(emb, t).copy_(w)
        return emb

    # ---- gradients -------------------------------------------------------------------------
    def replicated_parameters(self) -> list[nn.Parameter]:
        return [self.dp_table.weight] if self.dp_table is not None else []

    # ---- forward ---------------------------------------------------------------------------
    def exchange_ids(self, local: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """[G, tables of this rank]: each rank sends the ids of its samples to every rank that
        holds shards of their tables."""
        sends = [local[:, self.all_id_tables[r]].reshape(-1) for r in range(self.world_size)]
        send_counts = [len(x) for x in sends]
        recv_counts = [sizes[r] * len(self.id_tables) for r in range(self.world_size)]
        out = comm.all_to_all(torch.cat(sends), send_counts, recv_counts)
        self.bytes_sent += 8 * (sum(send_counts) - send_counts[self.rank])
        return out.view(sum(sizes), len(self.id_tables))

    def lookup(self, global_ids: torch.Tensor) -> torch.Tensor:
        """[G, local columns] pooled outputs of this rank's shards."""
        g = global_ids.shape[0]
        if not self.shards:
            return torch.zeros(g, 0)
        ids = global_ids.index_select(1, self.id_cols)  # [G, shards]
        outs = []
        for (w, idx), table, partial in zip(self.group_keys, self.local_tables, self.partial):
            lo, hi = self.row_start[idx[0] : idx[-1] + 1], self.row_end[idx[0] : idx[-1] + 1]
            sub = ids[:, idx[0] : idx[-1] + 1]
            if partial:
                inside = (sub >= lo) & (sub < hi)
                pooled = table(torch.where(inside, sub - lo, torch.zeros_like(sub))) * inside.unsqueeze(2).to(table.weight.dtype)
            else:
                pooled = table(sub)
            outs.append(pooled.reshape(g, -1))
        return torch.cat(outs, dim=1)

    def forward(self, ids: DistIds | torch.Tensor) -> torch.Tensor:
        if isinstance(ids, JaggedIds):
            raise DlrmkitError("sharded embeddings take one id per (sample, table); multi-hot bags are not supported yet")
        if isinstance(ids, torch.Tensor):
            ids = DistIds(ids, self._gather_sizes(ids.shape[0]))
        local, sizes = ids.local, ids.batch_sizes
        me, n, l = self.rank, self.world_size, sizes[self.rank]
        out = torch.zeros(l, self.num_tables * self.dim)
        if any(self.widths):
            global_ids = ids.global_ids if ids.global_ids is not None else self.exchange_ids(local, sizes)
            pooled = self.lookup(global_ids)  # [G, W_me]
            w_me = self.widths[me]
            send = [sizes[r] * w_me for r in range(n)]
            recv = [l * self.widths[r] for r in range(n)]
            flat = comm.AllToAll.apply(pooled, send, recv, self.comm_dtype)
            self.bytes_sent += 4 * 2 * (sum(send) - send[me])  # forward, and the reverse in backward
            blocks = torch.split(flat, recv)
            received = torch.cat([b.view(l, w) for b, w in zip(blocks, self.widths)], dim=1)
            out = out.index_add(1, self.mp_target, received)
        if self.dp_table is not None:
            dp = self.dp_table(local.index_select(1, self.dp_cols))
            out = out.index_add(1, self.dp_target, dp.reshape(l, -1))
        return out.view(l, self.num_tables, self.dim)

    def _gather_sizes(self, local: int) -> list[int]:
        if not dist.is_initialized() or self.world_size == 1:
            return [local]
        t = torch.tensor([local], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return [int(x) for x in out]
