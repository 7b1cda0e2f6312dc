"""Fused C++ row updates for split-SGD's sparse step, for plain SGD and Adagrad of fp32 tables read
by bag, and split-SGD's dense step in one pass (optional fast paths).

The pure-torch sparse step gathers the touched rows' halves, joins them, index_add_s and scatters
both halves back: five passes and three fresh buffers over the touched rows. This kernel walks the
lookups once and, for each, rejoins the row's halves in registers, applies ``w = fma(g, -lr, w)``
and splits again, in place. torch's CPU index_add_ computes ``self + alpha * source`` with a
fused multiply-add (checked below), in lookup order, so the result is bit-identical to the fp32
update. Every row's lookups stay in order on one thread: a sorted gradient is split across threads
at row boundaries; an unsorted one (narrow tables skip the sort) is walked by every thread, each
updating only the blocks of rows it owns.

Adagrad (element-wise or row-wise) reads a table's deferred gradient sorted by row: each row's lookups
are summed from the pooled gradient in lookup order into one fp32 row, which then takes the step
SparseAdagrad/RowWiseAdagrad take on a coalesced row; no per-lookup gradient rows, no coalesce.

Built on first use (needs a C++ compiler and ninja) into a folder of TORCH_EXTENSIONS_DIR named by
the source's hash, and loaded from there afterwards (kernel_build: no lock that a killed process can
leave behind); before first use the kernel is checked bit for bit against index_add_ on this
machine, and any failure (no compiler, other ISA, mismatch, a build elsewhere that does not finish
in time) falls back to the pure-torch path, logged once. DLRMKIT_SPLIT_SGD_KERNEL=0 skips it.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch

from dlrmkit.optim.bf16_split import join_fp32, split_fp32
from dlrmkit.optim.kernel_build import KernelBuild, KernelBuildError, load_kernel

log = logging.getLogger(__name__)


_SOURCE = Path(__file__).with_name("split_sgd_kernel.cpp")
_lock = threading.Lock()
_cache: dict[str, object] = {}  # "op" -> the built op, or None after a failure


def _build():
    """Load (or build once per source hash, see kernel_build) the op; only ATen/library headers, so
    the build is a fraction of a torch/extension.h one. at::parallel_for is OpenMP inline code:
    without -fopenmp it runs on one thread (measured: 2 threads took as long as 1), so OpenMP is
    tried first (the soname resolves to torch's own libgomp at run time) and a serial build is the
    fallback."""
    flags = ("-O3", "-ffp-contract=off", "-fno-math-errno")  # errno-free sqrtf: the Adagrad loop vectorizes
    try:
        load_kernel(KernelBuild(_SOURCE, (*flags, "-fopenmp"), ("-fopenmp",)))
    except KernelBuildError:
        raise  # a build still running elsewhere: do not start a second one
    except Exception as exc:  # no OpenMP for this compiler: the same kernel on one thread
        log.info("split-SGD kernel: OpenMP build failed (%s), building it single-threaded", exc)
        load_kernel(KernelBuild(_SOURCE, flags, prefix="dlrmkit_split_sgd_serial"))
    return torch.ops.dlrmkit_split_sgd.split_sgd_rows


def _self_check_fp32(op) -> bool:
    """The fp32-table op (plain sparse SGD) bit-exact against index_add_, by lookup and by bag."""
    gen = torch.Generator().manual_seed(1)
    for d in (1, 13, 128):
        w = torch.randn(50, d, generator=gen)
        rows = torch.randint(0, 50, (400,), generator=gen).sort()[0]
        pooled, bags = torch.randn(30, d, generator=gen), torch.randint(0, 30, (400,), generator=gen)
        ref = w.clone().index_add_(0, rows, pooled.index_select(0, bags), alpha=-0.37)
        got = w.clone()
        op(got, rows, pooled, -0.37, bags)
        if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
            return False
    return True


def _self_check(op) -> bool:
    """Bit-exact against fp32 index_add_ here (torch's formula may differ on another ISA/build)."""
    gen = torch.Generator().manual_seed(0)
    for d in (1, 8, 13, 128):
        w = torch.randn(50, d, generator=gen) * 4
        rows = torch.randint(0, 50, (400,), generator=gen)
        for r, g in (
            (rows, torch.randn(400, d, generator=gen).bfloat16()),
            (rows.sort()[0], torch.randn(400, d, generator=gen)),
        ):
            ref = w.clone().index_add_(0, r, g.float(), alpha=-0.37)
            pairs = w.view(torch.int16).view(50, d, 2)
            hi, lo = pairs[..., 1].contiguous().view(torch.bfloat16), pairs[..., 0].contiguous()
            op(hi, lo, r, g, -0.37)
            got = torch.stack((lo, hi.view(torch.int16)), dim=-1).view(torch.float32).view(50, d)
            if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
                return False
        # by bag: lookup i takes row bags[i] of a pooled gradient (the deferred-gradient path)
        pooled, bags = torch.randn(30, d, generator=gen).bfloat16(), torch.randint(0, 30, (400,), generator=gen)
        r = rows.sort()[0]
        ref = w.clone().index_add_(0, r, pooled.float().index_select(0, bags), alpha=-0.37)
        pairs = w.view(torch.int16).view(50, d, 2)
        hi, lo = pairs[..., 1].contiguous().view(torch.bfloat16), pairs[..., 0].contiguous()
        op(hi, lo, r, pooled, -0.37, bags)
        got = torch.stack((lo, hi.view(torch.int16)), dim=-1).view(torch.float32).view(50, d)
        if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
            return False
    return True


def _self_check_dense(op) -> bool:
    """The dense op bit-exact against SplitSGD's pure-torch dense step (join, add_, split), at sizes
    with and without a vector tail, bf16 and fp32 gradients."""
    gen = torch.Generator().manual_seed(2)
    for n in (1, 15, 16, 17, 100, 40_000):
        w = torch.randn(n, generator=gen) * 3
        for g in (torch.randn(n, generator=gen).bfloat16(), torch.randn(n, generator=gen)):
            ref = w.clone().add_(g.float(), alpha=-0.37)
            hi, lo = split_fp32(w)
            op(hi, lo, g, -0.37)
            if not torch.equal(join_fp32(hi, lo).view(torch.int32), ref.view(torch.int32)):
                return False
    return True


def _self_check_adagrad(op) -> bool:
    """The Adagrad op against the pure-torch update of the coalesced rows, element-wise with decay and
    row-wise, to fp32 rounding (the per-row sums may add in another order than coalesce's)."""
    gen = torch.Generator().manual_seed(3)
    for d, rowwise in ((1, False), (13, False), (128, False), (16, True)):
        w, acc = torch.randn(50, d, generator=gen), torch.rand(50, 1 if rowwise else d, generator=gen)
        rows, bags = torch.randint(0, 50, (400,), generator=gen).sort()[0], torch.randint(0, 30, (400,), generator=gen)
        pooled = torch.randn(30, d, generator=gen)
        uniq, inverse = torch.unique(rows, return_inverse=True)
        g = torch.zeros(len(uniq), d).index_add_(0, inverse, pooled.index_select(0, bags))
        g = g + 0.01 * w.index_select(0, uniq)
        ref_w, ref_acc = w.clone(), acc.clone()
        ref_acc.index_add_(0, uniq, g.square().mean(1, keepdim=True) if rowwise else g * g)
        ref_w.index_add_(0, uniq, g / ref_acc.index_select(0, uniq).sqrt().add(1e-10), alpha=-0.37)
        got_w, got_acc = w.clone(), (acc.view(-1) if rowwise else acc).clone()
        op(got_w, got_acc, rows, pooled, bags, 0.37, 1e-10, 0.01)
        if not (
            torch.allclose(got_w, ref_w, rtol=1e-5, atol=1e-6)
            and torch.allclose(got_acc.view_as(ref_acc), ref_acc, rtol=1e-5, atol=1e-6)
        ):
            return False
    return True


def fused_kernel():
    """The built, self-checked op ``(hi, lo, rows, values, alpha, bags=None) -> None``, or None (fall back
    to pure torch; the reason is logged once). DLRMKIT_SPLIT_SGD_KERNEL=0 disables it."""
    if os.environ.get("DLRMKIT_SPLIT_SGD_KERNEL", "1") == "0":
        return None
    with _lock:
        if "op" not in _cache:
            try:
                op = _build()
                if not _self_check(op) or not _self_check_fp32(torch.ops.dlrmkit_split_sgd.sgd_rows):
                    raise RuntimeError("kernel differs from torch's index_add_ on this machine")
                _cache["op"] = op
                try:
                    _warn_if_slow_clone()
                except Exception as exc:  # a diagnostic only: never lose a working kernel to it
                    log.debug("could not compare the kernel's clone with the CPU: %s", exc)
                _cache["dense"] = _self_check_dense(torch.ops.dlrmkit_split_sgd.split_sgd_dense)
                if not _cache["dense"]:
                    log.warning("split-SGD dense kernel differs from torch's add_ here; dense steps use pure torch")
                _cache["adagrad"] = _self_check_adagrad(torch.ops.dlrmkit_split_sgd.adagrad_rows)
                if not _cache["adagrad"]:
                    log.warning("Adagrad row kernel differs from the pure-torch update here; tables use pure torch")
            except Exception as exc:  # no compiler/ninja, unsupported platform, mismatch
                why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]
                log.warning(
                    "split-SGD fused kernel unavailable, using the pure-torch update "
                    "(DLRMKIT_SPLIT_SGD_KERNEL=0 skips trying): %s",
                    why,
                )
                log.debug("split-SGD kernel failure in full: %s", exc)
                _cache["op"] = None
        return _cache["op"]


def kernel_isa_level() -> int | None:
    """The x86-64 ISA level (3: AVX2, 4: AVX-512) whose clone the built kernels run on this CPU, 0
    for the portable clone, -1 when the compiler made no clones; None without the kernel."""
    if fused_kernel() is None:
        return None
    return int(torch.ops.dlrmkit_split_sgd.isa_level())


# what GCC's resolver requires per level, as Linux names the flags: v2 (cx16, lahf_lm, popcnt, SSE3
# = pni, SSSE3, SSE4.1/4.2), then v3 (AVX2, BMI1/2, F16C, FMA, LZCNT = abm, MOVBE, XSAVE), then v4
_V2_FLAGS = {"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"}
_V3_FLAGS = _V2_FLAGS | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4_FLAGS = _V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def cpu_isa_level(cpuinfo: str = "/proc/cpuinfo") -> int | None:
    """This CPU's x86-64 ISA level from its flags (4: the AVX-512 set, 3: AVX2 and its peers, else
    0); None where there are no x86 flags to read (not Linux, not x86-64)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    return 4 if _V4_FLAGS <= flags else 3 if _V3_FLAGS <= flags else 0


def _warn_if_slow_clone() -> None:
    """A kernel running a narrower clone than the CPU has is correct but several times slower (the
    model-named clones ran scalar on an AVX-512 AMD CPU: docs/BENCHMARKS.md, row kernels): say so."""
    level, cpu = int(torch.ops.dlrmkit_split_sgd.isa_level()), cpu_isa_level()
    if cpu is not None and cpu > max(level, 0):
        why = (
            "the compiler made no ISA clones (GCC >= 12 with glibc on x86-64 does)"
            if level == -1
            else f"it dispatched to level {level}"
        )
        log.warning(
            "split-SGD kernel runs without the vector code this CPU has (x86-64-v%d): %s; "
            "table updates are several times slower",
            cpu,
            why,
        )


def fused_dense_step(p: torch.Tensor, low: torch.Tensor, grad: torch.Tensor, lr: float) -> bool:
    """Apply a dense split-SGD step (MLP weights) in place with the kernel, in one pass; False if
    it cannot be used (the caller runs the pure-torch join, add_, split)."""
    if p.device.type != "cpu" or not p.data.is_contiguous() or not low.is_contiguous():
        return False
    if fused_kernel() is None or not _cache.get("dense"):
        return False
    if grad.dtype not in (torch.bfloat16, torch.float32) or grad.layout != torch.strided:
        return False
    torch.ops.dlrmkit_split_sgd.split_sgd_dense(p.data, low, grad.contiguous(), -lr)
    return True


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


def _bag_args(bag_grad) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, pooled gradient, bags) of an embedding.BagGrad as the kernels take them."""
    grad = bag_grad.grad if bag_grad.grad.dtype in (torch.bfloat16, torch.float32) else bag_grad.grad.float()
    return bag_grad.rows.contiguous(), grad.contiguous(), bag_grad.bags.contiguous()


def fused_bag_step(p: torch.Tensor, low: torch.Tensor, bag_grad, lr: float) -> bool:
    """Apply a deferred table gradient (embedding.BagGrad) in place with the kernel, each lookup's
    gradient row read from the pooled gradient; False if the kernel cannot be used."""
    if p.device.type != "cpu" or p.dim() != 2 or not p.data.is_contiguous() or not low.is_contiguous():
        return False
    op = fused_kernel()
    if op is None:
        return False
    if bag_grad.rows.numel():
        rows, grad, bags = _bag_args(bag_grad)
        op(p.data, low, rows, grad, -lr, bags)
    return True


def fused_sgd_bag_step(p: torch.Tensor, bag_grad, lr: float) -> bool:
    """Plain SGD of an fp32 table from a deferred gradient (embedding.BagGrad), in place, each
    lookup's row read from the pooled gradient; False if the kernel cannot be used."""
    if p.device.type != "cpu" or p.dim() != 2 or p.dtype != torch.float32 or not p.data.is_contiguous():
        return False
    if fused_kernel() is None:
        return False
    if bag_grad.rows.numel():
        rows, grad, bags = _bag_args(bag_grad)
        torch.ops.dlrmkit_split_sgd.sgd_rows(p.data, rows, grad, -lr, bags)
    return True


def fused_adagrad_bag_step(
    p: torch.Tensor, acc: torch.Tensor, bag_grad, lr: float, eps: float, weight_decay: float = 0.0
) -> bool:
    """Adagrad of an fp32 table from a deferred gradient (embedding.BagGrad), in place: each touched
    row's lookups summed straight from the pooled gradient, then one step of the row and its
    accumulator `acc` ([rows, dim] element-wise, [rows] row-wise); False if the kernel cannot be used."""
    if p.device.type != "cpu" or p.dim() != 2 or p.dtype != torch.float32 or not p.data.is_contiguous():
        return False
    if acc.dtype != torch.float32 or not acc.is_contiguous() or fused_kernel() is None or not _cache.get("adagrad"):
        return False
    if bag_grad.rows.numel():
        rows, grad, bags = _bag_args(bag_grad)
        if len(rows) > 1 and not bool((rows[1:] >= rows[:-1]).all()):  # lookup order (narrow or gathered)
            keys = rows.int() if p.shape[0] <= torch.iinfo(torch.int32).max else rows
            order = keys.sort(stable=True)[1]  # duplicates keep lookup order
            rows, bags = rows.index_select(0, order), bags.index_select(0, order)
        torch.ops.dlrmkit_split_sgd.adagrad_rows(p.data, acc, rows, grad, bags, lr, eps, weight_decay)
    return True
