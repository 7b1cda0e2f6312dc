"""Optimizers for embedding tables: they read the sparse gradient (one row per lookup) and
update only the rows it touches, without ever building a dense [rows, dim] gradient."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from dlrmkit.optim.split_sgd_kernel import fused_adagrad_bag_step, fused_sgd_bag_step


def sparse_parts(grad: torch.Tensor, coalesce: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices [n], gradient rows [n, dim]) of a sparse COO gradient."""
    if not grad.is_sparse:
        raise ValueError("sparse optimizers need embedding gradients made with sparse=True")
    if coalesce:
        grad = grad.coalesce()
    return grad._indices()[0], grad._values()


def take_bag_grads(p: torch.Tensor) -> list:
    """The deferred gradients (embedding.BagGrad) waiting on parameter `p`, handed over once."""
    pending = getattr(p, "bag_grads", None)
    if not pending:
        return []
    taken = list(pending)
    pending.clear()
    return taken


def take_bag_grad(p: torch.Tensor):
    """The deferred gradients waiting on `p` as one embedding.BagGrad (several, as from a weight
    looked up twice in a step, are concatenated in order), handed over once; None when there are none.
    Adagrad needs the step's whole gradient at once: it sums each row's lookups before its step."""
    taken = take_bag_grads(p)
    if len(taken) <= 1:
        return taken[0] if taken else None
    starts = [0]
    for g in taken[:-1]:
        starts.append(starts[-1] + len(g.grad))
    return type(taken[0])(
        torch.cat([g.rows for g in taken]),
        torch.cat([g.bags + s for g, s in zip(taken, starts)]),
        torch.cat([g.grad.reshape(len(g.grad), -1) for g in taken]),
    )


class TableOptimizer(Optimizer):
    """An optimizer of embedding tables: zero_grad also drops the deferred table gradients
    (FusedTable.defer_grads) of its parameters, as it drops ordinary ones."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if getattr(p, "bag_grads", None):
                    p.bag_grads.clear()


class SparseSGD(TableOptimizer):
    """Plain SGD on touched rows: w[i] -= lr * sum of the gradient rows for id i. Duplicates are
    summed without a sort or coalesce; on the CPU torch's dense += sparse kernel does this faster
    than index_add_ and uses both cores (figures: docs/BENCHMARKS.md). Tables that defer their gradients
    (FusedTable.defer_grads) are updated straight from the pooled gradient: on the CPU by the fused
    kernel, on a GPU by one index_add_ of each lookup's pooled row (atomic adds, so duplicates of a
    row add in no set order)."""

    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                for g in take_bag_grads(p):  # deferred table gradients: read by bag
                    if p.is_cuda:  # atomic adds on the GPU: no sort or coalesce of the lookups
                        p.index_add_(0, g.rows, g.grad.index_select(0, g.bags).to(p.dtype), alpha=-group["lr"])
                    elif not fused_sgd_bag_step(p, g, group["lr"]):
                        p.add_(g.to_sparse(p.shape).to(p.dtype), alpha=-group["lr"])
                if p.grad is None:
                    continue
                if not p.grad.is_sparse:
                    raise ValueError("sparse optimizers need embedding gradients made with sparse=True")
                p.add_(p.grad.to(p.dtype), alpha=-group["lr"])
        return None


class SparseAdagrad(TableOptimizer):
    """Adagrad on touched rows with an element-wise accumulator, as torch.optim.Adagrad does for
    sparse gradients: duplicates are summed first, then acc += g^2, w -= lr * g / (sqrt(acc) + eps).
    Tables that defer their gradients (FusedTable.defer_grads) are updated by the fused kernel, each
    row's lookups summed straight from the pooled gradient (split_sgd_kernel.fused_adagrad_bag_step).
    `weight_decay` adds wd * w to the gradient of the rows a batch touches (lazy L2: rare ids are
    pulled to 0 as often as they are seen, the regularization small data needs)."""

    def __init__(
        self, params, lr: float, eps: float = 1e-10, initial_accumulator_value: float = 0.0, weight_decay: float = 0.0
    ):
        super().__init__(
            params,
            {
                "lr": lr,
                "eps": eps,
                "initial_accumulator_value": initial_accumulator_value,
                "weight_decay": weight_decay,
            },
        )
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"] = torch.full_like(p, initial_accumulator_value, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                bag_grad = take_bag_grad(p)  # deferred table gradient: read by bag
                acc, lr, eps, decay = self.state[p]["sum"], group["lr"], group["eps"], group["weight_decay"]
                if bag_grad is not None and not fused_adagrad_bag_step(p, acc, bag_grad, lr, eps, decay):
                    self._sparse_step(p, group, bag_grad.to_sparse(p.shape))
                if p.grad is not None:
                    self._sparse_step(p, group, p.grad)
        return None

    def _sparse_step(self, p: torch.Tensor, group: dict, grad: torch.Tensor) -> None:
        rows, g = sparse_parts(grad, coalesce=True)
        g = g.float()
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p.index_select(0, rows).float()
        acc = self.state[p]["sum"]
        acc.index_add_(0, rows, g * g)
        update = g / acc.index_select(0, rows).sqrt_().add_(group["eps"])
        p.index_add_(0, rows, update.to(p.dtype), alpha=-group["lr"])
