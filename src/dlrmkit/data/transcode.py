"""Bring-your-own data: any CSV/TSV (plain or .gz) or Parquet file with named columns ->
FeatureSpec dataset, with the same encoder (`dlrmkit.data.encoder.Vocabulary`) as the Criteo
path. Files are streamed in Arrow record batches: one pass counts valid rows (to place the test
split), one counts categories of the training rows, one encodes; memory is bounded by the
vocabulary.

Held-out rows: the last valid rows in file order (test the last, validation the ones before), or
with `split_by` (`--split-by COL`) the latest by that column: test the rows with the largest
values, validation the next, equal values in file order (of two equal values the later row is the
later), so the counts are exactly those asked for and a file already in time order splits as it
does without the option. A value is a number or an ISO date/time (`2024-01-02`,
`2024-01-02T03:04:05.123`, with `Z` or `+01:00`: its seconds since 1970-01-01 UTC, without a zone
read as UTC), compared as float64; a missing or other value is a bad row (`bad_split_value`). The
counting pass keeps each valid row's value (8 bytes a row, as `sortable` integers), the cuts are
bisected over them in place (`add_latest`), then each row's mapping (1 byte a row) serves the other
two passes; each mapping keeps file order.

Long categorical values: a value longer than LONG_VALUE_BYTES (after its field is trimmed) is read
as `long_value_key(value)`, its first 32 characters and the SHA-256 of its bytes, so equal values
stay equal and each distinct value costs at most a few hundred bytes; the rows so read are counted
by column (`Report.long_values`). `predict` reads rows through the same `clean`, so a long value
gets the id it got here. Parquet columns of text are read dictionary-encoded (a value repeated over
many rows is held once) and cut into pieces of at most BATCH_BYTES of values before they are
expanded."""

from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dlrmkit.data.encoder import (
    LONG_VALUE_BYTES,
    CountAccumulator,
    Vocabulary,
    shorten_long,
    to_string_array,
    value_counts,
)
from dlrmkit.data.output_dir import check_replaceable, output_lock
from dlrmkit.data.split_binary import SplitBinaryWriter, allow_open_files
from dlrmkit.data.val_split import val_rows
from dlrmkit.errors import DlrmkitError

NUMBER_RE = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
# a numerical field holding one of these is missing, read as 0 as an empty one is: pandas' read_csv markers
# (R's write.csv writes NA, pandas' to_csv an empty field, databases NULL)
MISSING_VALUES = pa.array(["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                           "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"])  # fmt: skip
REASONS = ("wrong_field_count", "bad_label", "bad_number", "out_of_range", "undecodable", "bad_split_value")
# the ISO dates/times --split-by reads: without a zone (read as UTC), and with a time and a zone
_DATE = r"\d{4}-\d{2}-\d{2}"
_TIME = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,9})?)?)?"
DATE_TIME_RE = rf"^{_DATE}({_TIME})?$"
ZONED_DATE_TIME_RE = rf"^{_DATE}{_TIME}(Z|[+-]\d{{2}}(:?\d{{2}})?)$"
BATCH_BYTES = 8 << 20
QUOTE_CHUNK_BYTES = 1 << 20  # `quoted_lines` looks at this many bytes of lines at a time
PARQUET_BATCH_ROWS = 1 << 16
# a row group whose needed columns hold at most this many bytes uncompressed has its text columns read
# dictionary-encoded: Arrow's dictionary of a column gathers the values of its plain pages over the row group
DICTIONARY_READ_BYTES = 64 << 20


@dataclass
class TranscodeOptions:
    inputs: list[str]
    out: str
    label: str | None  # None: rows without a label (predict --no-label); transcode always names one
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
    numerical_dtype: str = "float32"  # how numerical columns are stored: float32, or float16 (half the bytes)
    missing_label_hint: str = ""  # appended to the error when the label column is missing
    label_values: tuple[str, str] | None = None  # the label's values read as 0 and 1; None: 0/1 as numbers
    keep: list[str] = field(default_factory=list)  # columns read as text only, carried to the output (predict)
    long_value_bytes: int | None = LONG_VALUE_BYTES  # None: categorical values read whole (an older vocabulary)
    split_by: str | None = None  # held-out rows: the latest by this column (None: the last in file order)


def float16_hint(opts: "TranscodeOptions", out_of_range: int) -> str:
    """Where float16 storage (--numerical-dtype float16) skipped rows for numbers beyond its range
    that a transform or float32 would keep, a clause saying so; else ''."""
    if not out_of_range or opts.log or opts.numerical_dtype != "float16":
        return ""
    return (
        f"; {out_of_range:,} rows were skipped for numbers beyond float16's +-65504 (--numerical-dtype float16): "
        "--log-transform stores log(1+x) and keeps them, and so does the default float32"
    )


@dataclass
class Report:
    read: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    first: list[str] = field(default_factory=list)
    _order: list[tuple[int, int]] = field(default_factory=list)  # (file, data row) of each listed position
    file_index: int = 0
    empty_lines: int = 0  # skipped, not rows: reported beside the rows skipped
    escaped: int = 0  # kept values (predict --keep-columns only) that are not UTF-8, written with \x escapes
    # (reason, column) -> rows skipped, each row at its first failing column ("" for a row's field count)
    by_column: dict[tuple[str, str], int] = field(default_factory=dict)
    first_by_column: dict[tuple[str, str], str] = field(default_factory=dict)  # the first such row, located
    unused: list[str] = field(default_factory=list)  # the first file's columns not read (neither label nor feature)
    long_values: dict[str, int] = field(default_factory=dict)  # column -> rows whose value was read as its key
    missing: dict[str, int] = field(default_factory=dict)  # numerical column -> rows written with it missing (0)

    def count_columns(self, reason: str, counts: dict[str, int], where: dict[str, str]) -> None:
        """Rows skipped for `reason`, by the column that failed; `where` locates the first row of
        each column in this batch."""
        for name, n in counts.items():
            key = (reason, name)
            self.by_column[key] = self.by_column.get(key, 0) + n
            self.first_by_column.setdefault(key, where[name])

    def bad(self, reason: str, count: int, where: list[str]) -> None:
        """`count` rows skipped for `reason` (exact); `where` locates the first few."""
        self.skipped[reason] += count
        self.first = (self.first + where)[:5]

    def bad_at(self, reason: str, count: int, rows: list[int], where: list[str]) -> None:
        """Like `bad`, keeping the listed positions in file order (first files, then rows)."""
        self.skipped[reason] += count
        pairs = sorted(zip(self._order, self.first)) + [((self.file_index, r), w) for r, w in zip(rows, where)]
        pairs.sort(key=lambda p: p[0])
        self._order, self.first = [p[0] for p in pairs[:5]], [p[1] for p in pairs[:5]]


def _is_parquet(path: str) -> bool:
    return path.lower().endswith((".parquet", ".pq"))


def iter_batches(opts: TranscodeOptions, path: str, report: Report | None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """(record batch with every needed column, 1-based data-row number of each of its rows)."""
    needed = _needed(opts)
    if _is_parquet(path):
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DlrmkitError(f"{path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        names = pf.schema_arrow.names
        twice = sorted(c for c in repeated(names) if c in needed)
        if twice:  # Arrow cannot say which one a read means
            raise DlrmkitError(f"{path}: column '{twice[0]}' appears twice in the Parquet schema")
        _check_columns(opts, path, needed, names, report)
        text = [c for c in needed if _is_text(pf.schema_arrow.field(c).type)]
        row0 = 0
        try:
            encoded = pq.ParquetFile(path, read_dictionary=text)  # a value repeated over many rows is held once
            for g in range(pf.metadata.num_row_groups):
                rows, size = _parquet_batch_rows(pf.metadata.row_group(g), needed)
                reader = encoded if size <= DICTIONARY_READ_BYTES else pf
                for b in reader.iter_batches(batch_size=rows, row_groups=[g], columns=needed):
                    for t in _parquet_pieces(opts, path, b, needed, row0, report):
                        yield t, np.arange(row0 + 1, row0 + t.num_rows + 1)
                        row0 += t.num_rows
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise DlrmkitError(f"{path}: cannot read Parquet data ({str(exc).splitlines()[0]})") from None
        return
    yield from _text_batches(opts, path, needed, report)


def repeated(names: list[str]) -> list[str]:
    """The names listed more than once, in the order they first appear; in time linear in the list
    (a header or a Parquet schema may name 100,000 columns: counting each name again took minutes)."""
    return [n for n, k in Counter(names).items() if k > 1]


def _needed(opts: TranscodeOptions) -> list[str]:
    """The columns read: the label (when there is one), the numerical and categorical ones, the
    split_by column, then those kept as text (`keep`)."""
    label = [opts.label] if opts.label is not None else []
    split = [opts.split_by] if opts.split_by is not None else []
    return list(dict.fromkeys([*label, *opts.numerical, *opts.categorical, *split, *opts.keep]))


def _check_columns(
    opts: TranscodeOptions, path: str, needed: list[str], names: list[str], report: Report | None = None
) -> None:
    """Every column named is in the file; the first file's others are noted in `report` (not read)."""
    missing = [c for c in needed if c not in names]
    if missing:
        hint = opts.missing_label_hint if opts.label in missing else ""
        if set(missing) <= set(opts.keep) - {opts.label, *opts.numerical, *opts.categorical}:
            hint = "; --keep-columns names columns of the input rows"
        other = [d for d in ",;|\t" if len(names) == 1 and d in names[0]]  # one name: the delimiter is another
        if other:
            hint = f"; the header is one column: are its fields separated by {other[0]!r} (--delimiter)?"
        raise DlrmkitError(f"{path}: no column(s) {', '.join(missing)} (has: {_listing(names)}){hint}")
    if report is not None and report.file_index == 0:
        report.unused = [c for c in dict.fromkeys(names) if c not in needed]


def _quoted(value: str | bytes | None, most: int = 20) -> str:
    """A field's value for a one-line message: quoted and escaped (never a line break), cut to
    `most` characters."""
    value = value or ""
    return repr(value[:most]) + ("..." if len(value) > most else "")


def _where(opts: TranscodeOptions, path: str, row: int) -> str:
    """A data row's position: `file:line: data row N` for text (the header is line 1), else `file: data row N`."""
    if _is_parquet(path):
        return f"{path}: data row {row}"
    return f"{path}:{row + (1 if opts.header else 0)}: data row {row}"


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _parquet_batch_rows(group: Any, needed: list[str]) -> tuple[int, int]:
    """(rows per batch, bytes) of a row group: about BATCH_BYTES of the needed columns'
    uncompressed pages (from the file's metadata), at most PARQUET_BATCH_ROWS, and those pages'
    bytes. A column stored dictionary-encoded is small there whatever its values' length: read
    dictionary-encoded, `_parquet_pieces` cuts it by the values' own length."""
    wanted = set(needed)
    size = sum(
        max(0, group.column(j).total_uncompressed_size)
        for j in range(group.num_columns)
        if group.column(j).path_in_schema.split(".")[0] in wanted
    )
    return int(max(1, min(PARQUET_BATCH_ROWS, BATCH_BYTES * max(1, group.num_rows) // max(1, size)))), size


def _parquet_pieces(
    opts: TranscodeOptions, path: str, b: pa.RecordBatch, needed: list[str], row0: int, report: Report | None
) -> Iterator[pa.Table]:
    """A record batch (text columns dictionary-encoded, or plain) as tables of text columns holding
    at most BATCH_BYTES of values each (or one row): each column's dictionary is cut to the entries
    the batch uses, a categorical entry longer than opts.long_value_bytes becomes its key
    (`long_value_key`, counted per row in `report`), and only then are the values expanded. A row
    whose values hold more than MAX_LINE_BYTES (a text file's longest line) is refused."""
    from dlrmkit.data.criteo_tsv import MAX_LINE_BYTES

    cols, row_bytes = {}, np.zeros(b.num_rows, np.int64)
    for c in needed:
        col = b.column(c)
        if pa.types.is_dictionary(col.type) and _is_text(col.type.value_type):
            col = _used_entries(col)
            if c in opts.categorical and opts.long_value_bytes is not None:
                col, long_rows = _shorten_dictionary(col, opts.long_value_bytes)
                if report is not None and long_rows:
                    report.long_values[c] = report.long_values.get(c, 0) + long_rows
            lengths = pc.binary_length(col.dictionary).to_numpy(zero_copy_only=False).astype(np.int64)
            row_bytes += np.append(lengths, 0)[col.indices.fill_null(len(lengths)).to_numpy(zero_copy_only=False)]
        elif _is_text(col.type):
            row_bytes += pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            row_bytes += col.nbytes // max(1, b.num_rows)
        cols[c] = col
    big = np.flatnonzero(row_bytes > MAX_LINE_BYTES)
    if len(big):
        raise DlrmkitError(
            f"{_where(opts, path, row0 + int(big[0]) + 1)}: its values hold {int(row_bytes[big[0]]):,} bytes, more "
            f"than the {MAX_LINE_BYTES >> 20} MiB a row may hold (a text file's longest line)"
        )
    ends = np.cumsum(row_bytes)
    start = 0
    while start < b.num_rows:  # at least one row a piece
        stop = max(start + 1, int(np.searchsorted(ends, ends[start] - row_bytes[start] + BATCH_BYTES, "right")))
        yield pa.table({c: _parquet_text(_expanded(col.slice(start, stop - start))) for c, col in cols.items()})
        start = stop


def _used_entries(col: pa.DictionaryArray) -> pa.DictionaryArray:
    """The same values with a dictionary of only the entries the rows use (a batch may carry its
    whole row group's dictionary)."""
    valid = col.indices.is_valid().to_numpy(zero_copy_only=False)
    idx = col.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    used = np.flatnonzero(np.bincount(idx[valid], minlength=len(col.dictionary)))
    if len(used) == len(col.dictionary):
        return col
    remap = np.zeros(len(col.dictionary), np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    indices = pa.array(remap[idx], pa.int32(), mask=~valid if not valid.all() else None)
    return pa.DictionaryArray.from_arrays(indices, col.dictionary.take(pa.array(used)))


def _shorten_dictionary(col: pa.DictionaryArray, limit: int) -> tuple[pa.DictionaryArray, int]:
    """`col` with each dictionary entry whose field (as `clean` trims it) is longer than `limit`
    bytes replaced by its key, and the rows that use such an entry."""
    values, ok = _as_text(col.dictionary)
    keys, long = shorten_long(_field(values), limit)
    long &= ok  # bytes that are not UTF-8: the row is bad (`clean`), left as they are
    if not long.any():
        return col, 0
    dictionary = pc.replace_with_mask(
        col.dictionary, pa.array(long), keys.filter(pa.array(long)).cast(col.dictionary.type)
    )
    idx = col.indices.drop_null().to_numpy(zero_copy_only=False)
    return pa.DictionaryArray.from_arrays(col.indices, dictionary), int(long[idx].sum())


def _expanded(col: pa.Array) -> pa.Array:
    return pc.take(col.dictionary, col.indices) if pa.types.is_dictionary(col.type) else col


def _parquet_text(col: pa.Array) -> pa.Array:
    """A Parquet column as strings, binary ones left as bytes: clean() decodes those, counting a
    row whose bytes are not UTF-8 as `undecodable`, as a text file's (one row, not the whole file)."""
    col = _plain(col)
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return col
    return pc.cast(col, pa.string())


def _plain(col: pa.Array) -> pa.Array:
    """A Parquet column as text reads it: booleans as 0/1 (a natural label column), not true/false."""
    return pc.cast(col, pa.int8()) if pa.types.is_boolean(col.type) else col


UNUSED_RECORDED = 1000  # the unused columns named in the FeatureSpec, each cut to 200 characters


def _unused_record(unused: list[str]) -> dict[str, Any]:
    """The first file's unused columns as the FeatureSpec records them: at most UNUSED_RECORDED
    names, and their count where there are more (a header of a million columns, or one name of
    16 MiB, wrote a feature_spec.yaml larger than a FeatureSpec may be: the dataset just written
    was refused by every command that reads it)."""
    names = [n if len(n) <= 200 else n[:197] + "..." for n in unused[:UNUSED_RECORDED]]
    return {"unused_columns": names, **({"unused_columns_count": len(unused)} if len(unused) > len(names) else {})}


def _listing(names: list[str], most: int = 20) -> str:
    """Column names for a one-line message: a header that is really a whole file stays short."""
    shown = [(n if len(n) <= 40 else n[:37] + "...") or "''" for n in names[:most]]  # '': an empty name
    return ", ".join(shown) + (f", ... ({len(names):,} in all)" if len(names) > most else "")


def _header(path: str, block: bytes, delim: bytes) -> list[str]:
    """The column names on the first line of `block` (the file's first block)."""
    first = block[: block.index(b"\n") + 1]
    try:
        text = first.rstrip(b"\r\n").decode("utf-8").removeprefix("\ufeff")  # a byte order mark is not a name
    except UnicodeDecodeError:
        raise DlrmkitError(f"{path}:1: the header line is not UTF-8 text") from None
    if not text.strip():  # else every name is '' and the error would list none
        rest = block.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\n")
        line = block[: len(block) - len(rest)].count(b"\n") + 1
        where = f" (line {line} is the first that is not)" if rest else ""
        raise DlrmkitError(f"{path}:1: the header line is blank{where}; the column names must be on line 1")
    try:  # names in CSV quotes may hold the delimiter, as data fields may (`quoted_lines`)
        names = next(csv.reader([text], delimiter=delim.decode(), strict=True))
    except csv.Error:  # a quote out of place: an ordinary character, as on a data line
        names = text.split(delim.decode())
    return [c.strip().strip('"').strip() for c in names]


def quoted_lines(b: np.ndarray, starts: np.ndarray, ends: np.ndarray, delim: int) -> tuple[np.ndarray, np.ndarray]:
    """(each line's field count where its quotes are CSV's, else 0; lines with quotes that are not):
    of the lines of block `b` (bytes `starts[i]` to `ends[i]`, a newline), those whose quotes all
    follow RFC 4180 within the line: a field that holds a quote starts and ends with one, and inside
    it quotes come doubled. Such a field may hold the delimiter. A line with a quote anywhere else (a
    stray one, an unclosed one, one after a space) is read with its quotes as ordinary characters,
    as a line without quotes has none, so a quote never joins lines. Vectorized over the quotes'
    runs: a run's parity (quotes before it on its line) says whether it opens, escapes inside or
    closes a field. Taken QUOTE_CHUNK_BYTES of whole lines at a time, so a block full of quotes
    holds a few arrays of that size at once."""
    n = len(starts)
    if n > 1 and ends[-1] - starts[0] > QUOTE_CHUNK_BYTES:
        fields, stray = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        i = 0
        while i < n:  # a loop over chunks of lines: at least one line each
            j = max(i + 1, int(np.searchsorted(ends, starts[i] + QUOTE_CHUNK_BYTES)))
            lo = starts[i]
            fields[i:j], stray[i:j] = quoted_lines(b[lo : ends[j - 1] + 1], starts[i:j] - lo, ends[i:j] - lo, delim)
            i = j
        return fields, stray
    quotes = np.flatnonzero(b == 34)
    if not len(quotes):
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    line = np.searchsorted(ends, quotes)
    per_line = np.bincount(line, minlength=n)
    before_line = np.searchsorted(quotes, starts)  # quotes before each line
    first = np.flatnonzero(np.diff(quotes, prepend=-2) != 1)  # each run's first quote (its index in `quotes`)
    run_len = np.diff(np.append(first, len(quotes)))
    run_start, run_line = quotes[first], line[first]
    run_end = run_start + run_len - 1
    odd_before = (first - before_line[run_line]) & 1
    odd_after = (odd_before + run_len) & 1
    at_start = (run_start == starts[run_line]) | ((b[run_start - 1] == delim) & (odd_before == 0))
    at_end = (b[run_end + 1] == 10) | ((b[run_end + 1] == delim) & (odd_after == 0))
    odd_len = (run_len & 1).astype(bool)
    ok = np.where(
        at_start,
        (odd_before == 0) & (odd_len != at_end),  # opens a field (odd), or is the whole field ("" or """")
        (odd_before == 1) & (odd_len == at_end),  # closes the field (odd) or escapes inside it (even)
    )
    bad_runs = np.bincount(run_line[~ok], minlength=n)
    quoted = (per_line > 0) & (per_line % 2 == 0) & (bad_runs == 0)
    delims = np.flatnonzero(b == delim)
    d_line = np.searchsorted(ends, delims)
    inside = ((np.searchsorted(quotes, delims) - before_line[d_line]) & 1).astype(bool)
    fields = np.bincount(d_line[~inside], minlength=n) + 1
    return np.where(quoted, fields, 0), (per_line > 0) & ~quoted


def _read_fields(block: bytes, names: list[str], needed: list[str], delim: str, quoted: bool) -> pa.Table:
    return pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False, block_size=len(block) + 1),
        parse_options=pacsv.ParseOptions(
            delimiter=delim, quote_char='"' if quoted else False, newlines_in_values=False, ignore_empty_lines=False
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(needed, pa.binary()), include_columns=needed, strings_can_be_null=False
        ),
    )


def _text_batches(
    opts: TranscodeOptions, path: str, needed: list[str], report: Report | None
) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Delimited text, one row per line. A field quoted as CSV quotes it (`quoted_lines`) may hold
    the delimiter and doubled quotes, never a line break; any other quote is an ordinary character
    (a field's surrounding quotes are removed later), so a quote can never join lines and hide the
    rows after it. A line with the wrong number of fields is a counted bad row."""
    from dlrmkit.data.criteo_tsv import Task, check_compression, iter_blocks

    check_compression(path)
    delim = (opts.delimiter or ("\t" if path.lower().endswith((".tsv", ".tsv.gz")) else ",")).encode()
    task = Task(0, path, 0, None if path.lower().endswith(".gz") else os.path.getsize(path), False)
    names = list(opts.columns) if not opts.header else None
    if names is not None and len(set(names)) != len(names):
        raise DlrmkitError(f"--columns: '{repeated(names)[0]}' appears twice")
    data_row = 0  # data lines before this block
    for block in iter_blocks(task, BATCH_BYTES):
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n")
        if names is None:
            names = _header(path, block, delim)
            block = block[block.index(b"\n") + 1 :]
            twice = sorted(c for c in repeated(names) if c in needed)
            if twice:
                raise DlrmkitError(f"{path}:1: column '{twice[0]}' appears twice in the header")
        if not data_row and names is not None:
            _check_columns(opts, path, needed, names, report)
        if not block:
            continue
        b = np.frombuffer(block, dtype=np.uint8)
        ends = np.flatnonzero(b == 10)
        starts = np.concatenate([[0], ends[:-1] + 1])
        nfields = np.diff(np.searchsorted(np.flatnonzero(b == delim[0]), ends), prepend=0) + 1
        quoted_fields, stray = quoted_lines(b, starts, ends, delim[0])
        nfields = np.where(quoted_fields > 0, quoted_fields, nfields)
        line_no = data_row + np.arange(1, len(ends) + 1)
        data_row += len(ends)
        blank = ends == starts  # empty lines are not rows (as CSV readers skip them): counted apart
        if report is not None:
            report.empty_lines += int(blank.sum())
        wrong = ~blank & (nfields != len(names))
        if b"\r" in block:  # a carriage return inside a line would end a row in Arrow: a bad row
            wrong[np.searchsorted(ends, np.flatnonzero(b == 13))] = True
        if report is not None and wrong.any():
            rows = np.flatnonzero(wrong)
            report.read += len(rows)
            where = [
                f"{_where(opts, path, int(line_no[r]))}: wrong_field_count ({int(nfields[r])} fields, expected {len(names)})"
                for r in rows[:5]
            ]
            report.bad_at("wrong_field_count", len(rows), [int(line_no[r]) for r in rows[:5]], where)
            report.count_columns("wrong_field_count", {"": len(rows)}, {"": where[0]})
        keep = ~blank & ~wrong
        if not keep.any():
            continue
        # a line without quotes reads the same with quoting or without: only stray quotes need the plain reader
        stray &= keep
        csv_quoted, sep = keep & ~stray, delim.decode()
        parts = [
            _read_fields(
                block if lines.all() else b[np.repeat(lines, ends - starts + 1)].tobytes(), names, needed, sep, q
            )
            for lines, q in ((csv_quoted, True), (stray, False))
            if lines.any()
        ]
        table = parts[0]
        if len(parts) == 2:  # back to file order: the rows of stray quotes after the others in the parts
            in_stray = stray[keep]
            order = np.where(in_stray, int(csv_quoted.sum()) + np.cumsum(in_stray) - 1, np.cumsum(~in_stray) - 1)
            table = pa.concat_tables(parts).take(pa.array(order))
        if len(table) != int(keep.sum()):  # quoted_lines admits no line Arrow would join: a bug, never input
            raise RuntimeError(f"{path}: {len(table)} rows read from {int(keep.sum())} lines")
        yield table, line_no[keep]


def _as_text(col: pa.Array, escape: bool = False) -> tuple[pa.Array, np.ndarray]:
    """(string array, rows that are valid UTF-8); invalid values become "" (their rows are bad), or,
    with `escape`, their text with each byte that is not UTF-8 as a \\xNN escape."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col, np.ones(len(col), dtype=bool)
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        return pc.cast(col, pa.string()), np.ones(len(col), dtype=bool)
    try:
        return pc.cast(col, pa.string()), np.ones(len(col), dtype=bool)
    except pa.ArrowInvalid:  # rare: find the undecodable values (a loop over this column only)
        values = col.to_pylist()
        ok = np.ones(len(values), dtype=bool)
        for i, v in enumerate(values):
            try:
                (v or b"").decode("utf-8")
            except UnicodeDecodeError:
                ok[i], values[i] = False, v.decode("utf-8", "backslashreplace").encode() if escape else b""
        return pc.cast(pa.array(values, pa.binary()), pa.string()), ok


def _field(arr: pa.Array) -> pa.Array:
    """A field as CSV readers give it: surrounding whitespace trimmed, one pair of enclosing quotes removed."""
    arr = pc.utf8_trim_whitespace(arr)
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(arr, pattern=r'^"(.*)"$', replacement=r"\1"))


def clean(
    opts: TranscodeOptions,
    t: pa.Table,
    report: Report | None,
    path: str,
    rows: np.ndarray,
    rows_out: list[np.ndarray] | None = None,
    kept_out: list[list[pa.Array]] | None = None,
    keys_out: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
    """Valid rows only: labels (bool; all False without a label column), numerical
    (opts.numerical_dtype) and categorical string columns. `rows` holds each row's 1-based data-row
    number. Every skipped row is counted by its first failing check: undecodable bytes, a bad label,
    a bad number, or a number the storage dtype cannot hold (|x| > 65504 for float16, 3.4e38 for
    float32, after the transform; never stored as infinity); it is located by the first column
    failing that check, with the column's value.
    `rows_out` (for `predict`) receives the data-row numbers of the valid rows, `kept_out` the
    valid rows' values of the `keep` columns, as text (a missing Parquet value as ""). A column kept
    and not read by the model never makes a row bad: a value there that is not UTF-8 is kept with
    \\xNN escapes, and counted (`report.escaped`). With `opts.split_by`, a row whose value there is
    missing or neither a number nor an ISO date/time is bad (`bad_split_value`), and `keys_out`
    receives the valid rows' values (`split_keys`)."""
    text, utf8, escaped = {}, {}, []
    model_columns = {opts.label, *opts.numerical, *opts.categorical, opts.split_by} - {None}
    for c in _needed(opts):
        arr, ok = _as_text(t.column(c).combine_chunks(), escape=c not in model_columns)
        text[c] = _field(arr)
        if c in opts.categorical and opts.long_value_bytes is not None:
            text[c], long = shorten_long(text[c], opts.long_value_bytes)
            if report is not None and long.any():  # rows of valid UTF-8 (the others are bad rows)
                report.long_values[c] = report.long_values.get(c, 0) + int((long & ok).sum())
        if c in model_columns:
            utf8[c] = ok
        else:  # counted below, in the rows written only
            escaped.append(~ok)
    n = t.num_rows
    utf8_ok = np.logical_and.reduce(list(utf8.values())) if utf8 else np.ones(n, dtype=bool)
    lab_ok, lab_val = np.ones(n, dtype=bool), np.zeros(n)
    if opts.label is not None:
        label = text[opts.label]
        if opts.label_values is not None:  # two named values, compared as text
            neg, pos = (
                pc.fill_null(pc.equal(label, v), False).to_numpy(zero_copy_only=False) for v in opts.label_values
            )
            lab_ok, lab_val = neg | pos, pos.astype(np.float64)
        else:
            lab_ok = pc.fill_null(pc.match_substring_regex(label, NUMBER_RE), False).to_numpy(zero_copy_only=False)
            lab_val = np.full(n, -1.0)
            if lab_ok.any():
                lab_val[lab_ok] = pc.cast(label.filter(pa.array(lab_ok)), pa.float64()).to_numpy()
            lab_ok &= (lab_val == 0) | (lab_val == 1)
    num_oks, nums, missing = [], [], []
    for c in opts.numerical:
        s = text[c]
        missing_value = pc.or_(pc.is_in(s, value_set=MISSING_VALUES), pc.is_null(s))  # null: Parquet's
        empty = missing_value.to_numpy(zero_copy_only=False)
        missing.append(empty)
        ok = empty | pc.fill_null(pc.match_substring_regex(s, NUMBER_RE), False).to_numpy(zero_copy_only=False)
        num_oks.append(ok)
        vals = np.full(len(s), np.nan)
        fill = ok & ~empty
        if fill.any():
            vals[fill] = pc.cast(s.filter(pa.array(fill)), pa.float64()).to_numpy()
        nums.append(vals)
    num_cols = np.stack(num_oks, axis=1) if num_oks else np.ones((n, 0), dtype=bool)
    num_ok = num_cols.all(axis=1)
    dense = np.stack(nums, axis=1) if nums else np.zeros((n, 0))
    dense = np.where(np.isnan(dense), 0.0, dense)  # empty -> 0; text that overflowed float64 stays inf
    with np.errstate(over="ignore", invalid="ignore"):
        stored = (np.log1p(np.maximum(dense, 0.0)) if opts.log else dense).astype(np.float32)
        stored = stored.astype(opts.numerical_dtype)
    range_cols = np.isfinite(stored)
    range_ok = range_cols.all(axis=1)  # beyond the dtype's range: a bad row, never +-inf
    keys, key_ok = split_keys(text[opts.split_by]) if opts.split_by is not None else (None, np.ones(n, dtype=bool))
    if report is not None:
        report.read += n
        named = list(utf8)
        checks = (  # the first failing check names the reason; each row is counted once
            ("undecodable", ~utf8_ok, named, np.stack([utf8[c] for c in named], axis=1) if named else None),
            ("bad_label", utf8_ok & ~lab_ok, [opts.label], None),
            ("bad_number", utf8_ok & lab_ok & ~num_ok, opts.numerical, num_cols),
            ("out_of_range", utf8_ok & lab_ok & num_ok & ~range_ok, opts.numerical, range_cols),
            ("bad_split_value", utf8_ok & lab_ok & num_ok & range_ok & ~key_ok, [opts.split_by], None),
        )
        for reason, mask_bad, cols, col_ok in checks:
            bad_rows = np.flatnonzero(mask_bad)
            if not len(bad_rows):
                continue
            # the first failing column of each bad row
            first_col = np.zeros(len(bad_rows), dtype=np.int64) if col_ok is None else np.argmin(col_ok[bad_rows], 1)

            def where(i: int, reason: str = reason, cols: list = cols, first_col: np.ndarray = first_col) -> str:
                r, c = int(bad_rows[i]), cols[int(first_col[i])]
                value = t.column(c)[r].as_py() if reason == "undecodable" else text[c][r].as_py()
                return f"{_where(opts, path, int(rows[r]))}: {reason} in column {c} ({_quoted(value)})"

            shown = [where(i) for i in range(min(5, len(bad_rows)))]
            report.bad_at(reason, len(bad_rows), [int(rows[r]) for r in bad_rows[:5]], shown)
            ks, firsts, counts = np.unique(first_col, return_index=True, return_counts=True)
            report.count_columns(
                reason,
                {cols[k]: int(m) for k, m in zip(ks, counts)},
                {cols[k]: where(int(i)) for k, i in zip(ks, firsts)},
            )
    good = utf8_ok & lab_ok & num_ok & range_ok & key_ok
    if report is not None:  # kept values escaped in the rows kept (a skipped row's are never written)
        report.escaped += sum(int((bad & good).sum()) for bad in escaped)
        for c, empty in zip(opts.numerical, missing):
            if (n_missing := int((empty & good).sum())) > 0:
                report.missing[c] = report.missing.get(c, 0) + n_missing
    if rows_out is not None:
        rows_out.append(rows[good])
    if keys_out is not None and keys is not None:
        keys_out.append(keys[good])
    dense = stored[good]
    mask = pa.array(good)
    if kept_out is not None:
        kept_out.append([pc.fill_null(text[c].filter(mask), "") for c in opts.keep])
    cats = [to_string_array(text[c].filter(mask)) for c in opts.categorical]
    return lab_val[good] == 1, dense, cats


def split_keys(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value of each --split-by field, which are valid): a number, or an ISO date/time as
    its seconds since 1970-01-01 UTC (without a zone: UTC); missing, other text, an impossible date
    (2024-02-30) or a number beyond float64 is not valid."""
    keys = np.full(len(values), np.nan)
    number = pc.fill_null(pc.match_substring_regex(values, NUMBER_RE), False).to_numpy(zero_copy_only=False)
    if number.any():
        keys[number] = pc.cast(values.filter(pa.array(number)), pa.float64()).to_numpy()
    for pattern, unit in ((DATE_TIME_RE, pa.timestamp("ns")), (ZONED_DATE_TIME_RE, pa.timestamp("ns", "UTC"))):
        if number.all():  # a column of numbers: no date to look for
            break
        date = pc.fill_null(pc.match_substring_regex(values, pattern), False).to_numpy(zero_copy_only=False)
        if date.any():
            ns = pc.cast(_cast_or_null(values.filter(pa.array(date)), unit), pa.int64())
            keys[date] = ns.to_numpy(zero_copy_only=False).astype(np.float64) / 1e9  # null -> nan
    return keys, np.isfinite(keys)


def _cast_or_null(values: pa.Array, to: pa.DataType) -> pa.Array:
    """`values` cast to `to`, each value that cannot be as null: halved until the casts succeed, so
    a few impossible values cost a few casts each, not one cast a value."""
    try:
        return pc.cast(values, to)
    except pa.ArrowInvalid:
        if len(values) == 1:
            return pa.nulls(1, to)
        half = len(values) // 2
        return pa.concat_arrays([_cast_or_null(values.slice(0, half), to), _cast_or_null(values.slice(half), to)])


def sortable(keys: np.ndarray) -> np.ndarray:
    """float64 values as uint64 in the same order (-0.0 as 0.0): one 8-byte array a row, compared
    and bisected exactly."""
    u = (keys + 0.0).view(np.uint64)
    return np.where(u >> np.uint64(63) == 1, ~u, u | np.uint64(1 << 63))


def _unsortable(v: int) -> float:
    """The float64 a `sortable` value stands for."""
    u = v & ~(1 << 63) if v >> 63 else ~v & ((1 << 64) - 1)
    return float(np.array([u], np.uint64).view(np.float64)[0])


def add_latest(where: np.ndarray, chunks: list[np.ndarray], k: int) -> float:
    """Add 1 to `where` (a uint8 a row) at the `k` rows latest by `chunks` (the rows' `sortable`
    values, in file order): the largest values, of equal values the last in file order, so exactly
    `k` rows; returns the smallest value taken. The cut is bisected bit by bit (64 counts over the
    values): no copy of them, no sort."""
    if k <= 0:
        return float("nan")
    cut = 0  # the largest t with at least k values >= t: the k-th largest value
    for bit in range(63, -1, -1):
        t = np.uint64(cut | 1 << bit)
        if sum(np.count_nonzero(c >= t) for c in chunks) >= k:
            cut = int(t)
    at = np.uint64(cut)
    need = k - sum(np.count_nonzero(c > at) for c in chunks)  # rows of the cut value taken: the last ones
    end = len(where)
    for c in reversed(chunks):
        taken = c > at
        if need:
            equal = np.flatnonzero(c == at)[-need:]
            taken[equal] = True
            need -= len(equal)
        where[end - len(c) : end] += taken
        end -= len(c)
    return _unsortable(cut)


def iter_clean(
    opts: TranscodeOptions, report: Report | None, keys_out: list[np.ndarray] | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, list[pa.Array]]]:
    for k, path in enumerate(opts.inputs):
        if report is not None:
            report.file_index = k
        for t, rows in iter_batches(opts, path, report):
            yield clean(opts, t, report, path, rows, keys_out=keys_out)


def transcode(opts: TranscodeOptions) -> tuple[Any, Report]:
    from dlrmkit.data.criteo_tsv import check_distinct, check_input_file

    check_distinct([("--input", p) for p in opts.inputs])
    for p in opts.inputs:
        check_input_file(p)
    if not opts.categorical and not opts.numerical:
        raise DlrmkitError("name at least one --numerical or --categorical column")
    named = [opts.label, *opts.numerical, *opts.categorical]
    twice = sorted(repeated(named))
    if twice:
        raise DlrmkitError(f"column '{twice[0]}' is named more than once in --label/--numerical/--categorical")
    if opts.split_by is not None and opts.split_by == opts.label:
        raise DlrmkitError(f"--split-by {opts.split_by} is the --label column: name a time column (numbers or dates)")
    if opts.split_by is not None and not (opts.test_rows or opts.test_fraction or opts.val_rows or opts.val_fraction):
        raise DlrmkitError("--split-by orders the held-out rows: give --test-rows/--test-fraction (or --val-*) too")
    mappings = 3 if opts.val_rows or opts.val_fraction else 2
    allow_open_files(mappings * (len(opts.categorical) + 2), f"{len(opts.categorical):,} --categorical columns")
    with output_lock(opts.out):  # one writer per --out
        check_replaceable(opts.out, opts.force, opts.inputs)
        return _transcode(opts)


def main_cause(opts: TranscodeOptions, report: Report) -> tuple[int, str, str, str]:
    """(rows, reason, column, advice) of the (reason, column) that skipped the most rows."""
    (reason, col), n = max(report.by_column.items(), key=lambda kv: kv[1])
    if reason == "bad_number":
        advice = f"if {col} holds ids or words rather than numbers, name it in --categorical instead of --numerical"
    elif reason == "out_of_range":
        advice = f"if {col} holds ids rather than quantities, name it in --categorical instead of --numerical" + (
            "; or store float32 (the default) or give --log-transform"
            if opts.numerical_dtype == "float16" and not opts.log
            else ""
        )
    elif reason == "bad_label":
        advice = (
            f"--label {col} must hold {' or '.join(opts.label_values)}: is it the click column?"
            if opts.label_values is not None
            else f"--label {col} must hold 0/1 (--label-values NEG,POS reads two other values): is it the click column?"
        )
    elif reason == "wrong_field_count":
        advice = (
            "the rows do not have the expected number of fields: check --delimiter (a field in quotes may "
            "hold the delimiter, as CSV quotes it, but not a line break)"
        )
    elif reason == "bad_split_value":
        advice = f"--split-by {col} must hold numbers or ISO dates/times (2024-01-02T03:04:05): is it the time column?"
    else:
        advice = f"column {col} is not UTF-8 text"
    return n, reason, col, advice


def too_many_skipped(opts: TranscodeOptions, report: Report) -> DlrmkitError | None:
    """The refusal when more than half of the rows read would be skipped (a column given the wrong
    type, a wrong delimiter or label): one line naming the cause of most skips, or None."""
    n_bad = sum(report.skipped.values())
    if not n_bad or n_bad * 2 <= report.read:
        return None
    n, reason, col, advice = main_cause(opts, report)
    return DlrmkitError(
        f"{', '.join(opts.inputs)}: {n_bad:,} of {report.read:,} rows read are bad (more than half), "
        f"{n:,} of them {reason}{f' in column {col}' if col else ''} (first: {report.first_by_column[(reason, col)]}): "
        f"{advice}; nothing written"
    )


def _held_out(
    opts: TranscodeOptions, keys: list[np.ndarray] | None, n_test: int, n_val: int
) -> tuple[dict[str, Any], np.ndarray | None]:
    """(how the rows were split, as the FeatureSpec records it; each valid row's mapping, 0 train,
    1 val, 2 test, or None for the last rows in file order). With --split-by, the held-out rows
    are the latest by its values (`add_latest`), and the record gives the smallest value of each."""
    given = {k: getattr(opts, k) for k in ("test_rows", "test_fraction", "val_rows", "val_fraction")}
    given = {k: v for k, v in given.items() if v is not None}
    if keys is None:
        return {"held_out": "the last valid rows in file order (test last, val before it)", **given}, None
    for i, chunk in enumerate(keys):  # in place: 8 bytes a valid row, 1 more for `where`
        keys[i] = sortable(chunk)
    where = np.zeros(sum(len(c) for c in keys), np.uint8)  # held-out rows 1, test rows 2
    test_from, val_from = add_latest(where, keys, n_test), add_latest(where, keys, n_test + n_val)
    keys.clear()
    split = {
        "held_out": (
            "the latest rows by column split_by (test the largest values, val the next; a number, or an ISO "
            "date/time as seconds since 1970-01-01 UTC; equal values in file order, the later row the later)"
        ),
        "split_by": opts.split_by,
        **given,
        **({"test_from": test_from} if n_test else {}),
        **({"val_from": val_from} if n_val else {}),
    }
    return split, where


def _transcode(opts: TranscodeOptions) -> tuple[Any, Report]:
    report = Report()
    keys: list[np.ndarray] | None = [] if opts.split_by is not None else None
    total = sum(len(lab) for lab, _, _ in iter_clean(opts, report, keys))
    if total == 0:
        from dlrmkit.data.criteo_count import no_valid_rows

        err = no_valid_rows(opts.inputs, report.skipped, report.first)
        if report.by_column:
            n, reason, col, advice = main_cause(opts, report)
            err = DlrmkitError(f"{err}; {n:,} {reason}{f' in column {col}' if col else ''}: {advice}")
        raise err
    refusal = too_many_skipped(opts, report)  # before anything is written: --out stays as it was
    if refusal is not None:
        raise refusal
    n_test = opts.test_rows or (int(round(opts.test_fraction * total)) if opts.test_fraction else 0)
    n_val = val_rows(opts.val_rows, opts.val_fraction, total - n_test)
    boundary = total - n_test - n_val  # train rows [0, boundary), val up to the test rows
    if boundary <= 0:
        hint = float16_hint(opts, report.skipped["out_of_range"])
        raise DlrmkitError(f"--test-*/--val-* options leave no training rows ({total} valid rows){hint}")
    split, held_out = _held_out(opts, keys, n_test, n_val)

    def mappings(seen: int, n: int) -> np.ndarray:
        """Each row's mapping (0 train, 1 val, 2 test) in a batch of `n` valid rows after `seen`."""
        if held_out is None:
            at = np.arange(seen, seen + n)
            return (at >= boundary).astype(np.uint8) + (at >= boundary + n_val)
        if seen + n > len(held_out):
            raise DlrmkitError(f"{', '.join(opts.inputs)}: the inputs changed while being read (more valid rows)")
        return held_out[seen : seen + n]

    acc, seen = CountAccumulator(len(opts.categorical)), 0
    for lab, _, cats in iter_clean(opts, None):  # the training rows' categories only
        train = mappings(seen, len(lab)) == 0
        if train.all():
            acc.add([value_counts(c) for c in cats])
        elif train.any():
            acc.add([value_counts(c.filter(pa.array(train))) for c in cats])
        seen += len(lab)
    vocab = Vocabulary.build(
        opts.categorical,
        acc.result(),
        opts.frequency_threshold,
        opts.max_table_size,
        extra={"numerical_columns": opts.numerical, "numerical_transform": "log1p" if opts.log else "none"},
    )
    writer = SplitBinaryWriter(
        opts.out, len(opts.numerical), vocab.cardinalities, overwrite=opts.force, val=n_val > 0,
        numerical_dtype=opts.numerical_dtype,
    )  # fmt: skip
    try:
        seen = 0
        tables = [vocab.id_table(t) for t in range(len(opts.categorical))]
        for lab, dense, cats in iter_clean(opts, None):
            ids = (
                np.stack([vocab.encode_column(t, c, tables[t]) for t, c in enumerate(cats)], axis=1)
                if cats
                else np.zeros((len(lab), 0), np.int64)
            )
            where = mappings(seen, len(lab))
            for k, mapping in enumerate(("train", "val", "test")):
                rows = where == k  # in file order
                if rows.all():
                    writer.append(mapping, dense, ids, lab)
                elif rows.any():
                    writer.append(mapping, dense[rows], ids[rows], lab[rows])
            seen += len(lab)
        vocab.save(writer.tmp_dir)
        meta = {
            "generator": "dlrmkit transcode",
            "source_files": [os.path.abspath(p) for p in opts.inputs],
            "label": opts.label,
            **({"label_values": list(opts.label_values)} if opts.label_values is not None else {}),
            # the text format, for `predict` to read new rows as these were: a delimiter given, the
            # column names of files without a header line
            **({"delimiter": opts.delimiter} if opts.delimiter is not None else {}),
            **({"columns": list(opts.columns or [])} if not opts.header else {}),
            "numerical_columns": opts.numerical,
            "categorical_columns": opts.categorical,
            "frequency_threshold": opts.frequency_threshold,
            "max_table_size": opts.max_table_size,
            "vocabulary_rows": "train mapping only (val and test rows are never counted)",
            "split": split,
            "numerical_transform": (
                f"missing/negative -> 0, log(1+x), {opts.numerical_dtype}"
                if opts.log
                else f"missing -> 0, {opts.numerical_dtype}"
            ),
            "vocabulary": "vocabulary/",
            "long_categorical_values": (
                f"longer than {opts.long_value_bytes} bytes: the first 32 characters, '...sha256:' and the "
                "SHA-256 of the value"
            ),
            "preprocess": {
                "report": {
                    "rows_read": report.read,
                    "rows_written": total,
                    "rows_skipped": report.skipped,
                    "empty_lines_skipped": report.empty_lines,
                    **({"long_values_as_keys": dict(report.long_values)} if report.long_values else {}),
                    **({"numerical_missing": dict(report.missing)} if report.missing else {}),
                    **_unused_record(report.unused),
                    "first_bad_rows": report.first,
                }
            },
        }
        return writer.finish(meta), report
    except BaseException:
        writer.abort()
        raise
