"""DLRM-DCNv2 training steps, dlrmkit next to TorchRec's `DLRM_DCN`, on CPU with the same shapes.

MLPerf DLRM-DCNv2's model (dim 128, bottom 512-256-128, 3 cross layers of rank 512, top
1024-1024-512-256-1, its 26 bag sizes 1..100) over the MLPerf tables scaled by --scale, the same
batches of multi-hot ids, Adagrad on MLPs and tables. TorchRec runs the way its CPU users train:
DistributedModelParallel (gloo, one rank) with FBGEMM's fused table-batched embeddings and the
tables' Adagrad applied in backward; dlrmkit runs its own step (sparse row gradients, its Adagrad).
Each library's steps are timed in alternating rounds (the machine is shared); the script prints
the median step time and samples/s of each. docs/BENCHMARKS.md holds the figures.

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


def dlrmkit_step(rows: list[int], lr: float):
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.model.embedding import JaggedIds
    from dlrmkit.optim.build import build_optimizers

    cfg = ModelConfig(13, rows, DIM, BOTTOM, TOP, "dcn", dcn_layers=LAYERS, dcn_rank=RANK)
    model = DLRM(cfg)
    model.reset_parameters(0)
    opts = build_optimizers(model, "adagrad", lr)

    def step(dense, lengths, values, labels) -> float:
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        logits = model(dense, JaggedIds(values, offsets, len(labels)))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        for o in opts:
            o.zero_grad()
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
        dist.init_process_group("gloo", rank=0, world_size=1)
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
        loss.backward()
        opt.step()
        return float(loss)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1e-3, help="table rows x this (default 1e-3: 40M -> 40K)")
    p.add_argument("--batch", type=int, default=2048, help="samples per step (default 2048)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (default 5)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: torch's)")
    p.add_argument("--lr", type=float, default=0.005)
    args = p.parse_args()
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
    print(
        f"DLRM-DCNv2 step on CPU ({torch.get_num_threads()} threads), tables MLPerf x {args.scale:g} "
        f"({sum(rows):,} rows, dim {DIM}), {sum(MLPERF_BAGS)} ids per sample, batch {args.batch}, "
        f"median of {args.rounds} alternating rounds of {args.steps} steps"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<9} {med * 1e3:9.1f} ms/step  {args.batch / med:10,.0f} samples/s  (rounds: "
              + ", ".join(f"{t * 1e3:.0f}" for t in ts) + " ms)")
    ratio = statistics.median(times["torchrec"]) / statistics.median(times["dlrmkit"])
    print(f"  torchrec / dlrmkit step time: {ratio:.2f}")


if __name__ == "__main__":
    main()
