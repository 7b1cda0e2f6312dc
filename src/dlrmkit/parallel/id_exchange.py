"""The id all-to-all of ShardedEmbedding: which ids each rank sends so that every shard receives,
for the global batch, the ids its table's strategy selects. The one-hot fast path sends one
column per (sample, table) in a single all-to-all; the general path (multi-hot bags, or a
strategy that buckets ids by row range) sends bag lengths, then the ids. Kept apart from the
lookups and the pooled exchange (dlrmkit.parallel.sharded_embedding) because
dlrmkit.parallel.ids_ahead runs it a batch ahead, on its own process group."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dlrmkit.model.embedding import Ids, JaggedIds
from dlrmkit.parallel.transport import AllToAll, Transport

Key = tuple[int, int, int]  # (table, row_start, row_end): the ids one rank needs for some shards


@dataclass
class DistIds:
    """Ids as a rank sees them: its local samples' ids of every table (one-hot [L, T] or
    JaggedIds), the local batch size of every rank, and optionally the global batch's ids of this
    rank's sharded tables, one-hot [G, len(id_tables[rank])] or JaggedIds (when the loader already
    delivered them, so the id all-to-all is skipped), or the general path's exchanged bags (when
    the exchange ran a batch ahead, dlrmkit.parallel.ids_ahead)."""

    local: Ids
    batch_sizes: list[int]
    global_ids: Ids | None = None
    bags: tuple | None = None  # (values, lengths, order) already exchanged (ShardedEmbedding.exchange)


class IdExchange:
    """ShardedEmbedding's id exchange, as a mixin: it reads the layout ShardedEmbedding builds
    (rank, world_size, keys and all_keys, id_tables and all_id_tables, widths, strategies,
    table_sizes, bucketed) and `ids_transport`, the Transport of CPU tensors."""

    def exchange(self, ids: DistIds, transport: Transport | None = None, kind: str = "ids") -> DistIds:
        """`ids` with the id all-to-all done now, on `transport` (default: ids_transport), so
        forward skips it: how dlrmkit.parallel.ids_ahead runs it a batch ahead."""
        if not any(self.widths) or ids.global_ids is not None or ids.bags is not None:
            return ids
        if isinstance(ids.local, torch.Tensor) and not self.bucketed:
            return replace(ids, global_ids=self.exchange_ids(ids.local, ids.batch_sizes, transport, kind))
        return replace(ids, bags=self.exchange_bags(ids.local, ids.batch_sizes, transport, kind))

    def exchange_ids(
        self, local: torch.Tensor, sizes: list[int], transport: Transport | None = None, kind: str = "ids"
    ) -> torch.Tensor:
        """Fast path, one-hot ids and no bucketing: [G, tables of this rank]; each rank sends
        the ids of its samples to every rank that holds shards of their tables."""
        return self.exchange_started(local, sizes, transport, kind)()

    def one_hot_fast(self, ids: DistIds) -> bool:
        """Whether `ids` take the fast path's single all-to-all (counts known without asking)."""
        return (
            isinstance(ids.local, torch.Tensor)
            and not self.bucketed
            and any(self.widths)
            and ids.global_ids is None
            and ids.bags is None
        )

    def exchange_started(self, local: torch.Tensor, sizes: list[int], transport: Transport | None = None, kind="ids"):
        """The fast path's all-to-all started: a function that waits for it and returns
        [G, tables of this rank]."""
        request = (transport or self.ids_transport).start([self.ids_op(local, sizes, kind)])
        return lambda: request.wait()[0].view(sum(sizes), len(self.id_tables))

    def ids_op(self, local: torch.Tensor, sizes: list[int], kind: str = "ids") -> AllToAll:
        """The fast path's all-to-all of one-hot ids [b, tables] (every rank's batch `sizes`)."""
        send, send_counts = self.id_sends(local)
        recv_counts = [sizes[r] * len(self.id_tables) for r in range(self.world_size)]
        return AllToAll(send, send_counts, recv_counts, kind)

    def id_sends(self, local: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """One-hot ids [b, tables] as the fast path sends them: rank by rank, the columns of the
        tables it holds shards of; and the count for each rank."""
        sends = [local[:, self.all_id_tables[r]].reshape(-1) for r in range(self.world_size)]
        return torch.cat(sends), [len(x) for x in sends]

    def key_bags(
        self, ids: Ids, keys: list[Key], cols: list[int] | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per key, the ids (relative to the range start) and bag lengths [B] of `ids`' samples
        that the key's shards receive, as its table's strategy selects them (row-wise: bucketing
        by row range, vectorized per key). Key i's ids are table cols[i] of `ids` (default: its
        table index)."""
        jag = ids if isinstance(ids, JaggedIds) else JaggedIds.from_dense(ids)
        b, one_hot = jag.batch_size, not isinstance(ids, JaggedIds)
        if b == 0:  # a rank whose slice of a last, short batch is empty
            return [jag.values[:0]] * len(keys), [jag.offsets[:0]] * len(keys)
        lengths = jag.offsets.diff().view(-1, b)
        bounds = jag.offsets[::b].tolist()
        values, lens = [], []
        for i, (t, a, e) in enumerate(keys):
            c = cols[i] if cols is not None else t
            v, l = self.strategies[t].select_ids(
                jag.values[bounds[c] : bounds[c + 1]], lengths[c], one_hot, a, e, self.table_sizes[t]
            )
            values.append(v)
            lens.append(l)
        return values, lens

    def exchange_bags(
        self, local: Ids, sizes: list[int], transport: Transport | None = None, kind: str = "ids"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """General path: (values, lengths, order) of the global batch's bags for this rank's
        keys; bag order[k * G + g] of (values, lengths) is key k's bag of global sample g.
        Two all-to-alls: bag lengths, then the ids (whose counts the lengths give)."""
        n, me = self.world_size, self.rank
        vals, lens, val_counts, len_counts = [], [], [], []
        for r in range(n):
            v, l = self.key_bags(local, self.all_keys[r])
            vals += v
            lens += l
            val_counts.append(sum(len(x) for x in v))
            len_counts.append(sizes[me] * len(self.all_keys[r]))
        k = len(self.keys)
        empty = torch.zeros(0, dtype=torch.int64)
        transport = transport or self.ids_transport
        recv_len_counts = [k * sizes[s] for s in range(n)]
        got_len = transport.all_to_all_single(torch.cat(lens) if lens else empty, len_counts, recv_len_counts, kind)
        got_len = got_len.wait()
        recv_val_counts = [int(x.sum()) for x in torch.split(got_len, recv_len_counts)]
        got_val = transport.all_to_all_single(torch.cat(vals) if vals else empty, val_counts, recv_val_counts, kind)
        got_val = got_val.wait()
        # received bag order is (source, key, sample); wanted (key, source, sample) = (key, global sample)
        base = torch.tensor([0] + recv_len_counts).cumsum(0).tolist()
        order = torch.cat([(base[s] + torch.arange(recv_len_counts[s])).view(k, sizes[s]) for s in range(n)], dim=1)
        return got_val, got_len, order.reshape(-1)

    def dense_bags(self, global_ids: Ids) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The general path's (values, lengths, order) from loader-delivered global ids (one-hot,
        or a multi-hot dataset's JaggedIds)."""
        col = {t: j for j, t in enumerate(self.id_tables)}
        v, l = self.key_bags(global_ids, self.keys, [col[t] for t, _, _ in self.keys])
        empty = torch.zeros(0, dtype=torch.int64)
        return (torch.cat(v) if v else empty), (torch.cat(l) if l else empty), None
