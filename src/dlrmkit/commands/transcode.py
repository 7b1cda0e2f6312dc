"""Turn any CSV/TSV/Parquet file with named columns into a FeatureSpec dataset (same encoder as
`dlrmkit preprocess criteo`). One line is one row; a field in CSV quotes may hold the delimiter.

Bad rows (a wrong field count, a label other than 0/1 or the --label-values, a numerical value that is not a number or
is beyond the storage type's range, bytes that are not UTF-8) are skipped and counted by reason;
the first five are listed as file:line with the column and its value. When more than half of the
rows read are bad, nothing is written: the run stops with exit code 2 and one line naming the
reason and column behind most of them (a --numerical column holding ids or words belongs in
--categorical).

A categorical value longer than 1,024 bytes is read as its first 32 characters and its SHA-256
(equal values stay equal; the vocabulary holds a few hundred bytes per value); the rows so read are
counted by column and printed, and `predict` reads its rows by the same rule.

The held-out rows are the last valid rows in file order, or with --split-by COL the latest by that
column (a time stamp: numbers or ISO dates/times), so files in any order split by time; the
dataset records which (`split` in its metadata)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError, one_line
from dlrmkit.options import add_options, option


@dataclass
class TranscodeOptions:
    input: list[str] = option(
        help="input files (.csv, .tsv, .parquet; .gz for text)", parse=ct.path, required=True, nargs="+"
    )
    out: str = option(help="output dataset folder", parse=ct.path, required=True)
    label: str = option(help="label column (values 0/1; others are counted bad rows)", parse=ct.text, required=True)
    label_values: tuple[str, str] | None = option(
        None,
        "NEG,POS: the label column's two values read as 0 and 1 (for example no,yes or False,True; "
        "--label-values=-1,1 for -1/1); "
        "any other value is a bad row",
        parse=ct.label_values,
    )
    numerical: str = option("", "comma-separated numerical (float) columns", parse=ct.names)
    categorical: str = option("", "comma-separated categorical columns (any strings or integers)", parse=ct.names)
    delimiter: str | None = option(None, "field delimiter (default: tab for .tsv, else comma)", parse=ct.single_char)
    header: bool = option(True, "the files have no header row (give --columns)", flag="--no-header", negate=True)
    columns: str | None = option(None, "comma-separated column names, with --no-header", parse=ct.names)
    test_rows: int | None = option(
        None,
        "the last N valid rows (or the latest by --split-by) are the test mapping",
        parse=ct.nonneg_rows,
        group="test",
    )
    test_fraction: float | None = option(
        None,
        "the last fraction F of the valid rows (or the latest by --split-by) are the test mapping",
        parse=ct.fraction,
        group="test",
    )
    val_rows: int | None = option(
        None,
        "the N valid rows before the test rows (by --split-by: the next latest) are the val mapping (model selection)",
        parse=ct.nonneg_rows,
        group="val",
    )
    val_fraction: float | None = option(
        None,
        "the last fraction F of the rows before the test rows are the val mapping (default: none; "
        "`train` then holds out its own)",
        parse=ct.fraction,
        group="val",
    )
    split_by: str | None = option(
        None,
        "the held-out rows are the latest by column COL, wherever they are in the files: test the rows with "
        "the largest values, val the next; COL holds numbers or ISO dates/times (2024-01-02T03:04:05, with Z "
        "or +01:00, else UTC); equal values go by file order; a missing or other value is a bad row "
        "(default: the last rows in file order)",
        parse=ct.text,
        metavar="COL",
    )
    frequency_threshold: int = option(1, "categories seen fewer than K times share id 0", parse=ct.frequency_threshold)
    max_table_size: int | None = option(
        None, "cap on a table's rows; ids beyond are folded into it", parse=ct.table_size
    )
    log_transform: bool = option(False, "numerical: negative -> 0, then log(1+x)")
    numerical_dtype: str = option(
        "float32",
        "how numerical columns are stored: float32 (default), or float16 (half the bytes, NVIDIA's "
        "format; values beyond +-65504 are out of range and their rows skipped, 2048 and above lose "
        "integer precision)",
        choices=("float32", "float16"),
    )
    force: bool = option(False, "replace an existing dataset (or empty folder) at --out")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, TranscodeOptions)


def _names(s: str | None) -> list[str]:
    return [c for c in (s or "").split(",") if c]


def run(args: argparse.Namespace) -> int:
    from dlrmkit.data.transcode import TranscodeOptions, transcode

    if not args.header and not args.columns:
        raise DlrmkitError("--no-header needs --columns a,b,c")
    if args.header and args.columns:
        raise DlrmkitError("--columns names the columns of files without a header row: add --no-header")
    opts = TranscodeOptions(
        inputs=args.input,
        out=args.out,
        label=args.label,
        label_values=args.label_values,
        numerical=_names(args.numerical),
        categorical=_names(args.categorical),
        delimiter=args.delimiter,
        header=args.header,
        columns=_names(args.columns) or None,
        test_rows=args.test_rows,
        test_fraction=args.test_fraction,
        val_rows=args.val_rows,
        val_fraction=args.val_fraction,
        split_by=args.split_by,
        frequency_threshold=args.frequency_threshold,
        max_table_size=args.max_table_size,
        log=args.log_transform,
        force=args.force,
        numerical_dtype=args.numerical_dtype,
    )
    from dlrmkit.commands.preprocess import print_report

    spec, _ = transcode(opts)
    report = spec.metadata["preprocess"]["report"]
    print_report(args.out, report, up_to_date=False)
    from dlrmkit.data.transcode import float16_hint

    hint = float16_hint(opts, report["rows_skipped"].get("out_of_range", 0))
    if hint:
        print("note" + hint.lstrip(";"))
    rows = spec.metadata["rows"]
    val = f" + {rows['val']:,} val" if "val" in rows else ""
    print(
        f"wrote {args.out}: {rows['train']:,} train{val} + {rows['test']:,} test rows, cardinalities {spec.cardinalities}"
    )
    split = spec.metadata["split"]
    if "split_by" in split:  # the values the held-out rows start from (a date as its seconds since 1970 UTC)
        held = [f"{m} from {split[f'{m}_from']!r}" for m in ("test", "val") if f"{m}_from" in split]
        print(f"held out the latest rows by {one_line(args.split_by)}: {', '.join(held)}")
    from dlrmkit.commands.validate import MOSTLY_NEW, new_ids_note, unknown_in_test

    for column, share in zip(opts.categorical, unknown_in_test(args.out)):
        if share > MOSTLY_NEW:  # its values the vocabulary of the training rows does not hold
            print(new_ids_note(f"column {one_line(column)}", share))
    return 0
