"""`--numerical-buckets N`: each numerical feature also read as a category, the index of its
value among N quantiles of the training rows (ties merged, so a feature with a few distinct
values gets fewer buckets), and every value held by VALUE_ROWS or more training rows (at most N
of them) in a bucket of its own. The model gives each bucket an embedding row and, with the wide term,
a first-order weight: a step function of the value beside the linear term, as gradient-boosted
trees and CTR libraries' bucketized counts have (docs/RECIPES.md measures it). The boundaries are
kept in the model's config (ModelConfig.numerical_buckets), so evaluate and predict bucket rows
exactly as training did; the bucket tables come after the dataset's own
(SplitBinaryDataset.with_buckets)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlrmkit.data.split_binary import SplitBinaryDataset

SAMPLE_ROWS = 1_000_000  # quantiles from at most this many training rows, spread over the mapping
BLOCK_ROWS = 1 << 16
VALUE_ROWS = 10  # a value held by this many sampled training rows gets a bucket of its own


def quantile_boundaries(train: SplitBinaryDataset, buckets: int) -> list[list[float]]:
    """Per numerical feature, the distinct inner N-quantiles of its training values (as stored)."""
    n = len(train)
    blocks = max(1, min(n, SAMPLE_ROWS) // BLOCK_ROWS)
    starts = np.unique(np.linspace(0, max(n - BLOCK_ROWS, 0), blocks).astype(np.int64))
    values = np.concatenate([train.read(int(s), min(int(s) + BLOCK_ROWS, n)).dense for s in starts]).astype(np.float32)
    qs = np.quantile(values, np.linspace(0, 1, buckets + 1)[1:-1], axis=0) if len(values) else np.zeros((0, 0))
    return [with_frequent_values(qs[:, j], values[:, j], buckets) for j in range(values.shape[1])]


def with_frequent_values(quantiles: np.ndarray, values: np.ndarray, most: int) -> list[float]:
    """`quantiles` plus a bucket of its own for each value held by VALUE_ROWS or more of the
    sampled rows (at most `most` of them, the most frequent): a boundary at the value and one at
    the next distinct value. Quantiles alone merge a feature's rare but telling values (a capital
    gain of 15,024 among 92% zeros) with their neighbours; trees split them out, so do these."""
    distinct, counts = np.unique(values, return_counts=True)
    frequent = np.flatnonzero(counts >= VALUE_ROWS)
    frequent = frequent[np.argsort(-counts[frequent], kind="stable")[:most]]
    after = distinct[np.minimum(frequent + 1, len(distinct) - 1)]
    # float32 before unique: two float64 quantiles that round to one float32 are one boundary
    return np.unique(np.concatenate([quantiles, distinct[frequent], after]).astype(np.float32)).tolist()


def model_view(dataset: SplitBinaryDataset, cfg: Any) -> SplitBinaryDataset:
    """`dataset` as a model of `cfg` (a ModelConfig) reads it: rare ids folded to 0 where its
    tables are smaller (--min-id-count), bucket tables appended (--numerical-buckets)."""
    n_cat = len(dataset.categorical)
    rows = list(cfg.table_sizes[:n_cat])
    if rows != [int(c) for c in dataset.cardinalities[:n_cat]]:
        dataset = dataset.fold_ids(rows)
    return dataset.with_buckets(cfg.numerical_buckets) if cfg.numerical_buckets else dataset


def reads(cfg: Any, data_rows: list[int]) -> bool:
    """Whether a model of `cfg` reads a dataset whose tables have `data_rows` rows: as many
    tables (bucket tables aside), each the same size or, trained with --min-id-count, smaller."""
    own = list(cfg.table_sizes[: len(cfg.table_sizes) - len(cfg.numerical_buckets or [])])
    if own == list(data_rows):
        return True
    return cfg.min_id_count > 1 and len(own) == len(data_rows) and all(m <= d for m, d in zip(own, data_rows))
