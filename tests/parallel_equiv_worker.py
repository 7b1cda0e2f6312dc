"""Run under torchrun by test_parallel_equivalence.py (and once without torchrun for the
single-process reference): a few training steps of a tiny DLRM on fixed random data for each
sharding plan, writing losses and final weights (tables gathered) to OUT/<plan>.pt on rank 0."""

from __future__ import annotations

import sys

import torch

from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.parallel.dist import batch_slice, batch_split, init_distributed, shutdown
from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig
from dlrmkit.parallel.plan import make_plan
from dlrmkit.parallel.sharded_embedding import DistIds
from dlrmkit.train.trainer import build_optimizers

TABLES = [3, 8, 20, 300, 500]
CFG = ModelConfig(4, TABLES, 16, [16], [16, 1])
GLOBAL_BATCH, STEPS = 50, 4
LR = {"sgd": 0.5, "adagrad": 0.05}
PLANS = {  # name -> (strategy, optimizer)
    "data_parallel": ("data_parallel", "sgd"),
    "table_wise": ("table_wise", "sgd"),
    "column_wise": ("column_wise", "sgd"),
    "row_wise": ("row_wise", "sgd"),
    "auto": ("auto", "adagrad"),  # mixed plan: replicated, table-wise and (N=4) column-wise
}


def data(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    dense = torch.rand(GLOBAL_BATCH, 4, generator=g)
    ids = torch.stack([torch.randint(0, n, (GLOBAL_BATCH,), generator=g) for n in TABLES], 1)
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
    return dense, ids, labels


def run(name: str, rank: int, world: int, distributed: bool) -> dict:
    strategy, opt_name = PLANS[name]
    model = DLRM(CFG)
    model.reset_parameters(7)
    losses = []
    if not distributed:
        opts = build_optimizers(model, opt_name, LR[opt_name])
        for step in range(STEPS):
            dense, ids, labels = data(step)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            losses.append(float(loss.detach()))
        tables = [w.detach().clone() for w in _tables(model.embeddings)]
    else:
        plan = make_plan(TABLES, 16, world, strategy, batch_size=GLOBAL_BATCH, min_rows_sharded=16)
        par = HybridParallel(model, plan, ctx_of(rank, world), ParallelConfig(sharding=strategy))
        opts = build_optimizers(model, opt_name, LR[opt_name])
        sizes = batch_split(GLOBAL_BATCH, world)
        a, b = batch_slice(GLOBAL_BATCH, rank, world)
        for step in range(STEPS):
            dense, ids, labels = data(step)
            logits = model(dense[a:b], DistIds(ids[a:b], sizes))
            for o in opts:
                o.zero_grad()
            losses.append(par.loss_backward(logits, labels[a:b], GLOBAL_BATCH))
            for o in opts:
                o.step()
        tables = par.sharded.gather_tables()
    dense_params = [p.detach().clone() for p in model.dense_parameters()]
    return {"losses": losses, "tables": tables, "dense": dense_params}


def _tables(emb):
    from dlrmkit.parallel.sharded_embedding import table_weight

    return [table_weight(emb, t) for t in range(len(emb.table_sizes))]


def ctx_of(rank: int, world: int):
    from dlrmkit.parallel.dist import DistContext

    return DistContext(rank=rank, world_size=world)


def main() -> None:
    out = sys.argv[1]
    torch.set_num_threads(1)
    ctx = init_distributed()
    distributed = ctx.backend != "none"
    for name in PLANS:
        result = run(name, ctx.rank, ctx.world_size, distributed)
        if ctx.rank == 0:
            torch.save(result, f"{out}/{name}.pt")
    shutdown()


if __name__ == "__main__":
    main()
