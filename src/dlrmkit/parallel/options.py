"""Whether torchrun started this process, without importing torch: `dlrmkit --help` and the data
commands decide this before torch loads (a second of start-up per command)."""

from __future__ import annotations

import os


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ
