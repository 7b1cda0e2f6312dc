"""`SharedMemorySum`: the Transport for ranks on one host that sums (and gathers) through shared
memory instead of gloo's TCP loopback, where every byte is copied into a socket and out again
on the rank's own core (docs/BENCHMARKS.md, "Hybrid parallel"). Chosen once at setup
(`ParallelConfig.shared_memory`, `--no-shm` in the benchmarks); delete this module and that
switch when torch's gloo sums through shared memory itself.

Each rank owns a slot: an anonymous memory file (memfd) that the other ranks map through
/proc/<pid>/fd. Nothing is ever named in /dev/shm, so a rank killed at any point leaves no file:
the kernel frees the memory with the last mapping. An all-reduce or all-gather writes this
rank's tensor into its slot; one small gloo collective (the `inner` transport's) tells every
rank that all slots are written and still turns a dead rank into a timeout; then each rank adds
(or concatenates) all slots in rank order, so every rank holds the same bits. What does not fit
in a slot, and every all-to-all, goes through `inner`.

Slots have two halves, used by alternate requests. A request is started only after the previous
one was waited for (`start` waits for it), so when a rank's request k completes, every rank has
started request k, hence finished reading request k - 1, whose half request k + 1 reuses."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from dlrmkit.faults import fault_point
from dlrmkit.parallel.transport import AllReduce, AllToAll, Collectives, Op, Request, Transport, sent_bytes

ALIGN = 64  # bytes: each region starts on a cache line
HEADER = ALIGN  # bytes at a slot's head: its owner's nonce


def host_identity() -> tuple[str, str]:
    """(host name, boot id): ranks that agree on it share one kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class SharedSlots:
    """Every rank's slot (two halves of `nbytes`), mapped here."""

    def __init__(self, slots: list[torch.Tensor], rank: int, nbytes: int):
        self.slots, self.rank, self.nbytes = slots, rank, nbytes

    @classmethod
    def create(cls, nbytes: int, group=None) -> "SharedSlots | None":
        """Slots for every rank of `group` (a collective: every rank calls it), or None on every
        rank alike unless all ranks run on one host and each could map every slot."""
        if not dist.is_initialized() or dist.get_world_size(group) < 2 or nbytes <= 0:
            return None
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        nbytes = aligned(nbytes)  # the second half starts on a cache line too
        size = HEADER + 2 * nbytes
        nonce = secrets.token_bytes(HEADER)  # at the slot's head: a peer checks it maps this very memory
        fd, mine = -1, None
        try:
            fd = os.memfd_create("dlrmkit-slot", 0)
            os.posix_fallocate(fd, 0, size)  # reserve the pages: no SIGBUS mid-step on a full host
            mine = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
            mine[:HEADER] = torch.frombuffer(bytearray(nonce), dtype=torch.uint8)
        except (OSError, RuntimeError, AttributeError):  # AttributeError: no memfd (not Linux)
            mine = None
        fault_point("shared-memory:created")  # reliability tests only (DLRMKIT_FAULT)
        states: list = [None] * world
        dist.all_gather_object(states, (host_identity(), mine is not None, os.getpid(), fd, nonce), group=group)
        usable = all(ok for _, ok, _, _, _ in states) and len({h for h, _, _, _, _ in states}) == 1
        slots: list[torch.Tensor] = []
        if usable:
            try:
                for r, (_, _, pid, peer_fd, peer_nonce) in enumerate(states):
                    path = f"/proc/{pid}/fd/{peer_fd}"
                    slot = mine if r == rank else torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
                    # another host under the same name (a container) would show other bytes
                    if bytes(slot[:HEADER].tolist()) != peer_nonce:
                        raise OSError("not the peer's slot")
                    slots.append(slot)
            except (OSError, RuntimeError):
                slots = []
        fault_point("shared-memory:mapped")  # reliability tests only (DLRMKIT_FAULT)
        mapped: list = [None] * world
        dist.all_gather_object(mapped, bool(slots), group=group)  # every rank has mapped (or given up)
        if fd >= 0:
            os.close(fd)  # the mappings keep the memory; none names it
        if not (usable and all(mapped)):
            return None
        return cls([slot[HEADER:] for slot in slots], rank, nbytes)

    def region(self, half: int, offset: int, numel: int, dtype: torch.dtype, rank: int | None = None) -> torch.Tensor:
        """`numel` values of `dtype` at byte `offset` of a half of a rank's slot (default: this rank's)."""
        start = half * self.nbytes + offset
        slot = self.slots[self.rank if rank is None else rank]
        return slot[start : start + numel * dtype.itemsize].view(dtype)


class SharedMemorySum(Collectives):
    """All-reduces and all-gathers through shared slots (see the module docstring); everything
    else, and what does not fit in a half of `nbytes`, through `inner`."""

    def __init__(self, inner: Transport, slots: SharedSlots):
        self.inner, self.slots, self.stats = inner, slots, inner.stats
        self.rank, self.world_size = inner.rank, inner.world_size
        self.count, self.previous = 0, None  # requests started; the last one
        self.places: dict[tuple, tuple] = {}  # place()'s answer by the ops' types, dtypes and sizes

    @classmethod
    def create(cls, inner: Transport, nbytes: int, group=None) -> "SharedMemorySum | None":
        slots = SharedSlots.create(nbytes, group)
        return cls(inner, slots) if slots is not None else None

    def start(self, ops: Sequence[Op]) -> Request:
        key = tuple((type(op), op.tensor.dtype, op.tensor.numel()) for op in ops)
        if key not in self.places:  # a step starts the same ops every time: placed once
            if len(self.places) > 64:  # sizes that vary (jagged lookups' gathers) are placed anew
                self.places.clear()
            self.places[key] = self.place(ops)
        blocks, through, sent = self.places[key]
        if not blocks:  # nothing in the slots: not one of this transport's requests
            return self.inner.start(ops)
        if self.previous is not None:
            self.previous.wait()  # its half is read before the other half's request starts
        half, self.count = self.count % 2, self.count + 1
        for block in blocks:
            tensors = [ops[i].tensor.reshape(-1) for i in block.ops]
            torch.cat(tensors, out=self.slots.region(half, block.offset, block.numel, block.dtype))
        for kind, n in sent.items():
            self.stats.add(kind, n)
        inner_ops = [ops[i] for i in through]
        if not inner_ops:  # a collective whose completion says that every rank's slot is written
            ones = [1] * self.world_size
            inner_ops = [AllToAll(torch.zeros(self.world_size), ones, ones, "allreduce")]
        self.previous = SharedRequest(self.slots, half, ops, blocks, through, self.inner.start(inner_ops))
        return self.previous

    def place(self, ops: Sequence[Op]) -> tuple[list["Block"], list[int], dict[str, int]]:
        """Where each op goes (the same on every rank: sizes agree): blocks in the slots (an
        all-gather alone; consecutive sums of one dtype packed together, added in one go), the
        ops for `inner`, and the bytes the slots' ops count as sent, by kind."""
        blocks: list[Block] = []
        through: list[int] = []
        at = 0
        for i, op in enumerate(ops):
            t = op.tensor
            last = blocks[-1] if blocks else None
            if isinstance(op, AllReduce) and last is not None and last.sums and last.dtype == t.dtype:
                end = last.offset + (last.numel + t.numel()) * t.element_size()
                if end <= self.slots.nbytes:
                    last.ops.append(i)
                    last.numel += t.numel()
                    at = aligned(end)
                    continue
            if isinstance(op, AllToAll) or at + t.numel() * t.element_size() > self.slots.nbytes:
                through.append(i)
                continue
            blocks.append(Block(at, t.dtype, isinstance(op, AllReduce), [i], t.numel()))
            at = aligned(at + t.numel() * t.element_size())
        sent: dict[str, int] = {}
        for i in (i for block in blocks for i in block.ops):
            sent[ops[i].kind] = sent.get(ops[i].kind, 0) + sent_bytes(ops[i], self.rank, self.world_size)
        return blocks, through, sent


@dataclass
class Block:
    """Ops side by side at byte `offset` of every rank's slot: sums of one dtype, or an all-gather."""

    offset: int
    dtype: torch.dtype
    sums: bool
    ops: list[int]
    numel: int


class SharedRequest:
    def __init__(self, slots: SharedSlots, half: int, ops, blocks: list[Block], through: list[int], request):
        self.slots, self.half, self.ops, self.blocks, self.through, self.request = (
            slots,
            half,
            ops,
            blocks,
            through,
            request,
        )
        self.result: list | None = None

    def wait(self) -> list:
        if self.result is not None:
            return self.result
        got = self.request.wait()
        out: list = [None] * len(self.ops)
        for i, r in zip(self.through, got):
            out[i] = r
        slots = self.slots
        for block in self.blocks:
            parts = [
                slots.region(self.half, block.offset, block.numel, block.dtype, r) for r in range(len(slots.slots))
            ]
            if not block.sums:
                out[block.ops[0]] = torch.cat(parts)
                continue
            total = torch.add(parts[0], parts[1])  # in rank order: every rank adds the same values alike
            for p in parts[2:]:
                total.add_(p)
            at = 0
            for i in block.ops:
                t = self.ops[i].tensor
                out[i] = total[at : at + t.numel()].view_as(t)
                at += t.numel()
        self.result = out
        return out
