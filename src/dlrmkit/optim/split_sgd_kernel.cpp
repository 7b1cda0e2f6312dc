// Fused split-SGD sparse row update; see split_sgd_kernel.py for why. Built by torch.utils.cpp_extension.load.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
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

constexpr int64_t kAhead = 8;

template <typename G>
DLRMKIT_CLONES static void run_range(uint16_t* hi, uint16_t* lo, const int64_t* rows, const G* g,
                                     int64_t begin, int64_t end, int64_t d, float alpha) {
  for (int64_t i = begin; i < end; ++i) {
    if (i + kAhead < end) {  // rows are random in a multi-GB table: fetch a later row's lines now
      const int64_t r = rows[i + kAhead] * d;
      for (int64_t j = 0; j < d; j += 32) {  // 32 halves = one 64-byte line
        __builtin_prefetch(hi + r + j, 1);
        __builtin_prefetch(lo + r + j, 1);
      }
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
static void split_sgd_rows(const at::Tensor& hi, const at::Tensor& lo, const at::Tensor& rows, const at::Tensor& values,
                           double alpha) {
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

TORCH_LIBRARY(dlrmkit_split_sgd, m) {
  m.def("split_sgd_rows(Tensor(a!) hi, Tensor(b!) lo, Tensor rows, Tensor values, float alpha) -> ()", &split_sgd_rows);
}
