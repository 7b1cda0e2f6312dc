"""`--embedding-optimizer adam`: Adam over whole tables, every row at every step, with L2 in the
gradient (`--embedding-weight-decay`: wd * w added to every row's gradient, rows a batch does
not touch included). It is how CTR libraries train the tables of small click logs (FuxiCTR: Adam
with its embedding regularizer), and what the factorization-machine candidate of `--preset auto`
uses (docs/RECIPES.md). Memory: two moments per weight; each step costs a pass over every table,
so it is for tables of up to a few million rows (the sparse optimizers' cost follows the batch)."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from dlrmkit.optim.sparse import sparse_parts


class TableAdam(Optimizer):
    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        for group in self.param_groups:
            for p in group["params"]:  # allocated up front: a checkpoint saves them by table row
                self.state[p]["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                self.state[p]["step"] = 0.0

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                g = torch.zeros_like(p, dtype=torch.float32)
                if p.grad is not None:
                    if p.grad.is_sparse:
                        rows, values = sparse_parts(p.grad, coalesce=False)  # index_add_ sums repeats
                        g.index_add_(0, rows, values.float())
                    else:
                        g.add_(p.grad.float())
                if group["weight_decay"]:
                    g.add_(p.float(), alpha=group["weight_decay"])
                st["step"] = float(st["step"]) + 1.0
                t = st["step"]
                st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (st["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(group["eps"])
                p.addcdiv_(st["exp_avg"].to(p.dtype), denom.to(p.dtype), value=-group["lr"] / (1 - b1**t))
        return None
