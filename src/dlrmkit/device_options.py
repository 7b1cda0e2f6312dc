"""The device section of `dlrmkit train`'s options: where one process trains, where its tables
live, its precision and threads (dlrmkit.device places the model as they say). Imports no torch:
the parser is built before a command is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.options import option

DEVICES = ("cpu", "cuda", "auto")
TABLE_PLACEMENTS = ("auto", "device", "host")
PRECISIONS = ("fp32", "bf16", "fp16")  # dlrmkit.precision's, which imports torch


@dataclass
class DeviceOptions:
    device: str = option(
        "cpu",
        "where to train: cpu, cuda (under torchrun GPU LOCAL_RANK, with NCCL) or auto "
        "(the GPU if torch sees one) (default {default})",
        choices=DEVICES,
    )
    table_placement: str = option(
        "auto",
        "one process on a GPU: tables on the GPU, in host memory (looked up "
        "there), or auto (the GPU when they fit in 80%% of its free memory) (default {default})",
        choices=TABLE_PLACEMENTS,
    )
    precision: str = option(
        "fp32",
        "autocast precision: bf16 on CPU/GPU; fp16 with dynamic loss scaling (GPU tensor cores; slow on "
        "CPUs without fp16 arithmetic) (default {default})",
        choices=PRECISIONS,
    )
    threads: int | None = option(
        None, "intra-op threads (default: torch's choice; 1 in the small-data recipe)", parse=ct.threads
    )
