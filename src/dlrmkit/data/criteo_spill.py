"""Pass 1's parsed blocks on disk, read back by pass 2 instead of parsing the text again: one
Arrow IPC file per block (`<out>.spill/<task>.<block>.arrow`), about 140 bytes a row."""

from __future__ import annotations

import glob
import os
from typing import Iterator

import numpy as np
import pyarrow as pa

from dlrmkit.data.criteo_tsv import CAT_COLS, NUM_INT, Task


def spill_path(spill_dir: str, task: Task, block: int) -> str:
    return os.path.join(spill_dir, f"{task.index:07d}.{block:06d}.arrow")


def task_spills(task: Task, spill_dir: str) -> list[str]:
    """The spilled blocks of a task, in block order."""
    return sorted(glob.glob(os.path.join(spill_dir, f"{task.index:07d}.*.arrow")))


def write_spill(path: str, labels: np.ndarray, dense: np.ndarray, cats: list[pa.DictionaryArray]) -> None:
    """One block as an Arrow IPC file: labels, the float16 numerical matrix (26-byte rows), the
    dictionary-encoded categoricals."""
    n = len(labels)
    dense_arr = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(2 * NUM_INT), n, [None, pa.py_buffer(np.ascontiguousarray(dense).tobytes())]
    )
    batch = pa.record_batch([pa.array(labels), dense_arr, *cats], names=["label", "numerical", *CAT_COLS])
    with pa.OSFile(path + ".part", "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
        w.write_batch(batch)
    os.replace(path + ".part", path)


def iter_spill(task: Task, spill_dir: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[pa.DictionaryArray]]]:
    """(labels, dense float16 [n, 13], cats) of each spilled block of a task, memory-mapped."""
    for path in task_spills(task, spill_dir):
        with pa.memory_map(path) as src:
            b = pa.ipc.open_file(src).get_batch(0)
            n = b.num_rows
            dense_arr = b.column(1)
            dense = np.frombuffer(
                dense_arr.buffers()[1], dtype=np.float16, count=n * NUM_INT, offset=dense_arr.offset * 2 * NUM_INT
            ).reshape(n, NUM_INT)
            yield b.column(0).to_numpy(zero_copy_only=False), dense, list(b.columns[2:])


def remove_spill(task: Task, spill_dir: str) -> None:
    """Delete a task's spilled blocks once encoded, so the spill never holds the whole input."""
    for path in task_spills(task, spill_dir):
        os.remove(path)
