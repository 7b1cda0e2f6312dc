"""All communication of hybrid-parallel training in one place: the all-to-alls of ids and of
pooled embeddings (and their reverse in backward), and bucketed gradient all-reduce. `dtype`
is the wire format (e.g. bfloat16 to halve bytes); results come back in the input's dtype."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.profiler import record_function


class CommStats:
    """Bytes this rank sent to other ranks and seconds spent in collectives, by kind
    ("ids", "pooled_fwd", "pooled_bwd", "allreduce"): what bench and the trainer report."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.lock = threading.Lock()  # the ids-ahead worker thread adds its own kind

    def add(self, kind: str, nbytes: int, seconds: float = 0.0) -> None:
        with self.lock:
            self.bytes[kind] = self.bytes.get(kind, 0) + int(nbytes)
            self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds

    def reset(self) -> None:
        with self.lock:
            self.bytes.clear()
            self.seconds.clear()


def all_to_all(
    x: torch.Tensor,
    send_counts: list[int],
    recv_counts: list[int],
    dtype: torch.dtype | None = None,
    stats: CommStats | None = None,
    kind: str = "a2a",
    group=None,
) -> torch.Tensor:
    """Flat all-to-all: the first send_counts[0] elements of `x` go to rank 0, and so on;
    returns the received elements, rank by rank. Counts are in elements."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        flat = x.reshape(-1)
        wire = flat if dtype is None or dtype == flat.dtype else flat.to(dtype)
        return wire.to(flat.dtype).clone() if wire is flat else wire.to(flat.dtype)
    out, wait = _launch(x, send_counts, recv_counts, dtype, stats, kind, group)
    wait()
    return out


@dataclass
class Carried:
    """Data that rides in another all-to-all instead of a collective of its own (the next
    batch's ids in the pooled one: on 2 bound CPU ranks each collective costs about 0.5 ms of
    wake-ups and syscalls). `data`: 1-D, `send_counts` of it to each rank, `recv_counts` from
    each; its element size a multiple of the wire's, whose elements its bytes travel as.
    `received`: what arrived, rank by rank, once the carrying all-to-all was waited for (None
    until then)."""

    data: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    kind: str
    received: torch.Tensor | None = None


def _interleave(a, b) -> list:
    return [t for pair in zip(a, b) for t in pair]


def all_to_all_started(
    x: torch.Tensor,
    send_counts: list[int],
    recv_counts: list[int],
    dtype: torch.dtype | None,
    stats: CommStats | None,
    kind: str,
    group=None,
    carry: Carried | None = None,
):
    """`all_to_all` launched asynchronously: (result buffer, wait). The buffer holds the
    received elements only after wait() returns; wait() also records the exposed seconds.
    `carry`: other data riding in the same collective (Carried), after each destination's block."""
    flat = x.reshape(-1)
    wire = (flat if dtype is None or dtype == flat.dtype else flat.to(dtype)).contiguous()
    sends, recvs, send = send_counts, recv_counts, wire
    if carry is not None:  # each destination's block, then its carried part (as the wire dtype's elements)
        k = carry.data.element_size() // wire.element_size()
        c_send, c_recv = [c * k for c in carry.send_counts], [c * k for c in carry.recv_counts]
        send = torch.cat(_interleave(wire.split(send_counts), carry.data.contiguous().view(wire.dtype).split(c_send)))
        sends = [a + b for a, b in zip(send_counts, c_send)]
        recvs = [a + b for a, b in zip(recv_counts, c_recv)]
    out = torch.empty(sum(recvs), dtype=send.dtype, device=flat.device)
    work = dist.all_to_all_single(out, send, recvs, sends, group=group, async_op=True)
    separate = out.dtype != flat.dtype or carry is not None
    result = torch.empty(sum(recv_counts), dtype=flat.dtype, device=flat.device) if separate else out
    if stats is not None:
        me = dist.get_rank(group)
        stats.add(kind, (sum(send_counts) - send_counts[me]) * wire.element_size())
        if carry is not None:
            stats.add(carry.kind, (sum(carry.send_counts) - carry.send_counts[me]) * carry.data.element_size())

    def wait(keep=send) -> None:  # `keep`: the send buffer lives until the collective is done
        t0 = time.perf_counter()
        with record_function(f"all_to_all wait ({kind})"):  # waits show in profiles as all-to-all
            work.wait()
        if carry is not None:
            parts = out.split(_interleave(recv_counts, c_recv))
            carry.received = torch.cat(parts[1::2]).view(carry.data.dtype)
            if result.dtype == out.dtype:
                torch.cat(parts[0::2], out=result)
            else:
                result.copy_(torch.cat(parts[0::2]))
        elif result is not out:
            result.copy_(out)
        if stats is not None:
            stats.add(kind, 0, time.perf_counter() - t0)

    return result, wait


_launch = all_to_all_started  # all_to_all's own launch (instrumenting the public name sees only async ones)


class AllToAll(torch.autograd.Function):
    """Differentiable all-to-all: backward sends gradients back along the reverse route. With a
    `waits` list, forward only launches the exchange and appends its wait there (the caller
    overlaps other work, then waits before reading the result). With
    `async_backward`, backward launches the exchange and returns its buffer at once, so autograd
    goes on with other branches (the bottom MLP's backward) while it travels; the wait is queued
    to run when the backward pass ends. Only for consumers that keep the gradient without reading
    it before then (tables that defer their gradients, FusedTable.defer_grads)."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        dtype,
        stats=None,
        async_backward: bool = False,
        waits: list | None = None,
        early: dict | None = None,
        carry: "Carried | None" = None,
    ):
        ctx.send_counts, ctx.recv_counts, ctx.dtype, ctx.shape, ctx.stats = (
            send_counts,
            recv_counts,
            dtype,
            x.shape,
            stats,
        )
        ctx.async_backward, ctx.early = async_backward, early
        if waits is not None and dist.is_initialized() and dist.get_world_size() > 1:
            # launched only: the caller runs waits[0]() (under no_grad) before reading the result
            out, wait = all_to_all_started(x, send_counts, recv_counts, dtype, stats, "pooled_fwd", carry=carry)
            waits.append(wait)
            return out
        return all_to_all(x, send_counts, recv_counts, dtype, stats, "pooled_fwd")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        started = ctx.early.pop("started", None) if ctx.early is not None else None
        if started is None and ctx.async_backward and dist.is_initialized() and dist.get_world_size() > 1:
            started = all_to_all_started(grad, ctx.recv_counts, ctx.send_counts, ctx.dtype, ctx.stats, "pooled_bwd")
        if started is not None:
            back, wait = started
            if wait is None:  # rides in the dense gradients' exchange, which fills `back` (Riders)
                pass
            elif ctx.async_backward:
                torch.autograd.Variable._execution_engine.queue_callback(wait)
            else:
                wait()
        else:
            back = all_to_all(grad.contiguous(), ctx.recv_counts, ctx.send_counts, ctx.dtype, ctx.stats, "pooled_bwd")
        return back.view(ctx.shape), None, None, None, None, None, None, None, None


class PooledRider:
    """Backward's pooled gradients riding in the pairwise dense-gradient exchange (GradBuckets'
    rider protocol: `dtype`, `outgoing(peer)`, `incoming(peer)`, `land(received)`, `alone()`):
    the peer's block goes out, ours stays; `back` is filled rank by rank when it lands."""

    def __init__(self, carried: Carried, back: torch.Tensor, stats: CommStats | None):
        self.carried, self.back, self.stats = carried, back, stats

    @property
    def dtype(self) -> torch.dtype:
        return self.carried.data.dtype

    def outgoing(self, peer: int) -> torch.Tensor:
        c = self.carried
        if self.stats is not None:
            self.stats.add(c.kind, c.send_counts[peer] * c.data.element_size())
        return c.data.split(c.send_counts)[peer]

    def incoming(self, peer: int) -> int:
        return self.carried.recv_counts[peer]

    def land(self, received: torch.Tensor) -> None:
        c, me = self.carried, dist.get_rank()
        blocks = list(self.back.split(c.recv_counts))
        blocks[me].copy_(c.data.split(c.send_counts)[me])
        blocks[1 - me].copy_(received)

    def alone(self, group=None) -> Callable[[], None]:
        """Its own all-to-all; the wait fills `back`."""
        c = self.carried
        out, wait = all_to_all_started(c.data, c.send_counts, c.recv_counts, None, self.stats, c.kind, group)

        def done() -> None:
            wait()
            self.back.copy_(out)

        return done


# backward's pooled gradients ride in the dense gradients' exchange up to this size: a collective
# fewer pays at small batches (criteo-kaggle, batch 128: 106 KiB); larger ones travel alone, during
# the bottom MLP's backward (`small` at batch 2048: 13 MiB)
RIDE_MAX_BYTES = 1 << 20


class LaunchBackward(torch.autograd.Function):
    """Identity whose backward starts AllToAll's backward exchange of the gradient (into the
    `early` dict the AllToAll node reads). Applied to AllToAll's output where it is consumed,
    it runs as soon as that gradient is complete, while the AllToAll node itself may run much
    later: autograd takes ready nodes newest first, and an exchange started before the model
    (ShardedEmbedding.start) is older than the whole bottom MLP."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, early: dict, send_counts: list[int], recv_counts: list[int], dtype, stats=None):
        ctx.early, ctx.send_counts, ctx.recv_counts, ctx.dtype, ctx.stats = (
            early,
            send_counts,
            recv_counts,
            dtype,
            stats,
        )
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        riders = ctx.early.get("riders")
        if riders is not None and grad.numel() * grad.element_size() <= RIDE_MAX_BYTES:
            # no collective of its own: rides in the dense gradients' exchange (GradBuckets.riders)
            carried = Carried(grad.contiguous(), ctx.recv_counts, ctx.send_counts, "pooled_bwd")
            back = torch.empty(sum(ctx.send_counts), dtype=grad.dtype, device=grad.device)
            riders.append(PooledRider(carried, back, ctx.stats))
            ctx.early["started"] = (back, None)
        else:
            ctx.early["started"] = all_to_all_started(
                grad.contiguous(), ctx.recv_counts, ctx.send_counts, ctx.dtype, ctx.stats, "pooled_bwd"
            )
        return grad, None, None, None, None, None


def all_reduce_sum(
    tensors: list[torch.Tensor],
    bucket_bytes: int = 25 << 20,
    dtype: torch.dtype | None = None,
    stats: CommStats | None = None,
    group=None,
) -> None:
    """Sums each tensor over ranks in place (on process group `group`, default the default
    group), flattening them into buckets of about `bucket_bytes` so a model with many small
    layers makes few collective calls."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not tensors:
        return
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            _reduce_bucket(bucket, dtype, stats, group)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, dtype, stats, group)


def ring_bytes(payload: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of `payload` bytes: 2 (N-1)/N of it (the
    minimum for any all-reduce algorithm with evenly spread traffic)."""
    return 2 * (world_size - 1) * payload // world_size


def _reduce_bucket(
    bucket: list[torch.Tensor], dtype: torch.dtype | None, stats: CommStats | None = None, group=None
) -> None:
    flat = torch.cat([t.reshape(-1) for t in bucket])
    t0 = time.perf_counter()
    sum_started(flat, dtype, stats, group)()
    if stats is not None:
        stats.add("allreduce", 0, time.perf_counter() - t0)
    offset = 0
    for t in bucket:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def pairwise(group=None) -> bool:
    """Whether `group` sums by pairwise exchange: two gloo ranks."""
    return dist.get_world_size(group) == 2 and dist.get_backend(group) == "gloo"


def sum_started(
    flat: torch.Tensor,
    dtype: torch.dtype | None = None,
    stats: CommStats | None = None,
    group=None,
    tail: tuple[int, int] = (0, 0),
) -> Callable[[], torch.Tensor | None]:
    """Launches the sum of 1-D `flat` over the ranks of `group`, in place; returns the wait, after
    which `flat` holds the sum. `dtype`: the wire format. Two gloo ranks send each other their
    whole buffer in one all-to-all and add: gloo's all-reduce is a ring of two rounds cut in
    segments, 1.5-2.8 ms for 4 KiB to 2 MiB against 0.5-1.2 ms for this exchange of the same
    bytes (ranks bound to a core each, docs/BENCHMARKS.md), and a + b == b + a bitwise, so both
    ranks hold the same sum. Otherwise (NCCL, more ranks) torch's all-reduce. `tail`: (last
    elements of `flat` sent to the peer, not summed; elements the peer sends so): data riding in
    a pairwise exchange, which the wait returns (None without a tail)."""
    wire = flat if dtype is None or dtype == flat.dtype else flat.to(dtype)
    n = flat.numel() - tail[0]
    if stats is not None:
        stats.add("allreduce", ring_bytes(n * wire.element_size(), dist.get_world_size(group)))
    if pairwise(group):
        peer = torch.empty(n + tail[1], dtype=wire.dtype, device=wire.device)
        first = dist.get_rank(group) == 0
        sends, recvs = (
            [0, wire.numel()] if first else [wire.numel(), 0],
            [0, peer.numel()] if first else [peer.numel(), 0],
        )
        work = dist.all_to_all_single(peer, wire, recvs, sends, group=group, async_op=True)

        def wait_pair() -> torch.Tensor | None:
            work.wait()
            if wire is flat:
                flat[:n].add_(peer[:n])
            else:  # summed in flat's dtype: both ranks add the same two rounded values
                torch.add(wire[:n].to(flat.dtype), peer[:n].to(flat.dtype), out=flat[:n])
            return peer[n:] if tail != (0, 0) else None

        return wait_pair
    if tail != (0, 0):
        raise ValueError("only a pairwise exchange carries other data")
    work = dist.all_reduce(wire, group=group, async_op=True)

    def wait() -> None:
        work.wait()
        if wire is not flat:
            flat.copy_(wire)

    return wait


def all_gather_objects(obj, group=None) -> list:
    """Every rank's `obj` (pickled), in rank order, over `group` (give a gloo group under NCCL, or
    the pickles travel through GPU memory); [obj] without a process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out
