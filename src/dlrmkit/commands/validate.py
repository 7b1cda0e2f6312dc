"""Check every file of a dataset against its FeatureSpec (sizes, dtypes, ids < cardinality,
labels in {0, 1}) and print a summary: rows per mapping, click rate, and per table its
cardinality, the share of lookups that hit its top 1% of ids, and the share of the test rows'
lookups the training rows never made (or id 0, the value a vocabulary does not hold: an unseen
or rare value of a transcoded or preprocessed dataset). A table whose test ids are mostly new is
a time stamp or a row id the model cannot learn from: a note names a table whose test ids are
nearly all new."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from dlrmkit import cli_types as ct
from dlrmkit.data.feature_spec import SPEC_FILE, TEST, TRAIN, VAL
from dlrmkit.data.split_binary import open_dataset, open_val
from dlrmkit.errors import DatasetError
from dlrmkit.options import add_options, option

CHUNK = 1 << 20


@dataclass
class ValidateOptions:
    data: str = option(help="dataset folder holding feature_spec.yaml", parse=ct.path, required=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ValidateOptions)


class IdCounts:
    """Lookups per id of one table: a dense histogram when the cardinality is at most the rows
    read (no more ids can occur), else counts of the ids seen, so memory follows the data and
    never a FeatureSpec's claimed cardinality (2**40 would ask for 8 TiB)."""

    def __init__(self, cardinality: int, rows: int):
        self.dense = np.zeros(cardinality, dtype=np.int64) if cardinality <= max(rows, 1 << 16) else None
        self.ids, self.counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # merged when as long as the counts so far

    def add(self, ids: np.ndarray) -> None:
        ids = ids.astype(np.int64)
        if self.dense is not None:
            self.dense += np.bincount(ids, minlength=len(self.dense))
            return
        self.pending.append(np.unique(ids, return_counts=True))
        if sum(len(u) for u, _ in self.pending) >= max(len(self.ids), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        ids = np.concatenate([self.ids, *(u for u, _ in self.pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self.pending)])
        self.ids, inv = np.unique(ids, return_inverse=True)
        self.counts = np.bincount(inv, weights=counts, minlength=len(self.ids)).astype(np.int64)
        self.pending = []

    def seen(self, zero_unknown: bool = True) -> "SeenIds":
        """The ids counted so far, to ask of others whether they are among them (`zero_unknown`:
        id 0 is the vocabulary's unknown value, new wherever it occurs)."""
        if self.dense is None:
            self._merge()
            return SeenIds(None, self.ids.copy(), zero_unknown)
        return SeenIds(self.dense > 0, None, zero_unknown)

    def sorted_counts(self) -> np.ndarray:
        if self.dense is None:
            self._merge()
        return np.sort(self.dense if self.dense is not None else self.counts)[::-1]


@dataclass
class SeenIds:
    """The ids one mapping's rows hold: a mask over the ids (dense) or the sorted ids (sparse).
    `zero_unknown`: id 0 is the unknown value (a dataset `transcode` or `preprocess` made, whose
    vocabulary maps an unseen or rare value there); elsewhere (synth, NVIDIA's) an id like any other."""

    mask: np.ndarray | None
    ids: np.ndarray | None
    zero_unknown: bool = True

    def new(self, ids: np.ndarray) -> int:
        """How many of `ids` are not among them, or are id 0 (the unknown value, with `zero_unknown`)."""
        ids = ids.astype(np.int64)
        if self.mask is not None:
            known = self.mask[ids]
        else:
            at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
            known = self.ids[at] == ids if len(self.ids) else np.zeros(len(ids), bool)
        return int(np.count_nonzero(~known | (ids == 0) if self.zero_unknown else ~known))


def zero_unknown(spec) -> bool:
    """Whether id 0 is the unknown value of the dataset's vocabulary (made by transcode or preprocess)."""
    generator = (spec.metadata or {}).get("generator")
    return isinstance(generator, str) and generator.startswith(("dlrmkit transcode", "dlrmkit preprocess"))


MOSTLY_NEW = 0.95  # a table whose test lookups are nearly all new to training gets a note (a user id: 0.75 on kdd12)


def check_rows(spec, datasets: dict) -> None:
    """The train mapping has rows, and metadata.rows (when the spec has it) tells the truth."""
    if not len(datasets[TRAIN]):
        raise DatasetError(f"{spec.base_directory}: the train mapping has no rows (train and baseline need some)")
    claimed = spec.metadata.get("rows") or {}
    for name, ds in datasets.items():
        if name in claimed and claimed[name] != len(ds):
            raise DatasetError(
                f"{spec.base_directory}/{SPEC_FILE}: metadata.rows.{name} is {claimed[name]:,}, "
                f"but the {name} files hold {len(ds):,} rows"
            )


def validate(path: str) -> dict:
    """Read every row once (chunked); raise DatasetError at the first bad value."""
    spec, train, test = open_dataset(path)
    cards = spec.cardinalities
    summary: dict = {"mappings": {}, "tables": [], "zero_unknown": zero_unknown(spec)}
    val = open_val(spec)
    datasets = {TRAIN: train, **({VAL: val} if val is not None else {}), TEST: test}
    check_rows(spec, datasets)
    hist = [IdCounts(c, sum(len(d) for d in datasets.values())) for c in cards]
    seen: list[SeenIds] = []  # the training rows' ids per table, once the train mapping is read
    new, lookups = np.zeros(len(cards), np.int64), np.zeros(len(cards), np.int64)  # the test rows'
    for name, ds in datasets.items():  # the train mapping first
        clicks = 0
        for start in range(0, ds.rows, CHUNK):
            end = min(start + CHUNK, ds.rows)
            # ids, labels and numerical values checked as train reads them: the first bad one is
            # named by its own file (a mapping may span several chunk files) and row
            batch = ds.read(start, end, check_ids=True)
            clicks += int(np.count_nonzero(batch.labels))
            for t in range(len(cards)):  # a multi-hot table's columns: every id of its bags
                ids = batch.ids[:, ds.id_columns[t] : ds.id_columns[t + 1]].reshape(-1)
                hist[t].add(ids)
                if name == TEST:
                    new[t] += seen[t].new(ids)
                    lookups[t] += len(ids)
        if name == TRAIN:
            seen = [h.seen(summary["zero_unknown"]) for h in hist]
        summary["mappings"][name] = {"rows": ds.rows, "click_rate": clicks / ds.rows if ds.rows else None}
    columns = source_columns(spec)
    for t, (name, c) in enumerate(zip(spec.categorical_names, cards)):
        counts = hist[t].sorted_counts()
        k = max(1, int(np.ceil(0.01 * c)))
        total = counts.sum()
        summary["tables"].append(
            {"name": name, "column": columns[t] if columns else None, "cardinality": c,
             "top1pct_share": float(counts[:k].sum() / total) if total else 0.0,
             "test_new_share": float(new[t] / lookups[t]) if lookups[t] else None}
        )  # fmt: skip
    return summary


def source_columns(spec) -> list[str] | None:
    """The raw columns the tables were made from, as `transcode` records them (metadata
    `categorical_columns`, one per table, in order), shown as text: None where the spec has no such
    list (other writers) or its length does not match the tables."""
    names = spec.metadata.get("categorical_columns")
    if not isinstance(names, list) or len(names) != len(spec.categorical_names):
        return None
    return [n if isinstance(n, str) and n.isprintable() and len(n) <= 40 else repr(n)[:40] for n in names]


def run(args: argparse.Namespace) -> int:
    s = validate(args.data)
    print(f"{args.data}: OK (every file matches its FeatureSpec; ids < cardinality; labels in {{0,1}})")
    for name, m in s["mappings"].items():
        rate = f"{m['click_rate']:.4f}" if m["click_rate"] is not None else "n/a"
        print(f"  {name}: {m['rows']:,} rows, click rate {rate}")
    print(f"  {'table':<14}{'cardinality':>14}{'top-1% ids share':>20}{'test ids new':>15}")
    for t in s["tables"]:
        column = f"  (column {t['column']})" if t["column"] is not None else ""
        fresh = "n/a" if t["test_new_share"] is None else f"{t['test_new_share']:.3f}"
        print(f"  {t['name']:<14}{t['cardinality']:>14,}{t['top1pct_share']:>20.3f}{fresh:>15}{column}")
    unknown = ", or of id 0, the unknown value" if s["zero_unknown"] else ""
    print(f"  (test ids new: the test rows' lookups of an id no training row holds{unknown})")
    for t in s["tables"]:
        if t["test_new_share"] is not None and t["test_new_share"] > MOSTLY_NEW:
            print(new_ids_note(t["name"] + (f" (column {t['column']})" if t["column"] is not None else ""), t["test_new_share"]))
    return 0


def new_ids_note(table: str, share: float) -> str:
    return (
        f"note: {table}: {share:.0%} of the test rows' ids are new to the training rows (a time stamp, a row "
        "id, or groups the test rows do not share?): the model learns nothing there that it can use on new rows; "
        "leave the column out, or derive a coarser one from it (a time stamp's hour of the day)"
    )


def unknown_in_test(path: str) -> list[float]:
    """Per table, the share of the test rows' lookups of id 0: in a dataset whose vocabulary holds
    the training rows' values (transcode, preprocess), the values it does not hold. Reads the test
    mapping's ids only."""
    spec, _, test = open_dataset(path)
    zeros = np.zeros(len(spec.cardinalities), np.int64)
    for start in range(0, test.rows, CHUNK):
        ids = test.read(start, min(start + CHUNK, test.rows), check_ids=False).ids
        for t in range(len(zeros)):
            zeros[t] += np.count_nonzero(ids[:, test.id_columns[t] : test.id_columns[t + 1]] == 0)
    per_table = np.diff(np.asarray(test.id_columns)) * test.rows
    return [float(z / n) if n else 0.0 for z, n in zip(zeros, per_table)]
