"""Preprocess raw click logs into a FeatureSpec dataset: `dlrmkit preprocess criteo ...`.

Two streaming passes (count, encode) over the input in chunks, parallel over --workers; memory is
bounded by the vocabulary, not the input. The vocabulary is saved in <out>/vocabulary/ so new raw
rows can be encoded the same way later (dlrmkit.data.encoder.Vocabulary.load)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError, one_line
from dlrmkit.options import add_options, option


@dataclass
class PreprocessOptions:
    format: str = option(
        help="input format (criteo: TSV label, I1..I13, C1..C26)", choices=("criteo",), positional=True
    )
    input: list[str] = option(help="input files (plain or .gz), in time order", parse=ct.path, required=True, nargs="+")
    out: str = option(help="output dataset folder", parse=ct.path, required=True)
    frequency_threshold: int = option(
        1,
        "categories seen fewer than K times in the training part share id 0 (default {default})",
        parse=ct.frequency_threshold,
    )
    max_table_size: int | None = option(
        None, "cap on a table's rows; ids beyond are folded into it", parse=ct.table_size
    )
    test_rows: int | None = option(
        None, "the last N valid rows are the test mapping", parse=ct.nonneg_rows, group="test"
    )
    test_fraction: float | None = option(
        None, "the last fraction F of the input lines are the test mapping", parse=ct.fraction, group="test"
    )
    test_files: list[str] = option([], "these files are the test mapping", parse=ct.path, nargs="+", group="test")
    val_rows: int | None = option(
        None,
        "the N valid rows before the test rows are the val mapping (model selection; not in the vocabulary)",
        parse=ct.nonneg_rows,
        group="val",
    )
    val_fraction: float | None = option(
        None,
        "the last fraction F of the input lines before the test rows are the val mapping "
        "(default: none; `train` then holds out its own)",
        parse=ct.fraction,
        group="val",
    )
    workers: int = option(min(os.cpu_count() or 1, 8), "worker processes (default: CPUs, at most 8)", parse=ct.workers)
    engine: str = option("local", "local processes or a PySpark job (default {default})", choices=("local", "spark"))
    spark_master: str = option("local[*]", "Spark master URL for --engine spark (default {default})", parse=ct.text)
    strict: bool = option(False, "stop at the first bad row (exit code 2)")
    force: bool = option(
        False, "replace an output folder that holds another dataset (never a folder holding other files)"
    )
    no_progress: bool = option(False, "no progress bars")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, PreprocessOptions)


def long_values_note(counts: dict) -> str:
    """The rows whose categorical value was read as its key (longer than the transcode limit), by column."""
    from dlrmkit.data.encoder import LONG_VALUE_BYTES

    by_column = ", ".join(f"{one_line(str(c))} {n:,}" for c, n in counts.items())
    return (
        f"categorical values longer than {LONG_VALUE_BYTES:,} bytes read as their first 32 characters and "
        f"SHA-256: {sum(counts.values()):,} rows ({by_column})"
    )


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
    if report.get("long_values_as_keys"):
        print(long_values_note(report["long_values_as_keys"]))
    if report.get("numerical_missing"):
        missing = report["numerical_missing"]
        by_column = ", ".join(f"{one_line(str(c))} {n:,}" for c, n in missing.items())
        print(f"numerical values missing (empty, NA, NaN, null, ...), read as 0: {by_column}")
    for pos in report["first_bad_rows"]:
        print(f"  bad row: {pos}")
    unused = report.get("unused_columns") or []
    if unused:  # a column left out by mistake would otherwise go unnoticed
        names = [str(n) if str(n).isprintable() and str(n) else repr(str(n)) for n in unused[:20]]  # '': empty
        count = report.get("unused_columns_count") or len(unused)  # more than the names recorded
        shown = ", ".join(names) + (f", ... ({count:,} in all)" if count > 20 else "")
        print(f"columns not used: {shown} (name them in --numerical or --categorical to use them)")


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
