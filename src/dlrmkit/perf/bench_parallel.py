"""`dlrmkit bench` under torchrun: the benchmark model sharded by a plan, fed the same random
data as single-process bench (dlrmkit.commands.bench.random_batches: ids uniform, bags of 1..10 ids),
each rank stepping its slice of the global batch; reported throughput is global samples/s.
`report` adds bytes per step (measured, against the analytic minimum for the plan) and a step
breakdown (lookup, all-to-all, dense compute, all-reduce, optimizer), blocking and overlapped."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.model.embedding import JaggedIds
from dlrmkit.parallel.dist import batch_slice, batch_split, init_distributed, launched_by_torchrun
from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig, build_plan
from dlrmkit.parallel.sharded_embedding import DistIds, rank_keys, rank_layout
from dlrmkit.parallel.transport import ring_bytes

A2A = ("ids", "pooled_fwd", "pooled_bwd")


@dataclass
class LocalBatch:
    dense: torch.Tensor
    ids: DistIds
    labels: torch.Tensor


def slice_jagged(ids: JaggedIds, a: int, b: int) -> JaggedIds:
    """Samples [a, b) of table-major jagged ids (vectorized: one mask over the bags)."""
    n, t = ids.batch_size, ids.num_tables
    lengths = ids.offsets.diff().view(t, n)
    keep = torch.zeros(t, n, dtype=torch.bool)
    keep[:, a:b] = True
    values = ids.values[torch.repeat_interleave(keep.reshape(-1), lengths.reshape(-1))]
    sub = lengths[:, a:b].reshape(-1)
    return JaggedIds(values, torch.cat([torch.zeros(1, dtype=torch.int64), sub.cumsum(0)]), b - a)


class BenchParallel(HybridParallel):
    def batches(
        self, cfg: ModelConfig, global_batch: int, count: int, seed: int, one_hot: bool = False
    ) -> list[LocalBatch]:
        """The single-process bench's batches (same seed), each rank keeping its slice;
        `one_hot`: one id per (sample, table) as [B, T] tensors, as Criteo datasets give."""
        from dlrmkit.perf.workload import random_batches

        n, r = self.ctx.world_size, self.ctx.rank
        sizes, (a, b) = batch_split(global_batch, n), batch_slice(global_batch, r, n)

        def local_ids(ids: JaggedIds):
            return ids.values.view(-1, global_batch).t()[a:b].contiguous() if one_hot else slice_jagged(ids, a, b)

        self.cycle = [
            LocalBatch(x.dense[a:b], DistIds(local_ids(x.ids), sizes), x.labels[a:b])
            for x in random_batches(cfg, global_batch, count, seed, max_bag=1 if one_hot else 10)
        ]
        return self.cycle

    def step(self, batch: LocalBatch, optimizers) -> torch.Tensor:
        """One training step (parallel/hybrid_step.py HybridStep); bench walks `self.cycle` in
        order, so (as the trainer's loader does) the next batch's ids are exchanged during this
        step."""
        if getattr(self, "step_of", (None,))[0] is not optimizers:
            move = lambda b: self.to_device(self.ids_ahead(b))  # noqa: E731
            self.step_of = (optimizers, self.make_step(optimizers, move=move, gate=False))
        return self.step_of[1](batch)

    def ids_ahead(self, batch: LocalBatch) -> LocalBatch:
        """`batch` with its ids exchanged (during the previous step) and the next one's started."""
        if self.ahead is not None and self.overlapping:
            cycle = getattr(self, "cycle", [])
            at = next((i for i, b in enumerate(cycle) if b is batch), None)
            return self.ahead.take(batch, cycle[(at + 1) % len(cycle)] if at is not None else None)
        if self.ahead is not None:
            self.ahead.drain()  # blocking mode: ids exchanged in forward, nothing left in flight
        return batch

    # ---- figures ---------------------------------------------------------------------------
    def min_bytes(self, global_batch: int, mean_bag: float) -> dict[str, float]:
        """Analytic minimum bytes per step, all ranks together, for this plan: every id reaches
        each (table, row range) owner that needs it once (expected share of a uniform id: the
        range's rows / table rows; int64 ids); every shard's pooled columns go once to each
        other rank's samples and come back once as gradients (fp32); dense gradients take a
        ring all-reduce (2 (N-1)/N of the payload per rank)."""
        n, sizes = self.ctx.world_size, batch_split(global_batch, self.ctx.world_size)
        rows = self.sharded.table_sizes
        ids = pooled = 0.0
        for r in range(n):
            others = global_batch - sizes[r]
            for t, a, e in rank_keys(rank_layout(self.plan, r)[0]):
                ids += others * mean_bag * (e - a) / rows[t] * 8
            pooled += 2 * others * sum(s.cols for _, s in rank_layout(self.plan, r)[0]) * 4
        dense = sum(p.numel() * p.element_size() for p in self.model.dense_parameters())
        dense += sum(p.numel() * p.element_size() for p in self.sharded.replicated_parameters())
        return {"ids": ids, "pooled": pooled, "allreduce": n * ring_bytes(dense, n)}

    def measure(self, step, batches: list, steps: int, overlap: bool) -> dict[str, float]:
        """Seconds per step by phase (mean over ranks) and bytes per step (sum over ranks)."""
        self.set_overlap(overlap)
        step(batches[0])  # warm the mode
        self.stats.reset()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        wall = time.perf_counter() - t0
        sec, byt = dict(self.stats.seconds), dict(self.stats.bytes)
        a2a = sum(sec.get(k, 0.0) for k in A2A)  # "ids_ahead" (the worker's wait) is not the step's
        phases = {
            "lookup": sec.get("lookup", 0.0),
            "all_to_all": a2a,
            "dense_compute": sec.get("forward", 0.0) + sec.get("backward", 0.0) - sec.get("lookup", 0.0) - a2a,
            "all_reduce": sec.get("reduce_total", 0.0),
            "optimizer": sec.get("optimizer", 0.0),
            "step": wall,
        }
        keys = sorted(phases)
        t = torch.tensor([phases[k] / steps for k in keys], dtype=torch.float64)
        b = (
            torch.tensor(
                [
                    byt.get("ids", 0) + byt.get("ids_ahead", 0),
                    byt.get("pooled_fwd", 0) + byt.get("pooled_bwd", 0),
                    byt.get("allreduce", 0),
                ],
                dtype=torch.float64,
            )
            / steps
        )
        dist.all_reduce(t)
        dist.all_reduce(b)
        self.set_overlap(self.pcfg.overlap)
        out = {f"{k}_s": float(v) / self.ctx.world_size for k, v in zip(keys, t)}
        out.update(bytes_ids=float(b[0]), bytes_pooled=float(b[1]), bytes_allreduce=float(b[2]))
        return out

    def report(self, step, batches: list, args, result: dict) -> None:
        """Adds bytes/step and the blocking/overlapped breakdowns to `result`; rank 0 prints."""
        steps = max(args.steps, 3)
        mean_bag = float(sum(len(b.ids.local.values) for b in batches)) / sum(
            b.ids.local.batch_size * b.ids.local.num_tables for b in batches
        )
        result["bytes_min_per_step"] = least = self.min_bytes(args.batch_size, mean_bag)
        result["breakdown_blocking"] = blocking = self.measure(step, batches, steps, overlap=False)
        result["breakdown_overlapped"] = overlapped = self.measure(step, batches, steps, overlap=True)
        row_bytes = 2 * 13 + 1 + 4 * len(self.sharded.table_sizes)  # one-hot dataset row: fp16 dense, label, int32 ids
        result["loader_bytes_read_per_step"] = {"exchange": args.batch_size * row_bytes}
        if self.ctx.rank != 0:
            return
        print(f"bytes/step, all ranks (measured vs analytic minimum for this plan, bags of {mean_bag:.1f} ids):")
        for k, m in (("ids", "ids"), ("pooled", "pooled"), ("allreduce", "allreduce")):
            got = blocking[f"bytes_{k}"]
            print(f"  {k:10s} {got / 1e6:10.3f} MB  minimum {least[m] / 1e6:10.3f} MB  ({got / max(least[m], 1):.2f}x)")
        print(
            f"  loader (exchange) reads {args.batch_size * row_bytes / 1e6:.3f} MB/step from disk for a one-hot "
            f"dataset of this shape (each rank its slice; no rank reads another's rows)"
        )
        print(
            "step breakdown, ms per step (mean over ranks): lookup, all-to-all, dense compute "
            "(forward + backward - lookup - all-to-all), all-reduce (exposed), optimizer, step"
        )
        for name, d in (("blocking", blocking), ("overlapped", overlapped)):
            print(
                f"  {name:10s} "
                + "  ".join(
                    f"{k} {1e3 * d[k + '_s']:.2f}"
                    for k in ("lookup", "all_to_all", "dense_compute", "all_reduce", "optimizer", "step")
                )
            )


def parallel_setup(
    model: DLRM,
    batch_size: int,
    sharding: str,
    backend: str | None = None,
    overlap: bool = False,
    seed: int | None = None,
    ids_ahead: bool = True,
    bucket_bytes: int | None = None,
    bind: bool = True,
    shared_memory: bool = True,
) -> BenchParallel | None:
    """None unless started by torchrun. `bind`: each rank on its own cores (parallel.dist.bind_cores);
    `shared_memory`: ranks on one host sum dense gradients through shared memory (ParallelConfig)."""
    if not launched_by_torchrun():
        return None
    ctx = init_distributed(backend, bind=bind)
    pcfg = ParallelConfig(sharding=sharding, overlap=overlap, ids_ahead=ids_ahead, shared_memory=shared_memory)
    if bucket_bytes is not None:
        pcfg.bucket_bytes = bucket_bytes
    return BenchParallel(model, build_plan(model, ctx, pcfg, batch_size), ctx, pcfg, seed=seed)
