"""Hostile rows, input files and output paths of the commands that write datasets (synth,
transcode, preprocess), beyond tests/test_hostile_inputs.py, one table row each, run by the same
check (exit 2, one line naming the file/line/option, nothing on disk changed): an empty --out
(the current folder), input files named twice, every row bad, inputs that are not files, lines
longer than any row, more tables than open files. A second table lists raw inputs that must be
accepted, each with what the dataset must hold. Hostile dataset folders are in
tests/test_hostile_datasets.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import yaml

from helpers import CliResult, run_cli
from hostile_util import Accepted, run_accepted, summarized
from test_hostile_inputs import (  # noqa: F401 - ws and trained_run are fixtures
    SPEC,
    Probe,
    snapshot,
    trained_run,
    write_bytes,
    ws,
)
from test_hostile_inputs import test_hostile_input as check_probe

TR = ("transcode", "--input", "{ws}/rows.csv", "--label", "y", "--numerical", "a,b", "--categorical", "c")
PP = ("preprocess", "criteo", "--input", "{ws}/rows.tsv", "--no-progress", "--workers", "1")
LONG = 17 << 20  # beyond the 16 MiB a line may hold


def parquet_rows(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    labels = pa.array([True, False, None, True, False])
    numbers = [1.5, None, 2.0, float("inf"), 3.0]
    table = pa.table({"y": labels, "a": numbers, "b": numbers, "c": ["x", None, "z", "w", "x"]})
    pq.write_table(table, root / "rows.parquet")


def parquet_column_twice(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table([[1, 0], [1.5, 2.0], [3, 4], ["x", "y"], ["z", "w"]], names=["y", "a", "b", "c", "c"])
    pq.write_table(table, root / "rows.parquet")


def compressed(rel: str, to: str, fmt: str) -> Callable[[Path], None]:
    """`to`: the file `rel` compressed as `fmt` (a format the standard library writes), or only
    that format's first bytes before the text (zstd)."""

    def setup(root: Path) -> None:
        import bz2
        import gzip
        import lzma
        import zipfile

        data = (root / rel).read_bytes()
        if fmt == "zip":
            with zipfile.ZipFile(root / to, "w") as z:
                z.writestr(rel, data)
            return
        write = {"bzip2": bz2.compress, "xz": lzma.compress, "gzip": gzip.compress}.get(fmt)
        (root / to).write_bytes(write(data) if write else b"\x28\xb5\x2f\xfd" + data)

    return setup


def long_line(rel: str, prefix: bytes) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        with open(root / rel, "ab") as f:
            f.write(prefix + b"7" * LONG + b"\n")

    return setup


PROBES = [
    # ---- option values: a comma list with an empty item
    Probe(
        "synth-cardinalities-empty-entry", ("synth", "--out", "{ws}/o", "--cardinalities", "5,,6"), "item 2 is empty"
    ),
    # ---- the declared output: an empty --out is the current folder
    Probe(
        "synth-out-empty", ("synth", "--out", "", "--rows", "10", "--test-rows", "10"), "--out: a path cannot be empty"
    ),
    Probe("synth-out-blank-force", ("synth", "--out", " ", "--force", "--rows", "10"), "--out: a path cannot be empty"),
    Probe("transcode-out-empty", (*TR, "--out", ""), "--out: a path cannot be empty"),
    Probe("preprocess-out-empty", (*PP, "--out", ""), "--out: a path cannot be empty"),
    # ---- input files named twice
    Probe(
        "transcode-input-twice",
        ("transcode", "--input", "{ws}/rows.csv", "{ws}/./rows.csv", *TR[3:], "--out", "{ws}/o"),
        "already given as --input",
    ),
    Probe(
        "preprocess-input-twice",
        (*PP[:4], "{ws}/rows.tsv", *PP[4:], "--out", "{ws}/o"),
        "already given as --input",
    ),
    Probe(
        "preprocess-test-file-is-input",
        (*PP, "--out", "{ws}/o", "--test-files", "{ws}/rows.tsv"),
        "--test-files",
    ),
    Probe(
        "preprocess-input-through-link",
        (*PP[:4], "{ws}/link.tsv", *PP[4:], "--out", "{ws}/o"),
        "already given as",
        setup=lambda root: os.symlink(root / "rows.tsv", root / "link.tsv"),
    ),
    # ---- every row bad: the error says why
    Probe(
        "transcode-every-row-bad",
        (*TR, "--out", "{ws}/o"),
        "3 bad rows: wrong_field_count 1, bad_label 2; first: ",
        setup=write_bytes("rows.csv", b"y,a,b,c\n7,1,2,x\n1,2\n-1,1,1,y\n"),
    ),
    Probe(
        "preprocess-every-row-bad",
        (*PP, "--out", "{ws}/o"),
        "rows.tsv:1: wrong_field_count (2 fields, expected 40)",
        setup=write_bytes("rows.tsv", b"1\tx\n" * 5),
    ),
    # ---- a progress bar is for a terminal: captured stderr holds the error line alone
    Probe(
        "preprocess-progress-bar-captured",
        (*PP[:4], "--workers", "1", "--out", "{ws}/o"),
        "no valid rows",
        setup=write_bytes("rows.tsv", b"1\tx\n" * 5),
    ),
    # ---- inputs that are not files
    Probe(
        "transcode-input-is-folder",
        ("transcode", "--input", "{ws}/notes", *TR[3:], "--out", "{ws}/o"),
        "not a regular file",
    ),
    Probe("preprocess-input-is-device", (*PP[:3], "/dev/null", *PP[4:], "--out", "{ws}/o"), "not a regular file"),
    # ---- options that would be silently ignored
    Probe("transcode-columns-with-header", (*TR, "--out", "{ws}/o", "--columns", "q,w,e,r"), "--no-header"),
    # ---- names from the file quoted in the error: escaped, never sent to the terminal as they are
    Probe(
        "transcode-header-escape-sequence",
        (*TR, "--out", "{ws}/o"),
        "(has: y, a\\x00, b, \\x1b[2J\\x1b[31mc\\u202e)",
        setup=write_bytes("rows.csv", "y,a\0,b,\x1b[2J\x1b[31mc\u202e\n1,2,3,x\n".encode()),
    ),
    # ---- a blank first line is no header (its names were none: "no column(s) y, a (has: )")
    Probe(
        "transcode-header-blank",
        (*TR, "--out", "{ws}/o"),
        "rows.csv:1: the header line is blank (line 3 is the first that is not); the column names must be on line 1",
        setup=write_bytes("rows.csv", b"\n\ny,a,b,c\n1,2,3,x\n"),
    ),
    # ---- compressed files of formats not read, named by their first bytes (were "header line is not UTF-8")
    Probe(
        "transcode-input-bzip2",
        ("transcode", "--input", "{ws}/rows.csv.bz2", *TR[3:], "--out", "{ws}/o"),
        "rows.csv.bz2: holds bzip2-compressed data; text input is read plain or gzip-compressed (named .gz)",
        setup=compressed("rows.csv", "rows.csv.bz2", "bzip2"),
    ),
    Probe(
        "transcode-input-zip",
        ("transcode", "--input", "{ws}/rows.zip", *TR[3:], "--out", "{ws}/o"),
        "rows.zip: holds zip-compressed data",
        setup=compressed("rows.csv", "rows.zip", "zip"),
    ),
    Probe(
        "transcode-input-gzip-not-named-gz",
        ("transcode", "--input", "{ws}/packed.csv", *TR[3:], "--out", "{ws}/o"),
        "packed.csv: holds gzip-compressed data; gzip input is read from a file named .gz: rename it",
        setup=compressed("rows.csv", "packed.csv", "gzip"),
    ),
    Probe(
        "preprocess-input-xz",
        (*PP[:3], "{ws}/rows.tsv.xz", *PP[4:], "--out", "{ws}/o"),
        "rows.tsv.xz: holds xz-compressed data",
        setup=compressed("rows.tsv", "rows.tsv.xz", "xz"),
    ),
    Probe(
        "preprocess-input-zstd-named-gz",
        (*PP[:3], "{ws}/rows.tsv.gz", *PP[4:], "--out", "{ws}/o"),
        "rows.tsv.gz: holds zstd-compressed data",
        setup=compressed("rows.tsv", "rows.tsv.gz", "zstd"),
    ),
    # ---- a Parquet schema naming a column twice (was "internal error")
    Probe(
        "transcode-parquet-column-twice",
        ("transcode", "--input", "{ws}/rows.parquet", *TR[3:], "--out", "{ws}/o"),
        "rows.parquet: column 'c' appears twice in the Parquet schema",
        setup=parquet_column_twice,
    ),
    # ---- lines longer than any row: one line naming the byte, memory bounded
    Probe(
        "transcode-line-too-long",
        (*TR, "--out", "{ws}/o"),
        "a line longer than 16 MiB",
        setup=long_line("rows.csv", b"1,"),
    ),
    Probe(
        "preprocess-line-too-long",
        (*PP, "--out", "{ws}/o"),
        "a line longer than 16 MiB",
        setup=long_line("rows.tsv", b"1\t"),
    ),
]


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_hostile_raw_input(ws, probe: Probe):  # noqa: F811 - the imported fixture
    check_probe(ws, probe)


# ---- raw inputs that must be accepted, with what the dataset holds ---------------------------------
def transcoded(rows: int) -> Callable[[Path, CliResult], None]:
    def check(root: Path, r: CliResult) -> None:
        doc = yaml.safe_load((root / "o" / SPEC).read_text())
        assert doc["metadata"]["rows"] == {"train": rows, "test": 0}
        assert doc["metadata"]["preprocess"]["report"]["rows_read"] == rows

    return check


ACCEPTED = [
    Accepted(
        "transcode-bom-header",
        (*TR, "--out", "{ws}/o"),
        transcoded(40),
        setup=lambda root: (root / "rows.csv").write_bytes(b"\xef\xbb\xbf" + (root / "rows.csv").read_bytes()),
    ),
    Accepted(
        "transcode-crlf-bom",
        (*TR, "--out", "{ws}/o"),
        transcoded(40),
        setup=lambda root: (root / "rows.csv").write_bytes(
            b"\xef\xbb\xbf" + (root / "rows.csv").read_bytes().replace(b"\n", b"\r\n")
        ),
    ),
    Accepted(  # Parquet booleans are 0/1 labels; a null label and an infinite number are counted bad rows
        "transcode-parquet-bool-label",
        ("transcode", "--input", "{ws}/rows.parquet", *TR[3:], "--out", "{ws}/o"),
        summarized("rows read 5  written 3  skipped 2 (bad_label 1, bad_number 1)"),
        setup=parquet_rows,
    ),
    Accepted(  # a header whose first name begins as bzip2 data does ("BZh") is text
        "transcode-header-bzh",
        ("transcode", "--input", "{ws}/bzh.csv", *TR[3:], "--out", "{ws}/o"),
        transcoded(40),
        setup=lambda root: (root / "bzh.csv").write_text(
            "".join(
                ("BZh9," if i == 0 else "0,") + line
                for i, line in enumerate((root / "rows.csv").read_text().splitlines(True))
            )
        ),
    ),
    Accepted(  # a file's type from its suffix in any case
        "transcode-upper-case-suffix",
        ("transcode", "--input", "{ws}/ROWS.TSV", *TR[3:], "--out", "{ws}/o"),
        transcoded(40),
        setup=lambda root: (root / "ROWS.TSV").write_text((root / "rows.csv").read_text().replace(",", "\t")),
    ),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_raw_input(ws, case: Accepted):  # noqa: F811 - the imported fixture
    run_accepted(ws, case)


def test_no_probe_repeats_another_table():
    """The three hostile tables (tests/test_hostile_inputs.py, tests/test_hostile_datasets.py and
    this file's) never hold one probe twice."""
    from test_hostile_datasets import PROBES as DATASETS
    from test_hostile_inputs import PROBES as FIRST

    ids = [p.id for table in (FIRST, DATASETS, PROBES) for p in table]
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})


def test_empty_out_leaves_the_current_folder(tmp_path):
    """The probe table runs in the workspace; here the current folder holds only a user's file."""
    (tmp_path / "mine.txt").write_text("keep")
    before = snapshot(tmp_path)
    r = run_cli("synth", "--out", "", "--rows", 10, "--test-rows", 10, cwd=tmp_path)
    assert r.code == 2 and "--out: a path cannot be empty" in r.err, r.err
    assert snapshot(tmp_path) == before and not os.path.exists(str(tmp_path) + ".tmp")
    from contextlib import chdir

    from dlrmkit.data.output_dir import check_replaceable, output_lock
    from dlrmkit.errors import DlrmkitError

    with chdir(tmp_path):  # the library refuses it too (callers that skip the command line)
        for call in (lambda: check_replaceable("", force=True), lambda: output_lock("").__enter__()):
            with pytest.raises(DlrmkitError, match="an empty path"):
                call()
    assert snapshot(tmp_path) == before


def test_split_points_never_read_a_long_line_whole(tmp_path, monkeypatch):
    """Task boundaries are found with a bounded readline: a long line across one is an error."""
    from dlrmkit.data import criteo_tsv
    from dlrmkit.errors import DlrmkitError

    monkeypatch.setattr(criteo_tsv, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "rows.tsv"
    path.write_bytes(b"1\tx\n" * 100 + b"9" * 5000 + b"\n" + b"0\ty\n" * 100)
    with pytest.raises(DlrmkitError, match="byte 500: a line longer than"):
        criteo_tsv.plan_tasks([str(path)], [], task_bytes=500)
    path.write_bytes(b"1\tx\n" * 300)
    tasks = criteo_tsv.plan_tasks([str(path)], [], task_bytes=500)  # short lines are split as before
    assert len(tasks) == 3 and all(t.start % 4 == 0 for t in tasks)


def test_many_tables_stop_before_writing(tmp_path, monkeypatch):
    """More files than the open-file limit allows: one line before anything is written."""
    import resource

    from dlrmkit.data.split_binary import allow_open_files
    from dlrmkit.errors import DatasetError

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    with pytest.raises(DatasetError, match="needs 2,116 open files at once, the limit is 1,024"):
        allow_open_files(2 * 1026, "1,024 tables")
    many = ",".join(["5"] * 600)  # 1,204 files + 64: refused before the teacher model is built
    r = run_cli("synth", "--out", tmp_path / "o", "--cardinalities", many, "--rows", 10, "--test-rows", 10)
    assert r.code == 2 and "600 tables: writing the dataset needs 1,268 open files" in r.err, r.err
    assert os.listdir(tmp_path) == []


def test_a_header_of_100k_columns_is_read_quickly_and_recorded_within_a_featurespecs_bounds(ws):  # noqa: F811
    """A header of 100,000 more columns, one named by 9 MiB: transcode takes seconds (each name was
    counted again: minutes), and the dataset it writes is one dlrmkit reads (the unused columns
    were all recorded in feature_spec.yaml: 18 MiB, which every command then refused)."""
    import time

    extra = ["n" * (9 << 20)] + [f"x{i}" for i in range(100_000 - 1)]
    lines = (ws / "rows.csv").read_text().splitlines()
    fill = "," * len(extra)
    (ws / "rows.csv").write_text("\n".join([",".join([lines[0], *extra]), *(x + fill for x in lines[1:])]) + "\n")
    start = time.monotonic()
    r = run_cli(*[a.replace("{ws}", str(ws)) for a in (*TR, "--out", "{ws}/o")], cwd=ws)
    took = time.monotonic() - start
    assert r.code == 0, r.err
    assert "... (100,000 in all)" in r.out, r.out
    report = yaml.safe_load((ws / "o" / SPEC).read_text())["metadata"]["preprocess"]["report"]
    assert report["unused_columns_count"] == 100_000 and len(report["unused_columns"]) == 1000
    assert report["unused_columns"][:2] == ["n" * 197 + "...", "x0"]
    v = run_cli("validate", "--data", ws / "o")
    assert v.code == 0, v.err
    assert took < 60, took
