"""Bring-your-own data: any CSV/TSV (plain or .gz) or Parquet file with named columns ->
FeatureSpec dataset, with the same encoder (`dlrmkit.data.encoder.Vocabulary`) as the Criteo
path. Files are streamed in Arrow record batches: one pass counts valid rows (to place the test
split), one counts categories of the training rows, one encodes; memory is bounded by the
vocabulary."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlrmkit.data.encoder import CountAccumulator, Vocabulary, log_transform, to_string_array, value_counts
from dlrmkit.data.split_binary import SplitBinaryWriter
from dlrmkit.data.val_split import val_rows
from dlrmkit.errors import DlrmkitError

NUMBER_RE = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
REASONS = ("wrong_field_count", "bad_label", "bad_number")
BATCH_BYTES = 8 << 20


@dataclass
class TranscodeOptions:
    inputs: list[str]
    out: str
    label: str
    numerical: list[str]
    categorical: list[str]
    delimiter: str | None = None  # None: from the file suffix (.tsv -> tab, else comma)
    header: bool = True
    columns: list[str] | None = None
    test_rows: int | None = None
    test_fraction: float | None = None
    val_rows: int | None = None
    val_fraction: float | None = None
    frequency_threshold: int = 1
    max_table_size: int | None = None
    log: bool = False
    force: bool = False


@dataclass
class Report:
    read: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    first: list[str] = field(default_factory=list)

    def bad(self, reason: str, where: list[str]) -> None:
        self.skipped[reason] += len(where)
        self.first = (self.first + where)[:5]


def _is_parquet(path: str) -> bool:
    return path.endswith((".parquet", ".pq"))


def iter_batches(opts: TranscodeOptions, path: str, report: Report | None) -> Iterator[pa.Table]:
    """Record batches of one file with every needed column as strings."""
    needed = [opts.label, *opts.numerical, *opts.categorical]
    if _is_parquet(path):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        missing = [c for c in needed if c not in pf.schema_arrow.names]
        if missing:
            raise DlrmkitError(f"{path}: no column(s) {', '.join(missing)} (has: {', '.join(pf.schema_arrow.names)})")
        for b in pf.iter_batches(batch_size=1 << 16, columns=needed):
            yield pa.table({c: pc.cast(b.column(c), pa.string()) for c in needed})
        return
    import pyarrow.csv as pacsv

    delim = opts.delimiter or ("\t" if path.endswith((".tsv", ".tsv.gz")) else ",")
    line_of = {"n": 0}

    def on_invalid(row) -> str:
        if report is not None:
            where = f"{path}:{row.number}" if row.number is not None else path
            report.bad("wrong_field_count", [f"{where}: wrong_field_count ({row.actual_columns} fields, expected {row.expected_columns})"])
            report.read += 1
        return "skip"

    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=opts.columns if not opts.header else None,
                                           use_threads=False, block_size=BATCH_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=delim, invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(needed, pa.string()),
                                                 include_columns=needed, strings_can_be_null=False),
        )
    except pa.ArrowInvalid as exc:
        raise DlrmkitError(f"{path}: cannot read as delimited text ({str(exc).splitlines()[0]})") from None
    except (KeyError, pa.ArrowKeyError) as exc:
        raise DlrmkitError(f"{path}: missing column {exc}") from None
    try:
        for b in reader:
            line_of["n"] += b.num_rows
            yield pa.Table.from_batches([b])
    except pa.ArrowInvalid as exc:
        raise DlrmkitError(f"{path}: {str(exc).splitlines()[0]}") from None


def clean(opts: TranscodeOptions, t: pa.Table, report: Report | None, path: str, row0: int,
          rows_out: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
    """Valid rows only: labels (bool), numerical (float16) and categorical string columns.
    `rows_out` (for `predict`) receives the 1-based data-row numbers of the valid rows."""
    label = t.column(opts.label).combine_chunks()
    lab_ok = pc.fill_null(pc.match_substring_regex(label, NUMBER_RE), False).to_numpy(zero_copy_only=False)
    lab_val = np.full(len(label), -1.0)
    if lab_ok.any():
        lab_val[lab_ok] = pc.cast(label.filter(pa.array(lab_ok)), pa.float64()).to_numpy()
    lab_ok &= (lab_val == 0) | (lab_val == 1)
    num_ok = np.ones(len(label), dtype=bool)
    nums = []
    for c in opts.numerical:
        s = t.column(c).combine_chunks()
        empty = pc.fill_null(pc.equal(s, ""), True).to_numpy(zero_copy_only=False)
        ok = empty | pc.fill_null(pc.match_substring_regex(s, NUMBER_RE), False).to_numpy(zero_copy_only=False)
        num_ok &= ok
        vals = np.full(len(s), np.nan)
        fill = ok & ~empty
        if fill.any():
            vals[fill] = pc.cast(s.filter(pa.array(fill)), pa.float64()).to_numpy()
        nums.append(vals)
    if report is not None:
        report.read += len(label)
        for reason, rows in (("bad_label", np.flatnonzero(~lab_ok)), ("bad_number", np.flatnonzero(lab_ok & ~num_ok))):
            if len(rows):
                report.bad(reason, [f"{path}: data row {row0 + int(r) + 1}: {reason}" for r in rows[:5]])
                report.skipped[reason] += 0
    good = lab_ok & num_ok
    if rows_out is not None:
        rows_out.append(row0 + np.flatnonzero(good) + 1)
    dense = np.stack(nums, axis=1)[good] if nums else np.zeros((int(good.sum()), 0))
    if opts.log:
        dense = log_transform(dense)
    else:
        dense = np.nan_to_num(dense, nan=0.0).astype(np.float16)
    mask = pa.array(good)
    cats = [to_string_array(t.column(c).combine_chunks().filter(mask)) for c in opts.categorical]
    return lab_val[good] == 1, dense, cats


def iter_clean(opts: TranscodeOptions, report: Report | None) -> Iterator[tuple[np.ndarray, np.ndarray, list[pa.Array]]]:
    for path in opts.inputs:
        row0 = 0
        for t in iter_batches(opts, path, report):
            yield clean(opts, t, report, path, row0)
            row0 += t.num_rows


def transcode(opts: TranscodeOptions) -> tuple[Any, Report]:
    for p in opts.inputs:
        if not os.path.isfile(p):
            raise DlrmkitError(f"{p}: no such input file")
        if os.path.getsize(p) == 0:
            raise DlrmkitError(f"{p}: empty input file")
    if os.path.exists(opts.out) and not opts.force:
        raise DlrmkitError(f"{opts.out}: output folder already exists (pass --force to replace it)")
    if not opts.categorical and not opts.numerical:
        raise DlrmkitError("name at least one --numerical or --categorical column")
    report = Report()
    total = sum(len(lab) for lab, _, _ in iter_clean(opts, report))
    if total == 0:
        raise DlrmkitError(f"{', '.join(opts.inputs)}: no valid rows in the input")
    n_test = opts.test_rows or (int(round(opts.test_fraction * total)) if opts.test_fraction else 0)
    n_val = val_rows(opts.val_rows, opts.val_fraction, total - n_test)
    boundary = total - n_test - n_val  # train rows [0, boundary), val up to the test rows
    if boundary <= 0:
        raise DlrmkitError(f"--test-*/--val-* options leave no training rows ({total} valid rows)")
    acc, seen = CountAccumulator(len(opts.categorical)), 0
    for lab, _, cats in iter_clean(opts, None):
        take = max(0, min(len(lab), boundary - seen))
        if take:
            acc.add([value_counts(c.slice(0, take)) for c in cats])
        seen += len(lab)
    vocab = Vocabulary.build(opts.categorical, acc.result(), opts.frequency_threshold, opts.max_table_size,
                             extra={"numerical_columns": opts.numerical, "numerical_transform": "log1p" if opts.log else "none"})
    writer = SplitBinaryWriter(opts.out, len(opts.numerical), vocab.cardinalities, overwrite=opts.force, val=n_val > 0)
    try:
        seen = 0
        tables = [vocab.id_table(t) for t in range(len(opts.categorical))]
        for lab, dense, cats in iter_clean(opts, None):
            ids = np.stack([vocab.encode_column(t, c, tables[t]) for t, c in enumerate(cats)], axis=1) \
                if cats else np.zeros((len(lab), 0), np.int64)
            bounds = [0, boundary - seen, boundary + n_val - seen, len(lab)]
            bounds = [max(0, min(len(lab), b)) for b in bounds]
            for mapping, lo, hi in zip(("train", "val", "test"), bounds[:-1], bounds[1:]):
                if hi > lo:
                    writer.append(mapping, dense[lo:hi], ids[lo:hi], lab[lo:hi])
            seen += len(lab)
        vocab.save(writer.tmp_dir)
        meta = {
            "generator": "dlrmkit transcode", "source_files": [os.path.abspath(p) for p in opts.inputs],
            "label": opts.label, "numerical_columns": opts.numerical, "categorical_columns": opts.categorical,
            "frequency_threshold": opts.frequency_threshold, "max_table_size": opts.max_table_size,
            "vocabulary_rows": "train mapping only (val and test rows are never counted)",
            "numerical_transform": "missing/negative -> 0, log(1+x), float16" if opts.log else "missing -> 0, float16",
            "vocabulary": "vocabulary/",
            "preprocess": {"report": {"rows_read": report.read, "rows_written": total,
                                      "rows_skipped": report.skipped, "first_bad_rows": report.first}},
        }
        return writer.finish(meta), report
    except BaseException:
        writer.abort()
        raise


def _names(s: str | None) -> list[str]:
    return [c for c in (s or "").split(",") if c]


def transcode_from_args(args: argparse.Namespace) -> int:
    if not args.header and not args.columns:
        raise DlrmkitError("--no-header needs --columns a,b,c")
    opts = TranscodeOptions(
        inputs=args.input, out=args.out, label=args.label, numerical=_names(args.numerical),
        categorical=_names(args.categorical), delimiter=args.delimiter, header=args.header,
        columns=_names(args.columns) or None, test_rows=args.test_rows, test_fraction=args.test_fraction,
        val_rows=args.val_rows, val_fraction=args.val_fraction, frequency_threshold=args.frequency_threshold, max_table_size=args.max_table_size, log=args.log_transform,
        force=args.force,
    )
    spec, report = transcode(opts)
    n_skipped = sum(report.skipped.values())
    print(f"rows read {report.read:,}  written {sum(spec.metadata['rows'].values()):,}"
          f"  skipped {n_skipped:,}" + (" (" + ", ".join(f"{k} {v:,}" for k, v in report.skipped.items() if v) + ")" if n_skipped else ""))
    for pos in report.first:
        print(f"  bad row: {pos}")
    rows = spec.metadata["rows"]
    val = f" + {rows['val']:,} val" if "val" in rows else ""
    print(f"wrote {args.out}: {rows['train']:,} train{val} + {rows['test']:,} test rows, cardinalities {spec.cardinalities}")
    return 0
