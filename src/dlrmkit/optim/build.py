"""Which optimizer trains which part of the DLRM, from `--optimizer` (dense part: MLPs) and
`--embedding-optimizer` (sparse row updates of the tables), checked against `--precision`."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from dlrmkit.errors import DlrmkitError
from dlrmkit.optim.lamb import Lamb
from dlrmkit.optim.names import EMBEDDING_OPTIMIZERS, OPTIMIZERS, resolve_embedding_optimizer
from dlrmkit.optim.rowwise_adagrad import RowWiseAdagrad
from dlrmkit.optim.sparse import SparseAdagrad, SparseSGD
from dlrmkit.optim.split_sgd import SplitSGD


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


def defer_table_grads(embeddings: torch.nn.Module) -> None:
    """Split-SGD and SparseSGD read table gradients by bag when the fused kernel is available (no
    per-lookup gradient copy, docs/BENCHMARKS.md). Replicated tables keep ordinary gradients:
    the data-parallel all-reduce needs them."""
    from dlrmkit.model.embedding import FusedTable
    from dlrmkit.optim.split_sgd_kernel import fused_kernel

    if fused_kernel() is None:
        return
    replicated = {id(p) for p in getattr(embeddings, "replicated_parameters", lambda: [])()}
    for table in embeddings.modules():
        if isinstance(table, FusedTable) and id(table.weight) not in replicated and table.weight.device.type == "cpu":
            table.defer_grads()


def build_optimizers(
    model: torch.nn.Module,
    optimizer: str,
    lr: float,
    embedding_optimizer: str | None = None,
    precision: str = "fp32",
    lamb_lr: float | None = None,
    embedding_weight_decay: float = 0.0,
) -> list[Optimizer]:
    """[dense optimizer, sparse embedding optimizer] for a DLRM (anything with
    `dense_parameters()` and `embeddings`). split-SGD turns the model's weights into bf16 halves.
    `lamb_lr`: LAMB's own peak LR (default `lr`); the schedule scales both together.
    `embedding_weight_decay`: lazy L2 on the touched table rows (Adagrad tables only)."""
    if embedding_weight_decay and resolve_embedding_optimizer(optimizer, embedding_optimizer) != "adagrad":
        raise DlrmkitError("--embedding-weight-decay needs --embedding-optimizer adagrad")
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
        dense_opt = torch.optim.Adagrad(dense, lr=lr, eps=1e-10)
    else:
        scale = (lamb_lr / lr) if lamb_lr is not None and lr else 1.0
        dense_opt = Lamb(dense, lr=lr, lr_scale=scale)
    emb = resolve_embedding_optimizer(optimizer, embedding_optimizer)
    if emb == "sgd":
        sparse_opt: Optimizer = SparseSGD(sparse, lr=lr)
        defer_table_grads(model.embeddings)
    elif emb == "adagrad":
        sparse_opt = SparseAdagrad(sparse, lr=lr, eps=1e-10, weight_decay=embedding_weight_decay)
    else:
        sparse_opt = RowWiseAdagrad(sparse, lr=lr, eps=1e-10)
    return [dense_opt, sparse_opt]
