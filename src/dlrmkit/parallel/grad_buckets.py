"""Dense gradients summed over ranks while backward runs: parameters in buckets, each bucket's
async sum (comm.sum_started) launched as soon as its gradients are complete (the last one with
the loss sum, the replicated tables' gradients and, on two ranks, the pooled gradients riding
along), and the summed replicated gradients made sparse again."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.profiler import record_function

from dlrmkit.parallel import comm


def nonzero_rows(g: torch.Tensor) -> torch.Tensor:
    """The rows of dense `g` that hold a nonzero value, as a coalesced sparse tensor: what
    `g.to_sparse(1)` gives, built directly (to_sparse(1) took 35-130 ms for a 3,187 x 16
    gradient, the replicated tables of Criteo Kaggle: most of the sharded step at batch 128)."""
    rows = g.ne(0).any(1).nonzero().squeeze(1)
    return torch.sparse_coo_tensor(
        rows.unsqueeze(0), g.index_select(0, rows), g.shape, is_coalesced=True, check_invariants=False
    )


class GradBuckets:
    """Overlapped gradient all-reduce: dense parameters in buckets (in reverse order, as
    backward produces their gradients); a hook launches a bucket's async all-reduce as soon as
    its last gradient is accumulated, so communication runs while backward continues. The last
    bucket (the first layers, whose gradients come last) waits for `launch_pending(extras)` at
    the end of backward, which launches it with `extras` (the loss sum, replicated tables'
    gradients) in the same collective: one all-reduce fewer per extra, and on a busy CPU each
    collective costs a round of wake-ups on both ranks. `riders` (two ranks) are pooled
    gradients sent to the peer unsummed in that exchange. `finish` waits for all of them, writes
    the summed extras back in place and fills the riders' buffers."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        bucket_bytes: int,
        dtype: torch.dtype | None,
        stats: comm.CommStats,
        first_bucket_bytes: int | None = None,
    ):
        self.dtype, self.stats, self.buckets = dtype, stats, [[]]
        size = 0
        for p in reversed(params):
            limit = first_bucket_bytes if first_bucket_bytes is not None and len(self.buckets) == 1 else bucket_bytes
            if size >= limit:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.ready = [0] * len(self.buckets)
        self.works: list = []
        # (comm.Carried, buffer it fills): the pooled gradients' all-to-all, riding in the last
        # bucket's exchange (comm.LaunchBackward appends it; HybridParallel decides when it may)
        self.riders: list[tuple] = []  # (comm.Carried, buffer it fills, stats)
        self.alone: list[tuple] = []  # riders that could not ride: (result, wait, buffer)
        self.enabled = True
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.nn.Parameter) -> None:
        if not self.enabled:
            return
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]) and b != len(self.buckets) - 1:
            self._launch(b)

    def _launch(self, b: int, extras: list[torch.Tensor] = (), rider: tuple | None = None) -> None:
        """Flattens bucket `b` (and `extras`) and launches its sum; a `rider` (the pooled
        gradients' exchange, two ranks) goes after them to the peer, unsummed."""
        ps = self.buckets[b]
        pieces = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]
        pieces += [t.reshape(-1) for t in extras]
        tail = (0, 0)
        if rider is not None:
            carried, _, stats = rider
            peer = 1 - dist.get_rank()
            pieces.append(carried.data.split(carried.send_counts)[peer])
            tail = (carried.send_counts[peer], carried.recv_counts[peer])
            if stats is not None:
                stats.add(carried.kind, tail[0] * carried.data.element_size())
        flat = torch.cat(pieces)
        self.ready[b] = -1  # launched
        self.works.append((b, flat, list(extras), comm.sum_started(flat, self.dtype, self.stats, tail=tail), rider))

    def launch_pending(self, extras: list[torch.Tensor] = ()) -> list[torch.Tensor]:
        """Launches the buckets not launched yet (no wait); `extras` go with the last bucket
        when their dtype is its gradients' and no wire dtype rounds them, and so does a rider
        (else it takes an all-to-all of its own). Returns the extras left for the caller."""
        last = len(self.buckets) - 1
        for b in range(last):
            if self.ready[b] != -1:
                self._launch(b)
        if self.ready[last] == -1:  # already launched (a second call)
            return list(extras)
        grad_dtype = self.buckets[last][0].dtype if self.buckets[last] else torch.float32
        fused = [t for t in extras if t.dtype == grad_dtype and self.dtype is None]
        rider = None
        for carried, back, stats in self.riders:
            if carried.data.dtype == grad_dtype and self.dtype is None and rider is None:
                rider = (carried, back, stats)
            else:  # cannot ride: its own all-to-all, waited for in finish()
                out, wait = comm.all_to_all_started(
                    carried.data, carried.send_counts, carried.recv_counts, None, stats, carried.kind
                )
                self.alone.append((out, wait, back))
        self._launch(last, fused, rider)
        return [t for t in extras if not any(t is f for f in fused)]

    def finish(self) -> None:
        self.launch_pending()
        t0 = time.perf_counter()
        for b, flat, extras, wait, rider in self.works:
            with record_function("allreduce wait (gradient bucket)"):  # shows in profiles as all-reduce
                received = wait()
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)
                offset += n
            for t in extras:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
            if rider is not None:  # the pooled gradients, rank by rank: ours kept, the peer's received
                carried, back, _ = rider
                me = dist.get_rank()
                blocks = list(back.split(carried.recv_counts))
                blocks[me].copy_(carried.data.split(carried.send_counts)[me])
                blocks[1 - me].copy_(received)
        for out, wait, back in self.alone:
            wait()
            back.copy_(out)
        self.stats.add("allreduce", 0, time.perf_counter() - t0)  # exposed (not overlapped) time
        self.works, self.ready, self.riders[:], self.alone = [], [0] * len(self.buckets), [], []
