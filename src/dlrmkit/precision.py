"""Mixed precision: one switch (`fp32 | bf16 | fp16`) for autocast, loss scaling and TF32.

bf16 autocast runs on CPU and GPU (AVX-512 BF16 / AMX on Xeon, tensor cores on GPU); bf16 has
fp32's exponent range, so it needs no loss scaling. fp16 (tensor cores on GPU; on a CPU without
fp16 arithmetic it runs, slowly) needs dynamic loss scaling against gradient underflow:
`LossScaler`, torch.amp.GradScaler's rule over every gradient a step makes, the tables' deferred
ones too. TF32 matmuls are enabled on Ampere and newer GPUs for the fp32 parts."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from dlrmkit.errors import DlrmkitError

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str) -> None:
    """Raise a one-line error for an unknown precision."""
    if precision not in PRECISIONS:
        raise DlrmkitError(f"unknown precision '{precision}' (choose {', '.join(PRECISIONS)})")


def compute_dtype(precision: str) -> torch.dtype:
    return _DTYPES[precision]


def autocast(precision: str, device_type: str = "cpu") -> ContextManager:
    """The autocast context for `precision` (a no-op for fp32)."""
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=_DTYPES[precision])


class LossScaler:
    """fp16's dynamic loss scaling, as torch.amp.GradScaler does it and with its kernels, over every
    gradient of a step: the parameters' `.grad` (dense or sparse) and the tables' deferred gradients
    (`weight.bag_grads`, dlrmkit.model.embedding.BagGrad), which GradScaler cannot see. The loss is
    multiplied by the scale before backward; `unscale` divides every gradient by it and says whether
    all are finite; `update` then halves the scale after an overflow (the step is skipped) and
    doubles it after GROWTH_INTERVAL finite steps in a row, between MIN_SCALE and MAX_SCALE (below,
    its float32 reciprocal would overflow and unscaled gradients would be infinite)."""

    INIT_SCALE, GROWTH, BACKOFF, GROWTH_INTERVAL = 2.0**16, 2.0, 0.5, 2000
    MIN_SCALE, MAX_SCALE = 2.0**-24, 2.0**127

    def __init__(self, device: torch.device | str = "cpu", scale: float = INIT_SCALE):
        self.scale_t = torch.full((1,), float(scale), dtype=torch.float32, device=device)
        self.tracker = torch.zeros(1, dtype=torch.int32, device=device)  # finite steps since the scale last changed
        self.skipped = 0  # steps skipped for an overflow, in this process

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss.float() * self.scale_t

    def unscale(self, optimizers: list) -> bool:
        """Every gradient of `optimizers`' parameters divided by the scale; True where all are finite."""
        inv = self.scale_t.double().reciprocal().float()
        grads: dict[tuple, list[torch.Tensor]] = {}
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    parts = []
                    for bag in getattr(p, "bag_grads", None) or []:
                        # a view of the pooled output's gradient, possibly expanded (one value read by
                        # many elements): unscaled in a copy of its own
                        bag.grad = bag.grad.contiguous()
                        parts.append(bag.grad)
                    if p.grad is not None:
                        parts.append(p.grad._values() if p.grad.is_sparse else p.grad)
                    for g in parts:
                        grads.setdefault((g.device, g.dtype), []).append(g)
        found = {device: torch.zeros(1, device=device) for device, _ in grads}
        for (device, _), group in grads.items():
            torch._amp_foreach_non_finite_check_and_unscale_(group, found[device], inv.to(device))
        return not any(bool(f.item()) for f in found.values())

    def update(self, finite: bool) -> None:
        """After a step's `unscale`: the next scale (`finite` False: the step is skipped, the scale halved)."""
        self.skipped += not finite
        found = torch.full((1,), 0.0 if finite else 1.0, device=self.scale_t.device)
        torch._amp_update_scale_(self.scale_t, self.tracker, found, self.GROWTH, self.BACKOFF, self.GROWTH_INTERVAL)
        self.scale_t.clamp_(self.MIN_SCALE, self.MAX_SCALE)  # a run of overflows stops halving at the floor

    @property
    def value(self) -> float:
        return float(self.scale_t.item())

    @property
    def growth_tracker(self) -> int:
        return int(self.tracker.item())


def enable_tf32(device: torch.device | str) -> bool:
    """Let fp32 matmuls and convolutions use TF32 on Ampere (sm_80) and newer; True if enabled.
    This is process-wide torch state, so call it once at start-up of a GPU run."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True
