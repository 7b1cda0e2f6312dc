"""`dlrmkit transcode --split-by COL`: the held-out rows are the latest by a column (numbers or ISO
dates/times) wherever they are in the files; equal values go by file order; a bad value there is a
counted bad row; the vocabulary counts the training rows only; the dataset records the split."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from helpers import run_cli
from dlrmkit.data.encoder import Vocabulary
from dlrmkit.data.feature_spec import VAL
from dlrmkit.data.split_binary import SplitBinaryDataset, open_dataset
from dlrmkit.data.transcode import add_latest, sortable, split_keys


def write_csv(path, ts: list[str], extra: dict[str, list[str]] | None = None) -> None:
    """Rows y,id,ts,c (and the `extra` columns, replacing those of the same name): `id` the row's
    position in the file, `c` 'v0'..'v2'."""
    cols = {"y": [str(i % 2) for i in range(len(ts))], "id": [str(i) for i in range(len(ts))], "ts": ts}
    cols["c"] = [f"v{i % 3}" for i in range(len(ts))]
    cols.update(extra or {})
    rows = zip(*cols.values())
    path.write_text(",".join(cols) + "\n" + "".join(",".join(r) + "\n" for r in rows))


def split_ids(out) -> tuple[list[int], list[int], list[int]]:
    """The `id` (the first numerical column) of the train, val and test rows, in their stored order."""
    spec, train, test = open_dataset(str(out))
    mappings = [train, SplitBinaryDataset(spec, VAL), test] if "val" in spec.metadata["rows"] else [train, [], test]
    return tuple(m.read(0, len(m)).dense[:, 0].astype(int).tolist() if len(m) else [] for m in mappings)


def transcode(src, out, *extra, numerical="id,ts"):
    return run_cli("transcode", "--input", src, "--out", out, "--label", "y", "--numerical", numerical,
                   "--categorical", "c", *extra)  # fmt: skip


def test_shuffled_rows_split_by_time_put_the_latest_in_test_and_the_next_in_val(tmp_path):
    n = 60
    ts = np.random.default_rng(3).permutation(n) * 10 + 1000
    src = tmp_path / "d.csv"
    late = ["late" if t >= 1000 + 10 * (n - 10) else f"v{i % 3}" for i, t in enumerate(ts)]
    write_csv(src, [str(t) for t in ts], {"c": late})
    r = transcode(src, tmp_path / "o", "--split-by", "ts", "--test-rows", "10", "--val-fraction", "0.2")
    assert r.code == 0, r.err
    assert "held out the latest rows by ts: test from 1500.0, val from 1400.0" in r.out
    train, val, test = split_ids(tmp_path / "o")
    order = np.argsort(ts)  # row ids from the earliest time to the latest
    assert test == sorted(order[-10:].tolist())  # the 10 latest, in file order
    assert val == sorted(order[-20:-10].tolist())  # 20% of the 50 rows before them: the next 10
    assert train == sorted(order[:-20].tolist()) and test != list(range(50, 60))
    assert min(ts[test]) > max(ts[val]) > max(ts[train])
    spec, _, _ = open_dataset(str(tmp_path / "o"))
    split = spec.metadata["split"]
    assert split["split_by"] == "ts" and split["test_rows"] == 10 and split["val_fraction"] == 0.2
    assert (split["test_from"], split["val_from"]) == (1500.0, 1400.0)
    # 'late' is the value of the 10 latest rows only: never counted, it is unseen (id 0)
    late_id, v0_id = Vocabulary.load(str(tmp_path / "o")).encode({"c": ["late", "v0"]})[:, 0].tolist()
    assert late_id == 0 and v0_id > 0
    # the split column read as a feature too: its values are those of the rows
    _, _, test_ds = open_dataset(str(tmp_path / "o"))
    assert test_ds.read(0, 10).dense[:, 1].tolist() == ts[test].tolist()
    # without the option: the last rows in file order, recorded so
    r = transcode(src, tmp_path / "plain", "--test-rows", "10", "--val-fraction", "0.2")
    assert r.code == 0 and split_ids(tmp_path / "plain")[2] == list(range(50, 60)), r.err
    assert "file order" in open_dataset(str(tmp_path / "plain"))[0].metadata["split"]["held_out"]


def test_the_split_holds_across_files_and_batches(tmp_path, monkeypatch):
    import dlrmkit.data.transcode as tr

    monkeypatch.setattr(tr, "BATCH_BYTES", 64)  # a few rows a batch
    ts = np.random.default_rng(4).permutation(40)
    srcs = [tmp_path / "a.csv", tmp_path / "b.csv"]
    write_csv(srcs[0], [str(t) for t in ts[:25]])
    write_csv(srcs[1], [str(t) for t in ts[25:]], {"id": [str(i) for i in range(25, 40)]})
    r = run_cli("transcode", "--input", *srcs, "--out", tmp_path / "o", "--label", "y", "--numerical", "id",
                "--categorical", "c", "--split-by", "ts", "--test-rows", "7", "--val-rows", "5")  # fmt: skip
    assert r.code == 0, r.err
    order = np.argsort(ts)
    assert split_ids(tmp_path / "o") == (sorted(order[:-12]), sorted(order[-12:-7]), sorted(order[-7:]))


def test_equal_times_go_by_file_order_and_the_counts_are_exact(tmp_path):
    ts = ["1", "3", "3", "2", "3", "3", "1", "0", "2", "3"]
    src = tmp_path / "d.csv"
    write_csv(src, ts)
    r = transcode(src, tmp_path / "o", "--split-by", "ts", "--test-rows", "3", "--val-rows", "3")
    assert r.code == 0, r.err
    # the five 3s are rows 1 2 4 5 9: the last three are test, the two before val with the later 2 (row 8)
    assert split_ids(tmp_path / "o") == ([0, 3, 6, 7], [1, 2, 8], [4, 5, 9])
    # a file already in time order splits as it does without the option, equal values included
    write_csv(src, sorted(ts, key=int))
    for out, extra in (("by", ("--split-by", "ts")), ("plain", ())):
        assert transcode(src, tmp_path / out, "--test-rows", "4", "--val-rows", "2", *extra).code == 0
    assert split_ids(tmp_path / "by") == split_ids(tmp_path / "plain") == (list(range(4)), [4, 5], [6, 7, 8, 9])


def test_parquet_times_and_iso_text_with_zones(tmp_path):
    n = 40
    base = dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc)
    minutes = np.random.default_rng(5).permutation(n)
    table = pa.table({
        "y": pa.array([i % 2 for i in range(n)]),
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "c": pa.array([f"v{i % 3}" for i in range(n)]),
        "when": pa.array([base + dt.timedelta(minutes=int(m)) for m in minutes], pa.timestamp("us", "UTC")),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "d.parquet")
    r = run_cli("transcode", "--input", tmp_path / "d.parquet", "--out", tmp_path / "o", "--label", "y",
                "--numerical", "id", "--categorical", "c", "--split-by", "when", "--test-fraction", "0.25")  # fmt: skip
    assert r.code == 0, r.err
    train, _, test = split_ids(tmp_path / "o")
    assert test == sorted(np.argsort(minutes)[-10:].tolist()) and len(train) == 30
    spec, _, _ = open_dataset(str(tmp_path / "o"))
    assert spec.metadata["split"]["test_from"] == (base + dt.timedelta(minutes=30)).timestamp()
    # ISO text: a zone is applied (10:00+02:00 is 08:00 UTC), a time without one is UTC, a date is midnight
    when = ["2024-01-02T10:00:00+02:00", "2024-01-02 09:00", "2024-01-02T08:30:00Z", "2024-01-03", "1704186000"]
    src = tmp_path / "d.csv"
    write_csv(src, ["0"] * len(when), {"when": when})
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "iso", "--label", "y", "--numerical", "id",
                "--categorical", "c", "--split-by", "when", "--test-rows", "2", "--val-rows", "1")  # fmt: skip
    assert r.code == 0, r.err
    # 1704186000 is 2024-01-02T09:00:00Z, equal to row 1: the later row (4) is the later
    assert split_ids(tmp_path / "iso") == ([0, 2], [1], [3, 4])


def test_a_bad_time_is_a_counted_bad_row_and_most_bad_is_refused(tmp_path):
    ts = [str(100 + i) for i in range(20)]
    ts[2], ts[5], ts[7], ts[11] = "", "soon", "2024-02-30", "1e999"
    src = tmp_path / "d.csv"
    write_csv(src, ts)
    r = transcode(src, tmp_path / "o", "--split-by", "ts", "--test-rows", "4", numerical="id")
    assert r.code == 0, r.err
    assert "skipped 4 (bad_split_value 4)" in r.out
    assert f"{src}:4: data row 3: bad_split_value in column ts ('')" in r.out
    assert f"{src}:9: data row 8: bad_split_value in column ts ('2024-02-30')" in r.out
    assert split_ids(tmp_path / "o")[2] == [16, 17, 18, 19]
    write_csv(src, ["soon"] * 15 + ts[:5])
    r = transcode(src, tmp_path / "x", "--split-by", "ts", "--test-rows", "1", numerical="id")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "bad_split_value in column ts" in r.err and "--split-by ts must hold numbers or ISO dates/times" in r.err
    assert not (tmp_path / "x").exists()


def test_impossible_dates_among_many_are_found_each():
    values = [f"2024-01-{1 + i % 28:02d}T{i % 24:02d}:00:00" for i in range(1000)]
    for i in (3, 500, 999):
        values[i] = "2024-02-30"
    keys, ok = split_keys(pa.array(values))
    assert np.flatnonzero(~ok).tolist() == [3, 500, 999] and np.isnan(keys[~ok]).all()
    assert keys[0] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp()


def test_the_latest_rows_are_those_of_a_stable_sort_in_chunks_of_any_size():
    rng = np.random.default_rng(7)
    for values in (
        rng.integers(-3, 4, 500).astype(np.float64),  # many ties, negatives
        rng.normal(size=500) * 1e300,
        np.array([0.0, -0.0, -1e-300, 1e-300, -np.finfo(float).max, np.finfo(float).max] * 50),
    ):
        rank = np.empty(len(values), np.int64)  # 0 the earliest; equal values: the later row the later
        rank[np.argsort(values + 0.0, kind="stable")] = np.arange(len(values))
        cuts = np.sort(rng.choice(np.arange(1, len(values)), 6, replace=False))
        chunks = np.split(sortable(values), cuts)
        for n_test, n_val in ((1, 0), (7, 13), (0, 30), (150, 150), (300, 0)):
            where = np.zeros(len(values), np.uint8)
            test_from = add_latest(where, chunks, n_test)
            add_latest(where, chunks, n_test + n_val)
            want = (rank >= len(values) - n_test - n_val).astype(np.uint8) + (rank >= len(values) - n_test)
            np.testing.assert_array_equal(where, want)
            if n_test:
                assert test_from == values[rank >= len(values) - n_test].min()


def test_split_by_refuses_the_label_a_missing_column_and_no_held_out_rows(tmp_path):
    src = tmp_path / "d.csv"
    write_csv(src, [str(i) for i in range(10)])
    for extra, said in (
        (("--split-by", "y", "--test-rows", "2"), "--split-by y is the --label column"),
        (("--split-by", "time", "--test-rows", "2"), "no column(s) time"),
        (("--split-by", "ts"), "--split-by orders the held-out rows: give --test-rows"),
    ):
        r = transcode(src, tmp_path / "o", *extra)
        assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, r.err
