"""Each rank on its own cores (parallel.dist.bind_cores), the dense gradient buckets' layout
(in backward's order, one dtype each), and the note train prints when a CPU job has too few
samples per rank for model parallelism to pay."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dlrmkit.parallel.grad_buckets import GradBuckets
from dlrmkit.parallel.transport import LocalCollectives

BIND = """
import json, os, sys, threading, time
from dlrmkit.parallel.dist import bind_cores
stop = threading.Event()
early = threading.Thread(target=stop.wait)  # a thread started before the binding
early.start()
got = bind_cores(int(sys.argv[1]), int(sys.argv[2]))
later = {}
t = threading.Thread(target=lambda: later.update(cores=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
early_cores = sorted(os.sched_getaffinity(early.native_id))
stop.set(); early.join()
print(json.dumps({"got": got, "main": sorted(os.sched_getaffinity(0)), "early": early_cores, "later": later["cores"]}))
"""


def bind(local_rank: int, local_world: int) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-c", BIND, str(local_rank), str(local_world)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux's affinity API (os.sched_getaffinity)")
def test_every_thread_of_a_rank_goes_to_its_share_of_the_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs at least 2 usable cores to give 2 ranks a share each")
    shares = [bind(r, 2) for r in range(2)]
    for s in shares:
        assert s["got"] and s["main"] == s["got"] and s["early"] == s["got"] and s["later"] == s["got"]
    assert sorted(shares[0]["got"] + shares[1]["got"]) == cores  # disjoint shares covering all the cores
    assert max(shares[0]["got"]) < min(shares[1]["got"])  # contiguous, by local rank


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux's affinity API (os.sched_getaffinity)")
def test_more_ranks_than_cores_leaves_the_process_unbound():
    many = len(os.sched_getaffinity(0)) + 1
    s = bind(0, many)
    assert s["got"] is None and s["main"] == sorted(os.sched_getaffinity(0))


def test_buckets_fill_in_backward_order_one_dtype_each():
    # backward produces gradients last layer first: buckets are filled in reverse order
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (300, 300, 300, 100, 100)]  # 4 bytes each
    buckets = GradBuckets(params, bucket_bytes=2000, transport=LocalCollectives())
    sizes = [[p.numel() for p in b] for b in buckets.buckets]
    assert sizes == [[100, 100, 300], [300, 300]]  # a bucket closes once it holds >= 2000 B
    one = GradBuckets(params, bucket_bytes=1 << 20, transport=LocalCollectives())
    assert [[p.numel() for p in b] for b in one.buckets] == [[100, 100, 300, 300, 300]]
    mixed = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))]
    assert (
        len(GradBuckets(mixed, bucket_bytes=1 << 20, transport=LocalCollectives()).buckets) == 2
    )  # one flat tensor each


def test_small_batch_note_names_samples_per_rank_on_cpu_only():
    from dlrmkit.parallel.dist import MIN_SAMPLES_PER_RANK_CPU, small_batch_note

    note = small_batch_note(128, 2, "cpu")
    assert note is not None and "64 samples per rank" in note and "--batch-size" in note
    assert small_batch_note(1001, 3, "cpu") is not None  # 333 per rank
    assert small_batch_note(2 * MIN_SAMPLES_PER_RANK_CPU, 2, "cpu") is None  # enough per rank
    assert small_batch_note(128, 2, "cuda") is None  # GPUs: not what the CPU figure says
    assert small_batch_note(128, 1, "cpu") is None  # one process: nothing split
