"""Hybrid parallelism applied from outside a single-device DLRM: swap `model.embeddings` for a
ShardedEmbedding, then each step sums dense gradients (MLPs and replicated tables) over ranks
in buckets. The loss is the global batch's mean: each rank back-propagates sum(local BCE) / G,
so summed gradients equal the single-process ones even when G is not divisible by N.
On GPUs (DistContext.device 'cuda', NCCL) the model moves there after the swap; dense features
and labels follow each batch, ids stay on the CPU for the id exchange (ShardedEmbedding)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import record_function

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.dlrm import DLRM
from dlrmkit.parallel import comm
from dlrmkit.parallel.dist import DistContext
from dlrmkit.parallel.grad_buckets import GradBuckets, nonzero_rows
from dlrmkit.parallel.options import ParallelOptions, torchrun_env
from dlrmkit.parallel.plan import ShardingPlan, host_replica_budget, make_plan
from dlrmkit.parallel.replica_grads import ReplicaExchange, lookup_counts, take_local
from dlrmkit.parallel.plan_cost import DENSE_REPLICA_ROWS
from dlrmkit.parallel.sharded_embedding import ShardedEmbedding


@dataclass
class ParallelConfig:
    sharding: str = "auto"  # auto | data_parallel | table_wise | column_wise | row_wise
    plan_path: str | None = None
    loader: str = "exchange"  # exchange | own-features | broadcast
    comm_dtype: torch.dtype | None = None
    bucket_bytes: int = 25 << 20
    # the first bucket (the top layers, whose gradients come first) closes at 1 MiB so its
    # all-reduce starts while the rest of backward runs, as DDP's first bucket does. Not for two
    # gloo ranks (comm.pairwise, one exchange per sum): with a core each, an early bucket only
    # added a collective (0.7 ms a step at criteo-kaggle's batch 128, nothing gained at `small`'s
    # 2048: docs/BENCHMARKS.md)
    first_bucket_bytes: int = 1 << 20
    min_rows_sharded: int = 2048
    # overlap communication with compute: pooled all-to-all started before the model and backward's
    # as soon as its gradient is known, dense gradients all-reduced in buckets during backward,
    # tables stepped while that travels (docs/BENCHMARKS.md); False: every collective blocks
    overlap: bool = True
    # replicated weights with more rows exchange their lookups' rows, not a dense gradient
    dense_replica_rows: int = DENSE_REPLICA_ROWS
    # ranks on one host sum dense gradients through shared memory (parallel/shared_slots.py);
    # gloo still runs a small collective per sum. False: every byte through gloo's TCP
    shared_memory: bool = True
    ids_ahead: bool = True  # with overlap: exchange the next batch's ids during this step (gloo; parallel/ids_ahead.py)


def build_plan(
    model: DLRM, ctx: DistContext, pcfg: ParallelConfig, batch_size: int, optimizer_state: float = 0
) -> ShardingPlan:
    cfg = model.cfg
    if pcfg.plan_path:
        plan = ShardingPlan.load(pcfg.plan_path)
        plan.check_matches(cfg.table_sizes, cfg.table_dim, ctx.world_size, pcfg.plan_path)
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
    )
    check_same_plan(plan, ctx)
    return plan


def check_same_plan(plan: ShardingPlan, ctx: DistContext) -> None:
    """Every rank plans alone (hosts may differ in memory): one line, not a hang, if they disagree."""
    if ctx.world_size < 2 or not dist.is_initialized():
        return
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    digests = comm.all_gather_objects(digest, ctx.cpu_group)
    if len(set(digests)) > 1:
        raise DlrmkitError(
            "the ranks made different sharding plans (their hosts differ in memory or devices): "
            "write one with `dlrmkit plan --json FILE` and give every rank --plan FILE"
        )


class HybridParallel:
    """Owns the sharded embeddings of `model` (replaced in place) and the gradient reduction.
    With `seed`, the model is initialized after the swap (model.reset_parameters(seed)): each
    rank generates only its shards, with the values single-process init gives them; without
    it, shards are copied out of the model's (already initialized) tables."""

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
        sharded = ShardedEmbedding(plan, ctx.rank, self.pcfg.comm_dtype, self.pcfg.dense_replica_rows)
        sharded.cpu_group = ctx.cpu_group
        if seed is None and not any(p.is_meta for p in model.embeddings.parameters()):
            sharded.load_from(model.embeddings)
        model.embeddings = sharded
        if seed is not None:
            model.reset_parameters(seed)
        model.to(ctx.device)  # before GradBuckets' hooks and the optimizers: parameters keep identity
        self.sharded = sharded
        self.stats = sharded.stats
        self.buckets = None
        self.ahead = None
        self.replica_waits: list = []  # replica_grads.ReplicaExchange.alone's waits of this step
        self.steps_taken = 0  # steps this process took (not those before a resume)
        self._early: tuple = (None, [])  # (optimizer and replica ids, the optimizers that step early)
        # False: the loss check can only raise, not skip a step, so tables step before it is known
        self.gate_early = True
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
        if on and self.buckets is None and self.ctx.world_size > 1:
            self.buckets = GradBuckets(
                self.model.dense_parameters(),
                self.pcfg.bucket_bytes,
                self.pcfg.comm_dtype,
                self.stats,
                None if comm.pairwise() else self.pcfg.first_bucket_bytes,
                shared=self.pcfg.shared_memory and self.ctx.device.type == "cpu",
            )
        if self.buckets is not None:
            self.buckets.enabled = on
        self.sharded.overlap = on
        # two gloo ranks: backward's pooled all-to-all rides in the dense gradients' exchange (one
        # collective fewer; what it could overlap shares the rank's core anyway)
        rides = self.buckets is not None and comm.pairwise() and self.pcfg.comm_dtype is None
        self.sharded.rider_sink = self.buckets if rides else None

    def to_device(self, batch):
        """`batch` with dense features and labels on this rank's device (ids stay for the exchange)."""
        if self.ctx.device.type == "cpu":
            return batch
        return replace(
            batch,
            dense=batch.dense.to(self.ctx.device, non_blocking=True),
            labels=batch.labels.to(self.ctx.device, non_blocking=True),
        )

    def start_lookups(self, batch) -> None:
        """Starts `batch`'s lookups and pooled all-to-all when overlapping (forward then waits)."""
        if self.overlapping:
            self.sharded.start(batch.ids)

    @staticmethod
    def global_size(batch) -> int:
        """Samples in the global batch (every rank's local batch size travels with the ids)."""
        return sum(batch.ids.batch_sizes)

    # ---- the step's hooks: the methods of dlrmkit.train.step.StepHooks (duck-typed: parallel
    # sits below train and imports nothing from it) -----------------------------------------
    def before_forward(self, batch) -> None:
        """Starts the lookups and their all-to-all: they travel while the bottom MLP runs."""
        self.forward_start = time.perf_counter()
        self.start_lookups(batch)

    def loss(self, logits: torch.Tensor, batch) -> torch.Tensor:
        """This rank's share of the global batch's mean loss: sum(local BCE) / global batch."""
        self.stats.add("forward", 0, time.perf_counter() - self.forward_start)
        self.loss_sum = F.binary_cross_entropy_with_logits(logits.float(), batch.labels, reduction="sum")
        self.global_batch = self.global_size(batch)
        return self.loss_sum / self.global_batch

    def backward_and_update(self, loss: torch.Tensor, optimizers: list, loss_ok=None) -> torch.Tensor:
        """Backward, gradients summed over ranks, updates; the global mean loss as a tensor."""
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        return self.backward_step(self.loss_sum, self.global_batch, optimizers, loss_ok, self.gate_early)

    # ---- backward and the gradient reduction --------------------------------------------
    def loss_backward(self, logits: torch.Tensor, labels: torch.Tensor, global_batch: int) -> float:
        """Back-propagates this rank's share of the global mean loss, sums dense gradients over
        ranks, and returns the global mean loss (the same value on every rank)."""
        loss_sum = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        return float(self.backward_step(loss_sum, global_batch, []))

    def backward_step(
        self, loss_sum: torch.Tensor, global_batch: int, optimizers: list, loss_ok=None, gate_early: bool = True
    ) -> torch.Tensor:
        """Backward of `loss_sum / global_batch`, then the optimizers' steps (all of them or none:
        `loss_ok(global mean loss)` decides, e.g. on a non-finite loss). Optimizers whose
        parameters take no all-reduce (the model-parallel tables') step while the dense
        gradients' all-reduce is still in flight; the others after it. Overlapped, the loss sum
        and the replicated tables' gradients travel in the dense gradients' last all-reduce; with
        `gate_early` False (loss_ok can only raise, not skip) the tables step before the loss is
        known, so they keep overlapping that all-reduce (on a non-finite local loss a rank leaves
        its tables alone). Returns the global mean loss, a tensor (the same on every rank)."""
        total = loss_sum.detach().reshape(1).clone()
        overlapped = self.buckets is not None and self.buckets.enabled
        # blocking mode: the loss sum travels during backward (no collective to wait for after it)
        work = dist.all_reduce(total, async_op=True) if self.ctx.world_size > 1 and not overlapped else None
        t0 = time.perf_counter()
        (loss_sum / global_batch).backward()
        self.stats.add("backward", 0, time.perf_counter() - t0)
        reps, rep_grads = self.replicated_grads()
        exchanges = self.replica_exchanges()
        if overlapped and comm.pairwise() and self.pcfg.comm_dtype is None:
            self.buckets.riders.extend(exchanges)  # their lookups ride in the dense gradients' exchange
        else:
            self.replica_waits = [x.alone() for x in exchanges]
        rep_rest = None
        riding = overlapped and bool(self.buckets.riders)  # tables' gradients arrive with the dense ones
        if overlapped:
            rest = self.buckets.launch_pending([total] + rep_grads)
            if any(t is total for t in rest):  # a wire dtype would round the loss: its own collective
                work = dist.all_reduce(total, async_op=True)
            rep_rest = [t for t in rest if t is not total]
        early = self.early_optimizers(optimizers, reps + [x.p for x in exchanges]) if self.overlapping else []
        gated = gate_early and loss_ok is not None
        finished = overlapped and ((gated and work is None) or riding)
        if finished:
            self.buckets.finish()  # the loss decides before any update; riding, the tables need it
        if work is not None:
            with record_function("allreduce wait (loss)"):
                work.wait()
        known = work is not None or finished or self.ctx.world_size == 1
        go = loss_ok is None or not known or loss_ok(total[0] / global_batch)
        t0 = time.perf_counter()
        for opt in early if go and (known or bool(torch.isfinite(loss_sum))) else []:
            opt.step()
        self.stats.add("optimizer", 0, time.perf_counter() - t0)
        self.reduce_gradients((reps, rep_grads, rep_rest, finished))
        loss = total[0] / global_batch
        if not known and loss_ok is not None:
            go = loss_ok(loss)
        t0 = time.perf_counter()
        for opt in optimizers if go else []:
            if not any(opt is o for o in early):
                opt.step()
        self.stats.add("optimizer", 0, time.perf_counter() - t0)
        return loss

    def early_optimizers(self, optimizers: list, reps: list) -> list:
        """The optimizers whose parameters take no sum over ranks (the model-parallel tables'):
        they may step before the dense gradients' sum lands. Kept per optimizer list, not found
        by walking every module's parameters each step (small steps feel Python's overhead)."""
        key = (tuple(map(id, optimizers)), tuple(map(id, reps)))
        if self._early[0] != key:
            reduced = {id(p) for p in self.model.dense_parameters()} | {id(p) for p in reps}
            early = [o for o in optimizers if not any(id(p) in reduced for g in o.param_groups for p in g["params"])]
            self._early = (key, early)
        return self._early[1]

    def replica_exchanges(self) -> list[ReplicaExchange]:
        """The large replicated weights' gradient exchanges of this step (their lookups packed;
        launched by the caller: riding, or alone)."""
        pairs = self.sharded.exchanged_replicas()
        if not pairs or self.ctx.world_size == 1:
            return []
        sizes, one_hot = self.sharded.batch_sizes, self.sharded.one_hot
        out = []
        for p, tables in pairs:
            local = take_local(p)
            counts = lookup_counts(sizes, tables, one_hot, len(local[0]), self.ctx.cpu_group)
            unit = (
                self.buckets.buckets[-1][0].dtype if self.buckets is not None and self.buckets.buckets[-1] else p.dtype
            )
            out.append(ReplicaExchange(p, local, counts, self.ctx.rank, unit, self.stats))
        return out

    def replicated_grads(self) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
        """The replicated tables and their gradients as dense tensors (summed over ranks in place)."""
        reps = self.sharded.replicated_parameters()
        return reps, [
            p.grad.to_dense()
            if p.grad is not None and p.grad.is_sparse
            else (p.grad if p.grad is not None else torch.zeros_like(p))
            for p in reps
        ]

    def reduce_gradients(self, taken: tuple | None = None) -> None:
        """Sums dense and replicated gradients over ranks. `taken`: backward_step's (replicated
        tables, their dense gradients, those of them not launched with the buckets (None: all,
        blocking mode), whether the buckets are already finished)."""
        t0 = time.perf_counter()
        reps, rep_grads, rest, finished = taken if taken is not None else (*self.replicated_grads(), None, False)
        if self.buckets is not None and self.buckets.enabled:
            if not finished:
                self.buckets.finish()
            grads = []
        else:
            grads = [p.grad for p in self.model.dense_parameters() if p.grad is not None]
        comm.all_reduce_sum(
            grads + (rep_grads if rest is None else rest), self.pcfg.bucket_bytes, self.pcfg.comm_dtype, self.stats
        )
        waits, self.replica_waits = self.replica_waits, []
        for wait in waits:  # the large replicated weights' lookups, when they took a collective of their own
            wait()
        for p, g in zip(reps, rep_grads):
            p.grad = nonzero_rows(g)  # rows nobody touched drop out: the sparse optimizers skip them
        self.stats.add("reduce_total", 0, time.perf_counter() - t0)


def gather_predictions(probs: np.ndarray, labels: np.ndarray, group=None) -> tuple[np.ndarray, np.ndarray]:
    """All ranks' predictions and labels (for AUC over the whole test set), on every rank."""
    parts = comm.all_gather_objects((probs, labels), group)
    return np.concatenate([p for p, _ in parts]), np.concatenate([l for _, l in parts])


def setup_parallel(
    model: DLRM, opts: ParallelOptions, device: str, batch_size: int, seed: int | None, optimizer_state: float = 0.0
) -> tuple[DistContext, "TrainerParallel | None", ShardingPlan | None]:
    """For the trainer: under torchrun, a process group, a plan and the sharded model;
    otherwise (DistContext(), None, None) and training stays single-process. `opts`: the parallel
    section of the train options; `device`: --device; `optimizer_state`: values the tables'
    optimizer keeps per weight, counted in the plan's memory (0: evaluation)."""
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
    plan = build_plan(model, ctx, pcfg, batch_size, optimizer_state)
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
        ranks = comm.all_gather_objects((tables, state, planned), self.ctx.cpu_group)
        return {
            "rank_table_bytes": [t for t, _, _ in ranks],
            "rank_state_bytes": [s for _, s, _ in ranks],
            "rank_planned_bytes": [p for _, _, p in ranks],
        }

    @torch.no_grad()
    def evaluate(self, dataset, batch_size: int) -> dict[str, float]:
        """AUC and log loss over the whole test set: each rank predicts its slice of every
        batch, then all ranks gather all predictions."""
        from dlrmkit.parallel.loader import DistBatchLoader
        from dlrmkit.metrics import log_loss, roc_auc

        was = self.model.training
        self.model.eval()
        probs, labels = [], []
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
            probs.append(torch.sigmoid(self.model(dense, batch.ids).float()).cpu().numpy())
            labels.append(batch.labels.numpy())
        self.model.train(was)
        p = np.concatenate(probs) if probs else np.empty(0)
        l = np.concatenate(labels) if labels else np.empty(0)
        p, l = gather_predictions(p, l, self.ctx.cpu_group)
        return {"auc": roc_auc(l, p), "logloss": log_loss(l, p)}
