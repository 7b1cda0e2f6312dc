"""Criteo click logs (TSV: label, I1..I13, C1..C26; plain or .gz) -> FeatureSpec dataset, on one
machine: the options, the output checks and the worker pool around the two passes.

Two streaming passes over byte-range tasks (plain files are cut at line boundaries, a .gz file is
one task; `criteo_tsv.py`): pass 1 (`criteo_count.py`) parses each task and returns per-column
value counts plus bad-row accounting, and spills each parsed block (labels, float16 numericals,
dictionary-encoded categoricals) as an Arrow IPC file to `<out>.spill/` (`criteo_spill.py`);
pass 2 (`criteo_encode.py`) reads those blocks back memory-mapped (the text is parsed once:
parsing is most of the cost), encodes them with the shared `Vocabulary` and writes part files
that are then concatenated in task order into `<out>.tmp`, renamed to `<out>` only when
complete. Memory is bounded by the vocabulary (and a few blocks per worker), never by the input;
the spill needs about 140 bytes of disk per row, and each task's spill is removed once encoded.
The Spark engine (`spark_preprocess.py`) runs the same passes' task functions.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator

import multiprocessing as mp

from dlrmkit.data.criteo_count import TaskResult, count_task, run_pass1
from dlrmkit.data.criteo_encode import encode_task, finish_dataset
from dlrmkit.data.criteo_options import CriteoOptions as CriteoOptions  # re-exported: the public entry
from dlrmkit.data.criteo_tsv import CAT_COLS, INT_COLS, Task, plan_tasks
from dlrmkit.data.encoder import Vocabulary
from dlrmkit.data.feature_spec import SPEC_FILE, FeatureSpec
from dlrmkit.data.output_dir import check_replaceable, fresh_temp_dir, output_lock, remove_temp_dir
from dlrmkit.errors import DlrmkitError


# ---- the worker pool (processes; one task per job) ----------------------------------------
_WORKER: dict[str, Any] = {}  # per worker process: the vocabulary, set once by the pool initializer


def _init_worker(vocab: Vocabulary | None, part_dir: str | None, spill_dir: str | None = None) -> None:
    _WORKER["vocab"], _WORKER["part_dir"], _WORKER["spill_dir"] = vocab, part_dir, spill_dir


def _count_job(args: tuple[Task, bool]) -> TaskResult:
    return count_task(args[0], count=args[1], spill_dir=_WORKER["spill_dir"])


def _encode_job(args: tuple[Task, int]) -> int:
    return encode_task(args[0], _WORKER["vocab"], args[1], _WORKER["part_dir"], _WORKER["spill_dir"])


def ordered_map(fn: Callable, items: Iterable, workers: int, init_args: tuple) -> Iterator:
    """fn over items, results in order, at most 2*workers in flight (bounded memory)."""
    if workers <= 1:
        _init_worker(*init_args)
        for it in items:
            yield fn(it)
        return
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=init_args) as ex:
        pending: deque = deque()
        for it in items:
            pending.append(ex.submit(fn, it))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def progress_bar(total: int, desc: str, enabled: bool):
    """A progress bar on a terminal only (disable=None): piped or captured, stderr holds nothing
    but the error line, if any (carriage-return frames split into lines there)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=None if enabled else True, leave=False)


def fingerprint(opts: CriteoOptions) -> dict[str, Any]:
    """What makes two runs produce the same dataset (inputs and options, not the engine)."""
    files = [
        {"path": os.path.abspath(p), "bytes": os.path.getsize(p), "mtime_ns": os.stat(p).st_mtime_ns, "role": role}
        for ps, role in ((opts.inputs, "input"), (opts.test_files, "test"))
        for p in ps
    ]
    return {
        "sources": files,
        "frequency_threshold": opts.frequency_threshold,
        "max_table_size": opts.max_table_size,
        "test_rows": opts.test_rows,
        "test_fraction": opts.test_fraction,
        **(
            {"val_rows": opts.val_rows, "val_fraction": opts.val_fraction} if opts.val_rows or opts.val_fraction else {}
        ),
    }


def check_output(opts: CriteoOptions, fp: dict[str, Any]) -> bool:
    """True when `out` already holds this very dataset; error when it holds another one."""
    if not os.path.exists(opts.out) or opts.force or (os.path.isdir(opts.out) and not os.listdir(opts.out)):
        return False
    spec_path = os.path.join(opts.out, SPEC_FILE)
    if os.path.exists(spec_path):
        try:
            old = FeatureSpec.from_yaml(spec_path).metadata.get("preprocess", {}).get("fingerprint")
        except DlrmkitError:
            old = None
        if old == fp:
            return True
        raise DlrmkitError(
            f"{opts.out}: holds a different dataset (other inputs or options); pass --force to replace it or choose another --out"
        )
    raise DlrmkitError(
        f"{opts.out}: exists and is not a dataset made by this command; pass --force or choose another --out"
    )


def validate_options(opts: CriteoOptions) -> None:
    chosen = sum(x is not None and x != [] for x in (opts.test_rows, opts.test_fraction, opts.test_files or None))
    if chosen > 1:
        raise DlrmkitError("choose one of --test-rows, --test-fraction, --test-files")
    if opts.test_rows is not None and opts.test_rows < 0:
        raise DlrmkitError(f"--test-rows must be >= 0, got {opts.test_rows}")
    if opts.test_fraction is not None and not 0 < opts.test_fraction < 1:
        raise DlrmkitError(f"--test-fraction must be in (0, 1), got {opts.test_fraction}")
    if opts.frequency_threshold < 1:
        raise DlrmkitError(f"--frequency-threshold must be >= 1, got {opts.frequency_threshold}")
    if not opts.inputs:
        raise DlrmkitError("no --input files")


def preprocess(opts: CriteoOptions) -> tuple[FeatureSpec | None, dict[str, Any]]:
    """Single-machine preprocessing. Returns (spec, report); spec is None when `out` was up to date."""
    validate_options(opts)
    tasks = plan_tasks(opts.inputs, opts.test_files, opts.task_bytes)
    fp = fingerprint(opts)
    with output_lock(opts.out):  # one writer per --out
        if check_output(opts, fp):
            return None, FeatureSpec.from_yaml(opts.out).metadata["preprocess"]["report"]
        check_replaceable(opts.out, opts.force, [*opts.inputs, *opts.test_files])
        total = sum(t.nbytes for t in tasks)
        # pass 1's parsed blocks, beside the output (removed at the end, also on errors)
        spill_dir = os.path.abspath(opts.out) + ".spill"
        fresh_temp_dir(spill_dir)
        try:
            return _preprocess(opts, tasks, fp, total, spill_dir)
        finally:
            remove_temp_dir(spill_dir)


def _preprocess(
    opts: CriteoOptions, tasks: list[Task], fp: dict[str, Any], total: int, spill_dir: str
) -> tuple[FeatureSpec | None, dict[str, Any]]:
    def count_in(ts: list[Task]) -> Iterator[TaskResult]:
        with progress_bar(total, "pass 1/2 count", opts.progress) as bar:
            jobs = [(t, not t.test) for t in ts]
            for res, t in zip(ordered_map(_count_job, jobs, opts.workers, (None, None, spill_dir)), ts):
                bar.update(t.nbytes)
                yield res

    p1 = run_pass1(opts, tasks, count_in, spill_dir)
    vocab = Vocabulary.build(
        CAT_COLS,
        p1.counts,
        opts.frequency_threshold,
        opts.max_table_size,
        extra={"numerical_columns": INT_COLS, "numerical_transform": "log1p"},
    )

    def encode_all(part_dir: str) -> None:
        jobs = [(t, p1.split_at[t.index]) for t in tasks]
        with progress_bar(total, "pass 2/2 encode", opts.progress) as bar:
            for _, t in zip(ordered_map(_encode_job, jobs, opts.workers, (vocab, part_dir, spill_dir)), tasks):
                bar.update(t.nbytes)

    spec = finish_dataset(opts, fp, p1, vocab, encode_all)
    return spec, spec.metadata["preprocess"]["report"]
