"""Criteo click logs (TSV: label, I1..I13, C1..C26; plain or .gz) -> FeatureSpec dataset.

Two streaming passes over byte-range tasks (plain files are cut at line boundaries, a .gz file is
one task): pass 1 parses each task and returns per-column value counts plus bad-row accounting,
and spills each parsed block (labels, float16 numericals, dictionary-encoded categoricals) as an
Arrow IPC file to `<out>.spill/`; pass 2 reads those blocks back memory-mapped (the text is parsed
once: parsing is most of the cost), encodes them with the shared `Vocabulary` and writes part
files that are then concatenated in task order into `<out>.tmp`, renamed to `<out>` only when
complete. Memory is bounded by the vocabulary (and a few blocks per worker), never by the input;
the spill needs about 140 bytes of disk per row, and each task's spill is removed once encoded.

Parsing is vectorized: numpy finds lines and counts fields per line, Arrow's CSV reader splits
the valid lines into columns, and regular-expression kernels validate labels and integers. Only
undecodable lines (rare) are located with a Python loop.
"""

from __future__ import annotations

import glob
import gzip
import os
import shutil
import zlib
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import multiprocessing as mp
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dlrmkit.data.encoder import CountAccumulator, Vocabulary, dictionary_counts, to_string_array
from dlrmkit.data.feature_spec import SPEC_FILE, TEST, TRAIN, FeatureSpec, categorical_dtype
from dlrmkit.data.output_dir import check_replaceable, fresh_temp_dir, output_lock, remove_temp_dir
from dlrmkit.data.val_split import carve_val, held_back  # noqa: F401  (held_back: also for the Spark engine)
from dlrmkit.data.split_binary import SplitBinaryWriter
from dlrmkit.errors import DlrmkitError

NUM_INT, NUM_CAT = 13, 26
INT_COLS = [f"I{i}" for i in range(1, NUM_INT + 1)]
CAT_COLS = [f"C{i}" for i in range(1, NUM_CAT + 1)]
COLUMNS = ["label", *INT_COLS, *CAT_COLS]
REASONS = ("wrong_field_count", "bad_integer", "bad_label", "undecodable")
INT_RE = r"^([-+]?[0-9]{1,18})?$"
TASK_BYTES = 64 << 20  # fewer tasks, fewer part files to create (measured -13% CPU vs 32 MiB)
BLOCK_BYTES = 16 << 20


@dataclass
class CriteoOptions:
    inputs: list[str]
    out: str
    frequency_threshold: int = 1
    max_table_size: int | None = None
    test_rows: int | None = None
    test_fraction: float | None = None
    test_files: list[str] = field(default_factory=list)
    val_rows: int | None = None  # validation rows carved before the test rows (val_split.py)
    val_fraction: float | None = None
    workers: int = 1
    strict: bool = False
    force: bool = False
    progress: bool = True
    task_bytes: int = TASK_BYTES


@dataclass
class Task:
    index: int
    path: str
    start: int
    end: int | None  # None: to the end (a .gz file)
    test: bool  # from --test-files

    @property
    def nbytes(self) -> int:
        return (self.end if self.end is not None else os.path.getsize(self.path)) - self.start


@dataclass
class Bad:
    """Bad rows of one task: counts by reason and the first few (relative line, reason, detail)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    first: list[tuple[int, str, str]] = field(default_factory=list)

    def add(self, reason: str, lines: np.ndarray, details: list[str]) -> None:
        self.counts[reason] += len(lines)
        for line, d in zip(lines[:5].tolist(), details):
            self.first.append((int(line), reason, d))
        self.first = sorted(self.first)[:5]


@dataclass
class TaskResult:
    index: int
    lines: int
    rows: int
    bad: Bad
    counts: list[pa.Table] | None


# ---- reading ------------------------------------------------------------------------------
def plan_tasks(inputs: list[str], test_files: list[str], task_bytes: int) -> list[Task]:
    """Byte-range tasks that start and end on line boundaries (a .gz file is one task)."""
    tasks: list[Task] = []
    for paths, is_test in ((inputs, False), (test_files, True)):
        for path in paths:
            if not os.path.isfile(path):
                raise DlrmkitError(f"{path}: no such input file")
            size = os.path.getsize(path)
            if size == 0:
                raise DlrmkitError(f"{path}: empty input file")
            if path.endswith(".gz"):
                tasks.append(Task(len(tasks), path, 0, None, is_test))
                continue
            bounds = [0]
            with open(path, "rb") as f:
                while bounds[-1] + task_bytes < size:
                    f.seek(bounds[-1] + task_bytes)
                    f.readline()
                    if f.tell() >= size:
                        break
                    bounds.append(f.tell())
            bounds.append(size)
            tasks += [Task(len(tasks) + i, path, a, b, is_test) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return tasks


def iter_blocks(task: Task, block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Whole-line blocks of a task, each ending in b'\\n'."""
    carry = b""
    try:
        if task.end is None:
            f = gzip.open(task.path, "rb")
            remaining = None
        else:
            f = open(task.path, "rb")
            f.seek(task.start)
            remaining = task.end - task.start
        with f:
            while True:
                n = block_bytes if remaining is None else min(block_bytes, remaining)
                data = f.read(n) if n else b""
                if remaining is not None:
                    remaining -= len(data)
                if not data:
                    break
                data = carry + data
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if cut:
                    yield data[:cut]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DlrmkitError(f"{task.path}: truncated or corrupt gzip file ({exc})") from None
    if carry:
        yield carry + b"\n"


# ---- parsing ------------------------------------------------------------------------------
@dataclass
class Parsed:
    labels: np.ndarray  # bool [n]
    ints: list[pa.Array]  # int64 with nulls, 13
    cats: list[pa.DictionaryArray]  # strings with nulls, 26
    lines: int
    valid: np.ndarray | None = None  # 0-based line (within the block) of each valid row; for `predict`


def _undecodable(block: bytes, starts: np.ndarray) -> np.ndarray:
    """Indices of lines that are not valid UTF-8 (loops over bad lines only)."""
    bad: list[int] = []
    pos = 0
    while True:
        try:
            block[pos:].decode("utf-8")
            return np.asarray(bad, dtype=np.int64)
        except UnicodeDecodeError as exc:
            line = int(np.searchsorted(starts, pos + exc.start, side="right") - 1)
            bad.append(line)
            if line + 1 >= len(starts):
                return np.asarray(bad, dtype=np.int64)
            pos = int(starts[line + 1])


def parse_block(block: bytes, bad: Bad, line0: int) -> Parsed:
    """Split a whole-line block into columns; bad rows are counted in `bad` (lines 1-based from line0)."""
    if b"\r" in block:
        block = block.replace(b"\r\n", b"\n")
    lines = block.count(b"\n")
    stray_cr = b"\r" in block  # Arrow would end a line there: such lines are bad rows
    if not stray_cr:
        try:  # fast path, all rows well formed: Arrow rejects a wrong field count, a non-integer or
            # non-UTF-8 bytes itself, so the block needs no scan of its own (a third of pass 1's CPU)
            return _parse_typed(block, bad, line0, np.arange(lines), lines)
        except pa.ArrowInvalid:
            pass
    b = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(b == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    tab_pos = np.flatnonzero(b == 9)
    tabs_before = np.searchsorted(tab_pos, ends)  # tabs before each line end
    nfields = np.diff(tabs_before, prepend=0) + 1
    ok = np.ones(len(ends), dtype=bool)
    undec = _undecodable(block, starts)
    if len(undec):
        ok[undec] = False
        bad.add("undecodable", line0 + undec, ["bytes that are not UTF-8"] * min(len(undec), 5))
    if stray_cr:
        cr_lines = np.unique(np.searchsorted(ends, np.flatnonzero(b == 13)))
        cr_lines = cr_lines[ok[cr_lines]]
        ok[cr_lines] = False
        bad.add("wrong_field_count", line0 + cr_lines, ["a carriage return inside the line"] * min(len(cr_lines), 5))
    wrong = np.flatnonzero(ok & (nfields != len(COLUMNS)))
    if len(wrong):
        ok[wrong] = False
        bad.add("wrong_field_count", line0 + wrong,
                [f"{n} fields, expected {len(COLUMNS)}" for n in nfields[wrong[:5]].tolist()])
    line_no = np.flatnonzero(ok)
    if not ok.all():
        keep = np.repeat(ok, ends - starts + 1)
        block = b[keep].tobytes()
    if not len(line_no):
        return Parsed(np.zeros(0, bool), [], [], len(ends), line_no)
    try:  # fast path: Arrow converts the integers itself; any bad value sends the block to the slow path
        return _parse_typed(block, bad, line0, line_no, len(ends))
    except pa.ArrowInvalid:
        pass
    table = pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=COLUMNS, use_threads=False, block_size=max(len(block) + 1, 1 << 20)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in COLUMNS}, strings_can_be_null=False, quoted_strings_can_be_null=False
        ),
    )
    label = table.column("label").combine_chunks()
    label_ok = pc.is_in(label, value_set=pa.array(["0", "1"])).to_numpy(zero_copy_only=False)
    int_ok = np.ones(len(label_ok), dtype=bool)
    first_bad_int: dict[int, str] = {}
    for c in INT_COLS:
        col_ok = pc.match_substring_regex(table.column(c).combine_chunks(), INT_RE).to_numpy(zero_copy_only=False)
        if not col_ok.all():
            rows = np.flatnonzero(~col_ok & label_ok & int_ok)
            for r in rows[:5].tolist():
                first_bad_int.setdefault(r, f"{c} is {table.column(c)[r].as_py()!r}, not an integer")
            int_ok &= col_ok
    bad_lab = np.flatnonzero(~label_ok)
    if len(bad_lab):
        bad.add("bad_label", line0 + line_no[bad_lab],
                [f"label is {label[int(r)].as_py()!r}, not 0 or 1" for r in bad_lab[:5].tolist()])
    bad_int = np.flatnonzero(label_ok & ~int_ok)
    if len(bad_int):
        bad.add("bad_integer", line0 + line_no[bad_int], [first_bad_int.get(int(r), "not an integer") for r in bad_int[:5]])
    good = label_ok & int_ok
    if not good.all():
        table = table.filter(pa.array(good))
    ints = []
    for c in INT_COLS:
        s = table.column(c).combine_chunks()
        ints.append(pc.cast(pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s), pa.int64()))
    cats = [to_string_array(table.column(c)).dictionary_encode() for c in CAT_COLS]
    labels = pc.equal(table.column("label"), "1").to_numpy(zero_copy_only=False)
    return Parsed(np.asarray(labels, dtype=bool), ints, cats, len(ends), line_no[good])


def _parse_typed(block: bytes, bad: Bad, line0: int, line_no: np.ndarray, lines: int) -> Parsed:
    # categoricals straight to dictionary arrays: cheaper than strings, and counting and encoding
    # then work on each block's distinct values only
    cat_type = pa.dictionary(pa.int32(), pa.string())
    types = {"label": pa.int64(), **dict.fromkeys(INT_COLS, pa.int64()), **dict.fromkeys(CAT_COLS, cat_type)}
    table = pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=COLUMNS, use_threads=False, block_size=max(len(block) + 1, 1 << 20)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True),
    )
    label = table.column("label").combine_chunks()
    ok = pc.fill_null(pc.is_in(label, value_set=pa.array([0, 1])), False).to_numpy(zero_copy_only=False)
    if not ok.all():
        bad_lab = np.flatnonzero(~ok)
        bad.add("bad_label", line0 + line_no[bad_lab],
                [f"label is {label[int(r)].as_py() if label[int(r)].is_valid else ''!r}, not 0 or 1" for r in bad_lab[:5]])
        table = table.filter(pa.array(ok))
        line_no = line_no[ok]
    ints = [table.column(c).combine_chunks() for c in INT_COLS]
    cats = [_one_chunk(table.column(c)) for c in CAT_COLS]
    labels = pc.equal(table.column("label"), 1).to_numpy(zero_copy_only=False)
    return Parsed(np.asarray(labels, dtype=bool), ints, cats, lines, line_no)


def _one_chunk(col: pa.ChunkedArray) -> pa.DictionaryArray:
    if col.num_chunks == 1:
        return col.chunk(0)
    return col.unify_dictionaries().combine_chunks()


def numerical_matrix(ints: list[pa.Array]) -> np.ndarray:
    """Missing and negative -> 0, then log(1+x), float16 [rows, 13]."""
    x = np.stack([np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64) for a in ints], axis=1)
    return np.log1p(np.maximum(x, 0).astype(np.float32)).astype(np.float16)


def iter_parsed(task: Task, bad: Bad) -> Iterator[Parsed]:
    line0 = 1
    for block in iter_blocks(task):
        p = parse_block(block, bad, line0)
        line0 += p.lines
        yield p


# ---- spill: pass 1's parsed blocks, read back by pass 2 instead of parsing the text again ----
def spill_path(spill_dir: str, task: Task, block: int) -> str:
    return os.path.join(spill_dir, f"{task.index:07d}.{block:06d}.arrow")


def write_spill(path: str, labels: np.ndarray, dense: np.ndarray, cats: list[pa.DictionaryArray]) -> None:
    """One block as an Arrow IPC file: labels, the float16 numerical matrix (26-byte rows), the
    dictionary-encoded categoricals."""
    n = len(labels)
    dense_arr = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(2 * NUM_INT), n, [None, pa.py_buffer(np.ascontiguousarray(dense).tobytes())])
    batch = pa.record_batch([pa.array(labels), dense_arr, *cats], names=["label", "numerical", *CAT_COLS])
    with pa.OSFile(path + ".part", "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
        w.write_batch(batch)
    os.replace(path + ".part", path)


def iter_spill(task: Task, spill_dir: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[pa.DictionaryArray]]]:
    """(labels, dense float16 [n, 13], cats) of each spilled block of a task, memory-mapped."""
    for path in sorted(glob.glob(os.path.join(spill_dir, f"{task.index:07d}.*.arrow"))):
        with pa.memory_map(path) as src:
            b = pa.ipc.open_file(src).get_batch(0)
            n = b.num_rows
            dense_arr = b.column(1)
            dense = np.frombuffer(dense_arr.buffers()[1], dtype=np.float16, count=n * NUM_INT,
                                  offset=dense_arr.offset * 2 * NUM_INT).reshape(n, NUM_INT)
            yield b.column(0).to_numpy(zero_copy_only=False), dense, list(b.columns[2:])


# ---- pass 1: count ------------------------------------------------------------------------
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


# ---- pass 2: encode -----------------------------------------------------------------------
def part_path(part_dir: str, mapping: str, name: str, index: int) -> str:
    return os.path.join(part_dir, mapping, f"{name}.{index:07d}")


def encode_task(task: Task, vocab: Vocabulary, split_at: int, part_dir: str, spill_dir: str | None = None) -> int:
    """Encode a task; its first `split_at` valid rows go to train parts, the rest to test parts.
    With `spill_dir`, the blocks spilled by `count_task` are read (and removed) instead of the text."""
    dtypes = [categorical_dtype(c) for c in vocab.cardinalities]
    if spill_dir is not None:
        blocks: Iterable[tuple[np.ndarray, np.ndarray, list[pa.DictionaryArray]]] = iter_spill(task, spill_dir)
    else:
        blocks = ((p.labels, numerical_matrix(p.ints), p.cats) for p in iter_parsed(task, Bad()) if len(p.labels))
    handles: dict[str, dict[str, Any]] = {}
    for mapping in (TRAIN, TEST):
        os.makedirs(os.path.join(part_dir, mapping), exist_ok=True)
        handles[mapping] = {
            n: open(part_path(part_dir, mapping, n, task.index), "wb")
            for n in ["label.bin", "numerical.bin", *[f"cat_{t}.bin" for t in range(NUM_CAT)]]
        }
    rows = 0
    try:
        for labels, dense, cats in blocks:
            n = len(labels)
            ids = [vocab.encode_column(t, cats[t]).astype(dtypes[t]) for t in range(NUM_CAT)]
            cut = max(0, min(n, split_at - rows))
            for mapping, sl in ((TRAIN, slice(0, cut)), (TEST, slice(cut, n))):
                if sl.start == sl.stop:
                    continue
                h = handles[mapping]
                np.ascontiguousarray(labels[sl]).tofile(h["label.bin"])
                np.ascontiguousarray(dense[sl]).tofile(h["numerical.bin"])
                for t in range(NUM_CAT):
                    np.ascontiguousarray(ids[t][sl]).tofile(h[f"cat_{t}.bin"])
            rows += n
    finally:
        for h in handles.values():
            for f in h.values():
                f.close()
    if spill_dir is not None:
        for path in glob.glob(os.path.join(spill_dir, f"{task.index:07d}.*.arrow")):
            os.remove(path)
    return rows


# ---- orchestration ------------------------------------------------------------------------
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
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)


def fingerprint(opts: CriteoOptions) -> dict[str, Any]:
    """What makes two runs produce the same dataset (inputs and options, not the engine)."""
    files = [
        {"path": os.path.abspath(p), "bytes": os.path.getsize(p), "mtime_ns": os.stat(p).st_mtime_ns, "role": role}
        for ps, role in ((opts.inputs, "input"), (opts.test_files, "test")) for p in ps
    ]
    return {
        "sources": files, "frequency_threshold": opts.frequency_threshold, "max_table_size": opts.max_table_size,
        "test_rows": opts.test_rows, "test_fraction": opts.test_fraction,
        **({"val_rows": opts.val_rows, "val_fraction": opts.val_fraction} if opts.val_rows or opts.val_fraction else {}),
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
        raise DlrmkitError(f"{opts.out}: holds a different dataset (other inputs or options); pass --force to replace it or choose another --out")
    raise DlrmkitError(f"{opts.out}: exists and is not a dataset made by this command; pass --force or choose another --out")


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
            "rows_read": read, "rows_written": self.train_rows + self.test_rows,
            "rows_skipped": bad, "first_bad_rows": first,
        }


def split_plan(tasks: list[Task], results: list[TaskResult], test_rows: int | None, opts: CriteoOptions) -> tuple[list[int], int, int]:
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


def first_bad_message(task: Task, res: TaskResult, line_base: int) -> str:
    line, reason, detail = res.bad.first[0]
    return f"{task.path}:{line_base + line}: bad row ({reason}: {detail}); stopped because of --strict"


def run_pass1(opts: CriteoOptions, tasks: list[Task], count_in_task: Callable[[list[Task]], Iterator[TaskResult]],
              spill_dir: str | None = None) -> Pass1:
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
        raise DlrmkitError(f"{', '.join(opts.inputs)}: no valid rows in the input")
    split_at, boundary, n_test = split_plan(tasks, results, test_rows, opts)
    if boundary <= 0:
        raise DlrmkitError(f"--test-rows/--test-fraction leave no training rows ({total_valid} valid rows in the input)")
    for task, res in window:
        k = split_at[task.index]
        if k == res.rows:
            acc.add(res.counts)
        elif k > 0:
            acc.add(count_spilled(task, k, spill_dir) if spill_dir else count_task(task, limit=k).counts)
    return Pass1(tasks, results, acc.result(), split_at, boundary, n_test, n_val)



def assemble(writer: SplitBinaryWriter, part_dir: str, tasks: list[Task]) -> None:
    """Concatenate the part files of every task, in task order, into the writer's files."""
    for mapping in (TRAIN, TEST):
        h = writer.handles[mapping]
        targets = {"label.bin": h["label"], "numerical.bin": h["numerical"],
                   **{f"cat_{t}.bin": f for t, f in enumerate(h["categorical"])}}
        for name, out in targets.items():
            for task in tasks:
                p = part_path(part_dir, mapping, name, task.index)
                if os.path.exists(p):
                    with open(p, "rb") as src:
                        shutil.copyfileobj(src, out, 16 << 20)
                    os.remove(p)
        h["label"].flush()
        writer.rows[mapping] = os.path.getsize(h["label"].name)
    shutil.rmtree(part_dir, ignore_errors=True)


def build_metadata(opts: CriteoOptions, fp: dict, p1: Pass1, vocab: Vocabulary) -> dict[str, Any]:
    return {
        "generator": "dlrmkit preprocess criteo",
        "source_files": [s["path"] for s in fp["sources"]],
        "frequency_threshold": opts.frequency_threshold,
        "max_table_size": opts.max_table_size,
        "numerical_transform": "missing/negative -> 0, log(1+x), float16",
        "categorical_columns": CAT_COLS,
        "numerical_columns": INT_COLS,
        "vocabulary": "vocabulary/",
        "preprocess": {"fingerprint": fp, "report": p1.report()},
        "test_click_rate": None,
    }


def finish_dataset(opts: CriteoOptions, fp: dict, p1: Pass1, vocab: Vocabulary,
                   encode_all: Callable[[str], None]) -> FeatureSpec:
    writer = SplitBinaryWriter(opts.out, NUM_INT, vocab.cardinalities, overwrite=True, val=p1.val_rows > 0)
    try:
        part_dir = os.path.join(writer.tmp_dir, "parts")
        encode_all(part_dir)
        assemble(writer, part_dir, p1.tasks)
        carve_val(writer, p1.val_rows)
        vocab.save(writer.tmp_dir)
        meta = build_metadata(opts, fp, p1, vocab)
        for h in writer.handles.values():
            for f in [h["label"], h["numerical"], *h["categorical"]]:
                f.flush()
        labels = np.fromfile(writer.handles[TEST]["label"].name, dtype=np.bool_)
        meta["test_click_rate"] = float(labels.mean()) if len(labels) else None
        return writer.finish(meta)
    except BaseException:
        writer.abort()
        raise


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


def _preprocess(opts: CriteoOptions, tasks: list[Task], fp: dict[str, Any], total: int, spill_dir: str
                ) -> tuple[FeatureSpec | None, dict[str, Any]]:
    def count_in(ts: list[Task]) -> Iterator[TaskResult]:
        with progress_bar(total, "pass 1/2 count", opts.progress) as bar:
            jobs = [(t, not t.test) for t in ts]
            for res, t in zip(ordered_map(_count_job, jobs, opts.workers, (None, None, spill_dir)), ts):
                bar.update(t.nbytes)
                yield res

    p1 = run_pass1(opts, tasks, count_in, spill_dir)
    vocab = Vocabulary.build(CAT_COLS, p1.counts, opts.frequency_threshold, opts.max_table_size,
                             extra={"numerical_columns": INT_COLS, "numerical_transform": "log1p"})

    def encode_all(part_dir: str) -> None:
        jobs = [(t, p1.split_at[t.index]) for t in tasks]
        with progress_bar(total, "pass 2/2 encode", opts.progress) as bar:
            for _, t in zip(ordered_map(_encode_job, jobs, opts.workers, (vocab, part_dir, spill_dir)), tasks):
                bar.update(t.nbytes)

    spec = finish_dataset(opts, fp, p1, vocab, encode_all)
    return spec, spec.metadata["preprocess"]["report"]
