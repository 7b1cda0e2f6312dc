"""Split binary files: one file per categorical feature, one for all numerical features
(row-major), one for labels. Reading copies rows with positioned reads (`Rows`); writing
appends chunk by chunk into a temporary folder that is renamed only when the dataset is complete."""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass

import numpy as np

from dlrmkit.data.feature_spec import TEST, TRAIN, VAL, FeatureSpec, categorical_dtype
from dlrmkit.errors import DatasetError


def _rel(path: str, base: str) -> str:
    return os.path.relpath(path, base)


class _Fd:
    """A file descriptor open for reading, closed when the last `Rows` of its file goes."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self, close=os.close) -> None:  # `close` bound now: at exit `os` may be gone first
        close(self.fd)


class Rows:
    """Rows [first, first + n) of one chunk file, copied out with positioned reads. Not a memory
    map: a file cut shorter while mapped ends the process with SIGBUS at the next page touched;
    here a short read is one line naming the file (the read's own byte count, so no window
    between a check and the copy)."""

    __slots__ = ("name", "file", "fd", "size", "row_bytes", "first", "n")

    def __init__(self, name: str, file: _Fd | None, size: int, row_bytes: int, first: int, n: int):
        self.name, self.file, self.fd, self.size = name, file, file.fd if file else -1, size
        self.row_bytes, self.first, self.n = row_bytes, first, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows: slice) -> "Rows":
        a, b, _ = rows.indices(self.n)
        return Rows(self.name, self.file, self.size, self.row_bytes, self.first + a, max(b - a, 0))

    def read_into(self, out: np.ndarray, a: int) -> None:
        """Rows [a, a + len(out)) of this piece into `out` (C-contiguous): one call, but for a file
        cut shorter and reads over 2 GiB (Linux)."""
        offset = (self.first + a) * self.row_bytes
        try:
            got = os.preadv(self.fd, [out], offset)
            if got < out.nbytes:
                view = memoryview(out).cast("B")
                while got < len(view):
                    more = os.preadv(self.fd, [view[got:]], offset + got)
                    if not more:
                        raise DatasetError(
                            f"{self.name}: the file shrank to {os.fstat(self.fd).st_size:,} bytes while "
                            f"it was read (it held {self.size:,} when opened)"
                        )
                    got += more
        except OSError as exc:  # EIO and the like: a failing disk, a lost network mount
            raise DatasetError(f"{self.name}: cannot read ({exc.strerror or exc})") from None


class Column:
    """A [rows, width] array stored in one or more chunk files (`Rows`)."""

    def __init__(self, files: list[str], dtype: np.dtype, width: int, base: str):
        self.files, self.dtype, self.width = files, np.dtype(dtype), width
        self.parts: list[Rows] = []
        row_bytes = self.dtype.itemsize * width
        for path in files:
            if not os.path.exists(path):
                raise DatasetError(f"{_rel(path, base)}: file named in the FeatureSpec does not exist")
            size = os.path.getsize(path)
            if size % row_bytes:
                raise DatasetError(
                    f"{_rel(path, base)}: size {size} bytes is not a whole number of rows "
                    f"({width} x {self.dtype} = {row_bytes} bytes per row); the file is truncated or has the wrong dtype"
                )
            try:
                file = _Fd(os.open(path, os.O_RDONLY | os.O_CLOEXEC)) if size else None
            except OSError as exc:  # unreadable, or the process's limit of open files reached
                raise DatasetError(f"{_rel(path, base)}: cannot read ({exc.strerror or exc})") from None
            self.parts.append(Rows(_rel(path, base), file, size, row_bytes, 0, size // row_bytes))
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.rows = self.total = int(self.starts[-1])  # total: rows in the chunks (`rows`: in the window)
        self.offset = 0  # first row of a window (see `window`)

    def window(self, lo: int, hi: int) -> "Column":
        """Rows [lo, hi) of this column as a column of its own (no copy)."""
        out = copy.copy(self)
        out.offset, out.rows = self.offset + lo, hi - lo
        return out

    def pieces(self) -> list[tuple[str, Rows]]:
        """(file, rows) of each chunk this column's rows lie in, clipped to its window."""
        lo, hi = self.offset, self.offset + self.rows
        return [
            (path, part[max(lo - s, 0) : min(hi - s, len(part))])
            for path, part, s in zip(self.files, self.parts, self.starts[:-1])
            if max(lo - s, 0) < min(hi - s, len(part))
        ]

    def joined(self, other: "Column") -> "Column":
        """This column's rows, then `other`'s, as one column (no copy)."""
        both = self.pieces() + other.pieces()
        out = copy.copy(self)
        out.files, out.parts = [f for f, _ in both], [p for _, p in both]
        out.starts = np.cumsum([0] + [len(p) for p in out.parts])
        out.rows = out.total = int(out.starts[-1])
        out.offset = 0
        return out

    def file_of_row(self, row: int) -> str:
        """The chunk file that holds `row`."""
        return self.files[int(np.searchsorted(self.starts, row + self.offset, side="right")) - 1]

    def read(self, start: int, end: int) -> np.ndarray:
        """Rows [start, end) as a new [n, width] array, read from the chunks they lie in."""
        start, end = start + self.offset, min(end + self.offset, self.total)
        out = np.empty((max(end - start, 0), self.width), self.dtype)
        if len(self.parts) == 1:  # one file, the common case: no loop over chunks (a read is a few microseconds)
            if start < end:
                self.parts[0].read_into(out, start)
            return out
        for part, lo in zip(self.parts, self.starts[:-1].tolist()):
            a, b = max(start - lo, 0), min(end - lo, len(part))
            if a < b:
                part.read_into(out[lo + a - start : lo + b - start], a)
        return out


@dataclass
class RawBatch:
    """A slice of a mapping as numpy arrays, before conversion to tensors."""

    dense: np.ndarray  # [n, num_numerical] float16 (or the spec's dtype)
    ids: np.ndarray  # [n, num_tables] int (widest cat dtype); multi-hot: [n, sum(hotness)], table by table
    labels: np.ndarray  # [n] bool
    hotness: list[int] | None = None  # ids per sample of each table, when some table is multi-hot


class SplitBinaryDataset:
    """One mapping (train or test) of a FeatureSpec dataset, its files opened and checked."""

    def __init__(self, spec: FeatureSpec, mapping: str):
        self.spec, self.mapping = spec, mapping
        base = spec.base_directory
        files = spec.mapping_files(mapping)
        self.cardinalities = np.asarray(spec.cardinalities, dtype=np.int64)
        self.label = Column(files.label, spec.dtype(spec.label_name), 1, base)
        num_names = spec.numerical_names
        self.numerical = Column(files.numerical, spec.numerical_dtype, len(num_names), base) if num_names else None
        self.hotness = spec.hotness  # ids per sample of each table (fixed-size bags)
        self.multi_hot = any(h != 1 for h in self.hotness)
        self.id_columns = np.concatenate([[0], np.cumsum(self.hotness)]).astype(np.int64)  # table t: [c_t, c_t+1)
        self.categorical = [
            Column(f, spec.dtype(name), h, base)
            for f, name, h in zip(files.categorical, spec.categorical_names, self.hotness)
        ]
        self.rows = self.label.rows
        for col in ([self.numerical] if self.numerical else []) + self.categorical:
            if col.rows != self.rows:
                raise DatasetError(
                    f"{', '.join(_rel(f, base) for f in col.files)}: {col.rows} rows, but "
                    f"{', '.join(_rel(f, base) for f in self.label.files)}: {self.rows} rows (mapping '{mapping}'); "
                    "the files are truncated or from different datasets"
                )
        self.id_dtype = np.result_type(*[c.dtype for c in self.categorical]) if self.categorical else np.int32
        self.table_rows: np.ndarray | None = None  # fold_ids: ids at or above these read as 0
        self.known: list[np.ndarray] | None = None  # fold_unknown: per table, which ids read as themselves
        self.buckets: list[np.ndarray] = []  # with_buckets: one more table per numerical feature

    def __len__(self) -> int:
        return self.rows

    def window(self, lo: int, hi: int, mapping: str | None = None) -> "SplitBinaryDataset":
        """Rows [lo, hi) as a dataset of their own (e.g. a validation set held out at run time)."""
        out = copy.copy(self)
        out.label = self.label.window(lo, hi)
        out.numerical = self.numerical.window(lo, hi) if self.numerical else None
        out.categorical = [c.window(lo, hi) for c in self.categorical]
        out.rows, out.mapping = hi - lo, mapping or self.mapping
        return out

    def joined(self, other: "SplitBinaryDataset") -> "SplitBinaryDataset":
        """This dataset's rows, then `other`'s (a mapping of the same FeatureSpec), read as this
        dataset reads its own (its folds and buckets; `other`'s are not applied): the training and
        validation rows together for a refit (dlrmkit.train.refit)."""
        out = copy.copy(self)
        out.label = self.label.joined(other.label)
        out.numerical = self.numerical.joined(other.numerical) if self.numerical else None
        out.categorical = [a.joined(b) for a, b in zip(self.categorical, other.categorical)]
        out.rows = self.rows + other.rows
        return out

    def fold_ids(self, table_rows: list[int]) -> "SplitBinaryDataset":
        """This dataset with each table's ids at or above `table_rows[t]` read as 0, the id of rare
        and unseen values: the tables of a model that keeps only the ids seen at least
        --min-id-count times (ids are numbered by descending training count: data/id_counts.py)."""
        out = copy.copy(self)
        out.table_rows = np.asarray(table_rows, dtype=np.int64)
        return out

    def fold_unknown(self, known: list[np.ndarray]) -> "SplitBinaryDataset":
        """This dataset with each table's ids `i` where `known[t][i]` is False read as 0 too (rows
        held out from the train mapping read as test rows will: an id the training rows saw too
        rarely is folded as an id first seen at test time is)."""
        out = copy.copy(self)
        out.known = [np.asarray(k, dtype=bool) for k in known]
        return out

    def with_buckets(self, boundaries: list[list[float]]) -> "SplitBinaryDataset":
        """This dataset with one more table per numerical feature, after the stored ones: the
        index of the feature's bucket, the number of `boundaries[j]` at or below its value (so
        a model reads a numerical feature as a category too: --numerical-buckets,
        data/numerical_buckets.py)."""
        out = copy.copy(self)
        out.buckets = [np.asarray(b, dtype=np.float32) for b in boundaries]
        sizes = [len(b) + 1 for b in boundaries]
        out.cardinalities = np.concatenate([self.cardinalities, sizes]).astype(np.int64)
        if self.table_rows is not None:
            out.table_rows = np.concatenate([self.table_rows, sizes]).astype(np.int64)
        out.hotness = list(self.hotness) + [1] * len(sizes)
        out.id_columns = np.concatenate([[0], np.cumsum(out.hotness)]).astype(np.int64)
        out.id_dtype = np.result_type(self.id_dtype, np.int16)
        return out

    def bucket_ids(self, dense: np.ndarray, features: list[int] | None = None) -> np.ndarray:
        """[n, features] bucket indices of the numerical values `dense` (as stored)."""
        features = list(range(len(self.buckets))) if features is None else features
        return bucket_columns([self.buckets[j] for j in features], dense[:, features])

    def _fold(self, ids: np.ndarray, tables: list[int]) -> None:
        if self.table_rows is not None and ids.size:
            rows = np.repeat(self.table_rows[tables], [self.hotness[t] for t in tables])
            ids[ids >= rows] = 0
        if self.known is not None and ids.size:
            col = 0
            for t in tables:
                if t < len(self.known):  # a categorical table (bucket tables come after them)
                    block = ids[:, col : col + self.hotness[t]]
                    block[~self.known[t][block]] = 0
                col += self.hotness[t]

    @property
    def num_numerical(self) -> int:
        return self.numerical.width if self.numerical else 0

    def read(self, start: int, end: int, check_ids: bool = True) -> RawBatch:
        """Rows [start, end). Ids are checked against the cardinalities (vectorized, per batch)."""
        n = end - start
        dense = self.numerical.read(start, end) if self.numerical else np.zeros((n, 0), np.float16)
        cols = self.id_columns.tolist()  # Python ints: indexing with numpy's took 0.5 us a table
        ids = np.empty((n, cols[-1]), dtype=self.id_dtype)
        stored = cols[len(self.categorical)]  # then the buckets' columns
        for t, col in enumerate(self.categorical):
            ids[:, cols[t] : cols[t + 1]] = col.read(start, end)
        labels = self.label.read(start, end)[:, 0]
        if check_ids and n:
            if stored:
                self.check_ids(ids[:, :stored], start)
            self.check_values(dense, labels, start)
        self._fold(ids[:, :stored], list(range(len(self.categorical))))
        if self.buckets:
            ids[:, stored:] = self.bucket_ids(dense)
        return RawBatch(dense, ids, labels, self.hotness if self.multi_hot else None)

    def read_tables(self, start: int, end: int, tables: list[int]) -> np.ndarray:
        """The id columns of `tables` for rows [start, end), [n, sum of their hotness], checked."""
        n_cat = len(self.categorical)
        dense = self.numerical.read(start, end) if any(t >= n_cat for t in tables) else None
        cols = [
            self.categorical[t].read(start, end) if t < n_cat else self.bucket_ids(dense, [t - n_cat]) for t in tables
        ]
        ids = (
            np.concatenate(cols, axis=1).astype(self.id_dtype, copy=False)
            if cols
            else np.zeros((end - start, 0), self.id_dtype)
        )
        if ids.size:
            self.check_ids(ids, start, tables)
        self._fold(ids, list(tables))
        return ids

    def check_values(self, dense: np.ndarray, labels: np.ndarray, start: int) -> None:
        """Labels 0 or 1 (a bool file may hold any byte: 7 is an error, not True) and finite
        numerical features; the first offending row is named (file and row)."""
        v = labels.view(np.uint8) if labels.dtype == np.bool_ else labels
        bad = (v > 1) | (v < 0) if v.dtype.kind == "i" else v > 1
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            path = _rel(self.label.file_of_row(start + row), self.spec.base_directory)
            raise DatasetError(f"{path}: row {start + row} has label {int(v[row])}, not 0 or 1")
        self.check_numerical(dense, start)

    def check_numerical(self, dense: np.ndarray, start: int) -> None:
        """Numerical features of rows start.. finite; the first offending row is named (file and row)."""
        if dense.size:
            finite = np.isfinite(dense)
            if not finite.all():
                row, col = (int(x[0]) for x in np.nonzero(~finite))
                path = _rel(self.numerical.file_of_row(start + row), self.spec.base_directory)
                raise DatasetError(
                    f"{path}: row {start + row} feature '{self.spec.numerical_names[col]}' is "
                    f"{float(dense[row, col])} (numerical features must be finite)"
                )

    def check_ids(self, ids: np.ndarray, start: int, tables: list[int] | None = None) -> None:
        """Ids of rows start.. (columns: every table's, or those of `tables`, each table's
        `hotness` columns side by side) lie in [0, cardinality)."""
        tables = list(range(len(self.categorical))) if tables is None else list(tables)
        hot = [self.hotness[t] for t in tables]
        col_table = np.repeat(np.asarray(tables, dtype=np.int64), hot)  # the table of each column
        cards = self.cardinalities[col_table]
        bad = (ids.max(axis=0) >= cards) | (ids.min(axis=0) < 0)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            t, col = int(col_table[k]), ids[:, k]
            row = int(np.flatnonzero((col < 0) | (col >= cards[k]))[0])
            name = self.spec.categorical_names[t]
            raise DatasetError(
                f"{_rel(self.categorical[t].file_of_row(start + row), self.spec.base_directory)}: feature '{name}' row {start + row} "
                f"has id {int(col[row])}, outside [0, {int(cards[k])}) (its cardinality in the FeatureSpec)"
            )


def bucket_columns(boundaries: list[np.ndarray], values: np.ndarray) -> np.ndarray:
    """[n, len(boundaries)]: for each column j of `values`, the number of `boundaries[j]` at or
    below each value (--numerical-buckets; the same rule in every reader and in predict)."""
    cols = [np.searchsorted(b, values[:, j].astype(np.float32), side="right") for j, b in enumerate(boundaries)]
    return np.stack(cols, axis=1) if cols else np.zeros((len(values), 0), np.int64)


def open_dataset(path: str) -> tuple[FeatureSpec, SplitBinaryDataset, SplitBinaryDataset]:
    """Load the spec in `path` and the train and test mappings, checking files against the spec."""
    spec = FeatureSpec.from_yaml(path)
    return spec, SplitBinaryDataset(spec, TRAIN), SplitBinaryDataset(spec, TEST)


def check_held_out(spec: FeatureSpec, chunk: int = 1 << 18) -> None:
    """The val and test mappings, which a run reads only at its evaluations and its end, checked
    before it trains: their files against the spec (opening them) and every row's ids (within the
    cardinalities) and numerical values (finite), as `read` checks them, chunk by chunk; their
    labels are not read (the test rows are read, and scored, once at the end), so a bad label
    there is still found then."""
    val = open_val(spec)
    for ds in ([val] if val is not None else []) + [SplitBinaryDataset(spec, TEST)]:
        for start in range(0, ds.rows, chunk):
            end = min(start + chunk, ds.rows)
            if ds.categorical:
                ds.check_ids(np.concatenate([c.read(start, end) for c in ds.categorical], axis=1), start)
            if ds.numerical is not None:
                ds.check_numerical(ds.numerical.read(start, end), start)


def open_val(spec: FeatureSpec) -> SplitBinaryDataset | None:
    """The validation mapping, or None when the dataset has none (NVIDIA's datasets). An empty
    one is an error: model selection would score nothing, and `train` would not say so."""
    if not spec.has_val:
        return None
    val = SplitBinaryDataset(spec, VAL)
    if not len(val):
        raise DatasetError(
            f"{spec.base_directory}: the val mapping has no rows, so model selection would see none; "
            "remove 'val' from source_spec (train then holds out training rows) or fill it"
        )
    return val


def allow_open_files(need: int, what: str) -> None:
    """The writer keeps one file open per feature and mapping: raise the soft limit on open files
    as far as the hard one allows, or stop before writing anything (not at the 1,025th table)."""
    import resource

    need += 64  # the interpreter's own files, libraries, pipes
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard == resource.RLIM_INFINITY or hard >= need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        else:
            raise DatasetError(
                f"{what}: writing the dataset needs {need:,} open files at once, the limit is {hard:,} "
                "(ulimit -n); use fewer tables or raise the limit"
            )


class SplitBinaryWriter:
    """Appends rows to a new dataset. Files go to `<out>.tmp`; `finish()` writes the spec and
    renames the folder, so an interrupted write never leaves a dataset that looks complete."""

    def __init__(
        self,
        out_dir: str,
        num_numerical: int,
        cardinalities: list[int],
        overwrite: bool = False,
        val: bool = False,
        hotness: list[int] | None = None,
        numerical_dtype: str = "float16",
    ):
        from dlrmkit.data.output_dir import check_replaceable, fresh_temp_dir

        self.out_dir = os.path.abspath(out_dir)
        check_replaceable(out_dir, overwrite)  # only a dataset or an empty folder is ever replaced
        allow_open_files((len(cardinalities) + 2) * (3 if val else 2), f"{len(cardinalities):,} tables")
        self.tmp_dir = self.out_dir + ".tmp"
        fresh_temp_dir(self.tmp_dir)
        self.spec = FeatureSpec.default(
            num_numerical, cardinalities, base_directory=self.tmp_dir, val=val, hotness=hotness,
            numerical_dtype=numerical_dtype,
        )  # fmt: skip
        self.numerical_dtype = np.dtype(numerical_dtype)
        self.id_columns = np.concatenate([[0], np.cumsum(hotness or [1] * len(cardinalities))]).astype(np.int64)
        self.cat_dtypes = [categorical_dtype(c) for c in cardinalities]
        self.spec_num_numerical = num_numerical
        self.mappings = (TRAIN, VAL, TEST) if val else (TRAIN, TEST)
        self.rows = dict.fromkeys(self.mappings, 0)
        self.handles: dict[str, dict[str, object]] = {}
        for mapping in self.mappings:
            os.makedirs(os.path.join(self.tmp_dir, mapping), exist_ok=True)
            files = self.spec.mapping_files(mapping)
            self.handles[mapping] = {
                "label": open(files.label[0], "wb"),
                "numerical": open(files.numerical[0], "wb") if files.numerical else None,
                "categorical": [open(f[0], "wb") for f in files.categorical],
            }

    def append(self, mapping: str, dense: np.ndarray, ids: np.ndarray, labels: np.ndarray) -> None:
        h = self.handles[mapping]
        n = len(labels)
        if h["numerical"] is not None:
            np.ascontiguousarray(dense, dtype=self.numerical_dtype).tofile(h["numerical"])
        for t, f in enumerate(h["categorical"]):  # a multi-hot table: its bags' columns, row-major
            np.ascontiguousarray(ids[:, self.id_columns[t] : self.id_columns[t + 1]], dtype=self.cat_dtypes[t]).tofile(
                f
            )
        np.ascontiguousarray(labels, dtype=np.bool_).tofile(h["label"])
        self.rows[mapping] += n

    def finish(self, metadata: dict | None = None) -> FeatureSpec:
        for h in self.handles.values():
            for f in [h["label"], h["numerical"], *h["categorical"]]:
                if f is not None:
                    f.close()
        from dlrmkit.data.output_dir import MARKER, publish

        self.spec.metadata = {**(metadata or {}), "rows": dict(self.rows)}
        self.spec.write(self.tmp_dir)
        os.remove(os.path.join(self.tmp_dir, MARKER))
        publish(self.tmp_dir, self.out_dir)
        self.spec.base_directory = self.out_dir
        return self.spec

    def abort(self) -> None:
        """Close and remove the temporary folder (this writer created it)."""
        for h in self.handles.values():
            for f in [h["label"], h["numerical"], *h["categorical"]]:
                if f is not None:
                    f.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


RAW_NUMERICAL = 20.0  # |x| above this on a sample: raw values, the model takes sign(x) log(1+|x|)


def numerical_scale(train: SplitBinaryDataset, rows: int = 100_000) -> float:
    """Largest |numerical value| in (a sample of) the training rows; inf when float16 overflowed."""
    if not train.num_numerical or not len(train):
        return 0.0
    n = min(rows, len(train))
    dense = train.read(0, n, check_ids=False).dense.astype(np.float32)
    return float(np.nan_to_num(np.abs(dense), nan=0.0, posinf=np.inf).max())
