"""Turn any CSV/TSV/Parquet file with named columns into a FeatureSpec dataset (same encoder as
`dlrmkit preprocess criteo`)."""

from __future__ import annotations

import argparse

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input", nargs="+", required=True, type=ct.path, help="input files (.csv, .tsv, .parquet; .gz for text)"
    )
    p.add_argument("--out", required=True, type=ct.path, help="output dataset folder")
    p.add_argument(
        "--label", required=True, type=ct.text, help="label column (values 0/1; others are counted bad rows)"
    )
    p.add_argument("--numerical", default="", type=ct.names, help="comma-separated numerical (float) columns")
    p.add_argument(
        "--categorical", default="", type=ct.names, help="comma-separated categorical columns (any strings or integers)"
    )
    p.add_argument("--delimiter", type=ct.single_char, help="field delimiter (default: tab for .tsv, else comma)")
    p.add_argument(
        "--no-header", dest="header", action="store_false", help="the files have no header row (give --columns)"
    )
    p.add_argument("--columns", type=ct.names, help="comma-separated column names, with --no-header")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--test-rows", type=ct.nonneg_rows, help="the last N valid rows are the test mapping")
    g.add_argument(
        "--test-fraction", type=ct.fraction, help="the last fraction F of the valid rows are the test mapping"
    )
    v = p.add_mutually_exclusive_group()
    v.add_argument(
        "--val-rows",
        type=ct.nonneg_rows,
        help="the N valid rows before the test rows are the val mapping (model selection)",
    )
    v.add_argument(
        "--val-fraction",
        type=ct.fraction,
        help="the last fraction F of the rows before the test rows are the val mapping (default: none; "
        "`train` then holds out its own)",
    )
    p.add_argument(
        "--frequency-threshold",
        type=ct.frequency_threshold,
        default=1,
        help="categories seen fewer than K times share id 0",
    )
    p.add_argument("--max-table-size", type=ct.table_size, help="cap on a table's rows; ids beyond are folded into it")
    p.add_argument("--log-transform", action="store_true", help="numerical: negative -> 0, then log(1+x)")
    p.add_argument("--force", action="store_true", help="replace an existing dataset (or empty folder) at --out")


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
        numerical=_names(args.numerical),
        categorical=_names(args.categorical),
        delimiter=args.delimiter,
        header=args.header,
        columns=_names(args.columns) or None,
        test_rows=args.test_rows,
        test_fraction=args.test_fraction,
        val_rows=args.val_rows,
        val_fraction=args.val_fraction,
        frequency_threshold=args.frequency_threshold,
        max_table_size=args.max_table_size,
        log=args.log_transform,
        force=args.force,
    )
    from dlrmkit.commands.preprocess import print_report

    spec, _ = transcode(opts)
    print_report(args.out, spec.metadata["preprocess"]["report"], up_to_date=False)
    rows = spec.metadata["rows"]
    val = f" + {rows['val']:,} val" if "val" in rows else ""
    print(
        f"wrote {args.out}: {rows['train']:,} train{val} + {rows['test']:,} test rows, cardinalities {spec.cardinalities}"
    )
    return 0
