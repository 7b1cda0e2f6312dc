"""Process-wide settings of the C allocator for training processes, set once at start-up by the CLI."""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks for reuse instead of handing them back to the kernel:
    blocks up to 32 MB (its largest mmap threshold) come from the heap, and the heap's top is trimmed
    only past 1 GB free. Each step frees and allocates the same activations, gradients and id
    buffers again; handed back, they are faulted in anew. Kept, mlperf-shape steps take almost no
    page faults and run faster (figures: docs/BENCHMARKS.md, allocator section). The cost
    is up to 1 GB of freed memory kept mapped. False where the C library is not glibc, or with
    DLRMKIT_KEEP_FREED_MEMORY=0."""
    if os.environ.get("DLRMKIT_KEEP_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)  # the C library this process already uses
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
