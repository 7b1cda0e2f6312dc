"""LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") for the dense part of
the DLRM: Adam's moments with a per-tensor trust ratio ||w|| / ||update||, which keeps each
layer's step proportional to its weight norm, so the global batch can grow to 64K-256K samples
(Intel's MLPerf DLRM on Xeon, AUC 0.8025 at 256K). State (moments) is always fp32, whatever the
parameters' dtype; bf16 parameters are updated in fp32 and rounded back."""

from __future__ import annotations

import math

import torch
from torch.optim import Optimizer


class Lamb(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        lr_scale: float = 1.0,
    ):
        """`lr_scale` multiplies whatever `lr` the LR schedule sets, so one schedule can drive the
        embeddings' SGD (lr ~ 1-30) and LAMB (lr ~ 0.01) together."""
        if lr < 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"bad LAMB hyper-parameters lr={lr} betas={betas} eps={eps}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "lr_scale": lr_scale,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr = group["lr"] * group["lr_scale"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("LAMB is for dense parameters; use a sparse optimizer for embeddings")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = float(state["step"])
                g = p.grad.float()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                if group["bias_correction"]:
                    c1, c2 = 1 - b1**t, 1 - b2**t
                else:
                    c1 = c2 = 1.0
                w = p.float()
                update = (m / c1).div_((v / c2).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(w, alpha=group["weight_decay"])
                w_norm, u_norm = float(w.norm()), float(update.norm())
                trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 and math.isfinite(u_norm) else 1.0
                if p.dtype == torch.float32:
                    p.add_(update, alpha=-lr * trust)
                else:
                    p.copy_(w.add_(update, alpha=-lr * trust))
        return None
