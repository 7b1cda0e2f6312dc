// Fused sparse row updates: split-SGD (bf16 hi + int16 lo halves), plain SGD and Adagrad on fp32 tables;
// and split-SGD's dense step in one pass; see split_sgd_kernel.py for why. Built by torch.utils.cpp_extension.load.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

// One clone per x86-64 ISA level, picked at load time by CPU features. (The former clones named CPU
// models, "arch=skylake-avx512" and "arch=haswell": GCC dispatches those on the CPU's model, so an AMD
// Zen 4 with AVX-512 ran the scalar default clone, 9x slower on cached rows, measured.) Clones need
// ifunc support, hence glibc.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__linux__) && defined(__GLIBC__)
#define DLRMKIT_AVX512 "arch=x86-64-v4"
#define DLRMKIT_AVX2 "arch=x86-64-v3"
#define DLRMKIT_CLONES __attribute__((target_clones(DLRMKIT_AVX512, DLRMKIT_AVX2, "default")))
// The clone those targets dispatch to on this CPU, by the same resolver (a test checks it against
// the CPU's flags: the model-named targets would have said 0 on Zen 4).
__attribute__((target("default"))) static int64_t isa_level() { return 0; }
__attribute__((target(DLRMKIT_AVX2))) static int64_t isa_level() { return 3; }
__attribute__((target(DLRMKIT_AVX512))) static int64_t isa_level() { return 4; }
#else
#define DLRMKIT_CLONES
static int64_t isa_level() { return -1; }  // no ISA clones with this compiler
#endif

// gradient element j as fp32; G is uint16_t (bf16 bits) or float
template <typename G>
[[gnu::always_inline]] static inline float grad_at(const G* __restrict g, int64_t j) {
  if constexpr (sizeof(G) == 2) {
    return __builtin_bit_cast(float, uint32_t(g[j]) << 16);
  } else {
    return g[j];
  }
}

// one lookup: w = fma(g, alpha, join(hi, lo)); (hi, lo) = split(w). G is uint16_t (bf16 bits) or float.
// Builtins only (no std::fma/bit_cast/memcpy calls): a call to a default-target function is not
// inlined into a target clone, which then stays scalar (seen in the object code).
template <typename G>
[[gnu::always_inline]] static inline void row_update(uint16_t* __restrict hi, uint16_t* __restrict lo, const G* __restrict g,
                              int64_t d, float alpha) {
  for (int64_t j = 0; j < d; ++j) {
    const float w = __builtin_bit_cast(float, (uint32_t(hi[j]) << 16) | uint32_t(lo[j]));
    const uint32_t out = __builtin_bit_cast(uint32_t, __builtin_fmaf(grad_at(g, j), alpha, w));
    hi[j] = uint16_t(out >> 16);
    lo[j] = uint16_t(out);
  }
}

// fp32 weights (plain sparse SGD): w = fma(g, alpha, w), as index_add_ computes it.
template <typename G>
[[gnu::always_inline]] static inline void row_update_fp32(float* __restrict w, const G* __restrict g, int64_t d,
                                                          float alpha) {
  for (int64_t j = 0; j < d; ++j) {
    w[j] = __builtin_fmaf(grad_at(g, j), alpha, w[j]);
  }
}

constexpr int64_t kAhead = 8;

// Lookups list[0..m) in that order, or begin, begin + 1, ... without a list: lookup i updates row
// rows[i] with gradient row (bags ? bags[i] : i) of g. With bags, g is the pooled gradient
// [num_bags, d] and no per-lookup gradient copy is ever made. Split: `hi`, `lo` are the split
// halves; else `lo` is an fp32 table (plain SGD) and `hi` is unused. (A run-time branch on this
// made the fp32 update 12% slower, measured.)
template <bool Split, typename G>
DLRMKIT_CLONES static void run_lookups(uint16_t* hi, void* lo, const int64_t* rows, const int64_t* bags, const G* g,
                                       const int64_t* list, int64_t begin, int64_t m, int64_t d, float alpha) {
  constexpr int64_t elem = Split ? 2 : 4;  // bytes per element of each of the one or two arrays
  for (int64_t k = 0; k < m; ++k) {
    if (k + kAhead < m) {  // rows are random in a multi-GB table: fetch a later row's lines now
      const int64_t i = list ? list[k + kAhead] : begin + k + kAhead, r = rows[i] * d * elem;
      for (int64_t j = 0; j < d * elem; j += 64) {
        if constexpr (Split) __builtin_prefetch(reinterpret_cast<char*>(hi) + r + j, 1);
        __builtin_prefetch(static_cast<char*>(lo) + r + j, 1);
      }
      if (bags) {
        const G* gr = g + bags[i] * d;
        for (int64_t j = 0; j < d; j += 64 / int64_t(sizeof(G))) __builtin_prefetch(gr + j, 0);
      }
    }
    const int64_t i = list ? list[k] : begin + k;
    const G* gr = g + (bags ? bags[i] : i) * d;
    if constexpr (Split) {
      row_update<G>(hi + rows[i] * d, static_cast<uint16_t*>(lo) + rows[i] * d, gr, d, alpha);
    } else {
      row_update_fp32<G>(static_cast<float*>(lo) + rows[i] * d, gr, d, alpha);
    }
  }
}

constexpr int64_t kOwnerBlock = 64;  // rows per ownership block: two threads never share a cache line

// Runs lookups [0, n) on all threads, each row's lookups in order on one thread. Sorted rows: ranges
// split at row boundaries. Unsorted rows (lookup order: narrow tables skip the backward's sort,
// embedding.py): thread t owns the rows with (row / kOwnerBlock) % T == t and walks its own lookups.
template <bool Split, typename G>
static void run(uint16_t* hi, void* lo, const int64_t* rows, const int64_t* bags, const G* g, int64_t n, int64_t d,
                float alpha, bool sorted) {
  if (sorted) {
    at::parallel_for(0, n, 2048, [&](int64_t b, int64_t e) {
      while (b > 0 && b < e && rows[b] == rows[b - 1]) ++b;  // that row belongs to the previous range
      while (e < n && e > 0 && rows[e] == rows[e - 1]) ++e;  // finish the last row here
      if (b < e) run_lookups<Split, G>(hi, lo, rows, bags, g, nullptr, b, e - b, d, alpha);
    });
    return;
  }
  const int64_t threads = at::get_num_threads();
  if (threads == 1 || n < 4096) {
    run_lookups<Split, G>(hi, lo, rows, bags, g, nullptr, 0, n, d, alpha);
    return;
  }
  at::parallel_for(0, threads, 1, [&](int64_t tb, int64_t te) {
    std::vector<int64_t> own;
    own.reserve(n / threads + n / 8);
    for (int64_t t = tb; t < te; ++t) {
      own.clear();
      for (int64_t i = 0; i < n; ++i)
        if ((rows[i] / kOwnerBlock) % threads == t) own.push_back(i);
      run_lookups<Split, G>(hi, lo, rows, bags, g, own.data(), 0, int64_t(own.size()), d, alpha);
    }
  });
}

// Checks rows/bags/values against a [num_rows, d] table; returns (bags or null, rows sorted?).
static std::pair<const int64_t*, bool> check_lookups(int64_t num_rows, int64_t d, const at::Tensor& rows,
                                                     const at::Tensor& values, const std::optional<at::Tensor>& bags) {
  TORCH_CHECK(rows.dim() == 1 && rows.is_contiguous() && rows.scalar_type() == at::kLong, "rows: contiguous int64");
  const int64_t n = rows.size(0);
  TORCH_CHECK(values.dim() == 2 && values.size(1) == d && values.is_contiguous(), "values: contiguous [*, d]");
  TORCH_CHECK(values.scalar_type() == at::kBFloat16 || values.scalar_type() == at::kFloat, "values: bf16 or fp32");
  const int64_t* bag = nullptr;
  if (bags.has_value()) {
    const at::Tensor& b = *bags;
    TORCH_CHECK(b.dim() == 1 && b.size(0) == n && b.is_contiguous() && b.scalar_type() == at::kLong, "bags: int64 like rows");
    bag = b.data_ptr<int64_t>();
    const int64_t num_bags = values.size(0);
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(bag[i] >= 0 && bag[i] < num_bags, "bag ", bag[i], " out of range [0, ", num_bags, ")");
  } else {
    TORCH_CHECK(values.size(0) == n, "values: one row per lookup");
  }
  const int64_t* r = rows.data_ptr<int64_t>();
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < num_rows, "row id ", r[i], " out of range [0, ", num_rows, ")");
    if (i > 0 && r[i] < r[i - 1]) sorted = false;
  }
  return {bag, sorted};
}

// In place: for each i, rows (hi, lo) [rows[i]] += alpha * values[bags ? bags[i] : i] in fp32, in order of i.
static void split_sgd_rows(const at::Tensor& hi, const at::Tensor& lo, const at::Tensor& rows, const at::Tensor& values,
                           double alpha, const std::optional<at::Tensor>& bags) {
  TORCH_CHECK(hi.dim() == 2 && hi.is_contiguous() && hi.scalar_type() == at::kBFloat16, "hi: contiguous 2-d bf16");
  TORCH_CHECK(lo.sizes() == hi.sizes() && lo.is_contiguous() && lo.scalar_type() == at::kShort, "lo: int16 like hi");
  const int64_t n = rows.size(0), d = hi.size(1);
  auto [bag, sorted] = check_lookups(hi.size(0), d, rows, values, bags);
  const int64_t* r = rows.data_ptr<int64_t>();
  auto* h = reinterpret_cast<uint16_t*>(hi.data_ptr());
  auto* l = reinterpret_cast<uint16_t*>(lo.data_ptr());
  const float a = static_cast<float>(alpha);
  if (values.scalar_type() == at::kBFloat16) {
    run<true, uint16_t>(h, l, r, bag, reinterpret_cast<const uint16_t*>(values.data_ptr()), n, d, a, sorted);
  } else {
    run<true, float>(h, l, r, bag, values.data_ptr<float>(), n, d, a, sorted);
  }
}

// In place: for each i, weight[rows[i]] += alpha * values[bags ? bags[i] : i] (fp32 table), in order of i.
static void sgd_rows(const at::Tensor& weight, const at::Tensor& rows, const at::Tensor& values, double alpha,
                     const std::optional<at::Tensor>& bags) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kFloat, "weight: contiguous 2-d fp32");
  const int64_t n = rows.size(0), d = weight.size(1);
  auto [bag, sorted] = check_lookups(weight.size(0), d, rows, values, bags);
  const int64_t* r = rows.data_ptr<int64_t>();
  const float a = static_cast<float>(alpha);
  if (values.scalar_type() == at::kBFloat16) {
    run<false, uint16_t>(nullptr, weight.data_ptr<float>(), r, bag, reinterpret_cast<const uint16_t*>(values.data_ptr()), n, d, a, sorted);
  } else {
    run<false, float>(nullptr, weight.data_ptr<float>(), r, bag, values.data_ptr<float>(), n, d, a, sorted);
  }
}

// Adagrad of one row from the summed gradient g (fp32, d values; overwritten): with decay, g += decay * w;
// element-wise: acc += g * g, w = fma(g / (sqrt(acc) + eps), -lr, w); row-wise (one accumulator per row):
// acc += mean(g * g), w = fma(g * (1 / (sqrt(acc) + eps)), -lr, w). The operations SparseAdagrad and
// RowWiseAdagrad run on the coalesced rows, in the same order.
template <bool RowWise>
[[gnu::always_inline]] static inline void adagrad_row(float* __restrict w, float* __restrict acc, float* __restrict g,
                                                      int64_t d, float lr, float eps, float decay) {
  if (decay != 0.f) {
    for (int64_t j = 0; j < d; ++j) g[j] = g[j] + decay * w[j];
  }
  if constexpr (RowWise) {
    float sq = 0.f;
    for (int64_t j = 0; j < d; ++j) sq += g[j] * g[j];
    acc[0] = acc[0] + sq / float(d);
    const float scale = 1.f / (__builtin_sqrtf(acc[0]) + eps);
    for (int64_t j = 0; j < d; ++j) w[j] = __builtin_fmaf(g[j] * scale, -lr, w[j]);
  } else {
    for (int64_t j = 0; j < d; ++j) {
      acc[j] = acc[j] + g[j] * g[j];
      w[j] = __builtin_fmaf(g[j] / (__builtin_sqrtf(acc[j]) + eps), -lr, w[j]);
    }
  }
}

// Lookups [b, e) of rows sorted ascending: each run of one row sums its gradient rows (g[bags[i]] or
// g[i]) in lookup order, then takes one Adagrad step.
template <bool RowWise, typename G>
DLRMKIT_CLONES static void adagrad_runs(float* w, float* acc, const int64_t* rows, const int64_t* bags, const G* g,
                                        int64_t b, int64_t e, int64_t d, float lr, float eps, float decay) {
  std::vector<float> sum(d);
  float* s = sum.data();
  for (int64_t i = b; i < e;) {
    const int64_t r = rows[i];
    if (i + kAhead < e) {  // the row kAhead lookups on: fetch its weight and accumulator now
      const int64_t ahead = rows[i + kAhead] * d;
      for (int64_t j = 0; j < d; j += 16) {
        __builtin_prefetch(w + ahead + j, 1);
        if constexpr (!RowWise) __builtin_prefetch(acc + ahead + j, 1);
      }
    }
    const G* first = g + (bags ? bags[i] : i) * d;
    for (int64_t j = 0; j < d; ++j) s[j] = grad_at(first, j);
    for (++i; i < e && rows[i] == r; ++i) {
      const G* gr = g + (bags ? bags[i] : i) * d;
      for (int64_t j = 0; j < d; ++j) s[j] += grad_at(gr, j);
    }
    adagrad_row<RowWise>(w + r * d, RowWise ? acc + r : acc + r * d, s, d, lr, eps, decay);
  }
}

// In place: Adagrad on the rows the lookups touch, each row's gradient the sum of its lookups'
// (g[bags[i]], or g[i] without bags), `rows` sorted. acc: [num_rows, d] (element-wise) or [num_rows] (row-wise).
static void adagrad_rows(const at::Tensor& weight, const at::Tensor& acc, const at::Tensor& rows,
                         const at::Tensor& values, const std::optional<at::Tensor>& bags, double lr, double eps,
                         double decay) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.scalar_type() == at::kFloat, "weight: contiguous 2-d fp32");
  const bool rowwise = acc.dim() == 1;
  TORCH_CHECK(acc.is_contiguous() && acc.scalar_type() == at::kFloat && acc.size(0) == weight.size(0) &&
                  (rowwise || acc.sizes() == weight.sizes()),
              "acc: contiguous fp32, [rows] or shaped like weight");
  const int64_t n = rows.size(0), d = weight.size(1);
  auto [bag, sorted] = check_lookups(weight.size(0), d, rows, values, bags);
  TORCH_CHECK(sorted, "rows: sorted ascending");
  const int64_t* r = rows.data_ptr<int64_t>();
  float* w = weight.data_ptr<float>();
  float* a = acc.data_ptr<float>();
  const float l = float(lr), ep = float(eps), dc = float(decay);
  const bool bf16 = values.scalar_type() == at::kBFloat16;
  at::parallel_for(0, n, 2048, [&](int64_t b, int64_t e) {
    while (b > 0 && b < e && r[b] == r[b - 1]) ++b;  // that row belongs to the previous range
    while (e < n && e > 0 && r[e] == r[e - 1]) ++e;  // finish the last row here
    if (b >= e) return;
    if (bf16) {
      auto* g = reinterpret_cast<const uint16_t*>(values.data_ptr());
      rowwise ? adagrad_runs<true, uint16_t>(w, a, r, bag, g, b, e, d, l, ep, dc)
              : adagrad_runs<false, uint16_t>(w, a, r, bag, g, b, e, d, l, ep, dc);
    } else {
      const float* g = values.data_ptr<float>();
      rowwise ? adagrad_runs<true, float>(w, a, r, bag, g, b, e, d, l, ep, dc)
              : adagrad_runs<false, float>(w, a, r, bag, g, b, e, d, l, ep, dc);
    }
  });
}

template <typename G>
DLRMKIT_CLONES static void dense_range(uint16_t* hi, uint16_t* lo, const G* g, int64_t begin, int64_t end, float alpha) {
  row_update<G>(hi + begin, lo + begin, g + begin, end - begin, alpha);
}

// In place, element-wise: (hi, lo) = split(fma(grad, alpha, join(hi, lo))): a dense (MLP) split-SGD
// step in one pass, where the pure-torch step makes an fp32 copy, adds, and copies both halves back.
static void split_sgd_dense(const at::Tensor& hi, const at::Tensor& lo, const at::Tensor& grad, double alpha) {
  TORCH_CHECK(hi.is_contiguous() && hi.scalar_type() == at::kBFloat16, "hi: contiguous bf16");
  TORCH_CHECK(lo.sizes() == hi.sizes() && lo.is_contiguous() && lo.scalar_type() == at::kShort, "lo: int16 like hi");
  TORCH_CHECK(grad.sizes() == hi.sizes() && grad.is_contiguous(), "grad: contiguous, shaped like hi");
  TORCH_CHECK(grad.scalar_type() == at::kBFloat16 || grad.scalar_type() == at::kFloat, "grad: bf16 or fp32");
  auto* h = reinterpret_cast<uint16_t*>(hi.data_ptr());
  auto* l = reinterpret_cast<uint16_t*>(lo.data_ptr());
  const float a = static_cast<float>(alpha);
  const bool bf16 = grad.scalar_type() == at::kBFloat16;
  at::parallel_for(0, hi.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    if (bf16) {
      dense_range<uint16_t>(h, l, reinterpret_cast<const uint16_t*>(grad.data_ptr()), b, e, a);
    } else {
      dense_range<float>(h, l, grad.data_ptr<float>(), b, e, a);
    }
  });
}

TORCH_LIBRARY(dlrmkit_split_sgd, m) {
  m.def("split_sgd_dense(Tensor(a!) hi, Tensor(b!) lo, Tensor grad, float alpha) -> ()", &split_sgd_dense);
  m.def("split_sgd_rows(Tensor(a!) hi, Tensor(b!) lo, Tensor rows, Tensor values, float alpha, Tensor? bags=None) -> ()",
        &split_sgd_rows);
  m.def("sgd_rows(Tensor(a!) weight, Tensor rows, Tensor values, float alpha, Tensor? bags=None) -> ()", &sgd_rows);
  m.def("adagrad_rows(Tensor(a!) weight, Tensor(b!) acc, Tensor rows, Tensor values, Tensor? bags, float lr, float eps, "
        "float decay) -> ()",
        &adagrad_rows);
  m.def("isa_level() -> int", [] { return isa_level(); });
}
