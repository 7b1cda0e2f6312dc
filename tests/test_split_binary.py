import os

import numpy as np
import pytest

from dlrmkit.data.output_dir import MARKER
from dlrmkit.errors import DlrmkitError

from dlrmkit.data.feature_spec import SPEC_FILE, FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryDataset, SplitBinaryWriter, open_dataset
from dlrmkit.data.synthetic import generate
from dlrmkit.errors import DatasetError

from helpers import tiny_config

CARDS = [5, 300, 40_000]  # -> int8, int16, int32
NUM = 3


def random_rows(rng, n, cards=CARDS, num=NUM):
    dense = rng.normal(0, 3, (n, num)).astype(np.float32)
    ids = np.stack([rng.integers(0, c, n) for c in cards], axis=1).astype(np.int64)
    labels = rng.random(n) < 0.3
    return dense, ids, labels


def write_dataset(out, rng, train_rows=(50, 37), test_rows=(20,), cards=CARDS, num=NUM):
    """Write a dataset in several appends; return the rows written per mapping."""
    writer = SplitBinaryWriter(str(out), num, cards)
    written = {}
    for mapping, chunks in (("train", train_rows), ("test", test_rows)):
        parts = [random_rows(rng, n, cards, num) for n in chunks]
        for dense, ids, labels in parts:
            writer.append(mapping, dense, ids, labels)
        written[mapping] = tuple(np.concatenate(x) for x in zip(*parts))
    writer.finish({"note": "unit test"})
    return written


@pytest.fixture
def small_dataset(tmp_path):
    out = tmp_path / "ds"
    written = write_dataset(out, np.random.default_rng(0))
    return out, written


# ---- round trip -------------------------------------------------------------------------------------


def test_writer_reader_round_trip(small_dataset):
    out, written = small_dataset
    assert not os.path.exists(str(out) + ".tmp")
    spec, train, test = open_dataset(str(out))
    assert spec.metadata["rows"] == {"train": 87, "test": 20}
    assert spec.metadata["note"] == "unit test"
    assert spec.base_directory == str(out)
    for ds, (dense, ids, labels) in ((train, written["train"]), (test, written["test"])):
        assert len(ds) == len(labels)
        assert ds.num_numerical == NUM
        raw = ds.read(0, len(ds))
        assert raw.labels.dtype == np.bool_ and raw.labels.shape == (len(labels),)
        assert raw.dense.dtype == np.float16 and raw.dense.shape == (len(labels), NUM)
        np.testing.assert_array_equal(raw.labels, labels)
        np.testing.assert_array_equal(raw.dense, dense.astype(np.float16))
        np.testing.assert_array_equal(raw.ids, ids)
        assert raw.ids.shape == (len(labels), len(CARDS))
        # each categorical feature is stored in the smallest integer type of its cardinality
        assert [c.dtype for c in ds.categorical] == [np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)]
        assert ds.label.dtype == np.dtype(np.bool_)
    # file sizes are exactly rows x itemsize (no header, no padding)
    n = 87
    assert os.path.getsize(out / "train" / "label.bin") == n
    assert os.path.getsize(out / "train" / "numerical.bin") == n * NUM * 2
    assert [os.path.getsize(out / "train" / f"cat_{i}.bin") for i in range(3)] == [n, 2 * n, 4 * n]


def test_partial_reads_match(small_dataset):
    out, written = small_dataset
    _, train, _ = open_dataset(str(out))
    dense, ids, labels = written["train"]
    for lo, hi in [(0, 1), (10, 60), (49, 51), (86, 87), (30, 30)]:
        raw = train.read(lo, hi)
        np.testing.assert_array_equal(raw.ids, ids[lo:hi])
        np.testing.assert_array_equal(raw.labels, labels[lo:hi])
        np.testing.assert_array_equal(raw.dense, dense[lo:hi].astype(np.float16))


def test_writer_refuses_existing_folder(small_dataset):
    out, _ = small_dataset
    with pytest.raises(DatasetError, match="already exists"):
        SplitBinaryWriter(str(out), NUM, CARDS)
    # with overwrite it replaces the old dataset
    write_dataset_rows = SplitBinaryWriter(str(out), 1, [2], overwrite=True)
    write_dataset_rows.append("train", np.zeros((4, 1)), np.ones((4, 1), np.int64), np.ones(4, bool))
    write_dataset_rows.append("test", np.zeros((2, 1)), np.zeros((2, 1), np.int64), np.zeros(2, bool))
    write_dataset_rows.finish()
    spec, train, test = open_dataset(str(out))
    assert spec.cardinalities == [2] and len(train) == 4 and len(test) == 2


# ---- chunked (multi-file) features -------------------------------------------------------------------


def split_file(path, dtype, width, row_counts, base):
    """Split `path` into consecutive chunk files with these row counts; return their relative names."""
    data = np.fromfile(path, dtype=dtype).reshape(-1, width)
    assert sum(row_counts) == len(data)
    names, start = [], 0
    for i, n in enumerate(row_counts):
        rel = os.path.relpath(path, base) + f".part{i}"
        data[start : start + n].tofile(os.path.join(base, rel))
        names.append(rel)
        start += n
    os.remove(path)
    return names


def test_chunked_features_read_across_boundaries(small_dataset):
    out, written = small_dataset
    spec = FeatureSpec.from_yaml(str(out))
    base = str(out)
    # split several train features into chunk files of different sizes (one of them empty)
    plan = {
        "label": (np.bool_, 1, [30, 0, 57]),
        "num_0": (np.float16, NUM, [40, 47]),  # the numerical chunk: all numerical features
        "cat_1.bin": (np.int16, 1, [1, 85, 1]),
        "cat_2.bin": (np.int32, 1, [87]),
    }
    for chunk in spec.source_spec["train"]:
        first = chunk["features"][0]
        if first in plan:
            dtype, width, counts = plan[first]
            chunk["files"] = split_file(os.path.join(base, chunk["files"][0]), dtype, width, counts, base)
    spec.write(base)
    spec = FeatureSpec.from_yaml(base)
    assert spec.mapping_files("train").categorical[1] == [
        os.path.join(base, "train", f"cat_1.bin.part{i}") for i in range(3)
    ]
    train = SplitBinaryDataset(spec, "train")
    assert len(train.label.files) == 3 and len(train.numerical.files) == 2
    dense, ids, labels = written["train"]
    assert len(train) == 87
    for lo, hi in [(0, 87), (25, 35), (29, 31), (30, 31), (0, 1), (1, 2), (85, 87), (86, 87), (39, 41), (40, 40)]:
        raw = train.read(lo, hi)
        np.testing.assert_array_equal(raw.labels, labels[lo:hi])
        np.testing.assert_array_equal(raw.dense, dense[lo:hi].astype(np.float16))
        np.testing.assert_array_equal(raw.ids, ids[lo:hi])


def test_a_chunk_file_cut_shorter_after_opening_is_one_line_naming_it(small_dataset):
    """Rows are copied with positioned reads, not memory-mapped: a chunk file that shrinks while
    the dataset is open is a DatasetError naming that chunk and both sizes at the first read that
    reaches past its new end (a mapped file: SIGBUS); rows before the cut, and the other chunks,
    still read as written."""
    out, written = small_dataset
    spec = FeatureSpec.from_yaml(str(out))
    base = str(out)
    for chunk in spec.source_spec["train"]:
        if chunk["features"][0] == "cat_1.bin":
            chunk["files"] = split_file(os.path.join(base, chunk["files"][0]), np.int16, 1, [40, 47], base)
    spec.write(base)
    train = SplitBinaryDataset(FeatureSpec.from_yaml(base), "train")
    os.truncate(os.path.join(base, "train", "cat_1.bin.part1"), 2 * 10)  # int16: 10 of its 47 rows
    ids = written["train"][1]
    np.testing.assert_array_equal(train.read(30, 50).ids, ids[30:50])  # chunk 0, then 10 rows of chunk 1
    with pytest.raises(DatasetError) as info:
        train.read(45, 51)
    assert str(info.value) == (
        f"{os.path.join('train', 'cat_1.bin.part1')}: the file shrank to 20 bytes while it was read "
        "(it held 94 when opened)"
    )


# ---- files that do not match the spec ---------------------------------------------------------------


def test_cat_file_shorter_than_label_file(small_dataset):
    out, _ = small_dataset
    path = out / "train" / "cat_1.bin"
    path.write_bytes(path.read_bytes()[: 2 * 80])  # int16: 80 of 87 rows
    with pytest.raises(DatasetError) as info:
        open_dataset(str(out))
    msg = str(info.value)
    assert os.path.join("train", "cat_1.bin") in msg
    assert "80" in msg and "87" in msg


def test_numerical_file_longer_than_label_file(small_dataset):
    out, _ = small_dataset
    with open(out / "test" / "numerical.bin", "ab") as f:
        f.write(np.zeros(NUM, np.float16).tobytes())
    with pytest.raises(DatasetError) as info:
        open_dataset(str(out))
    msg = str(info.value)
    assert os.path.join("test", "numerical.bin") in msg and "21" in msg and "20" in msg


def test_spec_naming_missing_file(small_dataset):
    out, _ = small_dataset
    os.remove(out / "test" / "cat_2.bin")
    with pytest.raises(DatasetError) as info:
        open_dataset(str(out))
    msg = str(info.value)
    assert os.path.join("test", "cat_2.bin") in msg and "does not exist" in msg


def test_spec_naming_missing_file_in_other_folder(small_dataset):
    out, _ = small_dataset
    spec = FeatureSpec.from_yaml(str(out))
    spec.source_spec["train"][1]["files"] = ["elsewhere/label.bin"]
    spec.write(str(out))
    with pytest.raises(DatasetError, match="elsewhere/label.bin: file named in the FeatureSpec does not exist"):
        open_dataset(str(out))


@pytest.mark.parametrize(
    "rel, extra",
    [("train/numerical.bin", 3), ("train/cat_2.bin", 1), ("test/cat_1.bin", 1)],
)
def test_size_not_whole_rows(small_dataset, rel, extra):
    out, _ = small_dataset
    with open(out / rel, "ab") as f:
        f.write(b"\0" * extra)
    with pytest.raises(DatasetError) as info:
        open_dataset(str(out))
    msg = str(info.value)
    assert os.path.normpath(rel) in msg and "not a whole number of rows" in msg


def write_id(path, dtype, row, value):
    arr = np.fromfile(path, dtype=dtype)
    arr[row] = value
    arr.tofile(path)


@pytest.mark.parametrize("value", [300, 301, 32767, -1])
def test_id_out_of_range_names_feature_and_row(small_dataset, value):
    out, _ = small_dataset
    write_id(out / "train" / "cat_1.bin", np.int16, 61, value)  # cardinality 300
    _, train, _ = open_dataset(str(out))
    train.read(0, 61)  # rows before the bad one are fine
    train.read(62, 87)
    with pytest.raises(DatasetError) as info:
        train.read(40, 80)
    msg = str(info.value)
    assert "'cat_1.bin'" in msg and "row 61" in msg and str(value) in msg and "300" in msg
    assert os.path.join("train", "cat_1.bin") in msg
    # check_ids=False skips the check (for callers that already validated the file)
    assert train.read(40, 80, check_ids=False).ids[21, 1] == value


def test_id_equal_to_cardinality_minus_one_is_valid(small_dataset):
    out, _ = small_dataset
    write_id(out / "test" / "cat_0.bin", np.int8, 3, 4)  # cardinality 5
    _, _, test = open_dataset(str(out))
    assert test.read(0, 20).ids[3, 0] == 4


def test_first_bad_row_is_reported(small_dataset):
    out, _ = small_dataset
    write_id(out / "train" / "cat_0.bin", np.int8, 70, 9)
    write_id(out / "train" / "cat_0.bin", np.int8, 12, 5)
    _, train, _ = open_dataset(str(out))
    with pytest.raises(DatasetError, match=r"'cat_0.bin' row 12 has id 5"):
        train.read(0, 87)


# ---- interrupted writes -----------------------------------------------------------------------------


def looks_complete(root):
    return [d for d, _, files in os.walk(root) if SPEC_FILE in files]


def test_aborted_writer_leaves_nothing(tmp_path):
    out = tmp_path / "ds"
    writer = SplitBinaryWriter(str(out), NUM, CARDS)
    assert os.path.isdir(str(out) + ".tmp")
    writer.append("train", *random_rows(np.random.default_rng(1), 10))
    writer.abort()
    assert not out.exists()
    assert not os.path.exists(str(out) + ".tmp")
    assert looks_complete(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_interrupted_generate_leaves_no_dataset(tmp_path, monkeypatch, exc):
    calls = {"n": 0}
    original = SplitBinaryWriter.append

    def failing_append(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise exc("interrupted")
        return original(self, *args)

    monkeypatch.setattr(SplitBinaryWriter, "append", failing_append)
    out = tmp_path / "ds"
    with pytest.raises(exc):
        generate(str(out), tiny_config(rows=1000, test_rows=100, chunk_rows=200))
    assert calls["n"] == 3
    assert not out.exists()
    assert not os.path.exists(str(out) + ".tmp")
    assert looks_complete(tmp_path) == []


def test_stale_tmp_folder_is_replaced(tmp_path):
    """A `.tmp` left by an interrupted write (it carries the marker) is replaced."""
    out = tmp_path / "ds"
    stale = tmp_path / "ds.tmp"
    (stale / "train").mkdir(parents=True)
    (stale / "train" / "junk.bin").write_bytes(b"xx")
    (stale / MARKER).write_bytes(b"")
    write_dataset(out, np.random.default_rng(3))
    assert not stale.exists()
    assert not (out / "train" / "junk.bin").exists()
    open_dataset(str(out))


def test_foreign_tmp_folder_is_never_deleted(tmp_path):
    """A `<out>.tmp` that dlrmkit did not make may be the user's: refused, left as it was."""
    stale = tmp_path / "ds.tmp"
    stale.mkdir()
    (stale / "notes.txt").write_text("mine")
    with pytest.raises(DlrmkitError, match="not made by dlrmkit"):
        write_dataset(tmp_path / "ds", np.random.default_rng(3))
    assert (stale / "notes.txt").read_text() == "mine"


def test_id_out_of_range_in_later_chunk_names_that_chunk(small_dataset):
    out, _ = small_dataset
    base = str(out)
    spec = FeatureSpec.from_yaml(base)
    for chunk in spec.source_spec["train"]:
        if chunk["features"] == ["cat_1.bin"]:
            chunk["files"] = split_file(os.path.join(base, chunk["files"][0]), np.int16, 1, [40, 47], base)
    spec.write(base)
    write_id(out / "train" / "cat_1.bin.part1", np.int16, 5, 999)  # global row 45
    train = SplitBinaryDataset(FeatureSpec.from_yaml(base), "train")
    with pytest.raises(DatasetError) as info:
        train.read(0, 87)
    msg = str(info.value)
    assert "row 45" in msg  # holds today
    assert "cat_1.bin.part1" in msg  # fails today: the message names cat_1.bin.part0
