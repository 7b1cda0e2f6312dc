"""One training step under torchrun (the `Step` protocol, dlrmkit.model.step), top to bottom:

1. the batch's dense features and labels go to this rank's device;
2. overlapped: the lookups and their pooled all-to-all start before the model, so they travel
   while the bottom MLP runs (ShardedEmbedding.start);
3. forward, then the loss: sum(BCE over the local rows) / global batch (`bce_loss`);
4. backward: GradBuckets starts full buckets' sums from hooks, PooledAllToAll the backward
   all-to-all as soon as its gradient is known;
5. after backward one coalesced start: the buckets left, the loss sum, the small replicated
   tables' gradients and the large ones' lookups (GradientSum.start);
6. the tables' optimizers, whose parameters no sum touches, step while that travels (unless the
   loss must be known first: --skip-nonfinite, or fp16's overflow check); then the wait, the
   decision on the global loss (non-finite: no rank updates anything), with fp16 every gradient
   unscaled and the ranks' overflow flags summed (an overflow on any rank: no rank updates
   anything, and every rank halves its scale alike), and the other optimizers' steps.

With fp16 (`scaler`, precision.LossScaler) backward runs on the loss times the scale, so the
sums and all-to-alls of step 4 and 5 carry scaled gradients (a sum is linear: unscaled after it)."""

from __future__ import annotations

import time
from typing import Callable

import torch

from dlrmkit.model.step import bce_loss
from dlrmkit.parallel.grad_buckets import nonzero_rows
from dlrmkit.parallel.replica_grads import ReplicaExchange, lookup_counts, take_local
from dlrmkit.parallel.transport import AllReduce
from dlrmkit.precision import LossScaler, autocast


class GradientSum:
    """Step 5 and its wait: every gradient summed (or gathered) over ranks in one coalesced start."""

    def __init__(self, par):
        self.par = par
        # the replicated weights: small ones sum a dense gradient, large ones gather lookups
        self.reps = par.sharded.replicated_parameters()
        self.exchanged = par.sharded.exchanged_replicas()

    def start(self, loss_sum: torch.Tensor, ids) -> tuple:
        """Starts the sum of the loss and of every replicated and dense gradient (`ids`: the
        batch's DistIds, every rank's batch size); returns what `wait` needs."""
        par, sharded = self.par, self.par.sharded
        total = loss_sum.detach().reshape(1).double()  # float64: no wire rounds the loss
        reps = self.reps
        grads = [p.grad.to_dense() if p.grad is not None else torch.zeros_like(p) for p in reps]
        exchanges = []
        for p, tables in self.exchanged:
            local = take_local(p)
            one_hot = isinstance(ids.local, torch.Tensor)
            counts = lookup_counts(ids.batch_sizes, tables, one_hot, local, sharded.ids_transport)
            exchanges.append(ReplicaExchange(p, local, counts, par.ctx.rank))
        extra = [AllReduce(total, "loss")] + [AllReduce(g) for g in grads] + [x.op for x in exchanges]
        par.buckets.start(extra)
        return reps, exchanges

    def wait(self, started: tuple) -> torch.Tensor:
        """Waits; every gradient is then the global batch's. Returns the loss sum over ranks."""
        reps, exchanges = started
        t0 = time.perf_counter()
        results = self.par.buckets.wait()
        total, rest = results[0], results[1:]
        for p, g in zip(reps, rest):
            p.grad = nonzero_rows(g)  # rows nobody touched drop out: the sparse optimizers skip them
        for x, gathered in zip(exchanges, rest[len(reps) :]):
            x.finish(gathered)
        self.par.stats.add("reduce_total", 0, time.perf_counter() - t0)
        return total


class HybridStep:
    """`step(batch) -> loss` (see the module docstring). `loss_ok(global mean loss)`, if given,
    may veto every update (a non-finite loss); `gate`: it may skip (not only raise), so nothing
    steps before the global loss is known; `scaler`: fp16's loss scaling."""

    def __init__(
        self,
        par,
        optimizers: list,
        amp=None,
        move=None,
        loss_ok: Callable | None = None,
        gate: bool = True,
        scaler: LossScaler | None = None,
    ):
        self.par, self.optimizers, self.loss_ok, self.gate, self.scaler = par, optimizers, loss_ok, gate, scaler
        self.move = move or par.to_device
        self.amp = amp or (lambda: autocast("fp32"))
        self.gradients = GradientSum(par)

    def __call__(self, batch) -> torch.Tensor:
        par, stats = self.par, self.par.stats
        batch = self.move(batch)
        t0 = time.perf_counter()
        if par.overlapping:
            par.sharded.start(batch.ids)
        with self.amp():
            logits = par.model(batch.dense, batch.ids)
            loss, loss_sum = bce_loss(logits, batch.labels, sum(batch.ids.batch_sizes))
        t1 = time.perf_counter()
        stats.add("forward", 0, t1 - t0)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        stats.add("backward", 0, time.perf_counter() - t1)
        return self.update(loss_sum, batch.ids)

    def update(self, loss_sum: torch.Tensor, ids) -> torch.Tensor:
        """Steps 5 and 6: the sums, then the optimizers. Returns the global mean loss."""
        started = self.gradients.start(loss_sum, ids)
        early = self.par.overlapping and not self.gate and self.scaler is None
        tables = self.par.unsummed_optimizers(self.optimizers) if early else []
        t0 = time.perf_counter()
        if tables and bool(torch.isfinite(loss_sum)):  # a rank whose own loss is not finite leaves its tables
            for opt in tables:
                opt.step()
        t1 = time.perf_counter()
        loss = (self.gradients.wait(started) / sum(ids.batch_sizes)).float()[0]
        t2 = time.perf_counter()
        ok = self.loss_ok is None or self.loss_ok(loss)  # the global loss: every rank decides alike
        if ok and self.scaler is not None:
            ok = self.unscaled_everywhere(loss_sum.device)
        if ok:
            for opt in self.optimizers:
                if not any(opt is o for o in tables):
                    opt.step()
        self.par.stats.add("optimizer", 0, (t1 - t0) + time.perf_counter() - t2)
        return loss

    def unscaled_everywhere(self, device: torch.device) -> bool:
        """fp16: this rank's gradients unscaled (the summed ones alike on every rank, the table
        shards' its own), then the ranks' overflow flags summed; True where no rank overflowed.
        Every rank updates its scale from that one answer, so the scales stay equal."""
        assert self.scaler is not None
        bad = torch.tensor([0.0 if self.scaler.unscale(self.optimizers) else 1.0], device=device)
        finite = not bool(self.par.transport.all_reduce(bad, "overflow").wait().item())
        self.scaler.update(finite)
        if not finite:  # no weight moves on any rank; the deferred table gradients are dropped now
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        return finite
