"""Row-wise Adagrad for embedding tables (FBGEMM's EXACT_ROWWISE_ADAGRAD, MLPerf DLRM v2): one
fp32 accumulator per row instead of one per element, so the optimizer state costs 4 bytes per
row rather than 4 bytes per weight. Only the rows a batch touches are read and written. Tables that
defer their gradients (FusedTable.defer_grads) are updated by the fused kernel, each row's lookups
summed straight from the pooled gradient (split_sgd_kernel.fused_adagrad_bag_step)."""

from __future__ import annotations

import torch

from dlrmkit.optim.sparse import TableOptimizer, sparse_parts, take_bag_grad
from dlrmkit.optim.split_sgd_kernel import fused_adagrad_bag_step


class RowWiseAdagrad(TableOptimizer):
    """Per touched row i (duplicate lookups summed first, in fp32):
    acc[i] += mean(g_i^2);  w[i] -= lr * g_i / (sqrt(acc[i]) + eps)."""

    def __init__(self, params, lr: float, eps: float = 1e-10, initial_accumulator_value: float = 0.0):
        super().__init__(params, {"lr": lr, "eps": eps, "initial_accumulator_value": initial_accumulator_value})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError("row-wise Adagrad needs 2-D [rows, dim] embedding weights")
                self.state[p]["sum"] = torch.full(
                    (p.shape[0],), initial_accumulator_value, dtype=torch.float32, device=p.device
                )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                bag_grad = take_bag_grad(p)  # deferred table gradient: read by bag
                acc, lr, eps = self.state[p]["sum"], group["lr"], group["eps"]
                if bag_grad is not None and not fused_adagrad_bag_step(p, acc, bag_grad, lr, eps):
                    self._sparse_step(p, group, bag_grad.to_sparse(p.shape))
                if p.grad is not None:
                    self._sparse_step(p, group, p.grad)
        return None

    def _sparse_step(self, p: torch.Tensor, group: dict, grad: torch.Tensor) -> None:
        rows, values = sparse_parts(grad, coalesce=False)
        if rows.numel() == 0:
            return
        uniq, inverse = torch.unique(rows, sorted=True, return_inverse=True)
        g = torch.zeros(len(uniq), values.shape[1], dtype=torch.float32, device=values.device)
        g.index_add_(0, inverse, values.float())
        acc = self.state[p]["sum"]
        acc.index_add_(0, uniq, g.square().mean(1))
        scale = acc.index_select(0, uniq).sqrt_().add_(group["eps"]).reciprocal_()
        p.index_add_(0, uniq, (g * scale.unsqueeze(1)).to(p.dtype), alpha=-group["lr"])
