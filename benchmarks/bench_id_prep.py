"""The id bookkeeping of a multi-hot lookup at the bench models' shapes (batch 2048, bags of 1..10
ids), each against the plain torch call it replaced, timed alternately (medians of 15 runs of 20):

- each value's bag: embedding.bag_of_each (a 1 at every bag start, running sum) against
  torch.repeat_interleave(arange(bags), lengths);
- the sample-major reorder: scatter_ of the values to their new positions against index_put_
  (`out[positions] = values`, which is what JaggedIds.sample_major did before);
- the backward's stable sort of the ids: int32 keys against int64.

    python benchmarks/bench_id_prep.py
"""

from __future__ import annotations

import statistics
import time

import torch

from dlrmkit.commands.bench import BENCH_MODELS, random_batches
from dlrmkit.model.embedding import bag_of_each


def ms(fn, reps: int = 20) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def side_by_side(label: str, ours, theirs, pairs: int = 15) -> None:
    ours(), theirs()
    a, b = [], []
    for _ in range(pairs):
        a.append(ms(ours))
        b.append(ms(theirs))
    print(f"  {label}: {statistics.median(a):.3f} ms against {statistics.median(b):.3f} ms")


def index_put(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(values)
    out[positions] = values
    return out


def sample_major_positions(ids) -> torch.Tensor:
    """Where each table-major id goes in sample-major order (as JaggedIds.sample_major computes it)."""
    b, t, offsets = ids.batch_size, ids.num_tables, ids.offsets
    new_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), offsets.diff().view(t, b).t().reshape(-1).cumsum(0)])
    dest_bag = torch.arange(b * t).view(b, t).t().reshape(-1)
    shift = new_offsets[:-1].index_select(0, dest_bag) - offsets[:-1]
    return torch.arange(len(ids.values)) + shift.index_select(0, bag_of_each(offsets, len(ids.values)))


def main() -> None:
    torch.set_num_threads(2)
    for name, cfg in BENCH_MODELS.items():
        ids = random_batches(cfg, 2048, 1, 0)[0].ids
        n, offsets = len(ids.values), ids.offsets
        print(f"{name}: {n:,} ids in {len(offsets) - 1:,} bags")
        assert torch.equal(
            bag_of_each(offsets, n), torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
        )
        side_by_side(
            "bag of each value, bag_of_each vs repeat_interleave",
            lambda: bag_of_each(offsets, n),
            lambda: torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff()),
        )
        positions = sample_major_positions(ids)
        side_by_side(
            "reorder, scatter_ vs index_put_",
            lambda: torch.empty_like(ids.values).scatter_(0, positions, ids.values),
            lambda: index_put(ids.values, positions),
        )
        side_by_side(
            "stable sort, int32 keys (cast included) vs int64",
            lambda: ids.values.int().sort(stable=True),
            lambda: ids.values.sort(stable=True),
        )


if __name__ == "__main__":
    import argparse

    # no options: --help prints what it times and how to run it, and anything else is refused
    argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main()
