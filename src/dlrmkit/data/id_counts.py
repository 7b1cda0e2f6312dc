"""`--min-id-count K`: ids seen fewer than K times in the training rows share id 0, the id that
rare, unseen and missing values already have. On small click logs most ids (users, queries) are
seen once; folded together they train one weight for "a rare value", which is also what an id
first seen at prediction time gets (docs/RECIPES.md measures it).

dlrmkit's preprocess and transcode number ids by descending count in the train mapping
(data/encoder.py), so the ids seen at least K times are 1..n and a table of n + 1 rows holds them:
the model's table t has `rows[t]` rows and a reader folds ids at or above it to 0
(SplitBinaryDataset.fold_ids; predict and evaluate fold the same way from the model's sizes).
"""

from __future__ import annotations

import numpy as np

from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.errors import DatasetError

BLOCK_ROWS = 1 << 18


def id_counts(train: SplitBinaryDataset) -> list[np.ndarray]:
    """How often each id of each table occurs in `train` (every row, checked as read)."""
    cards = [int(c) for c in train.cardinalities]
    counts = [np.zeros(c, np.int64) for c in cards]
    cols = train.id_columns
    for lo in range(0, len(train), BLOCK_ROWS):
        ids = train.read(lo, min(lo + BLOCK_ROWS, len(train))).ids
        for t, c in enumerate(cards):
            counts[t] += np.bincount(ids[:, cols[t] : cols[t + 1]].ravel(), minlength=c)
    return counts


def by_count(counts: list[np.ndarray]) -> int | None:
    """The first table whose ids 1.. are not numbered by descending count, or None."""
    return next((t for t, c in enumerate(counts) if (np.diff(c[1:]) > 0).any()), None)


def frequent_rows(train: SplitBinaryDataset, min_count: int, counts: list[np.ndarray] | None = None) -> list[int]:
    """Per table, 1 + the number of ids seen at least `min_count` times in the train mapping
    (`counts`: its id_counts, when already taken): the rows a model keeps with --min-id-count. One
    line naming the feature when the ids are not numbered by descending count (a FeatureSpec
    dataset made elsewhere)."""
    counts = id_counts(train) if counts is None else counts
    bad = by_count(counts)
    if bad is not None:
        raise DatasetError(
            f"{train.spec.base_directory}: feature '{train.spec.categorical_names[bad]}' is not numbered by "
            "descending training count (as dlrmkit's preprocess and transcode number ids), so --min-id-count "
            "cannot keep its frequent ids; use --min-id-count 1"
        )
    return [1 + int((c[1:] >= min_count).sum()) for c in counts]


def known_ids(counts: list[np.ndarray], held_out: SplitBinaryDataset, min_count: int) -> list[np.ndarray]:
    """Per table, whether each id is seen at least `min_count` times in the train mapping's rows
    outside `held_out` (rows of it, held out for validation; `counts`: the whole mapping's
    id_counts). Id 0 is always known: it is the fold's target."""
    held = id_counts(held_out)
    return [np.concatenate([[True], (c - h)[1:] >= min_count]) for c, h in zip(counts, held)]
