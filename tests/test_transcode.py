"""`dlrmkit transcode`: CSV with header, TSV without, Parquet; bad labels/numbers counted;
the ids equal those of the Criteo path (one shared encoder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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
    # each listed row names its file line (the header is line 1), the column and the value
    assert f"{src}:7: data row 6: bad_label in column y ('2')" in rep["first_bad_rows"]
    assert f"{src}:11: data row 10: bad_number in column a ('abc')" in rep["first_bad_rows"]
    assert f"{src}:11: data row 10: bad_number in column a ('abc')" in r.out
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


CRITEO_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo" / "deepctr_criteo_sample200.csv"


def test_bad_rows_name_the_first_failing_column_and_quote_its_value(tmp_path):
    rows = csv_rows(20)
    rows[2][2] = "x" * 50  # b not a number: the value is cut to 20 characters
    rows[4][1], rows[4][2] = "a", "b"  # a and b both bad: a, the first numerical column, is named
    lines = ["\t".join(r).encode() for r in rows]
    lines[7] = lines[7].replace(b"blue", b"bl\xffe")  # not UTF-8: the raw bytes are shown
    src = tmp_path / "d.tsv"
    src.write_bytes(b"\n".join(lines) + b"\n")
    r = run_cli(*args(src, tmp_path / "o", "--no-header", "--columns", "y,a,b,color,city"))
    assert r.code == 0, r.err
    assert "skipped 3 (bad_number 2, undecodable 1)" in r.out
    first = open_dataset(str(tmp_path / "o"))[0].metadata["preprocess"]["report"]["first_bad_rows"]
    assert first == [  # no header: the line number is the data row
        f"{src}:3: data row 3: bad_number in column b ('{'x' * 20}'...)",
        f"{src}:5: data row 5: bad_number in column a ('a')",
        f"{src}:8: data row 8: undecodable in column color (b'bl\\xffe')",
    ]


def mostly_hex(n_rows: int, n_hex: int) -> str:
    """y,n,h: h holds hex ids in `n_hex` of the rows, plain numbers in the others."""
    lines = ["y,n,h"] + [f"{i % 2},{i},{f'{i:08x}f' if i < n_hex else i}" for i in range(n_rows)]
    return "\n".join(lines) + "\n"


def test_a_numerical_column_bad_in_most_rows_is_refused_and_nothing_written(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text(mostly_hex(40, 21))  # 21 of 40 rows bad: more than half
    cmd = ("transcode", "--input", src, "--label", "y", "--numerical", "n,h", "--out")
    r = run_cli(*cmd, tmp_path / "o")
    assert r.code == 2, r.out
    (line,) = r.err.strip().splitlines()
    assert "21 of 40 rows read are bad (more than half), 21 of them bad_number in column h" in line
    assert f"(first: {src}:2: data row 1: bad_number in column h ('00000000f'))" in line
    assert "name it in --categorical instead of --numerical; nothing written" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]  # no folder, .tmp or .lock left

    # an existing dataset at --out stays as it was, even with --force
    src.write_text(mostly_hex(40, 0))
    assert run_cli(*cmd, tmp_path / "o").code == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "o").rglob("*") if p.is_file()}
    src.write_text(mostly_hex(40, 21))
    r = run_cli(*cmd, tmp_path / "o", "--force")
    assert r.code == 2 and "column h" in r.err
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "o"]

    # as a categorical column it is fine
    r = run_cli("transcode", "--input", src, "--label", "y", "--numerical", "n", "--categorical", "h",
                "--out", tmp_path / "c")  # fmt: skip
    assert r.code == 0, r.err
    assert "written 40  skipped 0" in r.out


def test_half_the_rows_bad_is_still_written_and_counted(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text(mostly_hex(40, 20))  # exactly half: not more than half
    r = run_cli("transcode", "--input", src, "--label", "y", "--numerical", "n,h", "--out", tmp_path / "o")
    assert r.code == 0, r.err
    assert "rows read 40  written 20  skipped 20 (bad_number 20)" in r.out
    assert f"bad row: {src}:2: data row 1: bad_number in column h ('00000000f')" in r.out


def test_other_causes_of_most_rows_bad_are_named(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text("y;n;c\n" + "".join(f"{i % 2};{i};k{i}\n" for i in range(10)))  # ';' but read with ','
    r = run_cli("transcode", "--input", src, "--label", "y", "--numerical", "n", "--out", tmp_path / "o")
    assert r.code == 2 and "no column(s) y, n" in r.err  # the header tells first
    src.write_text("y,n,c\n" + "".join(f"{i % 2},{i},k{i}\n" if i < 4 else f"{i % 2};{i};k{i}\n" for i in range(10)))
    r = run_cli("transcode", "--input", src, "--label", "y", "--numerical", "n", "--out", tmp_path / "o")
    assert r.code == 2
    assert "6 of 10 rows read are bad (more than half), 6 of them wrong_field_count (first: " in r.err
    assert "check --delimiter" in r.err
    src.write_text("y,n,c\n" + "".join(f"{i % 2 + (2 if i > 3 else 0)},{i},k{i}\n" for i in range(10)))
    r = run_cli("transcode", "--input", src, "--label", "y", "--numerical", "n", "--out", tmp_path / "o")
    assert r.code == 2 and "6 of them bad_label in column y" in r.err and "must hold 0/1" in r.err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not CRITEO_CSV.exists(), reason="needs ../shared/data/criteo (the 200-row Criteo CSV)")
def test_criteo_hex_column_given_as_numerical_is_refused(tmp_path):
    r = run_cli("transcode", "--input", CRITEO_CSV, "--out", tmp_path / "x", "--label", "label",
                "--numerical", "I1,C1", "--categorical", "C2")  # fmt: skip
    assert r.code == 2, r.out
    (line,) = r.err.strip().splitlines()
    assert "bad_number in column C1" in line and "--categorical" in line and f"{CRITEO_CSV}:2: data row 1" in line
    assert not (tmp_path / "x").exists()


def test_label_values_name_the_two_values_read_as_0_and_1(tmp_path):
    rows = csv_rows(40)
    for r in rows:
        r[0] = ["no", "yes"][int(r[0])]
    rows[3][0] = "maybe"  # neither value: a bad row, counted
    src = tmp_path / "d.csv"
    src.write_text("y,a,b,color,city\n" + "\n".join(",".join(r) for r in rows) + "\n")
    r = run_cli(*args(src, tmp_path / "plain"))
    assert r.code == 2 and "--label y must hold 0/1 (--label-values NEG,POS reads two other values)" in r.err
    r = run_cli(*args(src, tmp_path / "o", "--label-values", "no,yes", "--test-rows", "9"))
    assert r.code == 0, r.err
    assert "skipped 1 (bad_label 1)" in r.out and "bad_label in column y ('maybe')" in r.out
    spec, train, test = open_dataset(str(tmp_path / "o"))
    assert spec.metadata["label_values"] == ["no", "yes"]
    labels = np.concatenate([train.read(0, len(train)).labels, test.read(0, len(test)).labels])
    want = [int(r[0] == "yes") for i, r in enumerate(rows) if i != 3]
    assert labels.astype(int).tolist() == want and 0 < sum(want) < len(want)
    # the other way round, -1/1 (given with '=': argparse reads a leading '-' as an option)
    src.write_text(
        "y,a,b,color,city\n" + "\n".join(",".join([{"no": "-1", "yes": "1"}.get(r[0], r[0]), *r[1:]]) for r in rows)
    )
    r = run_cli(*args(src, tmp_path / "pm", "--label-values=-1,1"))
    assert r.code == 0 and "skipped 1 (bad_label 1)" in r.out, r.out + r.err
    for bad in ("1,1", "yes", "a,b,c", ",1"):
        r = run_cli(*args(src, tmp_path / "x", "--label-values", bad))
        assert r.code == 2 and "--label-values" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_columns_left_out_are_named(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text("y,a,b,color,city\n" + "\n".join(",".join(r) for r in csv_rows(20)) + "\n")
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "o", "--label", "y", "--numerical", "a",
                "--categorical", "city")  # fmt: skip
    assert r.code == 0, r.err
    assert "columns not used: b, color (name them in --numerical or --categorical to use them)" in r.out
    spec, _, _ = open_dataset(str(tmp_path / "o"))
    assert spec.metadata["preprocess"]["report"]["unused_columns"] == ["b", "color"]
    r = run_cli(*args(src, tmp_path / "all"))  # every column named: no such line
    assert r.code == 0 and "columns not used" not in r.out, r.out


def test_a_parquet_value_that_is_not_utf8_is_one_bad_row_as_in_a_text_file(tmp_path):
    n = 20
    cats = [b"v%d" % (i % 4) if i != 3 else b"\xff\xfe" for i in range(n)]
    table = pa.table({"y": pa.array([i % 2 for i in range(n)]), "c": pa.array(cats, pa.binary())})
    pq.write_table(table, tmp_path / "d.parquet")
    r = run_cli("transcode", "--input", tmp_path / "d.parquet", "--out", tmp_path / "o", "--label", "y",
                "--categorical", "c")  # fmt: skip
    assert r.code == 0, r.err
    assert "skipped 1 (undecodable 1)" in r.out and "data row 4: undecodable in column c" in r.out, r.out
    vocab = Vocabulary.load(str(tmp_path / "o"))
    assert vocab.encode({"c": ["v0", "v1", "v2", "v3"]})[:, 0].tolist() != [0, 0, 0, 0]  # the bytes read as text


def test_a_header_read_as_one_column_suggests_the_delimiter(tmp_path):
    src = tmp_path / "d.csv"
    src.write_text("y;a;b;color;city\n" + "\n".join(";".join(r) for r in csv_rows(20)) + "\n")
    r = run_cli(*args(src, tmp_path / "o"))
    assert r.code == 2 and not (tmp_path / "o").exists()
    (line,) = r.err.strip().splitlines()
    assert "(has: y;a;b;color;city); the header is one column: are its fields separated by ';' (--delimiter)?" in line
    r = run_cli(*args(src, tmp_path / "o", "--delimiter", ";"))
    assert r.code == 0, r.err


def test_a_quoted_field_holds_the_delimiter_but_never_a_line_break(tmp_path):
    src = tmp_path / "ua.csv"
    src.write_text(
        '"y","ua","city, state"\n1,"Mozilla/5.0 (X11, Linux)",a\n0,"curl/8.0",b\n0,"Mozilla/5.0 (Mac, Intel)",a\n'
        '1,"say ""hi"", twice",b\n0,Mozilla/5.0 (X11, Linux),a\n1,"Mozilla/5.0 (X11, Linux)",b\n'
    )
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "o", "--label", "y", "--categorical", "ua")
    assert r.code == 0, r.err
    assert "columns not used: city, state" in r.out  # a quoted name holding the delimiter is one column
    # the one unquoted comma is a field too many: a bad row, located; the quoted ones are one field each
    assert "rows read 6  written 5  skipped 1 (wrong_field_count 1)" in r.out, r.out
    assert f"{src}:6: data row 5: wrong_field_count (4 fields, expected 3)" in r.out
    _, train, _ = open_dataset(str(tmp_path / "o"))
    ids = train.read(0, len(train)).ids[:, 0]
    assert ids[0] == ids[4] and len(set(ids.tolist())) == 4  # the same user agent, quoted alike, is one id
    assert train.read(0, len(train)).ids.shape == (5, 1)

    # a quoted value over two lines is two bad rows, never one row that hides the lines after it
    src.write_text('y,ua,city\n1,"two\nlines",a\n0,"Mozilla/5.0 (Mac, Intel)",a\n')
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "o2", "--label", "y", "--categorical", "ua,city")
    assert r.code == 2 and not (tmp_path / "o2").exists()
    (line,) = r.err.strip().splitlines()
    assert f"{src}:2: data row 1: wrong_field_count (2 fields, expected 3)" in line
    assert "(a field in quotes may hold the delimiter, as CSV quotes it, but not a line break)" in line


def test_missing_numbers_are_zero_and_counted_by_column(tmp_path):
    """R writes a missing number as NA, pandas as an empty field, databases as NULL: each is 0, as an
    empty field is, and counted; a word is still a bad number, and NA stays a category of its own."""
    src = tmp_path / "na.csv"
    src.write_text("y,a,b,c\n1,NA,1,x\n0,2.5,NaN,y\n1,,2, NA \n0,null,3,NA\n1,7,N/A,x\n0,abc,4,y\n")
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "o", "--label", "y", "--numerical", "a,b",
                "--categorical", "c")  # fmt: skip
    assert r.code == 0, r.err
    assert "rows read 6  written 5  skipped 1 (bad_number 1)" in r.out
    assert "numerical values missing (empty, NA, NaN, null, ...), read as 0: a 3, b 2" in r.out
    assert f"{src}:7: data row 6: bad_number in column a ('abc')" in r.out
    _, train, _ = open_dataset(str(tmp_path / "o"))
    batch = train.read(0, len(train))
    np.testing.assert_array_equal(batch.dense, [[0, 1], [2.5, 0], [0, 2], [0, 3], [7, 0]])
    ids = batch.ids[:, 0]
    assert ids[2] == ids[3] != ids[0] == ids[4]


def test_an_empty_column_name_is_shown_quoted(tmp_path):
    """A header with a trailing delimiter has a last column without a name: the line naming the
    columns not used, and an error listing the header's names, show it as '' (it was nothing)."""
    src = tmp_path / "d.csv"
    src.write_text("y,a,b,color,city,\n" + "\n".join(",".join(r) + "," for r in csv_rows(20)) + "\n")
    r = run_cli(*args(src, tmp_path / "o"))
    assert r.code == 0, r.err
    assert "columns not used: '' (name them in --numerical or --categorical to use them)" in r.out, r.out
    r = run_cli("transcode", "--input", src, "--out", tmp_path / "o2", "--label", "y", "--numerical", "z")
    assert r.code == 2
    (line,) = r.err.strip().splitlines()
    assert "no column(s) z (has: y, a, b, color, city, '')" in line, line
