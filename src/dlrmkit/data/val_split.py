"""The validation mapping: rows carved from the end of the training rows, just before the test
rows, so time order is kept (MLPerf splits Criteo's day 23 the same way). Only training rows
count for the vocabulary: validation rows are held back with the test rows while counting, so an
id seen only there is "unseen" (id 0), exactly as it would be for new traffic."""

from __future__ import annotations

import os
import shutil
from typing import Callable

from dlrmkit.data.feature_spec import TEST, VAL
from dlrmkit.errors import DlrmkitError


def val_rows(rows: int | None, fraction: float | None, train_rows: Callable[[], int] | int) -> int:
    """Rows of the validation mapping: --val-rows N, or --val-fraction F of the rows before the test
    rows (`train_rows`, or a function that counts them, called only for a fraction)."""
    if rows is not None:
        if rows < 0:
            raise DlrmkitError(f"--val-rows must be >= 0, got {rows}")
        return rows
    if fraction is not None:
        if not 0 <= fraction < 1:
            raise DlrmkitError(f"--val-fraction must be in [0, 1), got {fraction}")
        n = train_rows() if callable(train_rows) else train_rows
        return int(round(fraction * n))
    return 0


def held_back(opts, count_train_lines: Callable[[], int]) -> tuple[int, int]:
    """(rows held back from the end of the inputs: validation + test, validation rows) for
    options with test_rows/test_fraction/val_rows/val_fraction (criteo.CriteoOptions)."""
    test_rows = opts.test_rows or 0
    if opts.test_fraction is not None:
        lines = count_train_lines()
        test_rows = int(round(opts.test_fraction * lines))
        count_train_lines = lambda: lines  # noqa: E731  (counted once)
    n_val = val_rows(opts.val_rows, opts.val_fraction, lambda: count_train_lines() - test_rows)
    return test_rows + n_val, n_val


def carve_val(writer, n_val: int) -> None:
    """Move the first `n_val` rows of the writer's test files into its val files (the test
    mapping was written as val rows followed by test rows). Streams; nothing is held in memory."""
    if n_val <= 0:
        return
    test, val = writer.handles[TEST], writer.handles[VAL]
    pairs = [(test["label"], val["label"], 1)]
    if test["numerical"] is not None:
        pairs.append((test["numerical"], val["numerical"], 2 * writer.spec_num_numerical))
    pairs += [(t, v, dt.itemsize) for t, v, dt in zip(test["categorical"], val["categorical"], writer.cat_dtypes)]
    for t, v, row_bytes in pairs:
        t.close()
        path = t.name
        with open(path, "rb") as src:
            _copy_bytes(src, v, n_val * row_bytes)
            with open(path + ".rest", "wb") as rest:
                shutil.copyfileobj(src, rest, 16 << 20)
        os.replace(path + ".rest", path)
    test["label"] = open(test["label"].name, "ab")
    if test["numerical"] is not None:
        test["numerical"] = open(test["numerical"].name, "ab")
    test["categorical"] = [open(f.name, "ab") for f in test["categorical"]]
    writer.rows[VAL] += n_val
    writer.rows[TEST] -= n_val


def _copy_bytes(src, dst, n: int) -> None:
    while n > 0:
        chunk = src.read(min(n, 16 << 20))
        if not chunk:
            raise DlrmkitError(f"{src.name}: fewer rows than the validation split needs")
        dst.write(chunk)
        n -= len(chunk)
