"""The tables a model of the dataset has, as `dlrmkit train` builds them and `dlrmkit plan --data`
plans them: the dataset's own, cut to their frequent ids with --min-id-count (data/id_counts.py),
then one bucket table per numerical feature with --numerical-buckets (data/numerical_buckets.py).
Both figures are label-free and taken over the whole train mapping, so train and plan get the
same sizes for the same options."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.errors import DlrmkitError


@dataclass
class ModelTables:
    rows: list[int]  # the dataset's own tables, as the model keeps them (fewer rows with --min-id-count)
    counts: list[np.ndarray] | None  # the train mapping's id_counts, taken for --min-id-count, else None
    buckets: list[list[float]] | None  # --numerical-buckets: each numerical feature's boundaries, else None

    @property
    def sizes(self) -> list[int]:
        """Every table's rows: the dataset's, then the bucket tables'."""
        return [*self.rows, *(len(b) + 1 for b in self.buckets or [])]


def model_tables(
    data: str, train: SplitBinaryDataset, min_id_count: int | None, numerical_buckets: int | None
) -> ModelTables:
    """The tables of a model with these options of the dataset `data` whose train mapping is
    `train`; one line when it has none (no categorical feature and no --numerical-buckets)."""
    from dlrmkit.data.id_counts import frequent_rows, id_counts
    from dlrmkit.data.numerical_buckets import quantile_boundaries

    rows, counts, buckets = [int(c) for c in train.cardinalities], None, None
    if (min_id_count or 1) > 1:
        counts = id_counts(train)
        rows = frequent_rows(train, min_id_count, counts)
    if (numerical_buckets or 0) > 0 and train.num_numerical:
        buckets = quantile_boundaries(train, numerical_buckets)
    tables = ModelTables(rows, counts, buckets)
    if not tables.sizes:
        raise DlrmkitError(
            f"{data}: no categorical features, so the model has no table to look up: give "
            "--numerical-buckets N (each numerical feature also read as a category), or transcode some "
            "columns as --categorical"
        )
    return tables
