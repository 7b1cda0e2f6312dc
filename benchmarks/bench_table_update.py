"""The table-update kernels alone at mlperf-shape sizes (5.2M x 128 table, 293k sorted lookups
drawn from 53k bags): split-SGD by lookup and by bag, fp32 SGD by bag, and a plain gather of the
touched rows as the memory floor; at 2 threads and at 1 (OpenMP scaling of the kernel).

    THP_MEM_ALLOC_ENABLE=1 python benchmarks/bench_table_update.py
"""

from __future__ import annotations

import time

import torch

from dlrmkit.optim.split_sgd_kernel import fused_kernel


def ms(fn, reps: int = 10) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    op = fused_kernel()
    if op is None:
        raise SystemExit("the fused kernel could not be built here")
    sgd = torch.ops.dlrmkit_split_sgd.sgd_rows
    rows_n, d, n, bags_n = 5_200_000, 128, 293_000, 2048 * 26
    hi, lo = torch.randn(rows_n, d).bfloat16(), torch.zeros(rows_n, d, dtype=torch.int16)
    w = torch.randn(rows_n, d)
    rows = torch.randint(0, rows_n, (n,)).sort(stable=True)[0]
    bags = torch.randint(0, bags_n, (n,))
    pooled = torch.randn(bags_n, d).bfloat16()
    pooled_fp32 = pooled.float()
    per_lookup = pooled.index_select(0, bags)
    for threads in (2, 1):
        torch.set_num_threads(threads)
        print(f"{threads} thread(s): split-SGD per-lookup rows {ms(lambda: op(hi, lo, rows, per_lookup, -0.01)):.1f} ms, "
              f"split-SGD by bag {ms(lambda: op(hi, lo, rows, pooled, -0.01, bags)):.1f} ms, "
              f"fp32 SGD by bag {ms(lambda: sgd(w, rows, pooled_fp32, -0.01, bags)):.1f} ms, "
              f"gather of the touched bf16 rows {ms(lambda: hi.index_select(0, rows)):.1f} ms")


if __name__ == "__main__":
    main()
