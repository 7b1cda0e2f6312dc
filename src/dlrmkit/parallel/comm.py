"""All communication of hybrid-parallel training in one place: the all-to-alls of ids and of
pooled embeddings (and their reverse in backward), and bucketed gradient all-reduce. `dtype`
is the wire format (e.g. bfloat16 to halve bytes); results come back in the input's dtype."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_to_all(x: torch.Tensor, send_counts: list[int], recv_counts: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Flat all-to-all: the first send_counts[0] elements of `x` go to rank 0, and so on;
    returns the received elements, rank by rank. Counts are in elements."""
    flat = x.reshape(-1)
    wire = flat if dtype is None or dtype == flat.dtype else flat.to(dtype)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return wire.to(flat.dtype).clone() if wire is flat else wire.to(flat.dtype)
    out = torch.empty(sum(recv_counts), dtype=wire.dtype, device=flat.device)
    dist.all_to_all_single(out, wire.contiguous(), recv_counts, send_counts)
    return out if out.dtype == flat.dtype else out.to(flat.dtype)


class AllToAll(torch.autograd.Function):
    """Differentiable all-to-all: backward sends gradients back along the reverse route."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send_counts: list[int], recv_counts: list[int], dtype):
        ctx.send_counts, ctx.recv_counts, ctx.dtype, ctx.shape = send_counts, recv_counts, dtype, x.shape
        return all_to_all(x, send_counts, recv_counts, dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = all_to_all(grad.contiguous(), ctx.recv_counts, ctx.send_counts, ctx.dtype)
        return back.view(ctx.shape), None, None, None


def all_reduce_sum(tensors: list[torch.Tensor], bucket_bytes: int = 25 << 20, dtype: torch.dtype | None = None) -> None:
    """Sums each tensor over ranks in place, flattening them into buckets of about
    `bucket_bytes` so a model with many small layers makes few collective calls."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not tensors:
        return
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            _reduce_bucket(bucket, dtype)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, dtype)


def _reduce_bucket(bucket: list[torch.Tensor], dtype: torch.dtype | None) -> None:
    flat = torch.cat([t.reshape(-1) for t in bucket])
    wire = flat if dtype is None else flat.to(dtype)
    dist.all_reduce(wire)
    if wire is not flat:
        flat.copy_(wire)
    offset = 0
    for t in bucket:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def all_gather_objects(obj) -> list:
    """Every rank's `obj` (pickled), in rank order; [obj] without a process group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
