"""Criteo TSV text (label, I1..I13, C1..C26; plain or .gz) -> columns: byte-range tasks cut at
line boundaries, whole-line blocks, and the block parser with its bad-row accounting.

Parsing is vectorized: numpy finds lines and counts fields per line, Arrow's CSV reader splits
the valid lines into columns, and regular-expression kernels validate labels and integers. Only
undecodable lines (rare) are located with a Python loop. `predict` and `transcode` read their
input through the same tasks and blocks.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dlrmkit.data.encoder import to_string_array
from dlrmkit.errors import DlrmkitError

NUM_INT, NUM_CAT = 13, 26
INT_COLS = [f"I{i}" for i in range(1, NUM_INT + 1)]
CAT_COLS = [f"C{i}" for i in range(1, NUM_CAT + 1)]
COLUMNS = ["label", *INT_COLS, *CAT_COLS]
REASONS = ("wrong_field_count", "bad_integer", "bad_label", "undecodable")
INT_RE = r"^([-+]?0*[0-9]{1,18})?$"  # an integer: a sign, decimal digits, magnitude below 10^18
INT_LIMIT = 10**18
TASK_BYTES = 64 << 20  # fewer tasks, fewer part files to create (measured -13% CPU vs 32 MiB)
BLOCK_BYTES = 16 << 20
MAX_BLOCK_LINES = 1 << 18  # lines parsed at once: bounds the per-line arrays (dense_pieces)
MAX_LINE_BYTES = 16 << 20  # a Criteo row is ~300 bytes; parsing a line takes ~8x its size in memory


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


# ---- reading ------------------------------------------------------------------------------
def check_distinct(named: list[tuple[str, str]]) -> None:
    """Each input file once: (option, path) pairs naming one file twice (also through another
    spelling, a symbolic or a hard link) would count its rows twice, or make training rows test rows."""
    from dlrmkit.data.feature_spec import file_key

    seen: dict[tuple[int, int] | str, str] = {}
    for option, path in named:
        key = file_key(path)
        if key in seen:
            raise DlrmkitError(
                f"{option} {path}: already given as {seen[key]} (the same file); name each input file once"
            )
        seen[key] = f"{option} {path}"


def check_input_file(path: str) -> int:
    """The size of an input file, or one line saying why it cannot be one (missing, a folder or
    a device, empty)."""
    if not os.path.isfile(path):
        raise DlrmkitError(
            f"{path}: {'not a regular file (a folder or a device)' if os.path.exists(path) else 'no such input file'}"
        )
    size = os.path.getsize(path)
    if size == 0:
        raise DlrmkitError(f"{path}: empty input file")
    return size


# formats recognized by their first bytes, to name one that is not read (text is plain or gzip, .gz)
MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),  # then a block size digit and a block or end-of-stream magic: checked below
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
)


def check_compression(path: str) -> None:
    """A text input is plain, or gzip named .gz: a file of another compressed format (or a gzip
    named otherwise) is one line naming its format, not a header or rows of undecodable bytes."""
    with open(path, "rb") as f:
        head = f.read(10)
    kind = next((name for magic, name in MAGIC if head.startswith(magic)), None)
    if kind == "bzip2" and not (head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90")):
        kind = None  # text that starts with "BZh"
    if kind is None or (kind == "gzip" and path.lower().endswith(".gz")):
        return
    if kind == "gzip":
        raise DlrmkitError(f"{path}: holds gzip-compressed data; gzip input is read from a file named .gz: rename it")
    raise DlrmkitError(
        f"{path}: holds {kind}-compressed data; text input is read plain or gzip-compressed (named .gz): "
        "decompress it, or recompress it with gzip"
    )


def plan_tasks(inputs: list[str], test_files: list[str], task_bytes: int) -> list[Task]:
    """Byte-range tasks that start and end on line boundaries (a .gz file is one task)."""
    check_distinct([("--input", p) for p in inputs] + [("--test-files", p) for p in test_files])
    tasks: list[Task] = []
    for paths, is_test in ((inputs, False), (test_files, True)):
        for path in paths:
            size = check_input_file(path)
            check_compression(path)
            if path.lower().endswith(".gz"):
                tasks.append(Task(len(tasks), path, 0, None, is_test))
                continue
            bounds = [0]
            with open(path, "rb") as f:
                while bounds[-1] + task_bytes < size:
                    f.seek(bounds[-1] + task_bytes)
                    if not f.readline(MAX_LINE_BYTES + 1).endswith(b"\n") and f.tell() < size:
                        raise line_too_long(path, bounds[-1] + task_bytes)
                    if f.tell() >= size:
                        break
                    bounds.append(f.tell())
            bounds.append(size)
            tasks += [Task(len(tasks) + i, path, a, b, is_test) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return tasks


def line_too_long(path: str, offset: int, max_line: int = MAX_LINE_BYTES) -> DlrmkitError:
    return DlrmkitError(
        f"{path}: byte {offset:,}: a line longer than {max_line >> 20} MiB; rows of delimited text are far "
        "shorter (is this the right file?)"
    )


def iter_blocks(task: Task, block_bytes: int = BLOCK_BYTES, max_line: int | None = None) -> Iterator[bytes]:
    """Whole-line blocks of a task, each ending in b'\\n'. A line longer than `max_line` stops
    the read with one line naming its byte offset: memory stays bounded whatever the input."""
    max_line = max_line or MAX_LINE_BYTES
    carry = b""
    offset = task.start  # of the first byte of `carry` (in the decompressed stream for .gz)
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
                if len(carry) > max_line or (cut and data.find(b"\n") > max_line):
                    raise line_too_long(task.path, offset + (cut if len(carry) > max_line else 0), max_line)
                offset += cut
                if cut:
                    yield from dense_pieces(data[:cut] if cut < len(data) else data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DlrmkitError(f"{task.path}: truncated or corrupt gzip file ({exc})") from None
    if carry:
        yield carry + b"\n"


def dense_pieces(block: bytes, max_lines: int = MAX_BLOCK_LINES) -> Iterator[bytes]:
    """`block` (whole lines), cut into pieces of at most `max_lines` lines: parsing keeps a few
    8-byte integers per line, so a block of empty or one-byte lines (16 MiB of newlines, or a small
    gzip that expands to them) would cost ~100x its size. A piece of at most `max_lines` bytes holds
    at most `max_lines` lines; a longer line is a piece of its own. Ordinary rows (hundreds of
    bytes) never reach the limit: their blocks pass through whole."""
    if block.count(b"\n") <= max_lines:
        yield block
        return
    pos = 0
    while pos < len(block):
        end = block.rfind(b"\n", pos, pos + max_lines) + 1
        if end <= pos:  # the next line alone is longer than max_lines bytes
            end = block.index(b"\n", pos) + 1
        yield block[pos:end]
        pos = end


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
        bad.add(
            "wrong_field_count",
            line0 + wrong,
            [f"{n} fields, expected {len(COLUMNS)}" for n in nfields[wrong[:5]].tolist()],
        )
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
        read_options=pacsv.ReadOptions(
            column_names=COLUMNS, use_threads=False, block_size=max(len(block) + 1, 1 << 20)
        ),
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
        bad.add(
            "bad_label",
            line0 + line_no[bad_lab],
            [f"label is {label[int(r)].as_py()!r}, not 0 or 1" for r in bad_lab[:5].tolist()],
        )
    bad_int = np.flatnonzero(label_ok & ~int_ok)
    if len(bad_int):
        bad.add(
            "bad_integer", line0 + line_no[bad_int], [first_bad_int.get(int(r), "not an integer") for r in bad_int[:5]]
        )
    good = label_ok & int_ok
    if not good.all():
        table = table.filter(pa.array(good))
    ints = []
    for c in INT_COLS:
        s = table.column(c).combine_chunks()
        s = pc.utf8_ltrim(s, characters="+")  # Arrow's cast takes no '+' sign
        ints.append(pc.cast(pc.if_else(pc.equal(s, ""), pa.scalar(None, pa.string()), s), pa.int64()))
    cats = [to_string_array(table.column(c)).dictionary_encode() for c in CAT_COLS]
    labels = pc.equal(table.column("label"), "1").to_numpy(zero_copy_only=False)
    return Parsed(np.asarray(labels, dtype=bool), ints, cats, len(ends), line_no[good])


def _parse_typed(block: bytes, bad: Bad, line0: int, line_no: np.ndarray, lines: int) -> Parsed:
    # categoricals straight to dictionary arrays: cheaper than strings, and counting and encoding
    # then work on each block's distinct values only. Arrow's integers are wider than INT_RE (spaces
    # around the digits, 0x hexadecimal, up to 2^63): a block where they could differ goes to the
    # slow path, so a row's fate never depends on the other rows of its block
    if b" " in block or b"x" in block or b"X" in block:
        raise pa.ArrowInvalid("spaces or hexadecimal digits: validated row by row")
    cat_type = pa.dictionary(pa.int32(), pa.string())
    types = {"label": cat_type, **dict.fromkeys(INT_COLS, pa.int64()), **dict.fromkeys(CAT_COLS, cat_type)}
    table = pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(
            column_names=COLUMNS, use_threads=False, block_size=max(len(block) + 1, 1 << 20)
        ),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True),
    )
    for c in INT_COLS:
        lo, hi = pc.min_max(table.column(c)).values()
        if lo.is_valid and (lo.as_py() <= -INT_LIMIT or hi.as_py() >= INT_LIMIT):
            raise pa.ArrowInvalid(f"{c}: an integer of more than 18 digits")
    label = table.column("label").combine_chunks()
    ok = pc.fill_null(pc.is_in(label, value_set=pa.array(["0", "1"])), False).to_numpy(zero_copy_only=False)
    if not ok.all():
        bad_lab = np.flatnonzero(~ok)
        bad.add(
            "bad_label",
            line0 + line_no[bad_lab],
            [f"label is {label[int(r)].as_py() if label[int(r)].is_valid else ''!r}, not 0 or 1" for r in bad_lab[:5]],
        )
        table = table.filter(pa.array(ok))
        line_no = line_no[ok]
    ints = [table.column(c).combine_chunks() for c in INT_COLS]
    cats = [_one_chunk(table.column(c)) for c in CAT_COLS]
    labels = pc.equal(table.column("label"), "1").to_numpy(zero_copy_only=False)
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
