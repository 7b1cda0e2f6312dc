"""Shared-memory slots for summing dense gradients between ranks on one host. gloo, the CPU
backend, has only a TCP transport: on one host every byte is copied into a loopback socket and
out again, on the rank's own core (Criteo Kaggle's 1.9 MiB of MLP gradients: about 2.5 ms of a
9 ms step on two ranks, docs/BENCHMARKS.md). Here every rank writes its gradients into its own
slot of a shared file (mapped by torch.from_file) and reads the others' slots directly. The
ordering stays gloo's: each sum still runs a small gloo collective (the loss, riders, or a
one-element token), whose completion tells every rank that all slots are written, and whose
timeout still turns a dead rank into an error.

Slots are double-buffered by step: a rank writes step t + 2 only after its sum of step t + 1
completed, so every rank has launched step t + 1 and therefore finished reading step t. Every
rank adds the slots in rank order, so all hold the same bits. Files are unlinked as soon as
every rank has mapped them: nothing is left in /dev/shm, even when a rank is killed."""

from __future__ import annotations

import os
import secrets
import socket

import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"
ALIGN = 64  # bytes: each region starts on a cache line
HEADER = ALIGN  # bytes at a slot's head: its owner's nonce


def map_existing(path: str, size: int) -> torch.Tensor:
    """A peer's slot file, shared; an error if it is missing or short (never created here)."""
    if os.stat(path).st_size < size:
        raise OSError(f"{path}: shorter than a slot")
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def host_identity() -> tuple[str, str]:
    """(host name, boot id): ranks that agree on it share one kernel, hence one /dev/shm."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


class SharedSlots:
    """Every rank's slot (two halves, one per step parity) of `nbytes` bytes, mapped here."""

    def __init__(self, slots: list[torch.Tensor], rank: int, nbytes: int, name: str = ""):
        self.slots, self.rank, self.nbytes, self.name = slots, rank, nbytes, name  # name: the files' prefix

    @classmethod
    def create(cls, nbytes: int, group=None, directory: str = SHM_DIR) -> "SharedSlots | None":
        """Slots of `nbytes` per parity for every rank of `group` (a collective: every rank
        calls it), or None, on every rank alike, unless all ranks run on one host and each
        could map its slot."""
        if not dist.is_initialized() or dist.get_world_size(group) < 2 or nbytes <= 0:
            return None
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        token = [secrets.token_hex(8) if rank == 0 else None]
        dist.broadcast_object_list(token, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        prefix = f"dlrmkit-slots-{token[0]}-"
        path = os.path.join(directory, f"{prefix}{rank}")
        size = HEADER + 2 * nbytes
        nonce = secrets.token_bytes(HEADER)  # written at the slot's head: a peer checks it maps this very file
        mine = None
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                # reserve the pages now: a full tmpfs is an error here, not a SIGBUS mid-step
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
            mine = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            mine[:HEADER] = torch.frombuffer(bytearray(nonce), dtype=torch.uint8)
        except (OSError, RuntimeError):
            mine = None
        state = (host_identity(), mine is not None, nonce)
        states: list = [None] * world
        dist.all_gather_object(states, state, group=group)
        usable = all(ok for _, ok, _ in states) and len({h for h, _, _ in states}) == 1
        slots: list[torch.Tensor] = []
        if usable:
            try:
                for r in range(world):
                    slots.append(mine if r == rank else map_existing(os.path.join(directory, f"{prefix}{r}"), size))
                # another /dev/shm under the same host name (a container) would show other bytes
                if any(bytes(slot[:HEADER].tolist()) != states[r][2] for r, slot in enumerate(slots)):
                    slots = []
            except (OSError, RuntimeError):
                slots = []
            mapped: list = [None] * world
            dist.all_gather_object(mapped, bool(slots), group=group)
            usable = all(mapped)
        if mine is not None:
            os.unlink(path)  # every rank has mapped it (or none will use it): the mapping outlives the name
        dist.barrier(group=group)  # on return, no rank's file is left
        return cls([slot[HEADER:] for slot in slots], rank, nbytes, prefix) if usable else None

    def region(self, parity: int, offset: int, numel: int, dtype: torch.dtype, rank: int | None = None) -> torch.Tensor:
        """`numel` values of `dtype` at byte `offset` of a rank's slot (default: this rank's)."""
        start = parity * self.nbytes + offset
        slot = self.slots[self.rank if rank is None else rank]
        return slot[start : start + numel * dtype.itemsize].view(dtype)

    def sum(self, parity: int, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new tensor: the region summed over ranks, in rank order (the same bits on every rank)."""
        parts = [self.region(parity, offset, numel, dtype, r) for r in range(len(self.slots))]
        out = torch.add(parts[0], parts[1])
        for p in parts[2:]:
            out.add_(p)
        return out


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
