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
from dlrmkit.parallel.shared_slots import SharedSlots, aligned


def nonzero_rows(g: torch.Tensor) -> torch.Tensor:
    """The rows of dense `g` that hold a nonzero value, as a coalesced sparse tensor: what
    `g.to_sparse(1)` gives, built directly (to_sparse(1) took 35-130 ms for a 3,187 x 16
    gradient, the replicated tables of Criteo Kaggle: most of the sharded step at batch 128)."""
    rows = g.ne(0).any(1).nonzero().squeeze(1)
    return torch.sparse_coo_tensor(
        rows.unsqueeze(0), g.index_select(0, rows), g.shape, is_coalesced=True, check_invariants=False
    )


# room in each rank's slot for riders' data (two ranks): pooled gradients ride up to 1 MiB a way
# (comm.RIDE_MAX_BYTES), replicated tables' lookups at the batches that replicate them (256 a rank
# x 26 tables x 128 columns: 3.4 MB); what does not fit goes through gloo
RIDER_AREA_BYTES = 4 << 20


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
        shared: bool = False,
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
        # data riding in the last bucket's exchange, sent to the peer unsummed (comm.PooledRider:
        # backward's pooled all-to-all, appended by comm.LaunchBackward where HybridParallel lets
        # it; replica_grads.ReplicaExchange: replicated tables' lookups)
        self.riders: list = []
        self.alone: list = []  # waits of riders that could not ride (a collective of their own)
        self.enabled = True
        # ranks on one host: the buckets' gradients travel through shared memory, each bucket in
        # its own region of every rank's slot (shared_slots); None: through gloo
        self.slots, self.regions, self.parity = None, [], 0
        if shared and dtype is None:
            offset = 0
            for ps in self.buckets:  # room for 4-byte values: split-SGD makes them bf16 later
                numel = sum(p.numel() for p in ps)
                room = aligned(numel * max([4] + [p.element_size() for p in ps]))
                self.regions.append((offset, numel, room))
                offset += room
            self.rider_area = (offset, offset + RIDER_AREA_BYTES)  # riders' data (two ranks), after the buckets
            self.slots = SharedSlots.create(offset + RIDER_AREA_BYTES)
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p: torch.nn.Parameter) -> None:
        if not self.enabled:
            return
        b = self.bucket_of[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]) and b != len(self.buckets) - 1:
            self._launch(b)

    def _launch(self, b: int, extras: list[torch.Tensor] = (), riders: list = ()) -> None:
        """Flattens bucket `b` (and `extras`) and launches its sum; `riders` (two ranks: the
        pooled gradients' exchange, replicated tables' lookups) go after them to the peer, unsummed."""
        ps = self.buckets[b]
        pieces = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]
        region = None
        dtypes = {t.dtype for t in pieces}
        fits = (
            len(dtypes) == 1
            and self.slots is not None
            and self.regions[b][1] * next(iter(dtypes)).itemsize <= self.regions[b][2]
        )
        if fits:  # the gradients into this rank's slot; gloo carries the rest
            offset, numel, _ = self.regions[b]
            region = (offset, numel, dtypes.pop())
            torch.cat(pieces, out=self.slots.region(self.parity, *region))
            self.stats.add("allreduce", comm.ring_bytes(numel * region[2].itemsize, dist.get_world_size()))
            # at least one element: the collective that tells every rank all slots are written
            pieces = [] if extras else [torch.zeros(1, dtype=region[2])]
        pieces += [t.reshape(-1) for t in extras]
        tail, parked, sent = (0, 0), [], []
        if riders:
            peer, at = 1 - dist.get_rank(), self.rider_area[0] if region is not None else 0
            for r in riders:  # through this rank's slot while the area has room (the same choice on
                data, n_in = r.outgoing(peer), r.incoming(peer)  # both ranks: each sizes both ways)
                room = aligned(max(data.numel(), n_in) * data.element_size())
                if region is not None and at + room <= self.rider_area[1]:
                    self.slots.region(self.parity, at, data.numel(), data.dtype).copy_(data)
                    parked.append((r, at, n_in, data.dtype))
                    at += room
                else:
                    sent.append((r, data))
            pieces += [data for _, data in sent]
            tail = (sum(d.numel() for _, d in sent), sum(r.incoming(peer) for r, _ in sent))
        flat = torch.cat(pieces)
        self.ready[b] = -1  # launched
        wait = comm.sum_started(flat, self.dtype, self.stats, tail=tail)
        self.works.append((b, flat, list(extras), wait, [r for r, _ in sent], region, parked))

    def launch_pending(self, extras: list[torch.Tensor] = ()) -> list[torch.Tensor]:
        """Launches the buckets not launched yet (no wait); `extras` go with the last bucket
        when their dtype is its gradients' and no wire dtype rounds them, and so do riders of
        that dtype (others take a collective of their own, waited for in finish()). Returns the
        extras left for the caller."""
        last = len(self.buckets) - 1
        for b in range(last):
            if self.ready[b] != -1:
                self._launch(b)
        if self.ready[last] == -1:  # already launched (a second call)
            return list(extras)
        grad_dtype = self.buckets[last][0].dtype if self.buckets[last] else torch.float32
        fused = [t for t in extras if t.dtype == grad_dtype and self.dtype is None]
        riding = [r for r in self.riders if r.dtype == grad_dtype and self.dtype is None]
        self.alone += [r.alone() for r in self.riders if not any(r is x for x in riding)]
        self._launch(last, fused, riding)
        return [t for t in extras if not any(t is f for f in fused)]

    def finish(self) -> None:
        self.launch_pending()
        t0 = time.perf_counter()
        for b, flat, extras, wait, riders, region, parked in self.works:
            with record_function("allreduce wait (gradient bucket)"):  # shows in profiles as all-reduce
                received = wait()
            if region is not None:  # every rank's slot written: their sum, in rank order
                grads, offset = self.slots.sum(self.parity, *region), 0 if extras else 1
            else:  # flat: the gradients, then the extras
                grads, offset = flat, sum(p.numel() for p in self.buckets[b])
            at = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad = grads[at : at + n].view_as(p)
                at += n
            for t in extras:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
            for r in riders:  # what the peer sent, rider by rider
                n = r.incoming(1 - dist.get_rank())
                r.land(received[:n])
                received = received[n:]
            for r, at, n, dtype in parked:  # what the peer left in its slot (land copies it out)
                r.land(self.slots.region(self.parity, at, n, dtype, rank=1 - dist.get_rank()))
        for wait in self.alone:
            wait()
        self.stats.add("allreduce", 0, time.perf_counter() - t0)  # exposed (not overlapped) time
        self.works, self.ready, self.riders[:], self.alone = [], [0] * len(self.buckets), [], []
        self.parity ^= 1  # the next step writes the other half of the slots
