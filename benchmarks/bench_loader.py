"""Loader throughput: samples/s reading a split binary dataset into torch batches (the
trainer's path: contiguous batches, one positioned read per file, converted in a background
thread).

    python benchmarks/bench_loader.py --data DIR --batch-size 2048 65536
"""

from __future__ import annotations

import argparse
import time

from dlrmkit.allocator import keep_freed_memory
from dlrmkit.data.loader import Prefetcher, batch_bounds, to_batch
from dlrmkit.data.split_binary import open_dataset


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, nargs="+", default=[2048, 65536])
    a = p.parse_args()
    keep_freed_memory()  # as the CLI does: each batch's arrays reuse freed pages, not fresh ones
    _, train, _ = open_dataset(a.data)
    for bs in a.batch_size:
        bounds = batch_bounds(len(train), bs, drop_last=True)
        for warm in (True, False):  # first pass warms the page cache
            t0, n = time.perf_counter(), 0
            for batch in Prefetcher(to_batch(train.read(s, e)) for s, e in bounds):
                n += len(batch)
            dt = time.perf_counter() - t0
        print(f"batch {bs:>6}: {n / dt:>14,.0f} samples/s  ({n:,} samples in {dt:.2f} s)")


if __name__ == "__main__":
    main()
