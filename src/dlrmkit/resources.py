"""Will it fit? Disk and memory checks made before a command starts writing or allocating, so
an option that asks for more than the machine holds is one line naming the option, not a full
disk or a process killed by the kernel halfway through."""

from __future__ import annotations

import os
import shutil

from dlrmkit.atomic_io import nearest_existing
from dlrmkit.errors import DlrmkitError


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def free_disk(path: str) -> int:
    return shutil.disk_usage(nearest_existing(os.path.dirname(os.path.abspath(path)) or ".")).free


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable), or physical memory where that is unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_disk(path: str, need: int, option: str) -> None:
    free = free_disk(path)
    if need > free:
        raise DlrmkitError(f"{option}: the output needs about {_human(need)} but {path} has {_human(free)} free")


def check_memory(need: int, option: str) -> None:
    avail = available_memory()
    if need > avail:
        raise DlrmkitError(f"{option}: needs about {_human(need)} of memory, {_human(avail)} is available")
