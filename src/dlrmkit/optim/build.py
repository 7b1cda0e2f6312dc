"""Which optimizer trains which part of the DLRM, from `--optimizer` (dense part: MLPs) and
`--embedding-optimizer` (sparse row updates of the tables), checked against `--precision`."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from dlrmkit.errors import DlrmkitError
from dlrmkit.optim.lamb import Lamb
from dlrmkit.optim.names import ADAM_FAMILY, EMBEDDING_OPTIMIZERS, OPTIMIZERS, resolve_embedding_optimizer
from dlrmkit.optim.rowwise_adagrad import RowWiseAdagrad
from dlrmkit.optim.sparse import SparseAdagrad, SparseSGD
from dlrmkit.optim.split_sgd import SplitSGD
from dlrmkit.optim.table_adam import TableAdam


def check_choice(optimizer: str, embedding_optimizer: str | None, precision: str = "fp32") -> None:
    """One-line errors for unknown or incompatible optimizer/precision choices."""
    if optimizer not in OPTIMIZERS:
        raise DlrmkitError(f"unknown optimizer '{optimizer}' (choose {', '.join(OPTIMIZERS)})")
    if embedding_optimizer is not None and embedding_optimizer not in EMBEDDING_OPTIMIZERS:
        raise DlrmkitError(
            f"unknown embedding optimizer '{embedding_optimizer}' (choose {', '.join(EMBEDDING_OPTIMIZERS)})"
        )
    if optimizer == "split-sgd":
        if precision != "bf16":
            raise DlrmkitError("--optimizer split-sgd keeps bf16 weights: it needs --precision bf16")
        if resolve_embedding_optimizer(optimizer, embedding_optimizer) != "sgd":
            raise DlrmkitError("--optimizer split-sgd updates the tables with split SGD: use --embedding-optimizer sgd")


def defer_table_grads(embeddings: torch.nn.Module, on_gpu: bool = False) -> None:
    """Split-SGD, SparseSGD and the Adagrads read the gradients of CPU tables by bag when the fused
    kernel is available (no per-lookup gradient copy, docs/BENCHMARKS.md). With `on_gpu` (SparseSGD),
    GPU tables too: SparseSGD adds their lookups to the rows with one index_add_, with no sort or
    coalesce. Replicated tables keep ordinary gradients: the data-parallel all-reduce needs them."""
    from dlrmkit.model.embedding import FusedTable
    from dlrmkit.optim.split_sgd_kernel import fused_kernel

    replicated = {id(p) for p in getattr(embeddings, "replicated_parameters", lambda: [])()}
    for table in embeddings.modules():
        if not isinstance(table, FusedTable) or id(table.weight) in replicated:
            continue
        if on_gpu and table.weight.is_cuda:
            table.defer_grads()
        elif table.weight.device.type == "cpu" and fused_kernel() is not None:
            table.defer_grads()


def build_optimizers(
    model: torch.nn.Module,
    optimizer: str,
    lr: float,
    embedding_optimizer: str | None = None,
    precision: str = "fp32",
    lamb_lr: float | None = None,
    embedding_weight_decay: float = 0.0,
    dense_lr: float | None = None,
    dense_weight_decay: float = 0.0,
) -> list[Optimizer]:
    """[dense optimizer, sparse embedding optimizer] for a DLRM (anything with
    `dense_parameters()` and `embeddings`). split-SGD turns the model's weights into bf16 halves.
    `lamb_lr`: LAMB's own peak LR (default `lr`); the schedule scales both together.
    `embedding_weight_decay`: L2 on the tables: lazy, on the touched rows (Adagrad), or on every
    row (Adam).
    `dense_lr`: Adam/AdamW's own peak LR (default 0.001), scaled by the schedule with `lr`;
    `dense_weight_decay`: AdamW's decoupled weight decay (Adam: an L2 term in the gradient)."""
    if embedding_weight_decay and resolve_embedding_optimizer(optimizer, embedding_optimizer) not in ("adagrad", "adam"):
        raise DlrmkitError("--embedding-weight-decay needs --embedding-optimizer adagrad or adam")
    check_choice(optimizer, embedding_optimizer, precision)
    dense = model.dense_parameters()
    # a rank that owns no table (more ranks than tables, table_wise) keeps an empty sparse optimizer:
    # every rank then has the same optimizers, as a checkpoint's manifest records them
    sparse: list = list(model.embeddings.parameters()) or [{"params": []}]
    if optimizer == "split-sgd":
        opts = [SplitSGD(dense, lr=lr), SplitSGD(sparse, lr=lr)]
        defer_table_grads(model.embeddings)
        return opts
    if optimizer == "sgd":
        dense_opt: Optimizer = torch.optim.SGD(dense, lr=lr)
    elif optimizer == "adagrad":
        dense_opt = dense_adagrad(dense, lr)
    elif optimizer in ADAM_FAMILY:
        dense_opt = ScaledAdam(
            dense,
            lr=lr,
            lr_scale=(dense_lr / lr) if dense_lr is not None and lr else 1.0,
            weight_decay=dense_weight_decay,
            decoupled=optimizer == "adamw",
        )
    else:
        scale = (lamb_lr / lr) if lamb_lr is not None and lr else 1.0
        dense_opt = Lamb(dense, lr=lr, lr_scale=scale)
    emb = resolve_embedding_optimizer(optimizer, embedding_optimizer)
    if emb == "sgd":
        sparse_opt: Optimizer = SparseSGD(sparse, lr=lr)
        defer_table_grads(model.embeddings, on_gpu=True)
    elif emb == "adam":
        sparse_opt = TableAdam(sparse, lr=lr, weight_decay=embedding_weight_decay)
    elif emb == "adagrad":
        sparse_opt = SparseAdagrad(sparse, lr=lr, eps=1e-10, weight_decay=embedding_weight_decay)
        defer_table_grads(model.embeddings)
    else:
        sparse_opt = RowWiseAdagrad(sparse, lr=lr, eps=1e-10)
        defer_table_grads(model.embeddings)
    return [dense_opt, sparse_opt]


def dense_adagrad(params: list, lr: float) -> Optimizer:
    """torch's Adagrad for the MLPs, as one fused kernel per parameter when they all live on the CPU
    (torch's fused CPU Adagrad: several times faster than its per-op loop, docs/BENCHMARKS.md). The
    choice is this process's: a checkpoint's saved flag is put back after loading (a CPU run's
    state may resume on a GPU, where torch has no fused Adagrad)."""
    fused = on_cpu(params)
    opt = torch.optim.Adagrad(params, lr=lr, eps=1e-10, fused=fused or None)
    opt.register_load_state_dict_post_hook(keep_fused(fused))
    return opt


def on_cpu(params: list) -> bool:
    """Whether torch's fused CPU kernels can step `params`: every one a CPU float32 or bfloat16 tensor."""
    return bool(params) and all(p.device.type == "cpu" and p.dtype in (torch.float32, torch.bfloat16) for p in params)


def keep_fused(fused: bool):
    """A load_state_dict post-hook that puts this process's fused flag back over the checkpoint's
    (a CPU run's state may resume on a GPU, and the other way round)."""

    def hook(optimizer: Optimizer) -> None:
        for group in optimizer.param_groups:
            group["fused"] = fused or None

    return hook


class ScaledAdam(torch.optim.AdamW):
    """Adam (L2 in the gradient) or AdamW (decoupled decay) whose step uses `lr * lr_scale`: the
    LR schedule sets one `lr` for every optimizer (the tables' Adagrad rate), and `lr_scale` keeps
    Adam's own rate in proportion, as LAMB's does."""

    def __init__(self, params, lr: float, lr_scale: float, weight_decay: float = 0.0, decoupled: bool = True):
        params = list(params)
        fused = on_cpu(params)  # torch's fused CPU Adam: one kernel per parameter (docs/BENCHMARKS.md)
        super().__init__(params, lr=lr, weight_decay=weight_decay if decoupled else 0.0, fused=fused or None)
        for group in self.param_groups:
            group["lr_scale"], group["l2"] = lr_scale, 0.0 if decoupled else weight_decay
        self.register_load_state_dict_post_hook(keep_fused(fused))

    @torch.no_grad()
    def step(self, closure=None):
        saved = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] = group["lr"] * group["lr_scale"]
            if group["l2"]:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.add_(p, alpha=group["l2"])
        try:
            return super().step(closure)
        finally:
            for group, lr in zip(self.param_groups, saved):
                group["lr"] = lr
