"""What `dlrmkit preprocess criteo` was asked to do: one dataclass every pass reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrmkit.data.criteo_tsv import TASK_BYTES


@dataclass
class CriteoOptions:
    inputs: list[str]
    out: str
    frequency_threshold: int = 1
    max_table_size: int | None = None
    test_rows: int | None = None
    test_fraction: float | None = None
    test_files: list[str] = field(default_factory=list)
    val_rows: int | None = None  # validation rows carved before the test rows (val_split.py)
    val_fraction: float | None = None
    workers: int = 1
    strict: bool = False
    force: bool = False
    progress: bool = True
    task_bytes: int = TASK_BYTES
