"""Where `dlrmkit baseline` keeps its figures in a dataset folder, and how `dlrmkit train` reads
them back for its lift line; here, below both commands, so training never imports a command."""

from __future__ import annotations

import json
import os
from typing import Any

RESULT_FILE = "baseline.json"


def read_baseline(data: str, fingerprint: str) -> dict[str, Any] | None:
    """The stored baseline of a dataset folder, or None. `stale` is set in it when it was not
    made for the dataset of `fingerprint` (dlrmkit.data.fingerprint: the files changed since, or
    an older `dlrmkit baseline` wrote it without one), so its test figure is not comparable."""
    path = os.path.join(data, RESULT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        float(result["test_auc"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    result["path"] = path
    result["stale"] = result.get("dataset_fingerprint") != fingerprint
    return result
