"""Hybrid parallelism applied from outside a single-device DLRM: swap `model.embeddings` for a
ShardedEmbedding, then each step sums dense gradients (MLPs and replicated tables) over ranks
in buckets. The loss is the global batch's mean: each rank back-propagates sum(local BCE) / G,
so summed gradients equal the single-process ones even when G is not divisible by N."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dlrmkit.model.dlrm import DLRM
from dlrmkit.parallel import comm
from dlrmkit.parallel.dist import DistContext
from dlrmkit.parallel.plan import ShardingPlan, make_plan
from dlrmkit.parallel.sharded_embedding import ShardedEmbedding


@dataclass
class ParallelConfig:
    sharding: str = "auto"  # auto | data_parallel | table_wise | column_wise | row_wise
    plan_path: str | None = None
    loader: str = "exchange"  # exchange | own-features | broadcast
    comm_dtype: torch.dtype | None = None
    bucket_bytes: int = 25 << 20
    min_rows_sharded: int = 2048


def build_plan(model: DLRM, ctx: DistContext, pcfg: ParallelConfig, batch_size: int) -> ShardingPlan:
    cfg = model.cfg
    if pcfg.plan_path:
        plan = ShardingPlan.load(pcfg.plan_path)
        plan.check_matches(cfg.table_sizes, cfg.embedding_dim, ctx.world_size, pcfg.plan_path)
        return plan
    return make_plan(cfg.table_sizes, cfg.embedding_dim, ctx.world_size, pcfg.sharding, batch_size=batch_size,
                     min_rows_sharded=pcfg.min_rows_sharded)


class HybridParallel:
    """Owns the sharded embeddings of `model` (replaced in place) and the gradient reduction."""

    def __init__(self, model: DLRM, plan: ShardingPlan, ctx: DistContext, pcfg: ParallelConfig | None = None):
        self.model, self.plan, self.ctx = model, plan, ctx
        self.pcfg = pcfg or ParallelConfig()
        sharded = ShardedEmbedding(plan, ctx.rank, self.pcfg.comm_dtype)
        sharded.load_from(model.embeddings)
        model.embeddings = sharded
        self.sharded = sharded

    def loss_backward(self, logits: torch.Tensor, labels: torch.Tensor, global_batch: int) -> torch.Tensor:
        """Back-propagates this rank's share of the global mean loss, sums dense gradients over
        ranks, and returns the global mean loss (the same value on every rank)."""
        loss_sum = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        (loss_sum / global_batch).backward()
        self.reduce_gradients(extra=[loss_sum.detach().reshape(1)])
        return self._last_loss / global_batch

    def reduce_gradients(self, extra: list[torch.Tensor] | None = None) -> None:
        dense = [p for p in self.model.dense_parameters() if p.grad is not None]
        grads = [p.grad for p in dense]
        reps = [p for p in self.sharded.replicated_parameters()]
        rep_grads = [p.grad.to_dense() if p.grad is not None and p.grad.is_sparse else
                     (p.grad if p.grad is not None else torch.zeros_like(p)) for p in reps]
        extra = extra or []
        comm.all_reduce_sum(grads + rep_grads + extra, self.pcfg.bucket_bytes, self.pcfg.comm_dtype)
        for p, g in zip(reps, rep_grads):
            p.grad = g.to_sparse(1)  # rows nobody touched drop out: the sparse optimizers skip them
        self._last_loss = float(extra[0]) if extra else float("nan")


def gather_predictions(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ranks' predictions and labels (for AUC over the whole test set), on every rank."""
    parts = comm.all_gather_objects((probs, labels))
    return np.concatenate([p for p, _ in parts]), np.concatenate([l for _, l in parts])


def setup_parallel(model: DLRM, cfg) -> tuple[DistContext, "TrainerParallel | None", ShardingPlan | None]:
    """For the trainer: under torchrun, a process group, a plan and the sharded model;
    otherwise (DistContext(), None, None) and training stays single-process."""
    from dlrmkit.parallel.dist import init_distributed, launched_by_torchrun

    if not launched_by_torchrun():
        return DistContext(), None, None
    ctx = init_distributed(getattr(cfg, "backend", None), float(getattr(cfg, "collective_timeout", 0) or 1800.0))
    pcfg = ParallelConfig(sharding=getattr(cfg, "sharding", "auto") or "auto", plan_path=getattr(cfg, "plan", None),
                          loader=getattr(cfg, "loader", "exchange") or "exchange")
    plan = build_plan(model, ctx, pcfg, cfg.batch_size)
    return ctx, TrainerParallel(model, plan, ctx, pcfg), plan


class TrainerParallel(HybridParallel):
    """The trainer's hooks: loader, step and evaluation under hybrid parallelism."""

    def loader(self, dataset, cfg):
        from dlrmkit.parallel.loader import DistBatchLoader

        return DistBatchLoader(dataset, cfg.batch_size, self.ctx.rank, self.ctx.world_size, self.sharded.id_tables,
                               self.pcfg.loader, shuffle=cfg.shuffle, seed=cfg.seed)

    @staticmethod
    def global_size(batch) -> int:
        return sum(batch.ids.batch_sizes)

    def train_step(self, trainer, batch) -> torch.Tensor:
        from dlrmkit.precision import autocast

        trainer.schedule.apply(trainer.optimizers, trainer.step)
        for opt in trainer.optimizers:
            opt.zero_grad(set_to_none=True)
        with autocast(trainer.cfg.precision):
            logits = self.model(batch.dense, batch.ids)
        loss = torch.tensor(self.loss_backward(logits.float(), batch.labels, self.global_size(batch)))
        if trainer.loss_is_finite(loss):
            for opt in trainer.optimizers:
                opt.step()
        trainer.step += 1
        return loss

    @torch.no_grad()
    def evaluate(self, dataset, batch_size: int) -> dict[str, float]:
        """AUC and log loss over the whole test set: each rank predicts its slice of every
        batch, then all ranks gather all predictions."""
        from dlrmkit.parallel.loader import DistBatchLoader
        from dlrmkit.train.metrics import log_loss, roc_auc

        was = self.model.training
        self.model.eval()
        probs, labels = [], []
        for batch in DistBatchLoader(dataset, batch_size, self.ctx.rank, self.ctx.world_size, self.sharded.id_tables,
                                     self.pcfg.loader).epoch(0):
            probs.append(torch.sigmoid(self.model(batch.dense, batch.ids).float()).numpy())
            labels.append(batch.labels.numpy())
        self.model.train(was)
        p = np.concatenate(probs) if probs else np.empty(0)
        l = np.concatenate(labels) if labels else np.empty(0)
        p, l = gather_predictions(p, l)
        return {"auc": roc_auc(l, p), "logloss": log_loss(l, p)}
