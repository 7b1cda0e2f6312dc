"""2 ranks against one process in one run, robust to this VM's drift (its speed moves 10-20% within
minutes): two torchrun ranks hold both the sharded 2-rank model and, on rank 0, the single-process
model. Windows alternate: rank 0 trains the single-process model on 2 threads while rank 1 waits
in a barrier, then both ranks train the table-wise model on 1 thread each; same random data, same
global batch. Each pair's ratio (2-rank samples/s / single-process samples/s) compares two windows
a second apart; the median over pairs is the figure.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 benchmarks/parallel_pingpong.py --pairs 30

Rank 1's CPU time while it waits is printed: a spinning wait would slow the single-process
windows and flatter the ratio (gloo's barrier blocks in a socket read; the figure shows it). So
is each rank's CPU per 2-rank step, split into its main thread and gloo's threads (Linux /proc):
what a rank's one core spends on compute and Python against communication.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist

from dlrmkit.commands.bench import BENCH_MODELS, random_batches
from dlrmkit.data.synthetic_shapes import KAGGLE_TABLE_SIZES
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.train.step import training_step
from dlrmkit.optim.build import build_optimizers
from dlrmkit.perf.bench_parallel import parallel_setup
from dlrmkit.perf.bench_perf import prepare_model


# the bench models plus train's criteo-kaggle preset on Criteo Kaggle's tables (2.2 GB of fp32 weights)
MODELS = {**BENCH_MODELS, "criteo-kaggle": ModelConfig(13, KAGGLE_TABLE_SIZES, 16, [512, 256, 64, 16], [512, 256, 1])}


def one_hot_batches(cfg: ModelConfig, batch_size: int, count: int, seed: int) -> list:
    """random_batches with one id per (sample, table), as [B, T] tensors (Criteo's shape)."""
    out = random_batches(cfg, batch_size, count, seed, max_bag=1)
    for x in out:
        x.ids = x.ids.values.view(-1, batch_size).t().contiguous()
    return out


def set_affinity(cores: set[int]) -> None:
    """Every thread of this process (the main one, OpenMP's, gloo's) on `cores`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just ended
            pass


def thread_cpu() -> collections.Counter:
    """CPU seconds so far of this process's threads by kind: "main" (the caller's thread), "gloo"
    (gloo's transport and work threads), "other"; empty where /proc has no per-thread stat."""
    out: collections.Counter = collections.Counter()
    tick, main = os.sysconf("SC_CLK_TCK"), threading.get_native_id()
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the name: state, ppid, ...
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read()
        except OSError:  # a thread that just ended
            continue
        kind = "main" if int(tid) == main else "gloo" if "gloo" in name else "other"
        out[kind] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def window(step, batches, steps: int, start: int) -> float:
    """Seconds for `steps` steps (the caller synchronizes around it)."""
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[(start + i) % len(batches)])
    return time.perf_counter() - t0


def profile_both(a, rank: int, single_step, single_batches, par_step, par_batches) -> None:
    """Self CPU per op and step of both set-ups (rank 0's view of the 2-rank one)."""
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    if rank == 0:
        torch.set_num_threads(a.single_threads)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            window(single_step, single_batches, a.profile, 0)
        torch.set_num_threads(1)
        print(f"single process, 2 threads, self CPU summed over {a.profile} steps")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        window(par_step, par_batches, a.profile, 0)
    dist.barrier()
    if rank == 0:
        print(f"2 ranks, 1 thread, rank 0, self CPU summed over {a.profile} steps")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def sharded_training(
    cfg,
    batch_size: int,
    sharding: str,
    seed: int,
    compile: bool = True,
    ids_ahead: bool = True,
    one_hot: bool = False,
    bucket_bytes: int | None = None,
    bind: bool = True,
    shared_memory: bool = True,
):
    """(BenchParallel, step(batch), its batches): the benchmark model sharded as `dlrmkit bench`
    shards it under torchrun, fp32 SGD, overlapped communication (also used by parallel_gaps.py)."""
    args = argparse.Namespace(compile=compile, embedding_backend="native", optimizer="sgd", precision="fp32", lr=0.01)
    model = DLRM(cfg)
    model.reset_parameters(seed)
    prepare_model(args, model, parallel=True)
    par = parallel_setup(
        model,
        batch_size,
        sharding,
        overlap=True,
        seed=seed,
        ids_ahead=ids_ahead,
        bucket_bytes=bucket_bytes,
        bind=bind,
        shared_memory=shared_memory,
    )
    if par is None:
        raise SystemExit("run under torchrun")
    opts = build_optimizers(model, "sgd", args.lr)
    return (
        par,
        lambda batch: par.step(batch, opts),
        (par.batches(cfg, batch_size, 4, seed, one_hot=True) if one_hot else par.batches(cfg, batch_size, 4, seed)),
    )


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="small", choices=list(MODELS))
    p.add_argument(
        "--one-hot", action="store_true", help="one id per (sample, table), as Criteo data (default: bags of 1-10 ids)"
    )
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--sharding", default="table_wise")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--steps", type=int, default=10, help="steps per window (default 10)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--single-threads",
        type=int,
        default=2,
        help="intra-op threads of the single process (default 2: "
        "the machine's two cores; 1 compares per core, immune to a loaded machine stalling OpenMP)",
    )
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bind each rank (all its threads: compute and gloo's) to core RANK during 2-rank windows, as "
        "train and bench do under torchrun (--bind-cores); the single-process windows use both cores",
    )
    p.add_argument(
        "--ids-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exchange the next batch's ids during the step (the default, as training does)",
    )
    p.add_argument(
        "--shm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sum dense gradients through shared memory, as training on one host does (the default); "
        "--no-shm: every byte through gloo's TCP",
    )
    p.add_argument(
        "--bucket-kb",
        type=int,
        help="every dense gradient bucket's size in KiB (default: ParallelConfig.bucket_bytes)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the pairs, profile STEPS steps of each on rank 0 and print the top ops",
    )
    a = p.parse_args()
    args = argparse.Namespace(compile=a.compile, embedding_backend="native", optimizer="sgd", precision="fp32", lr=0.01)
    cfg = MODELS[a.model]

    torch.set_num_threads(1)
    par, par_step, par_batches = sharded_training(
        cfg,
        a.batch_size,
        a.sharding,
        a.seed,
        a.compile,
        a.ids_ahead,
        a.one_hot,
        a.bucket_kb << 10 if a.bucket_kb else None,
        bind=False,
        shared_memory=a.shm,
    )
    if par.ctx.world_size != 2:
        raise SystemExit("run under torchrun --nproc_per_node=2")

    rank = par.ctx.rank
    if rank == 0:
        single = DLRM(cfg)
        single.reset_parameters(a.seed)
        prepare_model(args, single, parallel=False)
        single_step = training_step(single, build_optimizers(single, "sgd", args.lr))
        single_batches = (one_hot_batches if a.one_hot else random_batches)(cfg, a.batch_size, 4, a.seed)
        torch.set_num_threads(a.single_threads)
        window(single_step, single_batches, a.warmup, 0)
        torch.set_num_threads(1)
    window(par_step, par_batches, a.warmup, 0)

    ratios, singles, pairs_rates, idle_cpu = [], [], [], []
    par_cpu, par_wall = collections.Counter(), 0.0  # this rank's CPU by thread kind in 2-rank windows
    for i in range(a.pairs):
        dist.barrier()
        if rank == 0:
            torch.set_num_threads(a.single_threads)
            one = a.batch_size * a.steps / window(single_step, single_batches, a.steps, i * a.steps)
            torch.set_num_threads(1)
            # OpenMP's idle worker spins a while before it sleeps: not on rank 0's core in the 2-rank window
            time.sleep(0.02)
            dist.barrier()
        else:
            c0, w0 = time.process_time(), time.perf_counter()
            dist.barrier()
            idle_cpu.append((time.process_time() - c0) / (time.perf_counter() - w0))
        dist.barrier()
        cores = os.sched_getaffinity(0)
        if a.pin:
            set_affinity({sorted(cores)[rank % len(cores)]})
        cpu0 = thread_cpu()
        seconds = window(par_step, par_batches, a.steps, i * a.steps)
        par_cpu.update(thread_cpu() - cpu0)
        par_wall += seconds
        two = a.batch_size * a.steps / seconds
        if a.pin:
            set_affinity(cores)
        dist.barrier()
        if rank == 0:
            ratios.append(two / one)
            singles.append(one)
            pairs_rates.append(two)
            print(
                f"pair {i + 1}: 1 process x {a.single_threads} threads {one:,.0f} samples/s, 2 ranks x 1 thread {a.sharding} "
                f"{two:,.0f} samples/s, ratio {two / one:.3f}",
                flush=True,
            )
    if a.profile:
        profile_both(
            a, rank, single_step if rank == 0 else None, single_batches if rank == 0 else None, par_step, par_batches
        )
    cpu = torch.tensor([statistics.median(idle_cpu) if idle_cpu else 0.0])
    dist.all_reduce(cpu)
    per_rank = [None] * 2
    dist.all_gather_object(per_rank, (dict(par_cpu), par_wall))
    if rank == 0:
        print(
            f"{a.model} batch {a.batch_size}, {a.pairs} pairs of {a.steps}-step windows: median single "
            f"{statistics.median(singles):,.0f} ({a.single_threads} threads), median 2-rank "
            f"{statistics.median(pairs_rates):,.0f} samples/s; "
            f"median ratio {statistics.median(ratios):.3f} (quartiles "
            f"{' '.join(f'{q:.3f}' for q in statistics.quantiles(ratios, n=4)) if len(ratios) > 1 else '-'}); rank 1 used "
            f"{100 * float(cpu):.1f}% of a core while waiting"
        )
        steps = a.pairs * a.steps
        for r, (kinds, wall) in enumerate(per_rank):
            if kinds:
                print(
                    f"rank {r}, ms per 2-rank step: wall {1e3 * wall / steps:.2f}, CPU "
                    + ", ".join(f"{k} {1e3 * kinds.get(k, 0.0) / steps:.2f}" for k in ("main", "gloo", "other"))
                )
    par.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
