"""IdsAhead (parallel/ids_ahead.py) without a process group: a fake sharded module records the
exchanges. Batches come out in order, each with its own exchanged ids; the next batch's exchange
is started before the current one is handed out; an unexpected batch is exchanged on the spot
after the one in flight completes (so every rank issues the same collectives in the same order)."""

import threading
from dataclasses import dataclass

import torch

from dlrmkit.parallel.ids_ahead import DaemonWorker, IdsAhead


@dataclass
class FakeBatch:
    ids: object


class FakeSharded:
    def __init__(self, fast: bool = False, coalesces: bool = False):
        self.coalesces, self.coalesced = coalesces, []
        self.calls: list = []
        self.threads: set = set()
        self.fast = fast
        self.waited: list = []

    def one_hot_fast(self, ids) -> bool:
        return self.fast

    def exchange_started(self, local, sizes, transport=None, kind="ids"):
        """The fast path: started now (recorded), completed when the returned function runs."""
        self.calls.append(local)
        self.threads.add(threading.current_thread().name)
        return lambda: self.waited.append(local) or ("exchanged", local, transport, kind)

    def exchange(self, ids, transport=None, kind="ids"):
        self.calls.append(ids)
        self.threads.add(threading.current_thread().name)
        return ("exchanged", ids, transport, kind)


@dataclass
class FakeNext:
    ids: object
    received: object = None

    def deliver(self):
        """What the step's forward does: the ids arrive with its pooled all-to-all (a [2, 1] int tensor here)."""
        self.received = torch.tensor([[self.ids.local], [self.ids.local + 100]])


@dataclass
class FakeIds:
    local: object
    batch_sizes: tuple = (1, 1)
    global_ids: object = None


def ahead(fast: bool = False, coalesces: bool = False) -> tuple[IdsAhead, FakeSharded]:
    sharded = FakeSharded(fast, coalesces)
    a = IdsAhead(sharded)

    def coalesce(ids):
        """Ids travel with the next step's pooled all-to-all when `coalesces` (the test plays the forward)."""
        if not coalesces:
            return None
        sharded.coalesced.append(FakeNext(ids))
        return sharded.coalesced[-1]

    a.coalesce = coalesce
    a.transport, a.pool = "group", DaemonWorker("test-ids-ahead")  # what take() makes at first use
    return a, sharded


def test_pipeline_yields_every_batch_in_order_exchanged_one_ahead():
    a, sharded = ahead()
    batches = [FakeBatch(i) for i in range(5)]
    seen = []
    for got in a.pipeline(iter(batches)):
        seen.append(got.ids)
        # when batch i is handed out, batch i+1's exchange was already submitted
        if a.pending is not None:
            a.pending[1]()  # let it finish, to look at the calls
        assert sharded.calls == list(range(min(got.ids[1] + 2, 5)))
    assert seen == [("exchanged", i, "group", "ids_ahead") for i in range(5)]
    assert sharded.threads == {"test-ids-ahead"}  # never on the training thread
    a.close()


def test_take_of_an_unexpected_batch_completes_the_pending_one_first():
    a, sharded = ahead()
    b0, b1, other = FakeBatch("b0"), FakeBatch("b1"), FakeBatch("other")
    assert a.take(b0, b1).ids[1] == "b0"
    assert a.take(other).ids[1] == "other"  # b1 was started ahead: it completes (unused), then `other`
    assert sharded.calls == ["b0", "b1", "other"]
    assert a.pending is None
    a.close()
    assert a.pool is None


def test_one_hot_ids_are_launched_from_the_training_thread_one_ahead():
    """The fast path needs no worker: each batch's all-to-all is launched (async) one step
    ahead from the training thread and waited for when the batch is taken."""
    a, sharded = ahead(fast=True)
    batches = [FakeBatch(FakeIds(i)) for i in range(4)]
    for i, got in enumerate(a.pipeline(iter(batches))):
        assert got.ids.global_ids == ("exchanged", i, "group", "ids_ahead")
        assert sharded.calls == list(range(min(i + 2, 4)))  # the next one already launched
        assert sharded.waited == list(range(i + 1))  # this one completed, the next still in flight
    assert sharded.threads == {threading.current_thread().name}
    a.close()


def test_one_hot_ids_travel_with_the_previous_steps_pooled_all_to_all():
    """Where they can, the next batch's ids are registered to travel coalesced with the pooled
    all-to-all of the step that takes the batch just handed out, with no collective of their
    own; a batch whose step never ran its forward is exchanged when taken, and coalesced ids
    still pending are dropped, not waited for."""
    a, sharded = ahead(fast=True, coalesces=True)
    batches = [FakeBatch(FakeIds(i)) for i in range(3)]
    for i, got in enumerate(a.pipeline(iter(batches))):
        if i == 0:  # the first batch follows no step: exchanged on its own
            assert got.ids.global_ids == ("exchanged", 0, "group", "ids_ahead")
        else:
            assert torch.equal(got.ids.global_ids, torch.tensor([[i], [i + 100]]))
        if i < 2:
            assert sharded.coalesced[-1].ids is batches[i + 1].ids
            sharded.coalesced[-1].deliver()  # the step's forward
    assert sharded.calls == [0]
    assert a.pending is None

    a, sharded = ahead(fast=True, coalesces=True)
    b0, b1, b2 = (FakeBatch(FakeIds(i)) for i in range(3))
    a.take(b0, b1)  # b1 registered to travel with the next step; no forward runs
    assert a.take(b1).ids == ("exchanged", b1.ids, "group", "ids_ahead")  # exchanged when taken
    a.take(b2, b0)  # b0 registered; then an unexpected batch: b0 is dropped, nothing waited
    a.take(b1)
    assert sharded.calls == [0, b1.ids, 2, 1] and sharded.waited == [0, 2, 1] and a.pending is None
    a.close()
