"""Fused C++ row update for split-SGD's sparse step (optional fast path).

The pure-torch sparse step gathers the touched rows' halves, joins them, index_add_s and scatters
both halves back: five passes and three fresh buffers over the touched rows. This kernel walks the
lookups once and, for each, rejoins the row's halves in registers, applies ``w = fma(g, -lr, w)``
and splits again, in place. torch's CPU index_add_ computes ``self + alpha * source`` with a
fused multiply-add (checked below), in lookup order, so the result is bit-identical to the fp32
update. Rows of a sorted gradient are split across threads at row boundaries, so each row's
lookups stay in order on one thread.

Built on first use with torch.utils.cpp_extension.load (needs a C++ compiler and ninja),
cached under TORCH_EXTENSIONS_DIR; before first use the kernel is checked bit for bit against
index_add_ on this machine, and any failure (no compiler, other ISA, mismatch) falls back to the
pure-torch path, logged once.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)


_SOURCE = Path(__file__).with_name("split_sgd_kernel.cpp")
_lock = threading.Lock()
_cache: dict[str, object] = {}  # "op" -> the built op, or None after a failure


def _build():
    """Compile (or reuse from TORCH_EXTENSIONS_DIR) the op; only ATen/library headers, so the
    build is a fraction of a torch/extension.h one."""
    from torch.utils.cpp_extension import load

    load(name="dlrmkit_split_sgd_v1", sources=[str(_SOURCE)], extra_cflags=["-O3", "-ffp-contract=off"],
         is_python_module=False, verbose=False)
    return torch.ops.dlrmkit_split_sgd.split_sgd_rows


def _self_check(op) -> bool:
    """Bit-exact against fp32 index_add_ here (torch's formula may differ on another ISA/build)."""
    gen = torch.Generator().manual_seed(0)
    for d in (1, 8, 13, 128):
        w = torch.randn(50, d, generator=gen) * 4
        rows = torch.randint(0, 50, (400,), generator=gen)
        for r, g in ((rows, torch.randn(400, d, generator=gen).bfloat16()), (rows.sort()[0], torch.randn(400, d, generator=gen))):
            ref = w.clone().index_add_(0, r, g.float(), alpha=-0.37)
            pairs = w.view(torch.int16).view(50, d, 2)
            hi, lo = pairs[..., 1].contiguous().view(torch.bfloat16), pairs[..., 0].contiguous()
            op(hi, lo, r, g, -0.37)
            got = torch.stack((lo, hi.view(torch.int16)), dim=-1).view(torch.float32).view(50, d)
            if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
                return False
    return True


def fused_kernel():
    """The built, self-checked op ``(hi, lo, rows, values, alpha) -> None``, or None (fall back
    to pure torch; the reason is logged once). DLRMKIT_SPLIT_SGD_KERNEL=0 disables it."""
    if os.environ.get("DLRMKIT_SPLIT_SGD_KERNEL", "1") == "0":
        return None
    with _lock:
        if "op" not in _cache:
            try:
                op = _build()
                if not _self_check(op):
                    raise RuntimeError("kernel differs from torch's index_add_ on this machine")
                _cache["op"] = op
            except Exception as exc:  # no compiler/ninja, unsupported platform, mismatch
                log.warning("split-SGD fused kernel unavailable, using the pure-torch update: %s", exc)
                _cache["op"] = None
        return _cache["op"]


def fused_sparse_step(p: torch.Tensor, low: torch.Tensor, rows: torch.Tensor, values: torch.Tensor, lr: float) -> bool:
    """Apply the sparse split-SGD update in place with the kernel; False if it cannot be used."""
    if p.device.type != "cpu" or p.dim() != 2 or not p.data.is_contiguous() or not low.is_contiguous():
        return False
    op = fused_kernel()
    if op is None:
        return False
    if values.dtype not in (torch.bfloat16, torch.float32):
        values = values.float()
    op(p.data, low, rows.contiguous(), values.contiguous(), -lr)
    return True
