"""A cheap fingerprint of a dataset, so `train --resume` can tell another dataset from the one a
checkpoint was trained on without reading 100 GB: the spec's content, and for every file it
names its size and the SHA-256 of its first and last MiB. Two datasets of the same shape made
from other rows (or with another seed) differ; a dataset copied or moved elsewhere does not."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable

import pyarrow as pa

from dlrmkit.data.feature_spec import FeatureSpec

EDGE = 1 << 20  # bytes hashed at each end of a file


def dataset_fingerprint(spec: FeatureSpec) -> str:
    h = hashlib.sha256()
    doc = spec.to_dict()
    h.update(json.dumps(doc, sort_keys=True, default=str).encode())
    names = sorted(
        {f for chunks in (spec.source_spec or {}).values() for c in chunks or [] for f in c.get("files") or []}
    )
    for name in names:
        path = os.path.join(spec.base_directory, name)
        h.update(name.encode() + b"\0")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                h.update(str(size).encode() + b"\0")
                h.update(f.read(EDGE))
                if size > EDGE:
                    f.seek(max(EDGE, size - EDGE))
                    h.update(f.read(EDGE))
        except OSError:
            h.update(b"missing\0")
    return h.hexdigest()


def vocabulary_fingerprint(columns: list[str], max_table_size: Any, tables: Iterable[pa.Array]) -> str:
    """What `predict` reads of a dataset to turn a raw value into an id: the vocabulary's columns,
    its table size cap and each table's values in id order (dlrmkit.data.encoder.Vocabulary), not
    the dataset's rows nor how the Arrow files are laid out: a dataset made again from the same
    rows matches, one whose values read as other ids does not. `tables` may be read one at a time."""
    import numpy as np

    h = hashlib.sha256()
    h.update(json.dumps([columns, max_table_size]).encode())
    for values in tables:  # a string array: its length, its offsets (from 0) and the bytes they span
        h.update(f"\0{len(values)}\0".encode())
        if not len(values):
            continue
        _, offsets, data = values.buffers()[:3]
        at = np.frombuffer(offsets, np.int32)[values.offset : values.offset + len(values) + 1].astype(np.int64)
        h.update((at - at[0]).tobytes())
        h.update(memoryview(data)[at[0] : at[-1]] if data is not None else b"")
        if values.null_count:
            h.update(np.packbits(values.is_null().to_numpy(zero_copy_only=False)).tobytes())
    return h.hexdigest()


def dataset_vocabulary_fingerprint(data: str) -> str | None:
    """The vocabulary fingerprint of the dataset in folder `data`, its tables read one at a time,
    or None where it has no vocabulary (synth's and NVIDIA's datasets: predict reads no raw rows
    for them)."""
    from dlrmkit.data.encoder import VOCAB_DIR, VOCAB_FILE, Vocabulary

    if not any(os.path.exists(os.path.join(data, *p, VOCAB_FILE)) for p in ((), (VOCAB_DIR,))):
        return None
    doc, tables = Vocabulary.read_tables(data)
    return vocabulary_fingerprint(list(doc["columns"]), doc.get("max_table_size"), (v for v, _ in tables))
