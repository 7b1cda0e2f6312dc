"""How the dense gradients are summed over ranks, A/B in one run: the project's GradBuckets
(parallel/grad_buckets.py: buckets started from post-accumulate hooks, the last one coalesced with
the loss sum and the replicated tables' gradients, tables stepping while it travels) against PyTorch's
DistributedDataParallel on the same sharded model (the embeddings' parameters ignored, a comm hook
that sums, since the loss is already the global mean), each with an fp32 and a bf16 wire.

Every variant first trains the same steps from the same weights; the script prints the largest
difference of losses and dense weights against GradBuckets fp32 (equal results), then rotates
through the variants in windows of --steps steps and prints each one's median speed relative to
GradBuckets fp32 in the same round (this VM drifts; rounds a second apart cancel that).

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 benchmarks/dense_reducer_ab.py --model criteo-kaggle --one-hot --batch-size 128
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrmkit.model.dlrm import DLRM
from dlrmkit.model.step import bce_loss
from dlrmkit.optim.build import build_optimizers
from dlrmkit.parallel.grad_buckets import nonzero_rows
from dlrmkit.parallel.hybrid import ParallelConfig
from dlrmkit.perf.bench_parallel import BenchParallel, parallel_setup
from dlrmkit.perf.bench_perf import prepare_model

from parallel_pingpong import MODELS  # benchmarks/, on sys.path when run as a script


def sum_hook(wire: torch.dtype | None):
    """A DDP comm hook that sums the bucket over ranks (optionally on a narrower wire)."""

    def hook(group, bucket):
        buf = bucket.buffer()
        sent = buf if wire is None else buf.to(wire)
        fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

        def done(f):
            if sent is not buf:
                buf.copy_(f.value()[0])
            return buf

        return fut.then(done)

    return hook


class DDPStep:
    """One sharded training step whose dense gradients DDP sums: the loss sum travels during
    backward, DDP's buckets during backward (its reducer waits for them before backward returns),
    the replicated tables' gradients in one more all-reduce while the tables step."""

    def __init__(self, par: BenchParallel, optimizers: list, wire: torch.dtype | None):
        par.set_overlap(True)
        par.buckets.overlap = False  # no hook starts a bucket: DDP sums the dense gradients instead
        names = [f"embeddings.{n}" for n, _ in par.model.embeddings.named_parameters()]
        names += [f"embeddings.{n}" for n, _ in par.model.embeddings.named_buffers()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(par.model, names)
        self.ddp = DistributedDataParallel(
            par.model, forward_sync_buffers=False, init_sync=False, gradient_as_bucket_view=True
        )
        self.ddp.register_comm_hook(None, sum_hook(wire))
        self.par, self.optimizers = par, optimizers
        dense = {id(p) for p in par.model.dense_parameters()} | {id(p) for p in par.sharded.replicated_parameters()}
        self.early = [o for o in optimizers if not any(id(p) in dense for g in o.param_groups for p in g["params"])]
        self.late = [o for o in optimizers if not any(o is e for e in self.early)]

    def __call__(self, batch) -> torch.Tensor:
        par = self.par
        batch = par.ids_ahead(batch)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        par.sharded.start(batch.ids)
        logits = self.ddp(batch.dense, batch.ids)
        g = par.global_size(batch)
        loss, loss_sum = bce_loss(logits, batch.labels, g)
        total = loss_sum.detach().reshape(1).clone()
        work = dist.all_reduce(total, async_op=True)
        loss.backward()
        reps = par.sharded.replicated_parameters()
        rep_grads = [p.grad.to_dense() if p.grad is not None else torch.zeros_like(p) for p in reps]
        flat = torch.cat([t.reshape(-1) for t in rep_grads]) if rep_grads else None
        rep_work = dist.all_reduce(flat, async_op=True) if flat is not None else None
        for opt in self.early:
            opt.step()
        if rep_work is not None:
            rep_work.wait()
            offset = 0
            for p, t in zip(reps, rep_grads):
                p.grad = nonzero_rows(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
        work.wait()
        for opt in self.late:
            opt.step()
        return total[0] / g


def variant(cfg, args, par0: BenchParallel, name: str):
    """(step, parallel wrapper) of one variant, on a fresh copy of the model (same seed)."""
    wire = torch.bfloat16 if name.endswith("bf16") else None
    if name == "buckets-fp32":
        par = par0
    else:
        model = DLRM(cfg)
        model.reset_parameters(args.seed)
        prepare_model(
            argparse.Namespace(
                compile=args.compile, embedding_backend="native", optimizer="sgd", precision="fp32", lr=args.lr
            ),
            model,
            parallel=True,
        )
        pcfg = ParallelConfig(sharding=args.sharding, overlap=True, comm_dtype=wire)
        par = BenchParallel(model, par0.plan, par0.ctx, pcfg, seed=args.seed)
    optimizers = build_optimizers(par.model, "sgd", args.lr)
    if name.startswith("ddp"):
        return DDPStep(par, optimizers, wire), par
    return (lambda batch: par.step(batch, optimizers)), par


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="small", choices=list(MODELS))
    p.add_argument("--one-hot", action="store_true", help="one id per (sample, table), as Criteo data")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument(
        "--sharding",
        default="table_wise",
        help="default table_wise: DDP has no place for the lookups of a large replicated table (auto "
        "replicates every table at small per-rank batches)",
    )
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=10, help="steps per window")
    p.add_argument("--check-steps", type=int, default=5, help="steps of the equal-results check")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = MODELS[a.model]
    model = DLRM(cfg)
    model.reset_parameters(a.seed)
    prepare_model(
        argparse.Namespace(compile=a.compile, embedding_backend="native", optimizer="sgd", precision="fp32", lr=a.lr),
        model,
        parallel=True,
    )
    par0 = parallel_setup(model, a.batch_size, a.sharding, overlap=True, seed=a.seed)
    if par0 is None:
        raise SystemExit("run under torchrun")
    if par0.sharded.exchanged_replicas():
        raise SystemExit(
            f"--sharding {a.sharding} replicates large tables here, whose lookups DDP cannot sum: use table_wise"
        )
    rank = par0.ctx.rank
    names = ["buckets-fp32", "ddp-fp32", "buckets-bf16", "ddp-bf16"]
    variants = {n: variant(cfg, a, par0, n) for n in names}
    batches = par0.batches(cfg, a.batch_size, 4, a.seed, one_hot=a.one_hot)
    for _, par in variants.values():
        par.cycle = batches  # every variant walks the same batches (ids exchanged one ahead)

    losses = {n: [float(step(batches[i % 4])) for i in range(a.check_steps)] for n, (step, _) in variants.items()}
    ref = [p.detach().clone() for p in variants[names[0]][1].model.dense_parameters()]
    for n, (_, par) in variants.items():
        dw = max(float((p.detach() - r).abs().max()) for p, r in zip(par.model.dense_parameters(), ref))
        dl = max(abs(x - y) for x, y in zip(losses[n], losses[names[0]]))
        if rank == 0:
            print(
                f"equal results, {n} against {names[0]} after {a.check_steps} steps: max |loss diff| {dl:.2e}, "
                f"max |dense weight diff| {dw:.2e}",
                flush=True,
            )

    for step, _ in variants.values():  # warm up
        for i in range(3):
            step(batches[i % 4])
    rel: dict[str, list[float]] = {n: [] for n in names}
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds):
        got = {}
        for n in names if r % 2 == 0 else reversed(names):
            step = variants[n][0]
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(a.steps):
                step(batches[i % 4])
            dist.barrier()
            got[n] = a.batch_size * a.steps / (time.perf_counter() - t0)
        for n in names:
            rel[n].append(got[n] / got[names[0]])
            rates[n].append(got[n])
    if rank == 0:
        print(
            f"{a.model} batch {a.batch_size} {a.sharding}, 2 ranks x 1 thread, {a.rounds} rounds of {a.steps}-step "
            f"windows (median samples/s, median ratio to {names[0]} in the same round):"
        )
        for n in names:
            print(f"  {n:13s} {statistics.median(rates[n]):10,.0f}  {statistics.median(rel[n]):.3f}")
    for _, par in variants.values():
        par.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
