"""Run under torchrun by test_parallel_equivalence.py (and once without torchrun for the
single-process reference): a few training steps of a tiny DLRM on fixed random data for each
sharding plan, writing losses and final weights (tables gathered) to OUT/<plan>.pt on rank 0.

With a second argument `cpu-group`, the ranks give HybridParallel a separate gloo group for
CPU-tensor collectives, as NCCL runs do (DistContext.cpu_group), and every collective call is
recorded (function, group, dtype) into OUT/<plan>.pt: the CPU stand-in for the GPU path's split."""

from __future__ import annotations

import sys

import torch

from dlrmkit.data.loader import Batch
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.model.embedding import JaggedIds
from dlrmkit.parallel.dist import batch_slice, batch_split, init_distributed, shutdown
from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig
from dlrmkit.parallel.plan import make_plan
from dlrmkit.parallel.sharded_embedding import DistIds
from dlrmkit.optim.build import build_optimizers
from dlrmkit.precision import LossScaler, autocast
from dlrmkit.train.step import OneProcessStep

TABLES = [3, 8, 20, 300, 500]
CFG = ModelConfig(4, TABLES, 16, [16], [16, 1])
# plans named dcn_*: a DCNv2 cross network (low rank; full rank in *_full_rank; in dcn_parallel_*
# beside the top MLP's hidden layer) and fixed-size bags per table, as a multi-hot dataset's
# loader yields them
CFG_DCN = ModelConfig(4, TABLES, 16, [16], [16, 1], interaction="dcn", dcn_layers=2, dcn_rank=8)
FIXED_BAGS = [3, 2, 1, 5, 4]
GLOBAL_BATCH, STEPS = 50, 4
LR = {"sgd": 0.5, "adagrad": 0.05, "rowwise-adagrad": 0.05}
PLANS = {  # name -> (strategy, optimizer, multi-hot bags, overlapped all-reduce[, "exchanged"][, "fp16"])
    "data_parallel": ("data_parallel", "sgd", False, False),
    "table_wise": ("table_wise", "sgd", False, False),
    "column_wise": ("column_wise", "sgd", False, False),
    "row_wise": ("row_wise", "sgd", False, False),
    "auto": ("auto", "adagrad", False, False),  # mixed plan: replicated, table-wise and (N=4) column-wise
    "row_wise_multi_hot": ("row_wise", "sgd", True, True),  # bags of 0..4 ids split over row ranges
    "auto_multi_hot": ("auto", "adagrad", True, False),  # N=4: column slices of multi-hot bags
    # every table replicated, gradients exchanged as the rows each rank's lookups touched
    # (replica_grads): an all-gather started with the dense gradients' sum
    "replicated_rows": ("data_parallel", "sgd", False, True, "exchanged"),
    "replicated_rows_multi_hot": ("data_parallel", "adagrad", True, False, "exchanged"),
    "dcn_table_wise": ("table_wise", "adagrad", "fixed", False),
    "dcn_column_wise": ("column_wise", "sgd", "fixed", True),
    "dcn_row_wise": ("row_wise", "adagrad", "fixed", True),
    "dcn_auto_full_rank": ("auto", "sgd", "fixed", False),
    "replicated_dcn": ("data_parallel", "adagrad", "fixed", False),
    # row-wise Adagrad tables (one accumulator per row), read by bag like the element-wise ones
    "dcn_row_wise_rowwise_adagrad": ("row_wise", "rowwise-adagrad", "fixed", False),
    # DCNv2's parallel structure: the top MLP's hidden layer beside the cross network
    "dcn_parallel_column_wise": ("column_wise", "adagrad", "fixed", True),
    "replicated_rows_rowwise_adagrad": ("data_parallel", "rowwise-adagrad", True, False, "exchanged"),
    # fp16 autocast with the loss scale (precision.LossScaler): the ranks unscale after the sums and
    # agree on overflow; overlapped, so the tables' early step must wait for that agreement. SGD
    # tables: Adagrad's first step is lr * sign(g), and a near-zero row gradient's sign is a
    # rounding apart between the ranks' fp16 sums and one process's
    "fp16_row_wise": ("row_wise", "sgd", False, True, "fp16"),
    "fp16_auto_multi_hot": ("auto", "sgd", True, False, "fp16"),
}
FP16_START = 2.0**16


def optimizers_of(model, opt_name: str) -> list:
    if opt_name == "rowwise-adagrad":
        return build_optimizers(model, "adagrad", LR[opt_name], embedding_optimizer="rowwise-adagrad")
    return build_optimizers(model, opt_name, LR[opt_name])


def config_of(name: str) -> ModelConfig:
    if "dcn" not in name:
        return CFG
    if "parallel" in name:
        return ModelConfig(**{**CFG_DCN.__dict__, "dcn_structure": "parallel"})
    return ModelConfig(**{**CFG_DCN.__dict__, "dcn_rank": None}) if name.endswith("full_rank") else CFG_DCN


def data(step: int, multi_hot: bool | str = False):
    """(dense, ids, labels) of the global batch; ids [G, T], or (lengths [T, G], per-table values):
    bags of 0..4 ids, or of FIXED_BAGS[t] ids with multi_hot "fixed"."""
    g = torch.Generator().manual_seed(1000 + step)
    dense = torch.rand(GLOBAL_BATCH, 4, generator=g)
    if multi_hot == "fixed":
        lengths = torch.tensor(FIXED_BAGS).unsqueeze(1).expand(-1, GLOBAL_BATCH).contiguous()
        ids = (lengths, [torch.randint(0, n, (int(lengths[t].sum()),), generator=g) for t, n in enumerate(TABLES)])
    elif multi_hot:
        lengths = torch.randint(0, 5, (len(TABLES), GLOBAL_BATCH), generator=g)
        ids = (lengths, [torch.randint(0, n, (int(lengths[t].sum()),), generator=g) for t, n in enumerate(TABLES)])
    else:
        ids = torch.stack([torch.randint(0, n, (GLOBAL_BATCH,), generator=g) for n in TABLES], 1)
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
    return dense, ids, labels


def slice_ids(ids, a: int, b: int):
    """Samples [a, b) of the global batch's ids, as the model takes them."""
    if isinstance(ids, torch.Tensor):
        return ids[a:b]
    lengths, values = ids
    starts = torch.cat([torch.zeros(len(TABLES), 1, dtype=torch.int64), lengths.cumsum(1)], 1)
    vals = torch.cat([values[t][int(starts[t, a]) : int(starts[t, b])] for t in range(len(TABLES))])
    sub = lengths[:, a:b].reshape(-1)
    return JaggedIds(vals, torch.cat([torch.zeros(1, dtype=torch.int64), sub.cumsum(0)]), b - a)


CALLS: list[tuple[str, str, str]] = []  # (collective, "cpu" | "default" | "other", dtype) in cpu-group mode
CPU_GROUP = None
NAMES = {"AllReduce": "all_reduce", "AllToAll": "all_to_all_single", "AllGather": "all_gather"}


def record_collectives() -> None:
    """Wraps the transports' start (parallel/transport.py), so each collective a step starts is
    noted in CALLS by the group it travels on; shared memory's sums count as the default group's
    (its slots stand in for that group's all-reduce), and the small collective that tells every
    rank the slots are written is not noted: it carries no data."""
    import torch.distributed as dist

    from dlrmkit.parallel import shared_memory, transport

    def note(ops, group) -> None:
        where = "cpu" if group is CPU_GROUP else ("default" if group in (None, dist.group.WORLD) else "other")
        CALLS.extend((NAMES[type(op).__name__], where, str(op.tensor.dtype)) for op in ops)

    torch_start, shared_start = transport.TorchCollectives.start, shared_memory.SharedMemorySum.start
    inside = [False]

    def torch_recorded(self, ops):
        if not inside[0]:
            note(ops, self.group)
        return torch_start(self, ops)

    def shared_recorded(self, ops):
        note(ops, self.inner.group)
        inside[0] = True
        try:
            return shared_start(self, ops)
        finally:
            inside[0] = False

    transport.TorchCollectives.start = torch_recorded
    shared_memory.SharedMemorySum.start = shared_recorded


def run(name: str, rank: int, world: int, distributed: bool) -> dict:
    strategy, opt_name, multi_hot, overlap, *rest = PLANS[name]
    fp16 = "fp16" in rest
    scaler = LossScaler(scale=FP16_START) if fp16 else None
    amp = (lambda: autocast("fp16")) if fp16 else None
    losses = []
    if not distributed:
        model = DLRM(config_of(name))
        model.reset_parameters(7)
        opts = optimizers_of(model, opt_name)
        one_step = OneProcessStep(model, opts, amp=amp, scaler=scaler) if fp16 else None
        for step in range(STEPS):
            dense, ids, labels = data(step, multi_hot)
            if one_step is not None:
                losses.append(float(one_step(Batch(dense, slice_ids(ids, 0, GLOBAL_BATCH), labels))))
                continue
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(dense, slice_ids(ids, 0, GLOBAL_BATCH)), labels
            )
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            losses.append(float(loss.detach()))
        tables = [w.detach().clone() for w in _tables(model.embeddings)]
    else:
        model = DLRM(config_of(name), embedding_device="meta")  # no full tables: shards are initialized in place
        plan = make_plan(TABLES, 16, world, strategy, batch_size=GLOBAL_BATCH, min_rows_sharded=16)
        pcfg = pcfg_of(strategy, overlap, "exchanged" in rest)
        par = HybridParallel(model, plan, ctx_of(rank, world), pcfg, seed=7)
        opts = optimizers_of(model, opt_name)
        train_step = par.make_step(opts, amp=amp, gate=False, scaler=scaler)  # parallel/hybrid_step.py
        sizes = batch_split(GLOBAL_BATCH, world)
        a, b = batch_slice(GLOBAL_BATCH, rank, world)
        for step in range(STEPS):
            dense, ids, labels = data(step, multi_hot)
            losses.append(float(train_step(Batch(dense[a:b], DistIds(slice_ids(ids, a, b), sizes), labels[a:b]))))
        step_calls = list(CALLS)
        tables = par.sharded.gather_tables()
        gather_calls = CALLS[len(step_calls) :]
        CALLS.clear()
    dense_params = [p.detach().clone() for p in model.dense_parameters()]
    out = {"losses": losses, "tables": tables, "dense": dense_params}
    if scaler is not None:  # every rank's scale: equal, and at its start (no overflow in these steps)
        out["scale"] = scaler.value
    if distributed and CPU_GROUP is not None:
        out.update(step_calls=step_calls, gather_calls=gather_calls)
    return out


def _tables(emb):
    from dlrmkit.parallel.sharded_embedding import table_weight

    return [table_weight(emb, t) for t in range(len(emb.table_sizes))]


def pcfg_of(strategy: str, overlap: bool, exchanged: bool = False) -> ParallelConfig:
    """Overlapped: buckets small enough that the tiny model's dense gradients travel in two.
    `exchanged`: every replicated table exchanges its lookups' rows (no dense table gradient)."""
    rows = 0 if exchanged else ParallelConfig.dense_replica_rows
    if overlap:
        return ParallelConfig(sharding=strategy, overlap=True, bucket_bytes=256, dense_replica_rows=rows)
    return ParallelConfig(sharding=strategy, overlap=False, dense_replica_rows=rows)


def ctx_of(rank: int, world: int):
    from dlrmkit.parallel.dist import DistContext

    return DistContext(rank=rank, world_size=world, cpu_group=CPU_GROUP)


def main() -> None:
    out = sys.argv[1]
    torch.set_num_threads(1)
    ctx = init_distributed()
    distributed = ctx.backend != "none"
    if len(sys.argv) > 2 and sys.argv[2] == "cpu-group":
        import torch.distributed as dist

        global CPU_GROUP
        CPU_GROUP = dist.new_group(backend="gloo")
        record_collectives()
    for name in PLANS:
        result = run(name, ctx.rank, ctx.world_size, distributed)
        if ctx.rank == 0:
            torch.save(result, f"{out}/{name}.pt")
    shutdown()


if __name__ == "__main__":
    main()
