"""Gradients of large replicated tables, exchanged as the rows the batch touched. A replicated
table's gradient summed densely (rows x dim values on the wire) pays only for small tables; a
large one (a whole model replicated on each rank, as the planner does when per-rank batches are
too small for model parallelism to pay) sends its lookups instead: each rank's (row, gradient
row) pairs reach every rank, which concatenates them in rank order, the global batch's order,
and updates its copy as one process would with the global batch. Every rank applies the same
rows in the same order, so the replicas stay equal bit for bit.

On two gloo ranks the pairs ride in the dense gradients' exchange (GradBuckets, a `Rider`);
otherwise they take one all-gather of their own, padded to the largest rank's lookups."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from dlrmkit.model.embedding import BagGrad
from dlrmkit.parallel import comm


def take_local(p: torch.nn.Parameter) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [n], gradient rows [n, dim]) of this rank's lookups of `p`, in lookup order, from
    deferred gradients (FusedTable.defer_grads) or a sparse `p.grad`; both are handed over
    (cleared). No lookups: empty tensors."""
    rows, values = [], []
    for g in getattr(p, "bag_grads", None) or []:
        rows.append(g.rows)
        values.append(g.grad.index_select(0, g.bags))
    if getattr(p, "bag_grads", None):
        p.bag_grads.clear()
    if p.grad is not None:
        grad = p.grad if p.grad.is_sparse else p.grad.to_sparse(1)
        rows.append(grad._indices()[0])
        values.append(grad._values())
        p.grad = None
    if not rows:
        return torch.empty(0, dtype=torch.int64, device=p.device), torch.empty(
            0, p.shape[1], dtype=p.dtype, device=p.device
        )
    return torch.cat(rows), torch.cat(values)


def packed_size(n: int, dim: int, value: torch.dtype, unit: torch.dtype) -> int:
    """Elements of `unit` that n lookups take packed: values then int64 rows, padded."""
    nbytes = n * (dim * value.itemsize + 8)
    return -(-nbytes // unit.itemsize)


def pack(rows: torch.Tensor, values: torch.Tensor, unit: torch.dtype) -> torch.Tensor:
    """The bytes of `values` then `rows`, as a 1-D tensor of `unit` (a wire's element type)."""
    raw = torch.cat([values.contiguous().view(-1).view(torch.uint8), rows.contiguous().view(torch.uint8)])
    pad = packed_size(len(rows), values.shape[1], values.dtype, unit) * unit.itemsize - raw.numel()
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(unit)


def unpack(buf: torch.Tensor, n: int, dim: int, value: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """pack's inverse: (rows [n], values [n, dim]) from the start of `buf`."""
    raw = buf.view(torch.uint8)
    split = n * dim * value.itemsize
    return _as(raw[split : split + n * 8], torch.int64), _as(raw[:split], value).view(n, dim)


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes `raw` as `dtype`: a view where aligned (a received tail may start anywhere)."""
    return raw.view(dtype) if raw.storage_offset() % dtype.itemsize == 0 else raw.clone().view(dtype)


def set_global(p: torch.nn.Parameter, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """`p`'s gradient from every rank's (rows, values), concatenated in rank order: deferred
    (one BagGrad, read by the fused update) where `p` defers, else a sparse COO gradient."""
    rows = torch.cat([r for r, _ in parts])
    values = torch.cat([v for _, v in parts])
    if hasattr(p, "bag_grads"):
        p.bag_grads[:] = [BagGrad(rows, torch.arange(len(rows), device=rows.device), values)]
    else:
        p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, p.shape, check_invariants=False)


class ReplicaExchange:
    """One replicated weight's gradient exchange for one step: this rank's lookups packed, the
    lookup count of every rank (one-hot: local batch x tables), then either riding (two gloo
    ranks: `outgoing`, `incoming`, `land`, as GradBuckets' riders) or its own all-gather."""

    def __init__(
        self,
        p: torch.nn.Parameter,
        local: tuple[torch.Tensor, torch.Tensor],
        counts: list[int],
        rank: int,
        unit: torch.dtype,
        stats: comm.CommStats | None,
    ):
        """`local`: this rank's (rows, values) (take_local); `counts`: every rank's lookups."""
        self.p, self.counts, self.rank, self.unit, self.stats = p, counts, rank, unit, stats
        self.rows, self.values = local
        if len(self.rows) != counts[rank]:
            raise RuntimeError(f"replicated table: {len(self.rows)} lookups, {counts[rank]} expected")
        self.dim, self.value_dtype = p.shape[1], self.values.dtype
        self.data = pack(self.rows, self.values, unit)

    def size(self, r: int) -> int:
        return packed_size(self.counts[r], self.dim, self.value_dtype, self.unit)

    # ---- riding in the pairwise exchange (GradBuckets) ----------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.unit

    def outgoing(self, peer: int) -> torch.Tensor:
        if self.stats is not None:
            self.stats.add("replica_grads", self.data.numel() * self.unit.itemsize)
        return self.data

    def incoming(self, peer: int) -> int:
        return self.size(peer)

    def land(self, received: torch.Tensor) -> None:
        peer = 1 - self.rank
        theirs = unpack(received, self.counts[peer], self.dim, self.value_dtype)
        mine = (self.rows, self.values)
        set_global(self.p, [mine, theirs] if self.rank == 0 else [theirs, mine])

    def alone(self, group=None) -> Callable[[], None]:
        """Its own collective: an all-gather of every rank's pack, padded to the largest; the
        returned wait sets the global gradient."""
        n = dist.get_world_size(group)
        width = max(self.size(r) for r in range(n))
        send = torch.cat([self.data, self.data.new_zeros(width - self.data.numel())])
        out = send.new_empty(n * width)
        if self.stats is not None:
            self.stats.add("replica_grads", (n - 1) * width * self.unit.itemsize)
        work = dist.all_gather_into_tensor(out, send, group=group, async_op=True)

        def wait() -> None:
            work.wait()
            parts = [
                unpack(out[r * width : (r + 1) * width], self.counts[r], self.dim, self.value_dtype) for r in range(n)
            ]
            parts[self.rank] = (self.rows, self.values)
            set_global(self.p, parts)

        return wait


def lookup_counts(sizes: list[int], tables: int, one_hot: bool, local: int, group=None) -> list[int]:
    """Every rank's lookups of a replicated weight: local batch x tables for one-hot ids, else
    gathered (one small all-gather)."""
    if one_hot:
        return [s * tables for s in sizes]
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [local]
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, torch.tensor([local], dtype=torch.int64), group=group)
    return [int(x) for x in out]
