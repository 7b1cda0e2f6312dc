"""Model-parallel-friendly loading. Every rank walks the same global batches in the same
(seeded) order; per global batch it yields its local slice of dense features and labels, and
ids in the form the sharded embeddings want. Strategies (all yield identical batches):

- exchange (default): read only the rank's own slice, all columns (1/N of the bytes); the
  sharded module's id all-to-all delivers the global-batch ids each shard needs;
- own-features: read the own slice, plus the id files of this rank's sharded tables for the
  whole global batch (no id exchange);
- broadcast: rank 0 reads the global batch and broadcasts it; ranks keep what they need.
Each counts bytes read from disk (`bytes_read`); the sharded module counts bytes exchanged.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from dlrmkit.data.loader import Batch, BatchLoader, pin_batch, prefetched, row_bytes, to_batch
from dlrmkit.data.multi_hot import fixed_bags
from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.dist import batch_slice, batch_split
from dlrmkit.parallel.sharded_embedding import DistIds

LOADERS = ("exchange", "own-features", "broadcast")


class DistBatchLoader(BatchLoader):
    def __init__(
        self,
        dataset: SplitBinaryDataset,
        batch_size: int,
        rank: int,
        world_size: int,
        id_tables: list[int] | None = None,
        strategy: str = "exchange",
        group=None,
        **kw,
    ):
        if strategy not in LOADERS:
            raise DlrmkitError(f"unknown --loader '{strategy}' (choose {', '.join(LOADERS)})")
        super().__init__(dataset, batch_size, **{"prefetch": 2, **kw})  # each rank's reads beside its collectives
        self.rank, self.world_size, self.strategy = rank, world_size, strategy
        self.group = group  # of the broadcast strategy's CPU tensors (DistContext.cpu_group)
        self.id_tables = list(id_tables or [])
        self.bytes_read = 0
        self.ahead = None  # an IdsAhead: epochs' batches come with ids exchanged during the previous step
        self.row_bytes = row_bytes(dataset)
        self.id_bytes = [c.dtype.itemsize * c.width for c in dataset.categorical]  # a row's bag of each table

    def local_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        for b in self.order(epoch)[start:]:
            lo, hi = self.bounds[b]
            batch = self.read_global(lo, hi)
            if self.pin_memory:  # dense features and labels go to the GPU; ids stay for the exchange
                batch = pin_batch(batch)
            yield batch

    def order(self, epoch: int) -> np.ndarray:
        from dlrmkit.data.loader import epoch_order

        return epoch_order(len(self.bounds), epoch, self.seed, self.shuffle)

    def read_global(self, lo: int, hi: int) -> Batch:
        sizes = batch_split(hi - lo, self.world_size)
        a, b = batch_slice(hi - lo, self.rank, self.world_size)
        if self.strategy == "broadcast":
            return self._broadcast(lo, hi, a, b, sizes)
        raw = self.dataset.read(lo + a, lo + b)
        self.bytes_read += (b - a) * self.row_bytes
        batch = to_batch(raw)
        global_ids = None
        if self.strategy == "own-features":
            # every row of the batch, not only this rank's slice: checked here too
            stacked = self.dataset.read_tables(lo, hi, self.id_tables)
            self.bytes_read += sum((hi - lo) * self.id_bytes[t] for t in self.id_tables)
            global_ids = self._ids(stacked, self.id_tables)
        return Batch(batch.dense, DistIds(batch.ids, sizes, global_ids), batch.labels)

    def _ids(self, ids: np.ndarray | torch.Tensor, tables: list[int]):
        """Id columns of `tables` as the model takes them: [n, tables] one-hot, JaggedIds multi-hot."""
        if self.dataset.multi_hot:
            return fixed_bags(ids, [self.dataset.hotness[t] for t in tables])
        return torch.as_tensor(np.asarray(ids, dtype=np.int64)) if isinstance(ids, np.ndarray) else ids

    def _broadcast(self, lo: int, hi: int, a: int, b: int, sizes: list[int]) -> Batch:
        g = hi - lo
        if self.rank == 0:
            raw = self.dataset.read(lo, hi)
            self.bytes_read += g * self.row_bytes
            dense = torch.from_numpy(np.array(raw.dense, dtype=np.float32))  # float32, a copy
            ids = torch.from_numpy(np.asarray(raw.ids, dtype=np.int64))
            labels = torch.from_numpy(np.asarray(raw.labels, dtype=np.float32))
        else:
            dense = torch.empty(g, self.dataset.num_numerical)
            ids = torch.empty(g, int(self.dataset.id_columns[-1]), dtype=torch.int64)
            labels = torch.empty(g)
        if dist.is_initialized() and self.world_size > 1:
            for t in (dense, ids, labels):
                dist.broadcast(t, 0, group=self.group)
        cols = self.dataset.id_columns
        own = [c for t in self.id_tables for c in range(int(cols[t]), int(cols[t + 1]))]
        tables = list(range(len(self.dataset.categorical)))
        local = self._ids(ids[a:b], tables)
        return Batch(
            dense[a:b], DistIds(local, sizes, self._ids(ids[:, own].contiguous(), self.id_tables)), labels[a:b]
        )

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Batches of `epoch`; prefetched in a thread except with broadcast (collectives must be
        issued in the same order as the training step's, from one thread)."""
        depth = 0 if self.strategy == "broadcast" else self.prefetch
        batches = prefetched(self.local_batches(epoch, start), depth)
        return self.ahead.pipeline(batches) if self.ahead is not None else batches
