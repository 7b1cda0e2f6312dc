"""Mixed precision: one switch (`fp32 | bf16 | fp16`) for autocast, loss scaling and TF32.

bf16 autocast runs on CPU and GPU (AVX-512 BF16 / AMX on Xeon, tensor cores on GPU); bf16 has
fp32's exponent range, so it needs no loss scaling. fp16 runs only on CUDA and needs dynamic loss
scaling (torch.amp.GradScaler) against gradient underflow. TF32 matmuls are enabled on Ampere
and newer GPUs for the fp32 parts."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from dlrmkit.errors import DlrmkitError

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device_type: str = "cpu") -> None:
    """Raise a one-line error for an unknown precision or fp16 off CUDA."""
    if precision not in PRECISIONS:
        raise DlrmkitError(f"unknown precision '{precision}' (choose {', '.join(PRECISIONS)})")
    if precision == "fp16" and device_type != "cuda":
        raise DlrmkitError("--precision fp16 needs a CUDA device (use bf16 on CPU)")


def compute_dtype(precision: str) -> torch.dtype:
    return _DTYPES[precision]


def autocast(precision: str, device_type: str = "cpu") -> ContextManager:
    """The autocast context for `precision` (a no-op for fp32)."""
    check_precision(precision, device_type)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=_DTYPES[precision])


def grad_scaler(precision: str, device_type: str = "cpu") -> torch.amp.GradScaler:
    """Dynamic loss scaler, enabled only for fp16 (a pass-through otherwise)."""
    check_precision(precision, device_type)
    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")


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
