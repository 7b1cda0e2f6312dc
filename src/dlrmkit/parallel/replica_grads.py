"""Gradients of large replicated tables, exchanged as the lookups the batch made. A replicated
table's gradient summed densely (rows x dim values on the wire) pays only for small tables; a
large one (a whole model replicated on each rank, as the planner does when per-rank batches are
too small for model parallelism to pay) sends its lookups instead: each rank's pooled gradient
(one row per bag) with each lookup's row and bag reach every rank, which concatenates them in rank
order, the global batch's order, and updates its copy as one process would with the global batch.
A multi-hot bag's ids share their bag's gradient row: no per-id gradient row is made or sent.
Every rank applies the same rows in the same order, so the replicas stay equal bit for bit.

The parts travel in one all-gather (padded to the largest rank's), started with the dense
gradients' last sum (coalesced: parallel/grad_buckets.py)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from dlrmkit.model.embedding import BagGrad
from dlrmkit.parallel.transport import AllGather, Transport


class LocalGrad(NamedTuple):
    """This rank's gradient of a replicated weight, by bag: lookup i adds grad[bags[i]] to row rows[i]."""

    rows: torch.Tensor  # int64 [lookups]
    bags: torch.Tensor  # int64 [lookups]
    grad: torch.Tensor  # [gradient rows, dim]


def take_local(p: torch.nn.Parameter) -> LocalGrad:
    """This rank's lookups of `p` in lookup order, from deferred gradients (FusedTable.defer_grads:
    the pooled gradient and each lookup's bag, several concatenated in order) or a sparse `p.grad`
    (one gradient row per lookup); both are handed over (cleared). No lookups: empty tensors."""
    rows, bags, grads, start = [], [], [], 0
    for g in getattr(p, "bag_grads", None) or []:
        grad = g.grad.reshape(len(g.grad), -1)
        rows.append(g.rows)
        bags.append(g.bags + start)
        grads.append(grad)
        start += len(grad)
    if getattr(p, "bag_grads", None):
        p.bag_grads.clear()
    if p.grad is not None:
        grad = p.grad if p.grad.is_sparse else p.grad.to_sparse(1)
        values = grad._values()
        rows.append(grad._indices()[0])
        bags.append(torch.arange(start, start + len(values), device=p.device))
        grads.append(values)
        p.grad = None
    if not rows:
        empty = torch.empty(0, dtype=torch.int64, device=p.device)
        return LocalGrad(empty, empty, torch.empty(0, p.shape[1], dtype=p.dtype, device=p.device))
    return LocalGrad(torch.cat(rows), torch.cat(bags), torch.cat(grads))


def packed_size(n: int, m: int, dim: int, value: torch.dtype, unit: torch.dtype) -> int:
    """Elements of `unit` that n lookups over m gradient rows take packed: gradient rows, row ids
    and bags, padded; as many gradient rows as lookups (one-hot) travel one per lookup, no bags."""
    nbytes = m * dim * value.itemsize + n * (8 if n == m else 16)
    return -(-nbytes // unit.itemsize)


def one_per_lookup(local: LocalGrad) -> LocalGrad:
    """`local` with its gradient rows in lookup order (bags 0, 1, ...): what travels when there
    are as many gradient rows as lookups (the same bytes, no bags sent)."""
    return LocalGrad(
        local.rows, torch.arange(len(local.rows), device=local.rows.device), local.grad.index_select(0, local.bags)
    )


def pack(local: LocalGrad, unit: torch.dtype) -> torch.Tensor:
    """The bytes of the gradient rows, then the rows, then (fewer gradient rows than lookups) the
    bags, as a 1-D tensor of `unit`."""
    n, (m, dim) = len(local.rows), local.grad.shape
    parts = (local.grad, local.rows) if n == m else (local.grad, local.rows, local.bags)
    raw = torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in parts])
    pad = packed_size(n, m, dim, local.grad.dtype, unit) * unit.itemsize - raw.numel()
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(unit)


def unpack(buf: torch.Tensor, n: int, m: int, dim: int, value: torch.dtype) -> LocalGrad:
    """pack's inverse, from the start of `buf`."""
    raw = buf.view(torch.uint8)
    split = m * dim * value.itemsize
    rows = _as(raw[split : split + n * 8], torch.int64)
    bags = torch.arange(n, device=buf.device) if n == m else _as(raw[split + n * 8 : split + n * 16], torch.int64)
    return LocalGrad(rows, bags, _as(raw[:split], value).view(m, dim))


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes `raw` as `dtype`: a view where aligned (a received tail may start anywhere)."""
    return raw.view(dtype) if raw.storage_offset() % dtype.itemsize == 0 else raw.clone().view(dtype)


def set_global(p: torch.nn.Parameter, parts: list[LocalGrad]) -> None:
    """`p`'s gradient from every rank's part, concatenated in rank order: deferred (one BagGrad,
    read by the fused update) where `p` defers, else a sparse COO gradient (one row per lookup)."""
    starts = [0]
    for part in parts[:-1]:
        starts.append(starts[-1] + len(part.grad))
    rows = torch.cat([part.rows for part in parts])
    bags = torch.cat([part.bags + s for part, s in zip(parts, starts)])
    grad = torch.cat([part.grad for part in parts])
    if hasattr(p, "bag_grads"):
        p.bag_grads[:] = [BagGrad(rows, bags, grad)]
    else:
        p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), grad.index_select(0, bags), p.shape, check_invariants=False)


class ReplicaExchange:
    """One replicated weight's gradient exchange for one step: this rank's part packed as bytes,
    padded to the largest rank's, and `op`, the all-gather that brings every rank's;
    `finish(gathered)` sets the global gradient."""

    def __init__(self, p: torch.nn.Parameter, local: LocalGrad, counts: list[tuple[int, int]], rank: int):
        """`local`: this rank's part (take_local); `counts`: every rank's (lookups, gradient rows)."""
        if len(local.rows) == len(local.grad):
            local = one_per_lookup(local)
        self.p, self.counts, self.rank, self.local = p, counts, rank, local
        if (len(local.rows), len(local.grad)) != tuple(counts[rank]):
            raise RuntimeError(
                f"replicated table: {len(local.rows)} lookups over {len(local.grad)} gradient rows, "
                f"{tuple(counts[rank])} expected"
            )
        self.dim, self.value_dtype = p.shape[1], local.grad.dtype
        self.width = max(packed_size(n, m, self.dim, self.value_dtype, torch.uint8) for n, m in counts)
        data = pack(local, torch.uint8)
        self.op = AllGather(torch.cat([data, data.new_zeros(self.width - data.numel())]), "replica_grads")

    def finish(self, gathered: torch.Tensor) -> None:
        parts = [
            unpack(gathered[r * self.width : (r + 1) * self.width], n, m, self.dim, self.value_dtype)
            for r, (n, m) in enumerate(self.counts)
        ]
        parts[self.rank] = self.local
        set_global(self.p, parts)


def lookup_counts(
    sizes: list[int], tables: int, one_hot: bool, local: LocalGrad, ids: Transport
) -> list[tuple[int, int]]:
    """Every rank's (lookups, gradient rows) of a replicated weight: local batch x tables each for
    one-hot ids (one lookup per bag), else gathered (one small all-gather on `ids`, the transport
    of CPU tensors)."""
    if one_hot:
        return [(s * tables, s * tables) for s in sizes]
    mine = torch.tensor([len(local.rows), len(local.grad)], dtype=torch.int64)
    gathered = ids.all_gather_into_tensor(mine, "replica_grads").wait().view(-1, 2).tolist()
    return [(n, m) for n, m in gathered]
