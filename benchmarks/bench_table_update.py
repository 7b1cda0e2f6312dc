"""The table-update kernels alone at mlperf-shape sizes (5.2M x 128 table, 293k sorted lookups
drawn from 53k bags): split-SGD by lookup and by bag, fp32 SGD by bag, and a read of the touched
rows' hi halves (embedding_bag), a lower bound on the update's reads; at 2 threads and at 1 (OpenMP
scaling of the kernel). Then, per table width, a deferred gradient's update in lookup order against sorted by row (the sort counted,
as PooledLookup's backward pays it): what embedding.SORT_MIN_DIM is set from.

    THP_MEM_ALLOC_ENABLE=1 python benchmarks/bench_table_update.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from dlrmkit.model.embedding import bag_of_each
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
    # a lower bound on the reads (the update also reads lo and writes both): each touched hi row read
    # once, summed into bags of 8 (index_select instead wrote a fresh 75 MB output each call, and
    # took longer on 2 threads than on 1: 29-36 vs 19-20 ms)
    read_offsets = torch.arange(0, n, 8)
    for threads in (2, 1):
        torch.set_num_threads(threads)
        print(
            f"{threads} thread(s): split-SGD per-lookup rows {ms(lambda: op(hi, lo, rows, per_lookup, -0.01)):.1f} ms, "
            f"split-SGD by bag {ms(lambda: op(hi, lo, rows, pooled, -0.01, bags)):.1f} ms, "
            f"fp32 SGD by bag {ms(lambda: sgd(w, rows, pooled_fp32, -0.01, bags)):.1f} ms, "
            f"read of the touched bf16 rows {ms(lambda: F.embedding_bag(rows, hi, read_offsets, mode='sum')):.1f} ms"
        )

    order_by_width(op)


def order_by_width(op, pairs: int = 7) -> None:
    """Split-SGD by bag at 2 threads, multi-hot bags of 1..10 ids: lookup order vs sort + sorted."""
    torch.set_num_threads(2)
    rows_n, bags_n = 5_200_000, 2048 * 26  # mlperf-shape's rows and bags at every width
    for d in (16, 32, 64, 128, 256):
        lengths = torch.randint(1, 11, (bags_n,))
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        values = torch.randint(0, rows_n, (int(offsets[-1]),))
        hi, lo = torch.randn(rows_n, d).bfloat16(), torch.zeros(rows_n, d, dtype=torch.int16)
        grad = torch.randn(bags_n, d).bfloat16()

        def lookup_order():
            op(hi, lo, values, grad, -0.01, bag_of_each(offsets, len(values)))

        def sorted_rows():
            rows, order = values.sort(stable=True)
            op(hi, lo, rows, grad, -0.01, bag_of_each(offsets, len(values)).index_select(0, order))

        a, b = [], []
        for _ in range(pairs):
            a.append(ms(lookup_order, 5))
            b.append(ms(sorted_rows, 5))
        print(
            f"dim {d:3d}, {len(values):,} lookups, {rows_n:,} rows: lookup order {statistics.median(a):.2f} ms, "
            f"sort + sorted {statistics.median(b):.2f} ms (medians of {pairs} alternating runs)"
        )


if __name__ == "__main__":
    import argparse

    # no options: --help prints what it times and how to run it, and anything else is refused
    argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main()
