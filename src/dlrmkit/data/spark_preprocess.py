"""`dlrmkit preprocess criteo --engine spark`: the same preprocessing as a PySpark job.

The Spark job runs the single-machine task functions (`criteo_count.count_task`,
`criteo_encode.encode_task`) on executors, so the dataset is byte-identical to `--engine local`:
job 1 parses every task and returns only its row counts and bad-row report; the driver places the
train/test split; job 2 counts categories of the training rows and merges them with `treeReduce`
(the driver only ever holds the vocabulary); job 3 encodes every task into part files under
`<out>.tmp/parts`, which the driver concatenates in task order. On a cluster, the inputs and
`--out` must be on a file system every executor can reach (NFS, a mounted bucket). Needs `pip
install dlrmkit[spark]` and Java 17+.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dlrmkit.data.criteo import CriteoOptions, check_output, fingerprint, validate_options
from dlrmkit.data.criteo_count import Pass1, count_task, first_bad_message, pass1_failure, split_plan
from dlrmkit.data.criteo_encode import encode_task, finish_dataset
from dlrmkit.data.criteo_tsv import CAT_COLS, INT_COLS, plan_tasks
from dlrmkit.data.encoder import Vocabulary, merge_counts
from dlrmkit.data.val_split import held_back
from dlrmkit.errors import DlrmkitError


def _merge(a: list | DlrmkitError, b: list | DlrmkitError) -> list | DlrmkitError:
    if isinstance(a, DlrmkitError) or isinstance(b, DlrmkitError):
        return a if isinstance(a, DlrmkitError) else b
    return [merge_counts([x, y]) for x, y in zip(a, b)]


def _on_executor(fn: Any) -> Any:
    """`fn` as the executors run it: bad input it raises (a truncated gzip, a line too long) comes
    back as its value, which _raised raises on the driver as one line (raised on an executor, Spark
    printed a Java stack trace and the command ended in "internal error PythonException")."""

    def run(arg: Any) -> Any:
        try:
            return fn(arg)
        except DlrmkitError as exc:
            return exc

    return run


def _raised(results: list) -> list:
    """`results` of a job, after raising the first DlrmkitError an executor returned."""
    for r in results:
        if isinstance(r, DlrmkitError):
            raise r
    return results


def spark_session(master: str) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise DlrmkitError("--engine spark needs PySpark: pip install 'dlrmkit[spark]' (and Java 17+)") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return (
        SparkSession.builder.master(master)
        .appName("dlrmkit-preprocess")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("DLRMKIT_SPARK_DRIVER_MEMORY", "2g"))
        .getOrCreate()
    )


def preprocess_spark(opts: CriteoOptions, master: str = "local[*]") -> tuple[Any, dict[str, Any]]:
    """Same contract as `criteo.preprocess`: (spec or None when `out` is up to date, report)."""
    validate_options(opts)
    tasks = plan_tasks(opts.inputs, opts.test_files, opts.task_bytes)
    fp = fingerprint(opts)
    from dlrmkit.data.output_dir import output_lock

    with output_lock(opts.out):  # one writer per --out
        return _preprocess_spark(opts, master, tasks, fp)


def _preprocess_spark(opts: CriteoOptions, master: str, tasks: list, fp: dict) -> tuple[Any, dict[str, Any]]:
    from dlrmkit.data.output_dir import check_replaceable

    if check_output(opts, fp):
        from dlrmkit.data.feature_spec import FeatureSpec

        return None, FeatureSpec.from_yaml(opts.out).metadata["preprocess"]["report"]
    check_replaceable(opts.out, opts.force, [*opts.inputs, *opts.test_files])
    spark = spark_session(master)
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    try:
        n = max(len(tasks), 1)
        # job 1: rows, lines and bad rows of every task (no counts)
        results = _raised(sc.parallelize(tasks, n).map(_on_executor(lambda t: count_task(t, count=False))).collect())
        line_base: dict[str, int] = {}
        for task, res in zip(tasks, results):
            base = line_base.get(task.path, 0)
            if opts.strict and res.bad.first:
                raise DlrmkitError(first_bad_message(task, res, base))
            line_base[task.path] = base + res.lines
        if sum(r.rows for r in results) == 0:
            raise pass1_failure(tasks, results, opts.inputs)
        test_rows, n_val = held_back(opts, lambda: sum(r.lines for t, r in zip(tasks, results) if not t.test))
        split_at, boundary, n_test = split_plan(tasks, results, test_rows, opts)
        if boundary <= 0:
            total = sum(r.rows for r in results)
            raise DlrmkitError(f"--test-*/--val-* options leave no training rows ({total} valid rows in the input)")
        # job 2: category counts of the training rows, merged on the executors
        jobs = [(t, split_at[t.index]) for t in tasks if split_at[t.index] > 0]
        counts = (
            sc.parallelize(jobs, max(len(jobs), 1))
            .map(_on_executor(lambda j: count_task(j[0], limit=j[1]).counts))
            .treeReduce(_merge)
        )
        _raised([counts])
        p1 = Pass1(tasks, results, counts, split_at, boundary, n_test, n_val)
        vocab = Vocabulary.build(
            CAT_COLS,
            counts,
            opts.frequency_threshold,
            opts.max_table_size,
            extra={"numerical_columns": INT_COLS, "numerical_transform": "log1p"},
        )
        bvocab = sc.broadcast(vocab)

        def encode_all(part_dir: str) -> None:
            # job 3: every task encoded into part files (executors write, the driver concatenates)
            enc = [(t, split_at[t.index]) for t in tasks]
            _raised(
                sc.parallelize(enc, n)
                .map(_on_executor(lambda j: encode_task(j[0], bvocab.value, j[1], part_dir)))
                .collect()
            )

        spec = finish_dataset(opts, fp, p1, vocab, encode_all)
        return spec, spec.metadata["preprocess"]["report"]
    finally:
        spark.stop()
