"""Microbenchmark of split-SGD's sparse row update alone, at mlperf-shape sizes.

26 tables x 200k rows fused into one 5.2M x 128 table, ~290k sorted lookups (one bf16 gradient
row each, as PooledLookup produces), 1 thread by default. Prints median wall ms and CPU ms
(time.process_time, which is less disturbed by other jobs on a shared machine) for:
old (pure torch: unique + gathers + stack + index_add_ + scatters), torch-int32 (the same with
int32 joins instead of stack) and fused (the C++ kernel in dlrmkit.optim.split_sgd_kernel).

    python benchmarks/bench_split_sgd_update.py [--rows 5200000] [--lookups 290000] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dlrmkit.optim.split_sgd import SplitSGD, split_fp32
from dlrmkit.optim.split_sgd_kernel import fused_kernel


def torch_int32_sparse_step(
    hi: torch.Tensor, lo: torch.Tensor, rows: torch.Tensor, values: torch.Tensor, lr: float
) -> None:
    """Option (a), kept here for the record: the pure-torch update with int32 shift/or joins and
    splits instead of stack + strided half views (measured slower: four extra dtype passes)."""
    uniq, inverse = torch.unique_consecutive(rows, return_inverse=True)
    joined = hi.view(torch.int16).index_select(0, uniq).to(torch.int32).bitwise_left_shift_(16)
    joined.bitwise_or_(lo.index_select(0, uniq).to(torch.int32).bitwise_and_(0xFFFF))
    joined.view(torch.float32).index_add_(0, inverse, values.float(), alpha=-lr)
    lo.index_copy_(0, uniq, joined.to(torch.int16))  # int32 -> int16 keeps the low 16 bits
    hi.view(torch.int16).index_copy_(0, uniq, joined.bitwise_right_shift_(16).to(torch.int16))


def pure_torch_step(hi, lo, grad, lr) -> None:
    """SplitSGD's sparse step with the fused kernel switched off (the path it had before)."""
    os.environ["DLRMKIT_SPLIT_SGD_KERNEL"] = "0"
    try:
        SplitSGD._sparse_step(hi, lo, grad, lr)
    finally:
        del os.environ["DLRMKIT_SPLIT_SGD_KERNEL"]


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rows", type=int, default=26 * 200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lookups", type=int, default=290_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    w = torch.empty(args.rows, args.dim).uniform_(-0.05, 0.05, generator=gen)
    hi, lo = split_fp32(w)
    del w
    rows = torch.randint(0, args.rows, (args.lookups,), generator=gen).sort()[0]
    values = (torch.randn(args.lookups, args.dim, generator=gen) * 1e-3).bfloat16()
    grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, (args.rows, args.dim), check_invariants=False)
    kernel = fused_kernel()
    variants = {
        "old": lambda: pure_torch_step(hi, lo, grad, 0.01),
        "torch-int32": lambda: torch_int32_sparse_step(hi, lo, rows, values, 0.01),
    }
    if kernel is not None:
        variants["fused"] = lambda: SplitSGD._sparse_step(hi, lo, grad, 0.01)
    print(
        f"table {args.rows} x {args.dim}, {args.lookups} sorted lookups "
        f"({rows.unique().numel()} unique rows), threads={args.threads}, reps={args.reps}"
    )
    for name, fn in variants.items():
        fn()  # warm-up
        wall, cpu = [], []
        for _ in range(args.reps):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        print(
            f"{name:12s} median {statistics.median(wall):8.1f} ms wall  {statistics.median(cpu):8.1f} ms CPU"
            f"  (min {min(wall):.1f} ms)"
        )


if __name__ == "__main__":
    main()
