"""Malformed Criteo rows: each reason is skipped, counted and located (file:line); binary
garbage and CRLF endings; --strict exits 2; empty input and truncated .gz give one line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli
from dlrmkit.data.criteo_tsv import Bad, parse_block
from dlrmkit.data.split_binary import open_dataset


def row(label="0", ints=None, cats=None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats])


def good_rows(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        ints = [str(int(x)) if x >= 0 else "" for x in rng.integers(-1, 50, 13)]
        cats = [f"{int(x):08x}" if x else "" for x in rng.integers(0, 20, 26)]
        out.append(row(str(i % 2), ints, cats))
    return out


def write(path: Path, lines: list[bytes | str], eol: bytes = b"\n") -> Path:
    path.write_bytes(b"".join((l.encode() if isinstance(l, str) else l) + eol for l in lines))
    return path


def preprocess(src, out, *extra):
    return run_cli("preprocess", "criteo", "--input", src, "--out", out, "--no-progress", "--workers", "1", *extra)


def bad_fixture(tmp_path: Path) -> Path:
    lines: list = good_rows(30)
    lines[3] = row()[:-9]  # 39 fields
    lines[7] = row(ints=["12", "x1", *["0"] * 11])  # non-integer
    lines[11] = row(label="2")  # bad label
    lines[15] = row(cats=["\xff"] * 26).encode("latin-1")  # undecodable bytes
    lines[19] = bytes(x for x in range(256) if x != 10) * 3  # binary garbage (one line)
    lines[23] = row(ints=["1.5", *["0"] * 12])
    return write(tmp_path / "bad.tsv", lines)


def test_bad_rows_counted_by_reason_with_positions(tmp_path):
    src = bad_fixture(tmp_path)
    r = preprocess(src, tmp_path / "o", "--test-rows", "5")
    assert r.code == 0, r.err
    spec, train, test = open_dataset(str(tmp_path / "o"))
    rep = spec.metadata["preprocess"]["report"]
    assert rep["rows_read"] == 30 and rep["rows_written"] == 24
    assert rep["rows_skipped"] == {"wrong_field_count": 1, "bad_integer": 2, "bad_label": 1, "undecodable": 2}
    lines = [int(p.split(":")[1]) for p in rep["first_bad_rows"]]
    assert lines == [4, 8, 12, 16, 20]
    assert rep["first_bad_rows"][0].startswith(f"{src}:4: wrong_field_count")
    assert "'x1'" in rep["first_bad_rows"][1]
    assert f"{src}:4" in r.out and "skipped 6" in r.out
    assert (len(train), len(test)) == (19, 5)


def test_strict_stops_at_first_bad_row(tmp_path):
    r = preprocess(bad_fixture(tmp_path), tmp_path / "o", "--strict")
    assert r.code == 2
    assert "bad.tsv:4:" in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()


def test_crlf_line_endings_match_lf(tmp_path):
    lines = good_rows(40)
    write(tmp_path / "lf.tsv", lines)
    write(tmp_path / "crlf.tsv", lines, eol=b"\r\n")
    assert preprocess(tmp_path / "lf.tsv", tmp_path / "a", "--test-rows", "10").code == 0
    assert preprocess(tmp_path / "crlf.tsv", tmp_path / "b", "--test-rows", "10").code == 0
    for mapping in ("train", "test"):
        for f in os.listdir(tmp_path / "a" / mapping):
            assert (tmp_path / "a" / mapping / f).read_bytes() == (tmp_path / "b" / mapping / f).read_bytes()


def test_missing_final_newline_and_negative_ints(tmp_path):
    src = tmp_path / "x.tsv"
    src.write_text(row(ints=["-5", "", *["3"] * 11]) + "\n" + row(label="1"))
    assert preprocess(src, tmp_path / "o", "--test-rows", "1").code == 0
    _, train, test = open_dataset(str(tmp_path / "o"))
    dense = train.read(0, 1).dense.astype(np.float32)[0]
    assert dense[0] == 0 and dense[1] == 0 and dense[2] == np.float16(np.log1p(3.0))
    assert test.read(0, 1).labels.tolist() == [True]


def test_empty_input_and_truncated_gzip(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    r = preprocess(empty, tmp_path / "o")
    assert r.code == 2 and "empty input" in r.err and len(r.err.strip().splitlines()) == 1
    garbage_only = write(tmp_path / "g.tsv", [b"\x00\x01\x02", b"nope"])
    r = preprocess(garbage_only, tmp_path / "o")
    assert r.code == 2 and "no valid rows" in r.err
    gz = tmp_path / "day.gz"
    gz.write_bytes(gzip.compress(("\n".join(good_rows(2000)) + "\n").encode())[:-200])
    r = preprocess(gz, tmp_path / "o")
    assert r.code == 2 and "truncated or corrupt gzip" in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        (2, "0x1f", "bad_integer"),  # Arrow reads hexadecimal
        (2, " 12 ", "bad_integer"),  # and trims spaces
        (2, "1234567890123456789", "bad_integer"),  # and takes 19 digits
        (2, "+3", None),  # the slow path's cast took no '+': "internal error"
        (2, "0000000000000000000000012", None),
        (0, "01", "bad_label"),
        (0, "-0", "bad_label"),
        (0, " 1", "bad_label"),
    ],
)
def test_a_rows_fate_does_not_depend_on_the_other_rows_of_its_block(field, value, reason):
    lines = good_rows(20)
    fields = lines[3].split("\t")
    fields[field] = value
    lines[3] = "\t".join(fields)
    other_bad = row(ints=["1.5", *["0"] * 12])  # sends its block to the row-by-row parser
    for block_lines in (lines, [*lines, other_bad]):
        bad = Bad()
        parsed = parse_block(("\n".join(block_lines) + "\n").encode(), bad, 1)
        skipped = {k: v for k, v in bad.counts.items() if v}
        expect = {reason: 1} if reason else {}
        if len(block_lines) > len(lines):
            expect["bad_integer"] = expect.get("bad_integer", 0) + 1
        assert skipped == expect, block_lines[-1]
        assert len(parsed.labels) == 20 - (reason is not None)
        if reason is None:
            assert parsed.ints[1][3].as_py() == int(value)


def test_a_plus_sign_is_read_not_an_internal_error(tmp_path):
    lines = good_rows(20)
    lines[3] = row(ints=["+3", *["0"] * 12])
    lines[9] = row(ints=["1.5", *["0"] * 12])
    r = preprocess(write(tmp_path / "x.tsv", lines), tmp_path / "o", "--test-rows", "5")
    assert r.code == 0, r.err
    assert "skipped 1 (bad_integer 1)" in r.out


def test_held_back_rows_that_leave_no_training_rows_name_the_options(tmp_path):
    src = write(tmp_path / "x.tsv", good_rows(3))
    for held in (["--val-rows", "3"], ["--test-rows", "2", "--val-rows", "1"]):
        r = preprocess(src, tmp_path / "o", *held)
        assert r.code == 2 and "--test-*/--val-* options leave no training rows (3 valid rows" in r.err, r.err
        assert not (tmp_path / "o").exists()
