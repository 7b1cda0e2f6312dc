"""Where `dlrmkit baseline` keeps its figures in a dataset folder, and how `dlrmkit train` reads
them back for its lift line; here, below both commands, so training never imports a command."""

from __future__ import annotations

import os
from typing import Any

from dlrmkit.errors import DlrmkitError
from dlrmkit.untrusted import load_json

RESULT_FILE = "baseline.json"


def read_baseline(data: str, fingerprint: str) -> dict[str, Any] | None:
    """The stored baseline of a dataset folder, or None (also for a file that is not one: it comes
    with the dataset, so it is read bounded, only as a regular file, its figures numbers). `stale` is set in it when it was not
    made for the dataset of `fingerprint` (dlrmkit.data.fingerprint: the files changed since, or
    an older `dlrmkit baseline` wrote it without one), so its test figure is not comparable."""
    path = os.path.join(data, RESULT_FILE)
    if not os.path.lexists(path):
        return None
    try:  # a FIFO would block the end of a run; an oversized file, fill its memory
        result = load_json(path, "baseline result", 1 << 20)
    except DlrmkitError:
        return None

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not isinstance(result, dict) or not number(result.get("test_auc")):
        return None
    if not (result.get("refit_test_auc") is None or number(result["refit_test_auc"])):
        return None
    result["path"] = path
    result["stale"] = result.get("dataset_fingerprint") != fingerprint
    return result
