"""The one seam through which hybrid-parallel training moves bytes between ranks (torchrec's
`distributed/comm_ops.py` style, over torch's own collectives). A `Transport` starts a
collective and returns a `Request`; `wait()` gives its result. Three collectives exist:

  AllReduce(tensor)                        -> the sum over ranks (same shape and dtype)
  AllToAll(tensor, send_counts, recv_counts) -> what the other ranks sent this one, rank by rank
  AllGather(tensor)                        -> every rank's tensor, concatenated in rank order

`start(ops)` starts several as coalesced collectives (one collective where the implementation
can; the results come back in order), as torch's `all_reduce_coalesced` does for sums.

How the bytes travel is decided once, at setup (`parallel/hybrid.py` `make_transport`), by
choosing the implementation: `TorchCollectives` (gloo or NCCL: torch.distributed),
`LocalCollectives` (one rank: nothing travels), `Bf16Wire` (float32 values cross the wire as
bfloat16) and `SharedMemorySum` (`parallel/shared_memory.py`: ranks on one host sum and gather
through shared memory). The dense-gradient sum and the sharded embedding call only this
interface. Every rank must start the same collectives in the same order on one transport."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, Union

import torch
import torch.distributed as dist
from torch.profiler import record_function

from dlrmkit.faults import COLLECTIVE_NOTE


@dataclass
class AllReduce:
    """Sum `tensor` over ranks."""

    tensor: torch.Tensor
    kind: str = "allreduce"


@dataclass
class AllToAll:
    """Flat all-to-all: the first send_counts[0] elements of 1-D `tensor` go to rank 0, and so
    on; the result holds recv_counts[r] elements from each rank r, in rank order."""

    tensor: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    kind: str = "all_to_all"
    out: torch.Tensor | None = None  # where the result goes (torch's output tensor), if given


@dataclass
class AllGather:
    """Every rank's 1-D `tensor` (all of one size), concatenated in rank order."""

    tensor: torch.Tensor
    kind: str = "allgather"


Op = Union[AllReduce, AllToAll, AllGather]


class Request(Protocol):
    def wait(self) -> Any:
        """Blocks until the collective is done; returns its result (a list for `start`)."""


class Transport(Protocol):
    """Collectives over one group of ranks (see the module docstring)."""

    rank: int
    world_size: int
    stats: "CommStats"

    def start(self, ops: Sequence[Op]) -> Request:
        """Starts `ops` as coalesced collectives; wait() returns their results in order."""

    def all_reduce(self, tensor: torch.Tensor, kind: str = "allreduce") -> Request: ...

    def all_to_all_single(
        self, tensor: torch.Tensor, send_counts: list[int], recv_counts: list[int], kind: str = "all_to_all"
    ) -> Request: ...

    def all_gather_into_tensor(self, tensor: torch.Tensor, kind: str = "allgather") -> Request: ...


class CommStats:
    """Bytes this rank sent to other ranks and seconds spent waiting, by kind ("ids",
    "pooled_fwd", "pooled_bwd", "allreduce", "replica_grads", ...; the step adds its phases'
    seconds): what bench and the trainer report. Thread-safe (the ids' worker thread adds)."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, kind: str, nbytes: int, seconds: float = 0.0) -> None:
        with self.lock:
            self.bytes[kind] = self.bytes.get(kind, 0) + int(nbytes)
            self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds

    def reset(self) -> None:
        with self.lock:
            self.bytes.clear()
            self.seconds.clear()


def ring_bytes(payload: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of `payload` bytes: 2 (N-1)/N of it (the
    minimum for any all-reduce algorithm with evenly spread traffic)."""
    return 2 * (world_size - 1) * payload // world_size


def sent_bytes(op: Op, rank: int, world_size: int) -> int:
    """Bytes this rank sends for `op` (an all-reduce counted as a ring's)."""
    t = op.tensor
    if isinstance(op, AllReduce):
        return ring_bytes(t.numel() * t.element_size(), world_size)
    if isinstance(op, AllGather):
        return (world_size - 1) * t.numel() * t.element_size()
    return (sum(op.send_counts) - op.send_counts[rank]) * t.element_size()


def add_sent(stats: "CommStats", ops: Sequence[Op], rank: int, world_size: int) -> None:
    """Counts the bytes `ops` send, by kind."""
    sent: dict[str, int] = {}
    for op in ops:
        sent[op.kind] = sent.get(op.kind, 0) + sent_bytes(op, rank, world_size)
    for kind, n in sent.items():
        stats.add(kind, n)


class Done:
    """A request that is already complete."""

    def __init__(self, result: Any):
        self.result = result

    def wait(self) -> Any:
        return self.result


class Collectives:
    """The single-op methods of the Transport protocol, as `start` of one op."""

    def all_reduce(self, tensor: torch.Tensor, kind: str = "allreduce") -> Request:
        return Single(self.start([AllReduce(tensor, kind)]))

    def all_to_all_single(
        self, tensor: torch.Tensor, send_counts: list[int], recv_counts: list[int], kind: str = "all_to_all"
    ) -> Request:
        return Single(self.start([AllToAll(tensor, send_counts, recv_counts, kind)]))

    def all_gather_into_tensor(self, tensor: torch.Tensor, kind: str = "allgather") -> Request:
        return Single(self.start([AllGather(tensor, kind)]))


class Single:
    """The one result of a request started with one op."""

    def __init__(self, request: Request):
        self.request = request

    def wait(self) -> Any:
        return self.request.wait()[0]


class LocalCollectives(Collectives):
    """One rank: every collective's result is its input (a sum of one, a gather of one)."""

    rank, world_size = 0, 1

    def __init__(self, stats: CommStats | None = None):
        self.stats = stats or CommStats()

    def start(self, ops: Sequence[Op]) -> Request:
        return Done([into(op, op.tensor.reshape(-1).clone()) if isinstance(op, AllToAll) else op.tensor for op in ops])


class TorchCollectives(Collectives):
    """torch.distributed's collectives on `group` (gloo or NCCL). Coalesced: the all-reduces of
    one dtype are summed as one flat buffer; several all-to-alls travel as one (each
    destination's blocks side by side, as bytes); an all-gather is torch's."""

    def __init__(self, group=None, stats: CommStats | None = None):
        self.group, self.stats = group, stats or CommStats()
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)

    def start(self, ops: Sequence[Op]) -> Request:
        if not ops:
            return Done([])
        add_sent(self.stats, ops, self.rank, self.world_size)
        works, finish = [], [None] * len(ops)
        sums: dict[torch.dtype, list[int]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, AllReduce):
                sums.setdefault(op.tensor.dtype, []).append(i)
        for idx in sums.values():
            works.append(("all_reduce", self._sum([ops[i].tensor for i in idx], idx, finish)))
        a2a = [i for i, op in enumerate(ops) if isinstance(op, AllToAll)]
        if a2a:
            works.append(("all_to_all_single", self._all_to_all([ops[i] for i in a2a], a2a, finish)))
        for i, op in enumerate(ops):
            if isinstance(op, AllGather):
                t = op.tensor.reshape(-1).contiguous()
                out = t.new_empty(self.world_size * t.numel())
                works.append(
                    ("all_gather_into_tensor", dist.all_gather_into_tensor(out, t, group=self.group, async_op=True))
                )
                finish[i] = lambda out=out: out
        kinds = ", ".join(dict.fromkeys(op.kind for op in ops))
        what = "all_to_all" if a2a and len(a2a) == len(ops) else "allreduce"  # profiles file waits by these words
        return TorchRequest(works, finish, f"{what} wait ({kinds})", ops[0].kind, self.stats)

    def _sum(self, tensors: list[torch.Tensor], idx: list[int], finish: list):
        flat = tensors[0] if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        at = 0
        for i, t in zip(idx, tensors):
            finish[i] = (lambda t=t: t) if flat is t else (lambda at=at, t=t: flat[at : at + t.numel()].view_as(t))
            at += t.numel()
        return work

    def _all_to_all(self, ops: list[AllToAll], idx: list[int], finish: list):
        if len(ops) == 1:  # the common case: torch's all-to-all as it is
            op = ops[0]
            t = op.tensor.reshape(-1).contiguous()
            out = op.out if op.out is not None and op.out.dtype == t.dtype else t.new_empty(sum(op.recv_counts))
            finish[idx[0]] = lambda: out
            return dist.all_to_all_single(out, t, op.recv_counts, op.send_counts, group=self.group, async_op=True)
        # coalesced: for each destination, every op's block for it, as bytes
        sends = [op.tensor.reshape(-1).contiguous().view(torch.uint8) for op in ops]
        size = [op.tensor.element_size() for op in ops]
        blocks = [s.split([c * k for c in op.send_counts]) for s, op, k in zip(sends, ops, size)]
        send = torch.cat([b[r] for r in range(self.world_size) for b in blocks])
        recv_parts = [[op.recv_counts[r] * k for op, k in zip(ops, size)] for r in range(self.world_size)]
        out = send.new_empty(sum(map(sum, recv_parts)))
        send_sizes = [sum(op.send_counts[r] * k for op, k in zip(ops, size)) for r in range(self.world_size)]
        work = dist.all_to_all_single(
            out, send, list(map(sum, recv_parts)), send_sizes, group=self.group, async_op=True
        )

        def part(j: int) -> torch.Tensor:
            pieces = out.split([n for parts in recv_parts for n in parts])
            mine = torch.cat([pieces[r * len(ops) + j] for r in range(self.world_size)])
            return into(ops[j], mine.view(ops[j].tensor.dtype))

        for j, i in enumerate(idx):
            finish[i] = lambda j=j: part(j)
        return work


def into(op: Op, result: torch.Tensor) -> torch.Tensor:
    """`result`, in the op's output tensor where it names one."""
    out = getattr(op, "out", None)
    if out is None or out is result:
        return result
    return out.copy_(result.view_as(out))


class TorchRequest:
    def __init__(self, works: list, finish: list, name: str, kind: str, stats: CommStats):
        """`works`: (torch's collective's name, its async work) pairs."""
        self.works, self.finish, self.name, self.kind, self.stats, self.result = works, finish, name, kind, stats, None

    def wait(self) -> list:
        """Waits (the seconds exposed count under the first op's kind); the results. A wait that
        fails (a peer died or timed out) carries the collective's name as a note on the error."""
        if self.result is None:
            t0 = time.perf_counter()
            with record_function(self.name):
                for op, work in self.works:
                    try:
                        work.wait()
                    except RuntimeError as exc:
                        exc.add_note(f"{COLLECTIVE_NOTE}{op} ({self.kind})")
                        raise
            self.result = [f() for f in self.finish]
            self.stats.add(self.kind, 0, time.perf_counter() - t0)
        return self.result


class Bf16Wire(Collectives):
    """float32 values cross the wire as bfloat16 (half the bytes); results come back as float32.
    Other dtypes (ids, packed bytes, the float64 loss) travel as they are."""

    def __init__(self, inner: Transport):
        self.inner, self.rank, self.world_size, self.stats = inner, inner.rank, inner.world_size, inner.stats

    def start(self, ops: Sequence[Op]) -> Request:
        wired = [
            replace_tensor(op, op.tensor.to(torch.bfloat16))
            if op.tensor.dtype == torch.float32 and not isinstance(op, AllGather)
            else op
            for op in ops
        ]
        return Widened(self.inner.start(wired), ops)


def replace_tensor(op: Op, tensor: torch.Tensor) -> Op:
    if isinstance(op, AllToAll):
        return AllToAll(tensor, op.send_counts, op.recv_counts, op.kind)
    return type(op)(tensor, op.kind)


class Widened:
    def __init__(self, request: Request, ops: Sequence[Op]):
        self.request, self.ops, self.result = request, ops, None

    def wait(self) -> list:
        if self.result is None:
            self.result = [into(op, r.to(op.tensor.dtype)) for r, op in zip(self.request.wait(), self.ops)]
        return self.result


def torch_collectives(group=None, stats: CommStats | None = None) -> Transport:
    """torch's collectives on `group`, or LocalCollectives without a multi-rank process group."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return LocalCollectives(stats)
    return TorchCollectives(group, stats)


def all_gather_objects(obj, group=None) -> list:
    """Every rank's `obj` (pickled), in rank order, over `group` (give a gloo group under NCCL, or
    the pickles travel through GPU memory); [obj] without a process group. Setup only."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out
