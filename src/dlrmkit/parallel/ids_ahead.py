"""The id all-to-all one batch ahead (torchrec's sparse-dist pipelining, on gloo): while step i
trains, the ids of batch i+1 travel, so the step's forward starts at the lookups. One-hot ids
(the fast path: one all-to-all whose counts every rank knows) travel coalesced with the current
step's pooled all-to-all on CPU (`coalesce`: one collective fewer a step), or else as an async
all-to-all of their own, started from the main thread and waited for at the next step. Jagged
ids need two dependent all-to-alls (bag lengths, then ids), so a worker thread runs them, on a
process group of its own. Collectives of one group must be started in the same order on every
rank: this group's are started in batch order, on every rank alike."""

from __future__ import annotations

import dataclasses
import queue
import threading
from concurrent.futures import Future
from typing import Callable, Iterator

import torch.distributed as dist

from dlrmkit.parallel.sharded_embedding import DistIds, NextIds, ShardedEmbedding
from dlrmkit.parallel.transport import TorchCollectives


def with_ids(batch, ids: DistIds):
    """`batch` (a dataclass with an `ids` field) with other ids."""
    return dataclasses.replace(batch, ids=ids)


class DaemonWorker:
    """One daemon thread running submitted calls in order. Daemon: a process whose peer died
    must not hang at exit joining a thread stuck in that peer's collective (as
    ThreadPoolExecutor's threads would, joined at interpreter exit)."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, arg = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(arg))
                except BaseException as exc:  # handed to the caller of result()
                    future.set_exception(exc)

    def submit(self, fn: Callable, arg) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn, arg))
        return future

    def stop(self) -> None:
        self.jobs.put(None)


class IdsAhead:
    """Exchanges batches' ids on `group` in a worker thread, one batch ahead of training."""

    def __init__(self, sharded: ShardedEmbedding):
        self.sharded = sharded
        self.transport = None  # on a group made at first use (dist.new_group), from every rank's main thread
        self.pool: DaemonWorker | None = None
        # (batch, the function returning its exchanged ids, NextIds if they travel with a pooled all-to-all)
        self.pending: tuple[object, Callable[[], DistIds], object] | None = None

    @classmethod
    def create(cls, sharded: ShardedEmbedding) -> "IdsAhead | None":
        """None without a multi-rank gloo or NCCL default group, or when no rank holds a
        model-parallel shard (every table replicated: no ids to exchange, and a worker thread
        handed every batch would only cost wake-ups). Under NCCL the exchange is the same: ids
        are CPU tensors and this group is gloo's."""
        if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() not in ("gloo", "nccl"):
            return None
        if not any(sharded.widths):
            return None
        return cls(sharded)

    def _exchange(self, ids: DistIds) -> DistIds:
        return self.sharded.exchange(ids, self.transport, kind="ids_ahead")

    def take(self, batch, following=None):
        """`batch` with its ids exchanged (started a step ago if `batch` was last call's
        `following`, else now), after starting the exchange of `following` (if any)."""
        if self.pool is None:  # every rank reaches its first step at the same point
            self.transport = TorchCollectives(dist.new_group(backend="gloo"), self.sharded.stats)
            self.pool = DaemonWorker("dlrmkit-ids-ahead")
        if self.pending is not None and self.pending[0] is batch:
            current = self.pending[1]
        else:
            self.drain()
            current = self._start(batch.ids)
        coalesced = following is not None and self.sharded.one_hot_fast(following.ids)
        self.pending = (
            (following, self._start(following.ids), None) if following is not None and not coalesced else None
        )
        out = with_ids(batch, current())
        if coalesced:  # with this batch's pooled all-to-all where they can, else on their own
            nxt = self.coalesce(following.ids)
            wait = self._coalesced(nxt) if nxt is not None else self._start(following.ids)
            self.pending = (following, wait, nxt)
        return out

    def coalesce(self, ids: DistIds) -> NextIds | None:
        """Has one-hot `ids` travel coalesced with the pooled all-to-all that the next
        `sharded.start` starts, instead of an all-to-all of their own. None where they cannot:
        blocking mode, or ids on a transport of their own (NCCL runs keep them on gloo, the
        pooled embeddings on the GPU)."""
        sharded = self.sharded
        sharded.next_ids = None
        if not (sharded.overlap and sharded.ids_with_pooled):
            return None
        sharded.next_ids = NextIds(ids, sharded.ids_op(ids.local, ids.batch_sizes, "ids_ahead"))
        return sharded.next_ids

    def _coalesced(self, nxt: NextIds) -> Callable[[], DistIds]:
        """The function returning the ids as the pooled all-to-all delivered them; exchanged
        then if none did (no forward ran in between: on every rank alike)."""

        def result() -> DistIds:
            if nxt.received is None:
                return self._exchange(nxt.ids)
            return dataclasses.replace(nxt.ids, global_ids=nxt.received.view(sum(nxt.ids.batch_sizes), -1))

        return result

    def _start(self, ids: DistIds) -> Callable[[], DistIds]:
        """Launches the exchange of `ids`; returns the function that waits for it."""
        if self.sharded.one_hot_fast(ids):
            wait = self.sharded.exchange_started(ids.local, ids.batch_sizes, self.transport, kind="ids_ahead")
            return lambda: dataclasses.replace(ids, global_ids=wait())
        return self.pool.submit(self._exchange, ids).result

    def pipeline(self, batches: Iterator) -> Iterator:
        """`batches` with ids exchanged, each one's exchange running during the previous step."""
        it = iter(batches)
        current = next(it, None)
        while current is not None:
            following = next(it, None)
            yield self.take(current, following)
            current = following

    def drain(self) -> None:
        """Waits for the exchange started ahead (every rank started it) and drops it."""
        if self.pending is not None and self.pending[2] is None:  # coalesced ids: nothing in flight
            self.pending[1]()
        self.pending = None

    def close(self) -> None:
        """Waits for the exchange started ahead and ends the worker (before leaving the group)."""
        self.drain()
        if self.pool is not None:
            self.pool.stop()
            self.pool.thread.join(timeout=10)
            self.pool = None
