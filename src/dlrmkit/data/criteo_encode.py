"""Pass 2 of Criteo preprocessing: encode every task's rows with the shared vocabulary into part
files (train rows, then test rows), concatenate them in task order into the split binary
dataset, carve the validation rows and write the FeatureSpec with the run's report."""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from dlrmkit.data.criteo_count import Pass1
from dlrmkit.data.criteo_spill import iter_spill, remove_spill
from dlrmkit.data.criteo_tsv import CAT_COLS, INT_COLS, NUM_CAT, NUM_INT, Bad, Task, iter_parsed, numerical_matrix
from dlrmkit.data.encoder import Vocabulary
from dlrmkit.data.feature_spec import TEST, TRAIN, FeatureSpec, categorical_dtype
from dlrmkit.data.split_binary import SplitBinaryWriter
from dlrmkit.data.val_split import carve_val

from dlrmkit.data.criteo_options import CriteoOptions


def part_path(part_dir: str, mapping: str, name: str, index: int) -> str:
    return os.path.join(part_dir, mapping, f"{name}.{index:07d}")


def encode_task(task: Task, vocab: Vocabulary, split_at: int, part_dir: str, spill_dir: str | None = None) -> int:
    """Encode a task; its first `split_at` valid rows go to train parts, the rest to test parts.
    With `spill_dir`, the blocks spilled by `count_task` are read (and removed) instead of the text."""
    dtypes = [categorical_dtype(c) for c in vocab.cardinalities]
    if spill_dir is not None:
        blocks: Iterable[tuple[np.ndarray, np.ndarray, list[pa.DictionaryArray]]] = iter_spill(task, spill_dir)
    else:
        blocks = ((p.labels, numerical_matrix(p.ints), p.cats) for p in iter_parsed(task, Bad()) if len(p.labels))
    handles: dict[str, dict[str, Any]] = {}
    for mapping in (TRAIN, TEST):
        os.makedirs(os.path.join(part_dir, mapping), exist_ok=True)
        handles[mapping] = {
            n: open(part_path(part_dir, mapping, n, task.index), "wb")
            for n in ["label.bin", "numerical.bin", *[f"cat_{t}.bin" for t in range(NUM_CAT)]]
        }
    rows = 0
    try:
        for labels, dense, cats in blocks:
            n = len(labels)
            ids = [vocab.encode_column(t, cats[t]).astype(dtypes[t]) for t in range(NUM_CAT)]
            cut = max(0, min(n, split_at - rows))
            for mapping, sl in ((TRAIN, slice(0, cut)), (TEST, slice(cut, n))):
                if sl.start == sl.stop:
                    continue
                h = handles[mapping]
                np.ascontiguousarray(labels[sl]).tofile(h["label.bin"])
                np.ascontiguousarray(dense[sl]).tofile(h["numerical.bin"])
                for t in range(NUM_CAT):
                    np.ascontiguousarray(ids[t][sl]).tofile(h[f"cat_{t}.bin"])
            rows += n
    finally:
        for h in handles.values():
            for f in h.values():
                f.close()
    if spill_dir is not None:
        remove_spill(task, spill_dir)
    return rows


def assemble(writer: SplitBinaryWriter, part_dir: str, tasks: list[Task]) -> None:
    """Concatenate the part files of every task, in task order, into the writer's files."""
    for mapping in (TRAIN, TEST):
        h = writer.handles[mapping]
        targets = {
            "label.bin": h["label"],
            "numerical.bin": h["numerical"],
            **{f"cat_{t}.bin": f for t, f in enumerate(h["categorical"])},
        }
        for name, out in targets.items():
            for task in tasks:
                p = part_path(part_dir, mapping, name, task.index)
                if os.path.exists(p):
                    with open(p, "rb") as src:
                        shutil.copyfileobj(src, out, 16 << 20)
                    os.remove(p)
        h["label"].flush()
        writer.rows[mapping] = os.path.getsize(h["label"].name)
    shutil.rmtree(part_dir, ignore_errors=True)


def build_metadata(opts: CriteoOptions, fp: dict, p1: Pass1, vocab: Vocabulary) -> dict[str, Any]:
    return {
        "generator": "dlrmkit preprocess criteo",
        "source_files": [s["path"] for s in fp["sources"]],
        "frequency_threshold": opts.frequency_threshold,
        "max_table_size": opts.max_table_size,
        "numerical_transform": "missing/negative -> 0, log(1+x), float16",
        "categorical_columns": CAT_COLS,
        "numerical_columns": INT_COLS,
        "vocabulary": "vocabulary/",
        "preprocess": {"fingerprint": fp, "report": p1.report()},
        "test_click_rate": None,
    }


def finish_dataset(
    opts: CriteoOptions, fp: dict, p1: Pass1, vocab: Vocabulary, encode_all: Callable[[str], None]
) -> FeatureSpec:
    writer = SplitBinaryWriter(opts.out, NUM_INT, vocab.cardinalities, overwrite=True, val=p1.val_rows > 0)
    try:
        part_dir = os.path.join(writer.tmp_dir, "parts")
        encode_all(part_dir)
        assemble(writer, part_dir, p1.tasks)
        carve_val(writer, p1.val_rows)
        vocab.save(writer.tmp_dir)
        meta = build_metadata(opts, fp, p1, vocab)
        for h in writer.handles.values():
            for f in [h["label"], h["numerical"], *h["categorical"]]:
                f.flush()
        labels = np.fromfile(writer.handles[TEST]["label"].name, dtype=np.bool_)
        meta["test_click_rate"] = float(labels.mean()) if len(labels) else None
        return writer.finish(meta)
    except BaseException:
        writer.abort()
        raise
