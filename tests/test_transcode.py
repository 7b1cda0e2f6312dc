"""`dlrmkit transcode`: CSV with header, TSV without, Parquet; bad labels/numbers counted;
the ids equal those of the Criteo path (one shared encoder)."""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from helpers import run_cli
from dlrmkit.data.encoder import Vocabulary
from dlrmkit.data.split_binary import open_dataset


def csv_rows(n: int) -> list[list[str]]:
    rng = np.random.default_rng(1)
    return [
        [
            str(i % 2),
            f"{rng.normal():.3f}",
            "" if i % 7 == 0 else str(int(rng.integers(0, 9))),
            ["red", "green", "blue", "green", ""][i % 5],
            str(int(rng.integers(0, 4))),
        ]
        for i in range(n)
    ]


def args(src, out, *extra):
    return (
        "transcode",
        "--input",
        src,
        "--out",
        out,
        "--label",
        "y",
        "--numerical",
        "a,b",
        "--categorical",
        "color,city",
        *extra,
    )


def test_csv_bad_rows_and_ids(tmp_path):
    rows = csv_rows(60)
    rows[5][0] = "2"  # bad label
    rows[9][1] = "abc"  # bad number
    text = "y,a,b,color,city\n" + "\n".join(",".join(r) for r in rows) + "\n"
    src = tmp_path / "d.csv"
    src.write_text(text)
    r = run_cli(*args(src, tmp_path / "o", "--test-rows", "10"))
    assert r.code == 0, r.err
    spec, train, test = open_dataset(str(tmp_path / "o"))
    rep = spec.metadata["preprocess"]["report"]
    assert rep["rows_skipped"]["bad_label"] == 1 and rep["rows_skipped"]["bad_number"] == 1
    assert any("data row 6" in p for p in rep["first_bad_rows"])
    assert (len(train), len(test)) == (48, 10)
    vocab = Vocabulary.load(str(tmp_path / "o"))
    # green is the most frequent color -> id 1; missing -> 0
    assert vocab.encode({"color": ["green", "", "purple"], "city": ["0", "1", "9"]})[:, 0].tolist() == [1, 0, 0]
    assert run_cli("validate", "--data", tmp_path / "o").code == 0


def test_tsv_no_header_and_parquet_agree(tmp_path):
    rows = csv_rows(40)
    tsv = tmp_path / "d.tsv"
    tsv.write_text("\n".join("\t".join(r) for r in rows) + "\n")
    r = run_cli(*args(tsv, tmp_path / "a", "--no-header", "--columns", "y,a,b,color,city", "--test-fraction", "0.25"))
    assert r.code == 0, r.err
    cols = list(zip(*rows))
    table = pa.table(
        {
            "y": pa.array([int(v) for v in cols[0]]),
            "a": pa.array([float(v) for v in cols[1]]),
            "b": pa.array([int(v) if v else None for v in cols[2]]),
            "color": pa.array(cols[3]),
            "city": pa.array([int(v) for v in cols[4]]),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    r = run_cli(*args(tmp_path / "d.parquet", tmp_path / "b", "--test-fraction", "0.25"))
    assert r.code == 0, r.err
    _, tra, tea = open_dataset(str(tmp_path / "a"))
    _, trb, teb = open_dataset(str(tmp_path / "b"))
    assert (len(tra), len(tea)) == (30, 10)
    for x, y in ((tra, trb), (tea, teb)):
        bx, by = x.read(0, len(x)), y.read(0, len(y))
        np.testing.assert_array_equal(bx.ids, by.ids)
        np.testing.assert_array_equal(bx.labels, by.labels)
        np.testing.assert_allclose(bx.dense.astype(np.float32), by.dense.astype(np.float32), atol=1e-3)


def test_same_ids_as_criteo_path(tmp_path):
    """A Criteo TSV through transcode (log, float16) and through preprocess criteo: identical files."""
    rng = np.random.default_rng(3)
    lines = []
    for i in range(200):
        cats = [f"{int(x):08x}" if x else "" for x in rng.zipf(1.5, 26) % 50]
        lines.append("\t".join([str(i % 2), *[str(int(x)) for x in rng.integers(0, 30, 13)], *cats]))
    src = tmp_path / "c.tsv"
    src.write_text("\n".join(lines) + "\n")
    assert (
        run_cli(
            "preprocess",
            "criteo",
            "--input",
            src,
            "--out",
            tmp_path / "p",
            "--test-rows",
            "50",
            "--no-progress",
            "--workers",
            "1",
            "--frequency-threshold",
            "2",
        ).code
        == 0
    )
    names = ["y", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]
    r = run_cli(
        "transcode",
        "--input",
        src,
        "--out",
        tmp_path / "t",
        "--label",
        "y",
        "--no-header",
        "--columns",
        ",".join(names),
        "--numerical",
        ",".join(names[1:14]),
        "--categorical",
        ",".join(names[14:]),
        "--test-rows",
        "50",
        "--frequency-threshold",
        "2",
        "--log-transform",
        "--numerical-dtype",
        "float16",  # preprocess criteo's (NVIDIA's) storage
    )
    assert r.code == 0, r.err
    for d in ("train", "test"):
        for t in range(26):
            assert (tmp_path / "p" / d / f"cat_{t}.bin").read_bytes() == (
                tmp_path / "t" / d / f"cat_{t}.bin"
            ).read_bytes()
        assert (tmp_path / "p" / d / "numerical.bin").read_bytes() == (
            tmp_path / "t" / d / "numerical.bin"
        ).read_bytes()
