"""Hybrid parallelism applied from outside a single-device DLRM: swap `model.embeddings` for a
ShardedEmbedding, choose once how bytes travel (`make_transport`), and sum the dense gradients
(MLPs and replicated tables) over ranks in buckets. The step itself is parallel/hybrid_step.py.
On GPUs (DistContext.device 'cuda', NCCL) the model moves there after the swap; dense features
and labels follow each batch, ids stay on the CPU for the id exchange (ShardedEmbedding)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.dlrm import DLRM
from dlrmkit.parallel.dist import DistContext
from dlrmkit.parallel.grad_buckets import GradBuckets
from dlrmkit.parallel.hybrid_step import HybridStep
from dlrmkit.parallel.options import ParallelOptions, torchrun_env
from dlrmkit.parallel.plan import ShardingPlan, host_replica_budget, make_plan
from dlrmkit.parallel.plan_cost import DENSE_REPLICA_ROWS
from dlrmkit.parallel.shared_memory import SharedMemorySum
from dlrmkit.parallel.sharded_embedding import ShardedEmbedding
from dlrmkit.parallel.transport import Bf16Wire, CommStats, Transport, all_gather_objects, torch_collectives


@dataclass
class ParallelConfig:
    sharding: str = ParallelOptions.sharding  # the option's default (parallel/options.py)
    plan_path: str | None = None
    loader: str = ParallelOptions.loader
    comm_dtype: torch.dtype | None = None
    bucket_bytes: int = 25 << 20  # dense gradients summed per bucket of about this size
    min_rows_sharded: int = 2048
    # overlap communication with compute: pooled all-to-all started before the model and backward's
    # as soon as its gradient is known, dense gradients all-reduced in buckets during backward,
    # tables stepped while that travels (docs/BENCHMARKS.md); False: every collective blocks
    overlap: bool = True
    # replicated weights with more rows exchange their lookups' rows, not a dense gradient
    dense_replica_rows: int = DENSE_REPLICA_ROWS
    # ranks on one host sum dense gradients through shared memory (parallel/shared_memory.py);
    # gloo still runs a small collective per sum. False: every byte through gloo's TCP
    shared_memory: bool = True
    ids_ahead: bool = True  # with overlap: exchange the next batch's ids during this step (gloo; parallel/ids_ahead.py)


def build_plan(
    model: DLRM,
    ctx: DistContext,
    pcfg: ParallelConfig,
    batch_size: int,
    optimizer_state: float = 0,
    row_state: bool = False,
) -> ShardingPlan:
    cfg = model.cfg
    if pcfg.plan_path:
        plan = ShardingPlan.load(pcfg.plan_path)
        plan.check_matches(cfg.table_sizes, cfg.table_dim, ctx.world_size, pcfg.plan_path)
        if row_state:
            plan.check_row_state(pcfg.plan_path)
        return plan
    memory = replicate = None
    if ctx.device.type == "cuda":  # shards must fit beside activations: a plan error, not a CUDA OOM later
        memory = int(0.8 * torch.cuda.get_device_properties(ctx.device).total_memory)
    else:  # ranks on a CPU host share its memory: what replicating every table may take
        replicate = host_replica_budget(torchrun_env().local_world_size)
    plan = make_plan(
        cfg.table_sizes,
        cfg.table_dim,
        ctx.world_size,
        pcfg.sharding,
        batch_size=batch_size,
        min_rows_sharded=pcfg.min_rows_sharded,
        device_memory=memory,
        optimizer_state=optimizer_state,
        replicate_memory=replicate,
        row_state=row_state,
    )
    check_same_plan(plan, ctx)
    return plan


def check_same_plan(plan: ShardingPlan, ctx: DistContext) -> None:
    """Every rank plans alone (hosts may differ in memory): one line, not a hang, if they disagree."""
    if ctx.world_size < 2 or not dist.is_initialized():
        return
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    digests = all_gather_objects(digest, ctx.cpu_group)
    if len(set(digests)) > 1:
        raise DlrmkitError(
            "the ranks made different sharding plans (their hosts differ in memory or devices): "
            "write one with `dlrmkit plan --json FILE` and give every rank --plan FILE"
        )


def make_transport(ctx: DistContext, pcfg: ParallelConfig, model: DLRM, sharded: ShardedEmbedding) -> Transport:
    """How bytes travel, decided once: torch's collectives (gloo, NCCL; none for one rank), with
    float32 values as bfloat16 on the wire for `comm_dtype` bf16, or else, for CPU ranks on one
    host, sums and gathers through shared memory (parallel/shared_memory.py) where every rank
    could map every slot (a collective: every rank calls it)."""
    torch_ops = torch_collectives(None, CommStats())
    if pcfg.comm_dtype == torch.bfloat16:
        return Bf16Wire(torch_ops)
    if pcfg.shared_memory and ctx.device.type == "cpu":
        # room for a step's sums: dense and small replicated gradients (4-byte values: split-SGD
        # makes some bf16 later), the loss, and the large replicated tables' lookups
        params = list(model.dense_parameters()) + sharded.replicated_parameters()
        nbytes = sum(4 * p.numel() for p in params) + 64 * (len(params) + 8) + REPLICA_LOOKUP_BYTES
        return SharedMemorySum.create(torch_ops, nbytes) or torch_ops
    return torch_ops


# room in each rank's shared-memory slot for its large replicated tables' lookups (row ids and
# gradient rows, at the per-rank batches that replicate them: plan.REPLICATE_MAX_LOCAL_BATCH);
# more travels through gloo
REPLICA_LOOKUP_BYTES = 4 << 20


class HybridParallel:
    """Owns the sharded embeddings of `model` (replaced in place), the transports and the dense
    gradients' buckets. With `seed`, the model is initialized after the swap
    (model.reset_parameters(seed)): each rank generates only its shards, with the values
    single-process init gives them; without it, shards are copied out of the model's (already
    initialized) tables."""

    def __init__(
        self,
        model: DLRM,
        plan: ShardingPlan,
        ctx: DistContext,
        pcfg: ParallelConfig | None = None,
        seed: int | None = None,
    ):
        self.model, self.plan, self.ctx = model, plan, ctx
        self.pcfg = pcfg or ParallelConfig()
        ids_transport = torch_collectives(ctx.cpu_group) if ctx.cpu_group is not None else None
        sharded = ShardedEmbedding(plan, ctx.rank, self.pcfg.dense_replica_rows, ids_transport=ids_transport)
        if seed is None and not any(p.is_meta for p in model.embeddings.parameters()):
            sharded.load_from(model.embeddings)
        model.embeddings = sharded
        if seed is not None:
            model.reset_parameters(seed)
        model.to(ctx.device)  # before GradBuckets' hooks and the optimizers: parameters keep identity
        self.transport = make_transport(ctx, self.pcfg, model, sharded)
        sharded.transport, sharded.stats = self.transport, self.transport.stats
        if ids_transport is None:
            sharded.ids_transport = self.transport
        else:
            ids_transport.stats = self.transport.stats
        self.sharded, self.stats = sharded, self.transport.stats
        self.buckets = GradBuckets(list(model.dense_parameters()), self.pcfg.bucket_bytes, self.transport)
        self.ahead = None
        self.steps_taken = 0  # steps this process took (not those before a resume)
        self._unsummed: tuple = (None, [])  # (optimizer ids, the optimizers no sum touches)
        if self.pcfg.ids_ahead:
            from dlrmkit.parallel.ids_ahead import IdsAhead

            self.ahead = IdsAhead.create(sharded)
        self.set_overlap(self.pcfg.overlap)

    def close(self) -> None:
        """Before leaving the process group: waits for the id exchange started ahead."""
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None

    @property
    def overlapping(self) -> bool:
        return self.sharded.overlap

    def set_overlap(self, on: bool) -> None:
        """Switch between overlapped and blocking communication (bench compares both)."""
        self.buckets.overlap = self.sharded.overlap = on

    def to_device(self, batch):
        """`batch` with dense features and labels on this rank's device (ids stay for the exchange)."""
        if self.ctx.device.type == "cpu":
            return batch
        return replace(
            batch,
            dense=batch.dense.to(self.ctx.device, non_blocking=True),
            labels=batch.labels.to(self.ctx.device, non_blocking=True),
        )

    @staticmethod
    def global_size(batch) -> int:
        """Samples in the global batch (every rank's local batch size travels with the ids)."""
        return sum(batch.ids.batch_sizes)

    def make_step(self, optimizers: list, amp=None, move=None, loss_ok=None, gate: bool = True, scaler=None):
        """The training step (parallel/hybrid_step.py HybridStep) over these optimizers
        (`scaler`: fp16's precision.LossScaler)."""
        return HybridStep(self, optimizers, amp, move, loss_ok, gate, scaler)

    def unsummed_optimizers(self, optimizers: list) -> list:
        """The optimizers whose parameters take no sum over ranks (the model-parallel tables'):
        they may step before the gradients' sum completes. Kept per optimizer list, not found by
        walking every module's parameters each step (small steps feel Python's overhead)."""
        key = tuple(map(id, optimizers))
        if self._unsummed[0] != key:
            summed = {id(p) for p in self.model.dense_parameters()}
            summed |= {id(p) for lookup in self.sharded.local_lookups for p in lookup.parameters()}
            unsummed = [o for o in optimizers if not any(id(p) in summed for g in o.param_groups for p in g["params"])]
            self._unsummed = (key, unsummed)
        return self._unsummed[1]


def gather_predictions(probs: np.ndarray, labels: np.ndarray, group=None) -> tuple[np.ndarray, np.ndarray]:
    """All ranks' predictions and labels (for AUC over the whole test set), on every rank."""
    parts = all_gather_objects((probs, labels), group)
    return np.concatenate([p for p, _ in parts]), np.concatenate([l for _, l in parts])


def setup_parallel(
    model: DLRM,
    opts: ParallelOptions,
    device: str,
    batch_size: int,
    seed: int | None,
    optimizer_state: float = 0.0,
    row_state: bool = False,
) -> tuple[DistContext, "TrainerParallel | None", ShardingPlan | None]:
    """For the trainer: under torchrun, a process group, a plan and the sharded model;
    otherwise (DistContext(), None, None) and training stays single-process. `opts`: the parallel
    section of the train options; `device`: --device; `optimizer_state`: values the tables'
    optimizer keeps per weight, counted in the plan's memory (0: evaluation); `row_state`: it
    keeps one per row (row-wise Adagrad: no table is cut into column slices)."""
    from dlrmkit.parallel.dist import init_distributed, launched_by_torchrun

    if not launched_by_torchrun():
        return DistContext(), None, None
    from dlrmkit.device import resolve_device

    device = resolve_device(device).type
    ctx = init_distributed(opts.backend, opts.collective_timeout, device, bind=opts.bind_cores)
    pcfg = ParallelConfig(
        sharding=opts.sharding,
        plan_path=opts.plan,
        loader=opts.loader,
        comm_dtype=torch.bfloat16 if opts.comm_dtype == "bf16" else None,
    )
    plan = build_plan(model, ctx, pcfg, batch_size, optimizer_state, row_state)
    return ctx, TrainerParallel(model, plan, ctx, pcfg, seed=seed), plan


class TrainerParallel(HybridParallel):
    """The trainer's hooks: loader, step and evaluation under hybrid parallelism."""

    def loader(self, dataset, cfg):
        from dlrmkit.parallel.loader import DistBatchLoader

        self.train_loader = DistBatchLoader(
            dataset,
            cfg.schedule.batch_size,
            self.ctx.rank,
            self.ctx.world_size,
            self.sharded.id_tables,
            self.pcfg.loader,
            self.ctx.cpu_group,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            pin_memory=self.ctx.device.type == "cuda",
        )
        if self.overlapping:
            self.train_loader.ahead = self.ahead  # training batches: ids exchanged one batch ahead
        return self.train_loader

    def traffic(self, steps: int) -> dict[str, float]:
        """Mean bytes per step so far on this rank: read from disk by the loader, and sent in
        all-to-alls (ids, pooled forward/backward) and gradient all-reduce (ring-algorithm
        bytes) by the model, for the trainer's JSON-lines log."""
        steps = max(self.steps_taken or steps, 1)  # steps of this process (not before a resume)
        sent = dict(self.stats.bytes)
        sent["ids"] = sent.get("ids", 0) + sent.pop("ids_ahead", 0)  # exchanged in forward or a batch ahead
        out = {f"bytes_{k}_per_step": v / steps for k, v in sent.items() if v}
        loader = getattr(self, "train_loader", None)
        if loader is not None:
            out["bytes_read_per_step"] = loader.bytes_read / steps
        return out

    def held_bytes(self, optimizers: list) -> dict:
        """What every rank holds for its tables (shards and replicated tables) and their optimizer
        state, next to the plan's memory per rank: `plan --data` shows the same figures."""
        params = list(self.sharded.parameters())
        ids = {id(p) for p in params}
        tables = sum(p.numel() * p.element_size() for p in params)
        state = sum(
            v.numel() * v.element_size()
            for opt in optimizers
            for p, st in opt.state.items()
            if id(p) in ids
            for v in st.values()
            if isinstance(v, torch.Tensor)
        )
        planned = self.plan.rank_stats()[self.ctx.rank]["memory"]
        ranks = all_gather_objects((tables, state, planned), self.ctx.cpu_group)
        return {
            "rank_table_bytes": [t for t, _, _ in ranks],
            "rank_state_bytes": [s for _, s, _ in ranks],
            "rank_planned_bytes": [p for _, _, p in ranks],
        }

    @torch.no_grad()
    def predict(self, dataset, batch_size: int, logits: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Click probabilities (`logits`: the logits before the sigmoid) and labels of the whole
        dataset: each rank predicts its slice of every batch, then all ranks gather all of them
        (rank by rank: every row once, not in the dataset's order)."""
        from dlrmkit.parallel.loader import DistBatchLoader

        was = self.model.training
        self.model.eval()
        out, labels = [], []
        for batch in DistBatchLoader(
            dataset,
            batch_size,
            self.ctx.rank,
            self.ctx.world_size,
            self.sharded.id_tables,
            self.pcfg.loader,
            self.ctx.cpu_group,
        ).epoch(0):
            dense = batch.dense.to(self.ctx.device, non_blocking=True)
            z = self.model(dense, batch.ids).float()
            out.append((z if logits else torch.sigmoid(z)).cpu().numpy())
            labels.append(batch.labels.numpy())
        self.model.train(was)
        p = np.concatenate(out) if out else np.empty(0)
        l = np.concatenate(labels) if labels else np.empty(0)
        return gather_predictions(p, l, self.ctx.cpu_group)
