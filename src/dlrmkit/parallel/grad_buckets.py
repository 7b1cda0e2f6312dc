"""The dense gradients' sum over ranks, overlapped with backward (what DDP's reducer does, on the
Transport seam). Parameters sit in buckets of about `bucket_bytes`, in reverse order, as backward
produces their gradients. A reader holds three cases:

1. overlap on: a bucket's all-reduce starts from a hook as soon as its last gradient is
   accumulated (every bucket but the last, the first layers');
2. after backward, `start(extra)` starts the buckets not started yet, coalesced with the step's
   other collectives (`extra`: the loss sum, the replicated tables' gradients): on a CPU each
   collective costs a round of thread wake-ups on every rank, so the step pays one;
3. `wait()` waits for all, points every parameter's `.grad` at its sum and returns `extra`'s
   results. A parameter the loss does not reach (the MLPs with `--deep false`) has no gradient on
   any rank (every rank runs the same model): it sums zeros and keeps no `.grad`, so its optimizer
   leaves it as one process does.

With overlap off no hook starts anything: every bucket goes in case 2."""

from __future__ import annotations

import torch

from dlrmkit.parallel.transport import AllReduce, Op, Transport


def nonzero_rows(g: torch.Tensor) -> torch.Tensor:
    """The rows of dense `g` that hold a nonzero value, as a coalesced sparse tensor: what
    `g.to_sparse(1)` gives, built directly (to_sparse(1) is many times slower: docs/BENCHMARKS.md)."""
    rows = g.ne(0).any(1).nonzero().squeeze(1)
    return torch.sparse_coo_tensor(
        rows.unsqueeze(0), g.index_select(0, rows), g.shape, is_coalesced=True, check_invariants=False
    )


class GradBuckets:
    def __init__(self, params: list[torch.nn.Parameter], bucket_bytes: int, transport: Transport):
        self.transport, self.buckets = transport, [[]]
        size = 0
        for p in reversed(params):
            last = self.buckets[-1]
            if last and (size >= bucket_bytes or last[-1].dtype != p.dtype):  # one dtype: one flat sum
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.ready = [0] * len(self.buckets)
        self.requests: list = []  # (buckets, how many gradients, request) in start order
        self.overlap = True
        for p in params:  # the last bucket starts after backward: its parameters need no hook
            if self.bucket_of[id(p)] != len(self.buckets) - 1:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.nn.Parameter) -> None:
        if not self.overlap:
            return
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            self._start([b])

    def _start(self, buckets: list[int], extra: list[Op] = ()) -> None:
        """Starts the sums of `buckets`' gradients, one AllReduce each, coalesced with `extra`."""
        ops = [
            AllReduce(p.grad if p.grad is not None else torch.zeros_like(p)) for b in buckets for p in self.buckets[b]
        ]
        for b in buckets:
            self.ready[b] = -1  # started
        self.requests.append((buckets, len(ops), self.transport.start(ops + list(extra))))

    def start(self, extra: list[Op] = ()) -> None:
        """Starts the buckets not started yet, with `extra` (after backward)."""
        self._start([b for b in range(len(self.buckets)) if self.ready[b] != -1], extra)

    def wait(self) -> list:
        """Waits for every started sum; the summed gradients become the parameters' `.grad`.
        Returns the results of the last `start`'s extra ops."""
        extra: list = []
        for buckets, n, request in self.requests:
            results = request.wait()
            params = [p for b in buckets for p in self.buckets[b]]
            for p, total in zip(params, results):
                if p.grad is not None:  # None: the loss does not reach it, here as on every rank
                    p.grad = total.view_as(p)
            extra = results[n:]
        self.requests, self.ready = [], [0] * len(self.buckets)
        return extra
