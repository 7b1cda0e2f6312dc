"""Fused C++ row update for split-SGD's sparse step (optional fast path).

The pure-torch sparse step gathers the touched rows' halves, joins them, index_add_s and scatters
both halves back: five passes and three fresh buffers over the touched rows. This kernel walks the
lookups once and, for each, rejoins the row's halves in registers, applies ``w = fma(g, -lr, w)``
and splits again, in place. torch's CPU index_add_ computes ``self + alpha * source`` with a
fused multiply-add (checked below), in lookup order, so the result is bit-identical to the fp32
update. Rows of a sorted gradient are split across threads at row boundaries, so each row's
lookups stay in order on one thread.

Built on first use with torch.utils.cpp_extension.load_inline (needs a C++ compiler and ninja),
cached under TORCH_EXTENSIONS_DIR; before first use the kernel is checked bit for bit against
index_add_ on this machine, and any failure (no compiler, other ISA, mismatch) falls back to the
pure-torch path, logged once.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define DLRMKIT_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define DLRMKIT_CLONES
#endif

// one lookup: w = fma(g, alpha, join(hi, lo)); (hi, lo) = split(w). G is uint16_t (bf16 bits) or float.
template <typename G>
static inline void row_update(uint16_t* __restrict hi, uint16_t* __restrict lo, const G* __restrict g,
                              int64_t d, float alpha) {
  for (int64_t j = 0; j < d; ++j) {
    uint32_t bits = (uint32_t(hi[j]) << 16) | uint32_t(lo[j]);
    float w, gv;
    std::memcpy(&w, &bits, 4);
    if constexpr (sizeof(G) == 2) {
      uint32_t gb = uint32_t(g[j]) << 16;
      std::memcpy(&gv, &gb, 4);
    } else {
      gv = g[j];
    }
    w = std::fma(gv, alpha, w);
    std::memcpy(&bits, &w, 4);
    hi[j] = uint16_t(bits >> 16);
    lo[j] = uint16_t(bits);
  }
}

template <typename G>
DLRMKIT_CLONES static void run_range(uint16_t* hi, uint16_t* lo, const int64_t* rows, const G* g,
                                     int64_t begin, int64_t end, int64_t d, float alpha) {
  for (int64_t i = begin; i < end; ++i) {
    if (i + 4 < end) {  // the next rows are random in a multi-GB table: start fetching them early
      const int64_t r = rows[i + 4] * d;
      __builtin_prefetch(hi + r, 1);
      __builtin_prefetch(lo + r, 1);
    }
    const int64_t r = rows[i] * d;
    row_update<G>(hi + r, lo + r, g + i * d, d, alpha);
  }
}

template <typename G>
static void run(uint16_t* hi, uint16_t* lo, const int64_t* rows, const G* g, int64_t n, int64_t d,
                float alpha, bool sorted) {
  if (!sorted) {  // duplicates may be anywhere: one thread keeps every row's lookups in order
    run_range<G>(hi, lo, rows, g, 0, n, d, alpha);
    return;
  }
  at::parallel_for(0, n, 2048, [&](int64_t b, int64_t e) {
    while (b > 0 && b < e && rows[b] == rows[b - 1]) ++b;  // that row belongs to the previous range
    while (e < n && e > 0 && rows[e] == rows[e - 1]) ++e;  // finish the last row here
    if (b < e) run_range<G>(hi, lo, rows, g, b, e, d, alpha);
  });
}

// In place: for each i, rows (hi, lo) [rows[i]] += alpha * values[i] in fp32, in order of i.
void split_sgd_rows(torch::Tensor hi, torch::Tensor lo, torch::Tensor rows, torch::Tensor values, double alpha) {
  TORCH_CHECK(hi.dim() == 2 && hi.is_contiguous() && hi.scalar_type() == at::kBFloat16, "hi: contiguous 2-d bf16");
  TORCH_CHECK(lo.sizes() == hi.sizes() && lo.is_contiguous() && lo.scalar_type() == at::kShort, "lo: int16 like hi");
  TORCH_CHECK(rows.dim() == 1 && rows.is_contiguous() && rows.scalar_type() == at::kLong, "rows: contiguous int64");
  const int64_t n = rows.size(0), d = hi.size(1), num_rows = hi.size(0);
  TORCH_CHECK(values.dim() == 2 && values.size(0) == n && values.size(1) == d && values.is_contiguous(), "values: [n, d]");
  const int64_t* r = rows.data_ptr<int64_t>();
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < num_rows, "row id ", r[i], " out of range [0, ", num_rows, ")");
    if (i > 0 && r[i] < r[i - 1]) sorted = false;
  }
  auto* h = reinterpret_cast<uint16_t*>(hi.data_ptr());
  auto* l = reinterpret_cast<uint16_t*>(lo.data_ptr());
  const float a = static_cast<float>(alpha);
  if (values.scalar_type() == at::kBFloat16) {
    run<uint16_t>(h, l, r, reinterpret_cast<const uint16_t*>(values.data_ptr()), n, d, a, sorted);
  } else {
    TORCH_CHECK(values.scalar_type() == at::kFloat, "values: bf16 or fp32");
    run<float>(h, l, r, values.data_ptr<float>(), n, d, a, sorted);
  }
}
"""

_DECL = "void split_sgd_rows(torch::Tensor hi, torch::Tensor lo, torch::Tensor rows, torch::Tensor values, double alpha);"

_lock = threading.Lock()
_cache: dict[str, object] = {}  # "module" -> the built extension, or None after a failure


def _build():
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name="dlrmkit_split_sgd_v1",
        cpp_sources=[_CPP],
        functions=["split_sgd_rows"],
        extra_cflags=["-O3", "-ffp-contract=off"],
        verbose=False,
    )


def _self_check(mod) -> bool:
    """Bit-exact against fp32 index_add_ here (torch's formula may differ on another ISA/build)."""
    gen = torch.Generator().manual_seed(0)
    for d in (1, 8, 13, 128):
        w = torch.randn(50, d, generator=gen) * 4
        rows = torch.randint(0, 50, (400,), generator=gen)
        for r, g in ((rows, torch.randn(400, d, generator=gen).bfloat16()), (rows.sort()[0], torch.randn(400, d, generator=gen))):
            ref = w.clone().index_add_(0, r, g.float(), alpha=-0.37)
            pairs = w.view(torch.int16).view(50, d, 2)
            hi, lo = pairs[..., 1].contiguous().view(torch.bfloat16), pairs[..., 0].contiguous()
            mod.split_sgd_rows(hi, lo, r, g, -0.37)
            got = torch.stack((lo, hi.view(torch.int16)), dim=-1).view(torch.float32).view(50, d)
            if not torch.equal(got.view(torch.int32), ref.view(torch.int32)):
                return False
    return True


def fused_kernel():
    """The built, self-checked extension, or None (fallback to pure torch; reason logged once).
    DLRMKIT_SPLIT_SGD_KERNEL=0 disables it."""
    if os.environ.get("DLRMKIT_SPLIT_SGD_KERNEL", "1") == "0":
        return None
    with _lock:
        if "module" not in _cache:
            try:
                mod = _build()
                if not _self_check(mod):
                    raise RuntimeError("kernel differs from torch's index_add_ on this machine")
                _cache["module"] = mod
            except Exception as exc:  # no compiler/ninja, unsupported platform, mismatch
                log.warning("split-SGD fused kernel unavailable, using the pure-torch update: %s", exc)
                _cache["module"] = None
        return _cache["module"]


def fused_sparse_step(p: torch.Tensor, low: torch.Tensor, rows: torch.Tensor, values: torch.Tensor, lr: float) -> bool:
    """Apply the sparse split-SGD update in place with the kernel; False if it cannot be used."""
    mod = fused_kernel()
    if mod is None or p.device.type != "cpu" or p.dim() != 2 or not p.data.is_contiguous() or not low.is_contiguous():
        return False
    if values.dtype not in (torch.bfloat16, torch.float32):
        values = values.float()
    mod.split_sgd_rows(p.data, low, rows.contiguous(), values.contiguous(), -lr)
    return True
