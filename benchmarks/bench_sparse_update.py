"""Time the candidate kernels for a sparse SGD row update (w[ids] -= lr * g, duplicates summed) at
the bench models' shapes: index_add_, dense += sparse COO (what SparseSGD uses), index_put_ with
accumulate. Prints the median ms of each per thread count.

    THP_MEM_ALLOC_ENABLE=1 python benchmarks/bench_sparse_update.py [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SHAPES = {  # (table rows, dim, lookups per step at batch 2048, bags of 5.5 ids)
    "small": (8_000_000, 16, 90_000),
    "mlperf-shape": (5_200_000, 128, 290_000),
}


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, (rows, dim, n) in SHAPES.items():
            w = torch.randn(rows, dim)
            ids = torch.randint(0, rows, (n,)).sort().values
            g = torch.randn(n, dim)
            sparse = torch.sparse_coo_tensor(ids[None], g, (rows, dim), check_invariants=False)
            figures = {
                "index_add_": median_ms(lambda: w.index_add_(0, ids, g, alpha=-0.01)),
                "add_(sparse)": median_ms(lambda: w.add_(sparse, alpha=-0.01)),
                "index_put_(acc)": median_ms(lambda: w.index_put_((ids,), g, accumulate=True)),
            }
            print(f"{threads} thread(s) {name:12s} " + "  ".join(f"{k} {v:6.1f} ms" for k, v in figures.items()))


if __name__ == "__main__":
    main()
