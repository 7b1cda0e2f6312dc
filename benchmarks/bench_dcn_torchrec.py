"""DLRM-DCNv2 training steps, dlrmkit next to TorchRec's `DLRM_DCN`, on CPU with the same shapes.

MLPerf DLRM-DCNv2's model (dim 128, bottom 512-256-128, 3 cross layers of rank 512, top
1024-1024-512-256-1, its 26 bag sizes 1..100) over the MLPerf tables scaled by --scale, the same
batches of multi-hot ids, Adagrad on MLPs and tables. TorchRec runs the way its CPU users train:
DistributedModelParallel (gloo, one rank) with FBGEMM's fused table-batched embeddings and the
tables' Adagrad applied in backward; dlrmkit runs its own step (sparse row gradients, its Adagrad).
Each library's steps are timed in alternating rounds (the machine is shared); the script prints
the median step time and samples/s of each. With --ranks N each round is one torchrun job of N
ranks (1 thread each) per library, every rank stepping its share of the global batch: dlrmkit's
HybridParallel on its planner's plan (given the bag sizes), TorchRec's DistributedModelParallel
on its planner's. --profile times dlrmkit's step alone by phase and lists its top ops.
docs/BENCHMARKS.md holds the figures.

Needs torchrec and fbgemm-gpu-cpu, which dlrmkit does not depend on: a scratch virtualenv,
  python3 -m venv /work/scratch-dcn
  /work/scratch-dcn/bin/pip install -c constraints.txt torch==2.13.0
  /work/scratch-dcn/bin/pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 tensordict \
      torchmetrics==1.0.3 lightning-utilities
  /work/scratch-dcn/bin/pip install -c constraints.txt numpy pyyaml tqdm pyre-extensions pyvers
  PYTHONPATH=src /work/scratch-dcn/bin/python benchmarks/bench_dcn_torchrec.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

MLPERF_ROWS = [40_000_000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40_000_000, 3067956, 405282, 10]
MLPERF_ROWS += [2209, 11938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590152, 12973, 108, 36]
MLPERF_BAGS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DIM, BOTTOM, TOP, LAYERS, RANK = 128, [512, 256, 128], [1024, 1024, 512, 256, 1], 3, 512


def batches(rows: list[int], bags: list[int], batch: int, count: int, seed: int = 0):
    """(dense [B, 13], lengths [T*B] table-major, values, labels): fixed-size bags, uniform ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dense = torch.from_numpy(rng.random((batch, 13), dtype=np.float32))
        values = torch.from_numpy(np.concatenate([rng.integers(0, n, batch * k) for n, k in zip(rows, bags)]))
        lengths = torch.tensor(bags, dtype=torch.int64).repeat_interleave(batch)
        labels = torch.from_numpy((rng.random(batch) < 0.25).astype(np.float32))
        out.append((dense, lengths, values, labels))
    return out


def local_share(batch, rank: int, world: int):
    """Samples [a, b) of a global batch of fixed-size bags (each rank its slice)."""
    dense, lengths, values, labels = batch
    g = len(labels)
    a, b = rank * g // world, (rank + 1) * g // world
    starts = np.concatenate([[0], np.cumsum([g * k for k in MLPERF_BAGS])])
    vals = torch.cat([values[starts[t] + a * k : starts[t] + b * k] for t, k in enumerate(MLPERF_BAGS)])
    return dense[a:b], torch.tensor(MLPERF_BAGS, dtype=torch.int64).repeat_interleave(b - a), vals, labels[a:b]


def dlrmkit_step(rows: list[int], lr: float, world: int = 1, global_batch: int = 0):
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.model.embedding import JaggedIds
    from dlrmkit.optim.build import build_optimizers

    cfg = ModelConfig(13, rows, DIM, BOTTOM, TOP, "dcn", dcn_layers=LAYERS, dcn_rank=RANK)
    par = hybrid = None
    if world > 1:
        from dlrmkit.data.loader import Batch
        from dlrmkit.parallel.dist import batch_split, init_distributed
        from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig
        from dlrmkit.parallel.plan import host_replica_budget, make_plan
        from dlrmkit.parallel.sharded_embedding import DistIds

        ctx = init_distributed()
        model = DLRM(cfg, embedding_device="meta")
        # as train plans a CPU job of ranks on one host, with the bag sizes
        plan = make_plan(
            rows, DIM, world, "auto", None, global_batch, optimizer_state=1,
            replicate_memory=host_replica_budget(world), bags=MLPERF_BAGS,
        )  # fmt: skip
        par = HybridParallel(model, plan, ctx, ParallelConfig(sharding="auto"), seed=0)
        sizes = batch_split(global_batch, world)
    else:
        model = DLRM(cfg)
        model.reset_parameters(0)
    opts = build_optimizers(model, "adagrad", lr)
    if par is not None:
        hybrid = par.make_step(opts, gate=False)  # parallel/hybrid_step.py, as train steps

    def step(dense, lengths, values, labels) -> float:
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        ids = JaggedIds(values, offsets, len(labels))
        if hybrid is not None:
            return float(hybrid(Batch(dense, DistIds(ids, sizes), labels)))
        for o in opts:
            o.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels)
        loss.backward()
        for o in opts:
            o.step()
        return float(loss)

    return step


def torchrec_step(rows: list[int], lr: float):
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29731")
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    keys = [f"cat_{t}" for t in range(len(rows))]
    tables = [
        EmbeddingBagConfig(name=f"t_{k}", embedding_dim=DIM, num_embeddings=n, feature_names=[k])
        for k, n in zip(keys, rows)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(
        DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=13,
            dense_arch_layer_sizes=BOTTOM,
            over_arch_layer_sizes=TOP,
            dcn_num_layers=LAYERS,
            dcn_low_rank_dim=RANK,
            dense_device=torch.device("cpu"),
        )
    )
    apply_optimizer_in_backward(torch.optim.Adagrad, model.model.sparse_arch.parameters(), {"lr": lr})
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"))
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda params: torch.optim.Adagrad(params, lr=lr)
    )
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])

    def step(dense, lengths, values, labels) -> float:
        from torchrec.datasets.utils import Batch

        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
        loss, _ = dmp(Batch(dense_features=dense, sparse_features=kjt, labels=labels))
        opt.zero_grad()
        loss.backward()  # DistributedModelParallel's DDP averages the dense gradients over ranks
        opt.step()
        return float(loss)

    return step


def worker(args) -> None:
    """One torchrun rank of one library: warm-up, then `--steps` timed steps; rank 0 prints the
    mean step time as `STEP_S <seconds>`."""
    torch.set_num_threads(1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    rows = [max(1, int(n * args.scale)) for n in MLPERF_ROWS]
    data = [local_share(b, rank, world) for b in batches(rows, MLPERF_BAGS, args.batch, args.steps + 2)]
    step = dlrmkit_step(rows, args.lr, world, args.batch) if args.worker == "dlrmkit" else torchrec_step(rows, args.lr)
    for b in data[:2]:
        step(*b)
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    for b in data[2:]:
        step(*b)
    dist.barrier()
    if rank == 0:
        print(f"STEP_S {(time.perf_counter() - t0) / args.steps}", flush=True)
    dist.destroy_process_group()


def launch(args, library: str) -> float:
    """One torchrun job of `args.ranks` ranks running `library`; its mean step seconds."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks)]
    cmd += ["--master_addr", "127.0.0.1", "--master_port", str(port), __file__, "--worker", library]
    cmd += ["--scale", str(args.scale), "--batch", str(args.batch), "--steps", str(args.steps), "--lr", str(args.lr)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_S ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{library} with {args.ranks} ranks failed:\n{proc.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1e-3, help="table rows x this (default 1e-3: 40M -> 40K)")
    p.add_argument("--batch", type=int, default=2048, help="samples per step (default 2048)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: torch's)")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument(
        "--ranks", type=int, default=1, help="torchrun ranks per library, 1 thread each (default 1: in process)"
    )
    p.add_argument(
        "--profile", action="store_true", help="dlrmkit's step only: its phases and top ops (torch.profiler)"
    )
    p.add_argument("--worker", choices=("dlrmkit", "torchrec"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.profile:
        return profile_dlrmkit(args)
    if args.ranks > 1:
        times = {"dlrmkit": [], "torchrec": []}
        for _ in range(args.rounds):
            for name in times:
                times[name].append(launch(args, name))
        report(args, times, f"{args.ranks} ranks x 1 thread", sum(max(1, int(n * args.scale)) for n in MLPERF_ROWS))
        return None
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [max(1, int(n * args.scale)) for n in MLPERF_ROWS]
    data = batches(rows, MLPERF_BAGS, args.batch, args.steps + 2)
    runners = {"dlrmkit": dlrmkit_step(rows, args.lr), "torchrec": torchrec_step(rows, args.lr)}
    times: dict[str, list[float]] = {k: [] for k in runners}
    for name, step in runners.items():  # warm-up: first-touch of tables and optimizer state
        for b in data[:2]:
            step(*b)
    for _ in range(args.rounds):
        for name, step in runners.items():
            t0 = time.perf_counter()
            for b in data[2:]:
                step(*b)
            times[name].append((time.perf_counter() - t0) / args.steps)
    report(args, times, f"{torch.get_num_threads()} threads", sum(rows))


def profile_dlrmkit(args) -> None:
    """Where dlrmkit's step goes: median phase times (forward, backward, dense and table
    optimizers) over `--steps` steps, then the top ops by self CPU time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.model.embedding import JaggedIds
    from dlrmkit.optim.build import build_optimizers

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [max(1, int(n * args.scale)) for n in MLPERF_ROWS]
    model = DLRM(ModelConfig(13, rows, DIM, BOTTOM, TOP, "dcn", dcn_layers=LAYERS, dcn_rank=RANK))
    model.reset_parameters(0)
    opts = build_optimizers(model, "adagrad", args.lr)
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "dense optimizer": [], "table optimizer": []}

    def step(dense, lengths, values, labels, timed: bool = True) -> None:
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        for o in opts:
            o.zero_grad()
        t = [time.perf_counter()]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(dense, JaggedIds(values, offsets, len(labels))), labels
        )
        t.append(time.perf_counter())
        loss.backward()
        t.append(time.perf_counter())
        for o in opts:
            o.step()
            t.append(time.perf_counter())
        if timed:
            for name, a, b in zip(phases, t, t[1:]):
                phases[name].append(b - a)

    data = batches(rows, MLPERF_BAGS, args.batch, args.steps + 2)
    for b in data[:2]:
        step(*b, timed=False)
    for b in data[2:]:
        step(*b)
    print(f"dlrmkit DLRM-DCNv2 step, batch {args.batch}, {torch.get_num_threads()} threads, medians of {args.steps}:")
    for name, ts in phases.items():
        print(f"  {name:<16} {statistics.median(ts) * 1e3:8.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in data[2:4]:
            step(*b, timed=False)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def report(args, times: dict[str, list[float]], how: str, rows: int) -> None:
    print(
        f"DLRM-DCNv2 step on CPU ({how}), tables MLPerf x {args.scale:g} "
        f"({rows:,} rows, dim {DIM}), {sum(MLPERF_BAGS)} ids per sample, global batch {args.batch}, "
        f"median of {args.rounds} alternating rounds of {args.steps} steps"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {name:<9} {med * 1e3:9.1f} ms/step  {args.batch / med:10,.0f} samples/s  (rounds: "
            + ", ".join(f"{t * 1e3:.0f}" for t in ts)
            + " ms)"
        )
    ratio = statistics.median(times["torchrec"]) / statistics.median(times["dlrmkit"])
    print(f"  torchrec / dlrmkit step time: {ratio:.2f}")


if __name__ == "__main__":
    main()
