"""Pass 1 of Criteo preprocessing: parse every task, count each categorical column's values over
the training rows only (they make the vocabulary), account for bad rows, and place the
train/test split. The last rows (validation and test) are held back until the split is known,
so they never enter the vocabulary."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from dlrmkit.data.criteo_spill import iter_spill, spill_path, write_spill
from dlrmkit.data.criteo_tsv import NUM_CAT, REASONS, Bad, Task, iter_blocks, iter_parsed, numerical_matrix
from dlrmkit.data.encoder import CountAccumulator, dictionary_counts
from dlrmkit.data.val_split import held_back
from dlrmkit.errors import DlrmkitError

from dlrmkit.data.criteo_options import CriteoOptions


@dataclass
class TaskResult:
    index: int
    lines: int
    rows: int
    bad: Bad
    counts: list[pa.Table] | None


def count_task(task: Task, limit: int | None = None, count: bool = True, spill_dir: str | None = None) -> TaskResult:
    """Parse a task; per-column value counts of its first `limit` valid rows (all when None).
    With `spill_dir`, the parsed blocks are also written there for `encode_task`."""
    bad, acc, lines, rows = Bad(), CountAccumulator(NUM_CAT), 0, 0
    for k, p in enumerate(iter_parsed(task, bad)):
        n = len(p.labels)
        take = n if limit is None else max(0, min(n, limit - rows))
        if count and take:
            acc.add([dictionary_counts(c.slice(0, take)) for c in p.cats])
        if spill_dir is not None and n:
            write_spill(spill_path(spill_dir, task, k), p.labels, numerical_matrix(p.ints), p.cats)
        lines += p.lines
        rows += n
    return TaskResult(task.index, lines, rows, bad, acc.result() if count else None)


def count_spilled(task: Task, limit: int, spill_dir: str) -> list[pa.Table]:
    """Counts of the first `limit` valid rows of a task already spilled by `count_task`."""
    acc, rows = CountAccumulator(NUM_CAT), 0
    for labels, _, cats in iter_spill(task, spill_dir):
        take = max(0, min(len(labels), limit - rows))
        if take:
            acc.add([dictionary_counts(c.slice(0, take)) for c in cats])
        rows += len(labels)
    return acc.result()


def count_lines(tasks: list[Task]) -> int:
    n = 0
    for task in tasks:
        for block in iter_blocks(task):
            n += block.count(b"\n")
    return n


@dataclass
class Pass1:
    """Everything pass 1 learns: per-task lines and rows, bad rows, train counts, the split."""

    tasks: list[Task]
    results: list[TaskResult]
    counts: list[pa.Table]
    split_at: list[int]
    train_rows: int
    test_rows: int  # rows after the training rows: validation rows, then test rows
    val_rows: int = 0

    def report(self) -> dict[str, Any]:
        bad = dict.fromkeys(REASONS, 0)
        first: list[str] = []
        line_base: dict[str, int] = {}
        for task, res in zip(self.tasks, self.results):
            base = line_base.get(task.path, 0)
            for reason in REASONS:
                bad[reason] += res.bad.counts[reason]
            for line, reason, detail in res.bad.first:
                if len(first) < 5:
                    first.append(f"{task.path}:{base + line}: {reason} ({detail})")
            line_base[task.path] = base + res.lines
        read = sum(r.lines for r in self.results)
        return {
            "rows_read": read,
            "rows_written": self.train_rows + self.test_rows,
            "rows_skipped": bad,
            "first_bad_rows": first,
        }


def split_plan(
    tasks: list[Task], results: list[TaskResult], test_rows: int | None, opts: CriteoOptions
) -> tuple[list[int], int, int]:
    """How many valid rows of each task go to train (the last `test_rows` valid rows are test)."""
    train_total = sum(r.rows for t, r in zip(tasks, results) if not t.test)
    test_total = sum(r.rows for t, r in zip(tasks, results) if t.test)
    boundary = train_total - (test_rows or 0)
    split_at, start = [], 0
    for t, r in zip(tasks, results):
        if t.test:
            split_at.append(0)
            continue
        split_at.append(int(min(max(boundary - start, 0), r.rows)))
        start += r.rows
    return split_at, boundary, train_total - boundary + test_total


def no_valid_rows(inputs: list[str], skipped: dict[str, int], first: list[str]) -> DlrmkitError:
    """The error when every row was bad, with why: the counts by reason and the first bad row."""
    reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items() if v)
    why = f" ({sum(skipped.values()):,} bad rows: {reasons}; first: {first[0]})" if first else " (no rows at all)"
    return DlrmkitError(f"{', '.join(inputs)}: no valid rows in the input{why}")


def pass1_failure(tasks: list[Task], results: list[TaskResult], inputs: list[str]) -> DlrmkitError:
    report = Pass1(tasks, results, [], [], 0, 0).report()
    return no_valid_rows(inputs, report["rows_skipped"], report["first_bad_rows"])


def first_bad_message(task: Task, res: TaskResult, line_base: int) -> str:
    line, reason, detail = res.bad.first[0]
    return f"{task.path}:{line_base + line}: bad row ({reason}: {detail}); stopped because of --strict"


def run_pass1(
    opts: CriteoOptions,
    tasks: list[Task],
    count_in_task: Callable[[list[Task]], Iterator[TaskResult]],
    spill_dir: str | None = None,
) -> Pass1:
    """Pass 1 with train-only counts: results of the last `test_rows` rows are held back in a
    window until the split is known, so the test rows never enter the vocabulary."""
    test_rows, n_val = held_back(opts, lambda: count_lines([t for t in tasks if not t.test]))
    acc = CountAccumulator(NUM_CAT)
    window: deque[tuple[Task, TaskResult]] = deque()
    window_rows = 0
    results: list[TaskResult] = []
    line_base: dict[str, int] = {}
    for task, res in zip(tasks, count_in_task(tasks)):
        base = line_base.get(task.path, 0)
        if opts.strict and res.bad.first:
            raise DlrmkitError(first_bad_message(task, res, base))
        line_base[task.path] = base + res.lines
        counts, res.counts = res.counts, None
        results.append(res)
        if task.test:
            continue
        window.append((task, TaskResult(res.index, res.lines, res.rows, res.bad, counts)))
        window_rows += res.rows
        while window and window_rows - window[0][1].rows >= (test_rows or 0):
            t0, r0 = window.popleft()
            window_rows -= r0.rows
            acc.add(r0.counts)
    total_valid = sum(r.rows for r in results)
    if total_valid == 0:
        raise pass1_failure(tasks, results, opts.inputs)
    split_at, boundary, n_test = split_plan(tasks, results, test_rows, opts)
    if boundary <= 0:
        raise DlrmkitError(f"--test-*/--val-* options leave no training rows ({total_valid} valid rows in the input)")
    for task, res in window:
        k = split_at[task.index]
        if k == res.rows:
            acc.add(res.counts)
        elif k > 0:
            acc.add(count_spilled(task, k, spill_dir) if spill_dir else count_task(task, limit=k).counts)
    return Pass1(tasks, results, acc.result(), split_at, boundary, n_test, n_val)
