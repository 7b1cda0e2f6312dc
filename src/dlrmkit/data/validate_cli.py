"""Check every file of a dataset against its FeatureSpec (sizes, dtypes, ids < cardinality,
labels in {0, 1}) and print a summary: rows per mapping, click rate, and per table its
cardinality and the share of lookups that hit its top 1% of ids."""

from __future__ import annotations

import argparse

import numpy as np

from dlrmkit import cli_types as ct
from dlrmkit.data.feature_spec import TEST, TRAIN, VAL
from dlrmkit.data.split_binary import open_dataset, open_val
from dlrmkit.errors import DatasetError

CHUNK = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, type=ct.path, help="dataset folder holding feature_spec.yaml")


def validate(path: str) -> dict:
    """Read every row once (chunked, memory-mapped); raise DatasetError at the first bad value."""
    spec, train, test = open_dataset(path)
    cards = spec.cardinalities
    summary: dict = {"mappings": {}, "tables": []}
    hist = [np.zeros(c, dtype=np.int64) for c in cards]
    val = open_val(spec)
    for name, ds in ((TRAIN, train), *(((VAL, val),) if val is not None else ()), (TEST, test)):
        clicks = 0
        raw_label = ds.label
        for start in range(0, ds.rows, CHUNK):
            end = min(start + CHUNK, ds.rows)
            lab = raw_label.read(start, end)[:, 0]
            v = lab.view(np.uint8) if lab.dtype.itemsize == 1 else lab  # a bool file may hold any byte
            if (v > 1).any() or (v < 0).any():
                row = int(np.flatnonzero((v > 1) | (v < 0))[0])
                raise DatasetError(f"{raw_label.files[0]}: row {start + row} has label {int(v[row])}, not 0 or 1")
            clicks += int(lab.astype(bool).sum())
            batch = ds.read(start, end, check_ids=True)
            if batch.dense.size and not np.isfinite(batch.dense.astype(np.float32)).all():
                row = int(np.flatnonzero(~np.isfinite(batch.dense.astype(np.float32)).all(axis=1))[0])
                raise DatasetError(f"{name}: numerical row {start + row} holds NaN or infinity")
            for t in range(len(cards)):
                hist[t] += np.bincount(batch.ids[:, t].astype(np.int64), minlength=cards[t])
        summary["mappings"][name] = {"rows": ds.rows, "click_rate": clicks / ds.rows if ds.rows else None}
    for t, (name, c) in enumerate(zip(spec.categorical_names, cards)):
        counts = np.sort(hist[t])[::-1]
        k = max(1, int(np.ceil(0.01 * c)))
        total = counts.sum()
        summary["tables"].append(
            {"name": name, "cardinality": c, "top1pct_share": float(counts[:k].sum() / total) if total else 0.0}
        )
    return summary


def run(args: argparse.Namespace) -> int:
    s = validate(args.data)
    print(f"{args.data}: OK (every file matches its FeatureSpec; ids < cardinality; labels in {{0,1}})")
    for name, m in s["mappings"].items():
        rate = f"{m['click_rate']:.4f}" if m["click_rate"] is not None else "n/a"
        print(f"  {name}: {m['rows']:,} rows, click rate {rate}")
    print(f"  {'table':<14}{'cardinality':>14}{'top-1% ids share':>20}")
    for t in s["tables"]:
        print(f"  {t['name']:<14}{t['cardinality']:>14,}{t['top1pct_share']:>20.3f}")
    return 0
