"""Gradients of large replicated tables, exchanged as the rows the batch touched. A replicated
table's gradient summed densely (rows x dim values on the wire) pays only for small tables; a
large one (a whole model replicated on each rank, as the planner does when per-rank batches are
too small for model parallelism to pay) sends its lookups instead: each rank's (row, gradient
row) pairs reach every rank, which concatenates them in rank order, the global batch's order,
and updates its copy as one process would with the global batch. Every rank applies the same
rows in the same order, so the replicas stay equal bit for bit.

The pairs travel in one all-gather (padded to the largest rank's lookups), started with the dense
gradients' last sum (coalesced: parallel/grad_buckets.py)."""

from __future__ import annotations

import torch

from dlrmkit.model.embedding import BagGrad
from dlrmkit.parallel.transport import AllGather, Transport


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
    """One replicated weight's gradient exchange for one step: this rank's lookups packed as
    bytes, padded to the largest rank's, and `op`, the all-gather that brings every rank's;
    `finish(gathered)` sets the global gradient."""

    def __init__(self, p: torch.nn.Parameter, local: tuple[torch.Tensor, torch.Tensor], counts: list[int], rank: int):
        """`local`: this rank's (rows, values) (take_local); `counts`: every rank's lookups."""
        self.p, self.counts, self.rank = p, counts, rank
        self.rows, self.values = local
        if len(self.rows) != counts[rank]:
            raise RuntimeError(f"replicated table: {len(self.rows)} lookups, {counts[rank]} expected")
        self.dim, self.value_dtype = p.shape[1], self.values.dtype
        self.width = max(packed_size(n, self.dim, self.value_dtype, torch.uint8) for n in counts)
        data = pack(self.rows, self.values, torch.uint8)
        self.op = AllGather(torch.cat([data, data.new_zeros(self.width - data.numel())]), "replica_grads")

    def finish(self, gathered: torch.Tensor) -> None:
        parts = [
            unpack(gathered[r * self.width : (r + 1) * self.width], n, self.dim, self.value_dtype)
            for r, n in enumerate(self.counts)
        ]
        parts[self.rank] = (self.rows, self.values)
        set_global(self.p, parts)


def lookup_counts(sizes: list[int], tables: int, one_hot: bool, local: int, ids: Transport) -> list[int]:
    """Every rank's lookups of a replicated weight: local batch x tables for one-hot ids, else
    gathered (one small all-gather on `ids`, the transport of CPU tensors)."""
    if one_hot:
        return [s * tables for s in sizes]
    return ids.all_gather_into_tensor(torch.tensor([local], dtype=torch.int64), "replica_grads").wait().tolist()
