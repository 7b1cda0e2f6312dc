"""The one categorical encoder shared by `preprocess criteo`, `transcode` and later `predict`.

Counting: every chunk's categorical columns are reduced to (value, count) tables with Arrow's
`value_counts`; `CountAccumulator` merges them with a hash group-by, so memory grows with the
number of distinct values, never with the row count.

Ids: values seen at least `frequency_threshold` times in the training part get ids 1..n in order
of descending training frequency (ties broken by the value's bytes, ascending, so the numbering
is deterministic on any engine); id 0 is shared by rare, unseen and missing values. With
`max_table_size` M, values whose rank is at or beyond M are folded onto 1..M-1
(``1 + (rank - 1) % (M - 1)``), so the table has M rows.

The vocabulary is saved next to the dataset (``<dataset>/vocabulary/``) and reloads with
`Vocabulary.load(dataset_dir)`; `Vocabulary.encode(columns)` turns new raw rows into the same
ids (a value longer than LONG_VALUE_BYTES read as its `long_value_key`, as transcode read it),
and `log_transform` applies the numerical transform of the Criteo path::

    vocab = Vocabulary.load("criteo_ds")
    ids = vocab.encode({"C1": ["68fd1e64", None], ...})   # int64 [rows, tables]
    dense = log_transform(np.array([[1, -1, ...]]))       # float16
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import yaml

from dlrmkit.errors import DatasetError, DlrmkitError

VOCAB_DIR = "vocabulary"
VOCAB_FILE = "vocabulary.yaml"


def log_transform(values: np.ndarray) -> np.ndarray:
    """Criteo's numerical transform: missing (NaN) and negative -> 0, then log(1 + x), float16."""
    x = np.asarray(values, dtype=np.float64)
    x = np.where(np.isnan(x) | (x < 0), 0.0, x)
    return np.log1p(x).astype(np.float32).astype(np.float16)


def to_string_array(values: Any) -> pa.Array:
    """Any column (strings, ints, a list, numpy, Arrow) as an Arrow string array; ''/None -> null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values if not isinstance(values, np.ndarray) else values.tolist())
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    if pa.types.is_large_string(values.type):
        values = values.cast(pa.string())
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


def value_counts(values: pa.Array) -> pa.Table:
    """(value, count) of the non-null values of one column chunk."""
    vc = pc.value_counts(pc.drop_null(values))
    return pa.table({"value": vc.field("values"), "count": vc.field("counts").cast(pa.int64())})


def merge_counts(tables: Sequence[pa.Table]) -> pa.Table:
    """Sum (value, count) tables by value (a hash group-by, no Python loop over values)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({"value": pa.array([], pa.string()), "count": pa.array([], pa.int64())})
    if len(tables) == 1:
        return tables[0]
    merged = pa.concat_tables(tables).group_by("value").aggregate([("count", "sum")])
    return pa.table({"value": merged["value"], "count": merged["count_sum"]}).combine_chunks()


def to_dictionary(values: Any) -> pa.DictionaryArray:
    """Any column as a dictionary array of strings (missing and '' -> null index)."""
    if isinstance(values, pa.ChunkedArray) and values.num_chunks == 1:
        values = values.chunk(0)
    if isinstance(values, pa.DictionaryArray) and pa.types.is_string(values.type.value_type):
        return values
    return to_string_array(values).dictionary_encode()


def dictionary_counts(values: pa.DictionaryArray) -> pa.Table:
    """(value, count) of the non-null values of a dictionary array: a bincount of its indices."""
    ind = pc.drop_null(values.indices).to_numpy(zero_copy_only=False)
    counts = np.bincount(ind, minlength=len(values.dictionary))
    nz = np.flatnonzero(counts)
    return pa.table(
        {
            "value": values.dictionary.take(pa.array(nz)).cast(pa.string()),
            "count": pa.array(counts[nz].astype(np.int64)),
        }
    )


def fixed_width_keys(values: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, ok): each string zero-padded to `width` bytes (a multiple of 8), as uint64 when
    width is 8 (big-endian, so order is byte order) else as numpy bytes; ok is False for nulls,
    longer strings and strings holding NUL (zero padding would make those ambiguous)."""
    values = values.cast(pa.string())
    n = len(values)
    bufs = values.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=values.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None and n else np.zeros(1, np.uint8)
    lengths = np.diff(offsets)
    ok = lengths <= width
    if values.null_count:
        ok &= values.is_valid().to_numpy(zero_copy_only=False)
    mat = np.zeros((n, width), dtype=np.uint8)
    starts = offsets[:-1]
    for j in range(min(width, int(lengths.max(initial=0)))):  # a loop over byte positions, not rows
        rows = np.flatnonzero(ok & (lengths > j))
        col = data[starts[rows] + j]
        ok[rows[col == 0]] = False
        mat[rows, j] = col
    if width == 8:
        keys = mat.view(">u8").ravel().astype(np.uint64)
    else:
        keys = mat.view(f"S{width}").ravel()
    return keys, ok


@dataclass
class ValueIndex:
    """Sorted fixed-width keys of one column's vocabulary and their ids: a lookup is a binary
    search per distinct value, with the index built once (pc.index_in rebuilds a hash table of the
    whole vocabulary on every call)."""

    keys: np.ndarray  # sorted
    ids: np.ndarray  # id of each key
    width: int

    @classmethod
    def build(cls, values: pa.Array, ids: np.ndarray, max_width: int = 64) -> "ValueIndex | None":
        lengths = pc.binary_length(values).to_numpy(zero_copy_only=False) if len(values) else np.zeros(0, np.int64)
        longest = int(lengths.max(initial=0))
        if longest > max_width:
            return None
        width = max(8, -(-longest // 8) * 8)
        keys, ok = fixed_width_keys(values, width)
        if not ok.all():  # NUL bytes in the vocabulary
            return None
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], np.asarray(ids, dtype=np.int64)[order], width)

    def ids_of(self, values: pa.Array) -> np.ndarray:
        """Id of each value (0 when not in the vocabulary)."""
        if not len(self.keys) or not len(values):
            return np.zeros(len(values), dtype=np.int64)
        keys, ok = fixed_width_keys(values, self.width)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = ok & (self.keys[pos] == keys)
        return np.where(hit, self.ids[pos], 0)


@dataclass
class CountAccumulator:
    """Running per-column counts; pending chunks are merged once they hold `compact_rows` rows, or
    more bytes than `compact_bytes` and the merged counts together (the same few long values
    counted again in every chunk were kept once per chunk until 4,000,000 rows: gigabytes)."""

    num_columns: int
    compact_rows: int = 4_000_000
    compact_bytes: int = 64 << 20
    parts: list[list[pa.Table]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    pending_bytes: list[int] = field(default_factory=list)
    merged_bytes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.parts = [[] for _ in range(self.num_columns)]
        self.pending = [0] * self.num_columns
        self.pending_bytes = [0] * self.num_columns
        self.merged_bytes = [0] * self.num_columns

    def add(self, counts: Sequence[pa.Table]) -> None:
        for i, t in enumerate(counts):
            self.parts[i].append(t)
            self.pending[i] += t.num_rows
            self.pending_bytes[i] += t.nbytes
            if self.pending[i] > self.compact_rows or self.pending_bytes[i] > max(
                self.compact_bytes, self.merged_bytes[i]
            ):  # merged bytes: a large vocabulary is merged again after as many new bytes, not every chunk
                self.parts[i] = [merge_counts(self.parts[i])]
                self.pending[i] = self.parts[i][0].num_rows
                self.merged_bytes[i], self.pending_bytes[i] = self.parts[i][0].nbytes, 0

    def result(self) -> list[pa.Table]:
        return [merge_counts(p) for p in self.parts]


def read_vocabulary_doc(path: str) -> dict[str, Any]:
    """vocabulary.yaml, read with bounds and checked field by field (it comes with a dataset)."""
    from dlrmkit.untrusted import load_yaml

    try:
        doc = load_yaml(path, "vocabulary file", 1 << 20)  # bounded; a FIFO or a device is refused
    except DlrmkitError as exc:
        raise DatasetError(str(exc)) from None

    def bad(what: str) -> DatasetError:
        return DatasetError(f"{path}: {what}")

    if not isinstance(doc, dict):
        raise bad("expected a mapping with columns, files, frequency_threshold")
    columns, files = doc.get("columns"), doc.get("files")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise bad(f"columns must be a list of column names, got {columns!r:.80}")
    if (
        not isinstance(files, list)
        or len(files) != len(columns)
        or not all(isinstance(f, str) and f not in ("", ".", "..") and os.path.basename(f) == f for f in files)
    ):
        raise bad(f"files must name one file of this folder per column, got {files!r:.80}")
    for key, lo, optional in (("frequency_threshold", 1, False), ("max_table_size", 2, True)):
        v = doc.get(key)
        if not (optional and v is None) and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise bad(f"{key} must be an integer >= {lo}, got {v!r:.80}")
    return doc


def _body_compressed(metadata: pa.Buffer, kind: str) -> bool:
    """Whether an Arrow IPC message's record batch declares a compressed body, read from its
    flatbuffer without decompressing anything: Message.header is field 2, a DictionaryBatch holds
    its RecordBatch in field 1, and RecordBatch.compression is field 3."""
    b = metadata.to_pybytes()

    def u(pos: int, n: int, signed: bool = False) -> int:
        return int.from_bytes(b[pos : pos + n], "little", signed=signed)

    def field_at(table: int, k: int) -> int | None:  # where field k's value lies, None when absent
        vtable = table - u(table, 4, signed=True)
        if not 0 <= vtable < len(b) or 6 + 2 * k > u(vtable, 2):
            return None
        offset = u(vtable + 4 + 2 * k, 2)
        return table + offset if offset else None

    header = field_at(u(0, 4), 2)
    batch = None if header is None else header + u(header, 4)
    if batch is not None and kind == "dictionary batch":
        data = field_at(batch, 1)
        batch = None if data is None else data + u(data, 4)
    return batch is None or field_at(batch, 3) is not None


def read_vocabulary_table(path: str) -> pa.Table:
    """A vocabulary table as `Vocabulary.save` writes it: an uncompressed Arrow file whose `value`
    column is plain text. Its bytes in memory are then the file's own: a compressed body (50 KiB of
    zstd became 1 GB of values) or a dictionary-encoded column (one long value repeated by index)
    is refused before anything is expanded."""
    with pa.OSFile(path) as f:
        buf = f.read_buffer()
    reader = pa.ipc.open_file(buf)
    value = reader.schema.field("value").type  # KeyError: no such column
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        raise ValueError(f"column 'value' is {value}, not plain text (string)")
    for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(buf.slice(8))):
        if message.type != "schema" and _body_compressed(message.metadata, message.type):
            raise ValueError("its body is compressed; a vocabulary table is written uncompressed")
    return reader.read_all()


LONG_VALUE_BYTES = 1024  # a categorical value longer than this is read as long_value_key(value)


def long_value_key(value: bytes) -> str:
    """What a categorical value longer than LONG_VALUE_BYTES is read as: its first 32 characters,
    '...sha256:' and the SHA-256 of its UTF-8 bytes (at most 202 bytes; equal values, equal keys).
    It is its own field as transcode's `clean` trims it (no surrounding whitespace, no enclosing
    quotes)."""
    return f"{value.decode('utf-8')[:32]}...sha256:{hashlib.sha256(value).hexdigest()}"


def shorten_long(values: pa.Array, limit: int) -> tuple[pa.Array, np.ndarray]:
    """(values with each one longer than `limit` bytes replaced by its `long_value_key`, which
    rows were): the keys are computed once per distinct long value."""
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    long = lengths > limit
    if not long.any():
        return values, long
    distinct = pc.dictionary_encode(values.filter(pa.array(long)))
    keys = pa.array([long_value_key(v) for v in distinct.dictionary.cast(pa.binary()).to_pylist()], pa.string())
    return pc.replace_with_mask(values, pa.array(long), keys.take(distinct.indices).cast(values.type)), long


@dataclass
class Vocabulary:
    """Per-column ordered values: `values[t][k]` has id ``fold(k + 1)`` (see module doc)."""

    columns: list[str]
    values: list[pa.Array]  # string, most frequent first
    counts: list[np.ndarray]
    frequency_threshold: int = 1
    max_table_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _lookups: dict[int, "ValueIndex | None"] = field(default_factory=dict, repr=False, compare=False)
    _longest: int | None = field(default=None, repr=False, compare=False)  # bytes of its longest value

    @classmethod
    def build(
        cls,
        columns: Sequence[str],
        counts: Sequence[pa.Table],
        frequency_threshold: int = 1,
        max_table_size: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> "Vocabulary":
        if max_table_size is not None and max_table_size < 2:
            raise DatasetError(f"--max-table-size must be at least 2, got {max_table_size}")
        values, cnts = [], []
        for t in counts:
            t = t.filter(pc.greater_equal(t["count"], max(int(frequency_threshold), 1)))
            # descending count, then ascending value bytes: deterministic on every engine
            t = t.sort_by([("count", "descending"), ("value", "ascending")])
            values.append(t["value"].combine_chunks().cast(pa.string()))
            cnts.append(t["count"].to_numpy().astype(np.int64))
        return cls(list(columns), values, cnts, int(frequency_threshold), max_table_size, dict(extra or {}))

    @property
    def cardinalities(self) -> list[int]:
        sizes = [len(v) + 1 for v in self.values]
        if self.max_table_size:
            sizes = [min(s, self.max_table_size) for s in sizes]
        return sizes

    def id_table(self, t: int) -> np.ndarray:
        """Id of vocabulary entry k of column t, for k = 0..len-1 (ranks folded by max_table_size)."""
        ids = np.arange(1, len(self.values[t]) + 1, dtype=np.int64)
        if self.max_table_size and len(ids) >= self.max_table_size:
            ids = 1 + (ids - 1) % (self.max_table_size - 1)
        return ids

    def lookup(self, t: int) -> "ValueIndex | None":
        """Column t's value -> id index, built once per Vocabulary (None: values unfit for fixed-width keys)."""
        if t not in self._lookups:
            self._lookups[t] = ValueIndex.build(self.values[t], self.id_table(t))
        return self._lookups[t]

    def encode_column(self, t: int, values: Any, id_table: np.ndarray | None = None) -> np.ndarray:
        """Ids (int64) of one column's raw values; unseen, rare and missing -> 0.

        The values are dictionary-encoded (a dictionary array is used as is), only the distinct
        values are looked up, and the ids are gathered per row."""
        arr = to_dictionary(values)
        index = self.lookup(t)
        if index is not None:
            dict_ids = index.ids_of(arr.dictionary)
        else:  # rare: very long values or NUL bytes; pc.index_in hashes the whole vocabulary per call
            idx = pc.index_in(arr.dictionary, value_set=self.values[t]).fill_null(-1).to_numpy(zero_copy_only=False)
            table = self.id_table(t) if id_table is None else id_table
            dict_ids = np.where(idx >= 0, table[np.maximum(idx, 0)] if len(table) else 0, 0)
        dict_ids = np.append(np.asarray(dict_ids, dtype=np.int64), 0)  # the last slot: missing
        return dict_ids[arr.indices.fill_null(len(arr.dictionary)).to_numpy(zero_copy_only=False)]

    def encode(self, columns: Mapping[str, Any] | Sequence[Any]) -> np.ndarray:
        """[rows, tables] int64 ids; `columns` maps column name -> values, or lists them in order."""
        if isinstance(columns, Mapping):
            missing = [c for c in self.columns if c not in columns]
            if missing:
                raise DatasetError(f"encode: missing categorical column(s) {', '.join(missing)}")
            columns = [columns[c] for c in self.columns]
        if len(columns) != len(self.columns):
            raise DatasetError(f"encode: expected {len(self.columns)} categorical columns, got {len(columns)}")
        limit = self.long_value_bytes()
        if limit is not None:  # as transcode read them
            columns = [shorten_long(to_string_array(col), limit)[0] for col in columns]
        encoded = [self.encode_column(t, col) for t, col in enumerate(columns)]
        return np.stack(encoded, axis=1) if encoded else np.zeros((0, 0), np.int64)

    def long_value_bytes(self) -> int | None:
        """The length past which a raw value is read as its `long_value_key`, as transcode read it:
        LONG_VALUE_BYTES, or None (values read whole) for a vocabulary holding a longer value,
        which a transcode before the rule wrote."""
        if self._longest is None:  # once per Vocabulary: encode asks on every call
            self._longest = max((int(pc.max(pc.binary_length(v)).as_py() or 0) for v in self.values if len(v)), default=0)
        return None if self._longest > LONG_VALUE_BYTES else LONG_VALUE_BYTES

    # ---- persistence --------------------------------------------------------------------
    def save(self, dataset_dir: str) -> str:
        """Write `<dataset_dir>/vocabulary/` (one Arrow file per column plus vocabulary.yaml)."""
        d = os.path.join(dataset_dir, VOCAB_DIR)
        os.makedirs(d, exist_ok=True)
        files = []
        for t, (vals, cnts) in enumerate(zip(self.values, self.counts)):
            name = f"cat_{t}.arrow"
            feather.write_feather(
                pa.table({"value": vals, "count": pa.array(cnts, pa.int64())}),
                os.path.join(d, name),
                compression="uncompressed",
            )
            files.append(name)
        doc = {
            "encoder": "dlrmkit.data.encoder.Vocabulary",
            "columns": self.columns,
            "files": files,
            "frequency_threshold": self.frequency_threshold,
            "max_table_size": self.max_table_size,
            "cardinalities": self.cardinalities,
            "id_rule": "id 0 = rare/unseen/missing; others by descending train count, ties by value",
            **self.extra,
        }
        with open(os.path.join(d, VOCAB_FILE), "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        return d

    @staticmethod
    def read_tables(dataset_dir: str) -> tuple[dict[str, Any], Iterator[tuple[pa.Array, np.ndarray]]]:
        """The vocabulary document saved next to a dataset, and its tables' (values, counts), read
        one at a time as the iterator is advanced (`load` keeps them all)."""
        d = (
            dataset_dir
            if os.path.exists(os.path.join(dataset_dir, VOCAB_FILE))
            else os.path.join(dataset_dir, VOCAB_DIR)
        )
        path = os.path.join(d, VOCAB_FILE)
        if not os.path.exists(path):
            raise DatasetError(
                f"{dataset_dir}: no vocabulary ({VOCAB_DIR}/{VOCAB_FILE}); was it made by preprocess/transcode?"
            )
        doc = read_vocabulary_doc(path)

        def tables() -> Iterator[tuple[pa.Array, np.ndarray]]:
            for name in doc["files"]:
                table_path = os.path.join(d, name)
                if not os.path.isfile(table_path):
                    raise DatasetError(f"{table_path}: not a regular file (a vocabulary table is named in {path})")
                if os.path.dirname(os.path.realpath(table_path)) != os.path.realpath(d):  # a link out of the folder
                    raise DatasetError(
                        f"{table_path}: points outside the vocabulary folder {d}; its tables are its own files"
                    )
                try:
                    t = read_vocabulary_table(table_path)
                    values = t["value"].combine_chunks().cast(pa.string())
                    counts = np.asarray(t["count"].to_numpy(), dtype=np.int64)
                except (pa.ArrowException, OSError, KeyError, TypeError, ValueError) as exc:
                    raise DatasetError(
                        f"{table_path}: not a vocabulary table (an Arrow file with 'value' and 'count' columns): "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                    ) from None
                yield values, counts

        return doc, tables()

    @classmethod
    def load(cls, dataset_dir: str) -> "Vocabulary":
        """Load the vocabulary saved next to a dataset (the folder, or its vocabulary/ folder)."""
        doc, tables = cls.read_tables(dataset_dir)
        values, counts = [], []
        for v, c in tables:
            values.append(v)
            counts.append(c)
        known = {"encoder", "columns", "files", "frequency_threshold", "max_table_size", "cardinalities", "id_rule"}
        return cls(
            list(doc["columns"]),
            values,
            counts,
            int(doc["frequency_threshold"]),
            doc.get("max_table_size"),
            {k: v for k, v in doc.items() if k not in known},
        )
