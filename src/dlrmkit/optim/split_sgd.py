"""Split-SGD BF16 (Intel's MLPerf DLRM on Xeon): each fp32 weight is kept as two 16-bit halves.

The top half is a valid bf16 number and *is* the model's parameter, so forward and backward run
in bf16 with no cast and no separate fp32 master copy; the bottom half (the remaining 16 mantissa
bits, as int16) lives in the optimizer state. A step rejoins the halves into the exact fp32
weight, applies SGD in fp32, and splits the result again: weights cost 4 bytes each, as in fp32,
and every update is exactly an fp32 update. The bf16 weight the model sees is the fp32 weight
truncated (not rounded) to its top 16 bits.

Dense gradients (MLPs) update whole tensors; sparse COO gradients (embedding tables) update only
the rows they touch: each touched row is rejoined once, gets its lookups' gradients added in
fp32 in order (index_add_, exactly as SparseSGD updates an fp32 table), and is split once.
"""

from __future__ import annotations

import torch

from dlrmkit.optim.bf16_split import join_fp32, split_fp32, truncate_to_bf16  # noqa: F401 (part of this module's API)
from dlrmkit.optim.sparse import TableOptimizer, take_bag_grads
from dlrmkit.optim.split_sgd_kernel import fused_bag_step, fused_dense_step, fused_sparse_step


class SplitSGD(TableOptimizer):
    """Plain SGD on split bf16/int16 weights. Taking ownership of `params`: on construction each
    fp32 parameter's data is replaced by its bf16 top half (the low half goes to state["low"]);
    parameters that are already bf16 start with a zero low half. Use `master_weight(p)` for the
    exact fp32 value."""

    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype == torch.bfloat16:
                    low = torch.zeros(p.shape, dtype=torch.int16, device=p.device)
                elif p.dtype == torch.float32:
                    hi, low = split_fp32(p.data)
                    p.data = hi
                else:
                    raise ValueError(f"split-SGD needs fp32 or bf16 parameters, got {p.dtype}")
                self.state[p]["low"] = low

    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The exact fp32 weight of parameter `p` (a new tensor)."""
        return join_fp32(p.data, self.state[p]["low"])

    def load_state_dict(self, state_dict: dict) -> None:
        """As Optimizer.load_state_dict, but the int16 low halves are not cast to the params'
        dtype (the base class casts every floating-param state tensor, which would ruin them)."""
        lows = {k: s["low"] for k, s in state_dict["state"].items() if "low" in s}
        stripped = {k: {n: v for n, v in s.items() if n != "low"} for k, s in state_dict["state"].items()}
        super().load_state_dict({**state_dict, "state": stripped})
        params = [p for group in self.param_groups for p in group["params"]]
        for k, low in lows.items():
            p = params[int(k)]
            if low.shape != p.shape:
                raise ValueError(f"split-SGD state of shape {tuple(low.shape)} for a parameter of {tuple(p.shape)}")
            self.state[p]["low"] = low.to(device=p.device, dtype=torch.int16).clone()

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr = group["lr"]
            for p in group["params"]:
                for g in take_bag_grads(p):  # deferred table gradients (FusedTable.defer_grads)
                    if not fused_bag_step(p, self.state[p]["low"], g, lr):
                        self._sparse_step(p, self.state[p]["low"], g.to_sparse(p.shape), lr)
                if p.grad is None:
                    continue
                low = self.state[p]["low"]
                if p.grad.is_sparse:
                    self._sparse_step(p, low, p.grad, lr)
                elif not fused_dense_step(p, low, p.grad, lr):  # same bits, one pass (split_sgd_kernel.py)
                    w = join_fp32(p.data, low)
                    w.add_(p.grad.float(), alpha=-lr)
                    pairs = w.view(torch.int16).view(*w.shape, 2)
                    p.data.view(torch.int16).copy_(pairs[..., 1])
                    low.copy_(pairs[..., 0])
        return None

    @staticmethod
    def _sparse_step(p: torch.Tensor, low: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        rows, values = grad._indices()[0], grad._values()
        if rows.numel() == 0:
            return
        if fused_sparse_step(p, low, rows, values, lr):  # same bits, one pass (split_sgd_kernel.py)
            return
        # unique rows (sorted) and each lookup's slot; PooledLookup's gradients usually arrive sorted
        if bool((rows[1:] >= rows[:-1]).all()):
            uniq, inverse = torch.unique_consecutive(rows, return_inverse=True)
        else:
            uniq, inverse = torch.unique(rows, sorted=True, return_inverse=True)
        w = join_fp32(p.data.index_select(0, uniq), low.index_select(0, uniq))
        w.index_add_(0, inverse, values.float(), alpha=-lr)  # exactly SparseSGD's fp32 update
        pairs = w.view(torch.int16).view(*w.shape, 2)  # strided views of the halves, no copy
        p.data.view(torch.int16).index_copy_(0, uniq, pairs[..., 1])
        low.index_copy_(0, uniq, pairs[..., 0])
