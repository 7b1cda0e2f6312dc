"""Batches from a split-binary dataset, converted to tensors in a background thread.

Batches are contiguous row ranges (one positioned read per file and batch); shuffling permutes
the order of batches per epoch, seeded, as NVIDIA's DLRM loader does. numpy and torch release
the GIL while copying, so the prefetch thread overlaps reading with the training step; batches
under PREFETCH_BYTES are read inline instead, where the thread's handoff of each batch (the GIL
and a queue) costs more than the read it hides (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from dlrmkit.data.split_binary import RawBatch, SplitBinaryDataset
from dlrmkit.model.embedding import Ids


@dataclass
class Batch:
    dense: torch.Tensor  # float32 [B, num_numerical]
    ids: Ids  # int64 [B, num_tables] one-hot, or a multi-hot dataset's JaggedIds
    labels: torch.Tensor  # float32 [B]

    def __len__(self) -> int:
        return len(self.labels)


def to_batch(raw: RawBatch) -> Batch:
    """numpy -> torch in whole-array operations (no per-sample Python work); a multi-hot
    dataset's fixed-size bags become JaggedIds."""
    from dlrmkit.data.multi_hot import fixed_bags

    return Batch(
        dense=torch.from_numpy(np.array(raw.dense, dtype=np.float32)),  # float32, a copy
        ids=fixed_bags(raw.ids, raw.hotness)
        if raw.hotness is not None
        else torch.from_numpy(np.asarray(raw.ids, dtype=np.int64)),
        labels=torch.from_numpy(np.asarray(raw.labels, dtype=np.float32)),
    )


def pin_batch(batch):
    """`batch` (a dataclass with dense, ids and labels) in page-locked memory, so its copy to a GPU
    need not block; ids without pin_memory (DistIds, which the id exchange reads first) stay."""
    ids = batch.ids.pin_memory() if hasattr(batch.ids, "pin_memory") else batch.ids
    return dataclasses.replace(batch, dense=batch.dense.pin_memory(), ids=ids, labels=batch.labels.pin_memory())


def batch_bounds(rows: int, batch_size: int, drop_last: bool) -> list[tuple[int, int]]:
    """[start, end) of each batch over `rows` rows."""
    n = rows // batch_size if drop_last else -(-rows // batch_size)
    return [(i * batch_size, min((i + 1) * batch_size, rows)) for i in range(n)]


def epoch_order(num_batches: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """Batch order of one epoch: a seeded permutation, identical on every rank."""
    if not shuffle:
        return np.arange(num_batches)
    return np.random.default_rng([seed, epoch]).permutation(num_batches)


class Prefetcher:
    """Runs an iterator of batches in a daemon thread, `depth` batches ahead."""

    _END = object()

    def __init__(self, source: Iterator, depth: int = 2):
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.error: BaseException | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._work, args=(source,), daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        """Queue `item` unless the consumer has stopped; never blocks forever."""
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, source: Iterator) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
        except BaseException as exc:  # re-raised in the consumer's thread
            self.error = exc
        self._put(self._END)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        item = self.queue.get()
        if item is self._END:
            if self.error is not None:
                raise self.error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop and wait for the thread, so it is never inside a torch op at interpreter exit
        (that aborts the process: 'terminate called without an active exception')."""
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=10)


PREFETCH_BYTES = 1 << 20  # a batch this large or larger is read ahead in a thread


def row_bytes(dataset: SplitBinaryDataset) -> int:
    """Bytes one row of `dataset` takes on disk: its numerical values, its label, its ids."""
    numerical = dataset.numerical.dtype.itemsize * dataset.num_numerical if dataset.numerical else 0
    return numerical + dataset.label.dtype.itemsize + sum(c.dtype.itemsize * c.width for c in dataset.categorical)


def prefetched(source: Iterator, depth: int) -> Iterator:
    """`source`, run `depth` items ahead in a thread (or inline when depth <= 0)."""
    if depth <= 0:
        yield from source
        return
    fetcher = Prefetcher(source, depth)
    try:
        yield from fetcher
    finally:
        fetcher.close()


class BatchLoader:
    """Iterates epochs of `dataset` in batches of `batch_size`, resumable at any batch index."""

    def __init__(
        self,
        dataset: SplitBinaryDataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int | None = None,
        pin_memory: bool = False,
    ):
        """`prefetch`: batches read ahead in a thread (0: inline); None: 2 where a batch takes
        PREFETCH_BYTES or more, else 0."""
        self.dataset, self.batch_size = dataset, batch_size
        if prefetch is None:
            prefetch = 2 if batch_size * row_bytes(dataset) >= PREFETCH_BYTES else 0
        self.shuffle, self.seed, self.prefetch = shuffle, seed, prefetch
        self.pin_memory = pin_memory  # page-locked batches (made in the prefetch thread) copy to a GPU without blocking
        self.bounds = batch_bounds(len(dataset), batch_size, drop_last)

    def __len__(self) -> int:
        return len(self.bounds)

    def raw_batches(self, epoch: int, start: int = 0) -> Iterator[RawBatch]:
        for b in epoch_order(len(self.bounds), epoch, self.seed, self.shuffle)[start:]:
            lo, hi = self.bounds[b]
            yield self.dataset.read(lo, hi)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Batches of `epoch` from batch index `start` on, prefetched in a thread (`prefetch`)."""
        batches = (to_batch(raw) for raw in self.raw_batches(epoch, start))
        if self.pin_memory:
            batches = (pin_batch(b) for b in batches)
        return prefetched(batches, self.prefetch)
