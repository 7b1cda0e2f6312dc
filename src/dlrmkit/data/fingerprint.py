"""A cheap fingerprint of a dataset, so `train --resume` can tell another dataset from the one a
checkpoint was trained on without reading 100 GB: the spec's content, and for every file it
names its size and the SHA-256 of its first and last MiB. Two datasets of the same shape made
from other rows (or with another seed) differ; a dataset copied or moved elsewhere does not."""

from __future__ import annotations

import hashlib
import json
import os

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
