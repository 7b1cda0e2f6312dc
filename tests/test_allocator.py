"""keep_freed_memory: glibc keeps freed blocks for reuse, so a repeated allocation pattern like a
training step's faults far fewer pages in (counted by the kernel, not timed)."""

import platform
import subprocess
import sys

import pytest

from dlrmkit import allocator

PATTERN = """
import resource, sys
from dlrmkit.allocator import keep_freed_memory
tuned = keep_freed_memory()
import torch
def step():  # buffers of a step's sizes, freed at its end
    buffers = [torch.ones(n // 4) for n in (3 << 20, 9 << 20, 20 << 20, 30 << 20, 5 << 20)]
    del buffers
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(keep: str) -> tuple[bool, int]:
    """(whether the allocator was tuned, the page faults of 20 steps), with huge pages as the CLI sets them."""
    env = {
        "DLRMKIT_KEEP_FREED_MEMORY": keep,
        "THP_MEM_ALLOC_ENABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", PATTERN], env=env, capture_output=True, text=True, check=True).stdout
    tuned, count = out.split()
    return tuned == "True", int(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's; this C library is another")
def test_kept_memory_cuts_page_faults_of_repeated_steps():
    # the fewest of three runs each, alternated: what else runs on the machine moves the counts
    runs = [(faults("0"), faults("1")) for _ in range(3)]
    assert all(not off[0] and on[0] for off, on in runs)
    default, kept = min(off[1] for off, _ in runs), min(on[1] for _, on in runs)
    assert kept < default / 2, (kept, default)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("DLRMKIT_KEEP_FREED_MEMORY", "0")
    assert allocator.keep_freed_memory() is False
