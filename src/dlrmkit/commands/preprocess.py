"""Preprocess raw click logs into a FeatureSpec dataset: `dlrmkit preprocess criteo ...`.

Two streaming passes (count, encode) over the input in chunks, parallel over --workers; memory is
bounded by the vocabulary, not the input. The vocabulary is saved in <out>/vocabulary/ so new raw
rows can be encoded the same way later (dlrmkit.data.encoder.Vocabulary.load)."""

from __future__ import annotations

import argparse

from dlrmkit import cli_types as ct
import os

from dlrmkit.errors import DlrmkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=["criteo"], help="input format (criteo: TSV label, I1..I13, C1..C26)")
    p.add_argument("--input", nargs="+", required=True, type=ct.path, help="input files (plain or .gz), in time order")
    p.add_argument("--out", required=True, type=ct.path, help="output dataset folder")
    p.add_argument(
        "--frequency-threshold",
        type=ct.frequency_threshold,
        default=1,
        help="categories seen fewer than K times in the training part share id 0 (default 1)",
    )
    p.add_argument("--max-table-size", type=ct.table_size, help="cap on a table's rows; ids beyond are folded into it")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--test-rows", type=ct.nonneg_rows, help="the last N valid rows are the test mapping")
    g.add_argument(
        "--test-fraction", type=ct.fraction, help="the last fraction F of the input lines are the test mapping"
    )
    g.add_argument("--test-files", nargs="+", default=[], type=ct.path, help="these files are the test mapping")
    v = p.add_mutually_exclusive_group()
    v.add_argument(
        "--val-rows",
        type=ct.nonneg_rows,
        help="the N valid rows before the test rows are the val mapping (model selection; not in the vocabulary)",
    )
    v.add_argument(
        "--val-fraction",
        type=ct.fraction,
        help="the last fraction F of the input lines before the test rows are the val mapping "
        "(default: none; `train` then holds out its own)",
    )
    p.add_argument(
        "--workers",
        type=ct.workers,
        default=min(os.cpu_count() or 1, 8),
        help="worker processes (default: CPUs, at most 8)",
    )
    p.add_argument(
        "--engine", choices=["local", "spark"], default="local", help="local processes or a PySpark job (default local)"
    )
    p.add_argument(
        "--spark-master",
        default="local[*]",
        type=ct.text,
        help="Spark master URL for --engine spark (default local[*])",
    )
    p.add_argument("--strict", action="store_true", help="stop at the first bad row (exit code 2)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an output folder that holds another dataset (never a folder holding other files)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def print_report(out: str, report: dict, up_to_date: bool) -> None:
    if up_to_date:
        print(f"{out}: already holds this dataset (same inputs and options); nothing to do")
    skipped = report["rows_skipped"]
    n_skipped = sum(skipped.values())
    print(
        f"rows read {report['rows_read']:,}  written {report['rows_written']:,}  skipped {n_skipped:,}"
        + (" (" + ", ".join(f"{k} {v:,}" for k, v in skipped.items() if v) + ")" if n_skipped else "")
    )
    if report.get("empty_lines_skipped"):
        print(f"empty lines skipped {report['empty_lines_skipped']:,}")
    for pos in report["first_bad_rows"]:
        print(f"  bad row: {pos}")


def run(args: argparse.Namespace) -> int:
    from dlrmkit.data.criteo import CriteoOptions, preprocess

    if args.workers < 1:
        raise DlrmkitError(f"--workers must be >= 1, got {args.workers}")
    if args.engine != "spark" and args.spark_master != "local[*]":
        raise DlrmkitError("--spark-master applies with --engine spark")
    opts = CriteoOptions(
        inputs=args.input,
        out=args.out,
        frequency_threshold=args.frequency_threshold,
        max_table_size=args.max_table_size,
        test_rows=args.test_rows,
        test_fraction=args.test_fraction,
        test_files=args.test_files,
        val_rows=args.val_rows,
        val_fraction=args.val_fraction,
        workers=args.workers,
        strict=args.strict,
        force=args.force,
        progress=not args.no_progress,
    )
    if args.engine == "spark":
        from dlrmkit.data.spark_preprocess import preprocess_spark

        spec, report = preprocess_spark(opts, args.spark_master)
    else:
        spec, report = preprocess(opts)
    print_report(args.out, report, spec is None)
    if spec is not None:
        rows = spec.metadata["rows"]
        val = f" + {rows['val']:,} val" if "val" in rows else ""
        print(
            f"wrote {args.out}: {rows['train']:,} train{val} + {rows['test']:,} test rows, "
            f"{len(spec.cardinalities)} tables, cardinalities {spec.cardinalities}"
        )
    return 0
