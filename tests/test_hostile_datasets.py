"""Hostile datasets and data inputs beyond tests/test_hostile_inputs.py, one table row each, run by
the same check (exit 2, one line naming the file/field/option, nothing on disk changed): FeatureSpec
YAML that expands or nests without bound, file names that are not paths, a file named twice,
metadata of the wrong type, an empty --out (the current folder), input files named twice, lines
longer than any row. A second table lists inputs that must be accepted, each with what the result
must hold, so a fix never turns good data into an error (or garbage into a dataset)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml

from conftest import CliResult, run_cli
from test_hostile_inputs import (  # noqa: F401 - ws and trained_run are fixtures
    SPEC,
    Probe,
    both,
    edit_spec,
    set_feature,
    set_file,
    snapshot,
    trained_run,
    write_bytes,
    ws,
)
from test_hostile_inputs import test_hostile_input as check_probe

V = ("validate", "--data", "{ws}/data")
T = ("train", "--data", "{ws}/data", "--no-progress", "--max-steps", "2", "--run-dir", "{ws}/newrun")
B = ("baseline", "--data", "{ws}/data", "--out", "{ws}/b.json", "--max-iter", "2")
TR = ("transcode", "--input", "{ws}/rows.csv", "--label", "y", "--numerical", "a,b", "--categorical", "c")
PP = ("preprocess", "criteo", "--input", "{ws}/rows.tsv", "--no-progress", "--workers", "1")
LONG = 17 << 20  # beyond the 16 MiB a line may hold


def spec_text(fn: Callable[[str], str]) -> Callable[[Path], None]:
    """Rewrite the spec's text (YAML that yaml.safe_dump would never write)."""

    def setup(root: Path) -> None:
        path = root / "data" / SPEC
        path.write_text(fn(path.read_text()))

    return setup


def alias_bomb(text: str) -> str:
    """Nine levels of nine aliases each: 400 bytes that stand for 387 million strings."""
    levels = ['b0: &b0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"b{i}: &b{i} [" + ",".join([f"*b{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return text.replace("metadata:", "\n".join(levels) + "\nmetadata:\n  bomb: *b8", 1)


def wide_ids(feature: str, cardinality: int) -> Callable[[Path], None]:
    """`feature` declared with `cardinality` as int64, its files rewritten as int64 (consistent)."""

    def setup(root: Path) -> None:
        edit_spec(set_feature(feature, cardinality=cardinality, dtype="int64"))(root)
        for mapping in ("train", "test"):
            path = root / "data" / mapping / feature
            np.fromfile(path, np.int8).astype(np.int64).tofile(path)

    return setup


def empty_mapping(mapping: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        for f in (root / "data" / mapping).iterdir():
            f.write_bytes(b"")

    return setup


def empty_val(root: Path) -> None:
    """A val mapping whose files hold no rows."""
    (root / "data" / "val").mkdir()
    for f in (root / "data" / "train").iterdir():
        (root / "data" / "val" / f.name).write_bytes(b"")

    def add(doc: dict) -> None:
        doc["source_spec"]["val"] = [
            {**c, "files": [f.replace("train/", "val/") for f in c["files"]]} for c in doc["source_spec"]["train"]
        ]

    edit_spec(add)(root)


def parquet_rows(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    labels = pa.array([True, False, None, True, False])
    numbers = [1.5, None, 2.0, float("inf"), 3.0]
    table = pa.table({"y": labels, "a": numbers, "b": numbers, "c": ["x", None, "z", "w", "x"]})
    pq.write_table(table, root / "rows.parquet")


def long_line(rel: str, prefix: bytes) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        with open(root / rel, "ab") as f:
            f.write(prefix + b"7" * LONG + b"\n")

    return setup


def no_features(doc: dict) -> None:
    doc["channel_spec"].update(categorical=[], numerical=[])
    for mapping in ("train", "test"):
        doc["source_spec"][mapping] = [c for c in doc["source_spec"][mapping] if c["features"] == ["label"]]


PROBES = [
    # ---- FeatureSpec YAML: bounded reading
    Probe("spec-alias-bomb", V, "aliases", setup=spec_text(alias_bomb)),
    Probe("spec-alias-bomb-train", T, "aliases", setup=spec_text(alias_bomb)),
    Probe("spec-self-alias", V, "nested", setup=spec_text(lambda t: t + "loop: &l [*l]\n")),
    Probe("spec-deep-nesting", V, "nested", setup=write_bytes("data/" + SPEC, b"a: " + b"[" * 5000)),
    Probe(
        "spec-duplicate-key",
        V,
        "key 'cardinality' given twice",
        setup=spec_text(lambda t: t.replace("cardinality: 3\n", "cardinality: 3\n    cardinality: 2\n", 1)),
    ),
    Probe(
        "spec-integer-of-5000-digits",
        V,
        "Exceeds the limit",
        setup=spec_text(lambda t: t.replace("cardinality: 3\n", "cardinality: " + "9" * 5000 + "\n", 1)),
    ),
    Probe("spec-syntax-error-line", V, "at line 3", setup=write_bytes("data/" + SPEC, b"a: 1\nb: 2\nc: d: e\n")),
    # ---- file names that are not paths, files named twice
    Probe("spec-nul-in-file-name", V, "control character", setup=edit_spec(set_file("train", "label", ["tr\0in"]))),
    Probe("spec-newline-in-file-name", V, "control character", setup=edit_spec(set_file("test", "label", ["a\nb"]))),
    Probe(
        "spec-file-twice-in-chunk",
        V,
        "also the file of mapping 'train' feature 'label'",
        setup=edit_spec(set_file("train", "label", ["train/label.bin", "train/label.bin"])),
    ),
    Probe(
        "spec-two-features-one-file",
        V,
        "also the file of mapping 'train' feature 'cat_0.bin'",
        setup=edit_spec(set_file("train", "cat_1.bin", ["train/cat_0.bin"])),
    ),
    Probe(
        "spec-test-files-are-train-files",
        T,
        "also the file of mapping 'train'",
        setup=edit_spec(lambda d: d["source_spec"].update(test=d["source_spec"]["train"])),
    ),
    Probe(
        "spec-same-file-other-spelling",
        V,
        "also the file of",
        setup=edit_spec(set_file("test", "cat_2.bin", ["train/../train/cat_2.bin"])),
    ),
    Probe(
        "spec-test-file-hard-link",
        V,
        "also the file of mapping 'train' feature 'label'",
        setup=lambda root: (
            (root / "data/test/label.bin").unlink(),
            os.link(root / "data/train/label.bin", root / "data/test/label.bin"),
        ),
    ),
    # ---- channels and metadata the commands read
    Probe("spec-no-features", T, "at least one", setup=edit_spec(no_features)),
    Probe(
        "spec-optimal-auc-text",
        T,
        "metadata.optimal_auc",
        setup=edit_spec(lambda d: d["metadata"].update(optimal_auc="high")),
    ),
    Probe(
        "spec-optimal-auc-above-1",
        V,
        "metadata.optimal_auc",
        setup=edit_spec(lambda d: d["metadata"].update(optimal_auc=7)),
    ),
    Probe("spec-rows-a-list", V, "metadata.rows", setup=edit_spec(lambda d: d["metadata"].update(rows=[1, 2]))),
    Probe(
        "validate-rows-metadata-lies",
        V,
        "metadata.rows.train is 5",
        setup=edit_spec(lambda d: d["metadata"].update(rows={"train": 5, "test": 1000})),
    ),
    Probe(
        "validate-label-int8-negative",
        V,
        "test/label.bin: row 17 has label -1, not 0 or 1",
        setup=both(
            edit_spec(set_feature("label", dtype="int8")),
            write_bytes("data/test/label.bin", b"\0" * 17 + b"\xff" + b"\1" * 982),
        ),
    ),
    Probe("validate-empty-train", V, "the train mapping has no rows", setup=empty_mapping("train")),
    Probe(
        "evaluate-empty-test-mapping",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", "{ws}/run/checkpoints"),
        "the test mapping has no rows; nothing to evaluate",
        setup=empty_mapping("test"),
    ),
    Probe("train-empty-val-mapping", T, "the val mapping has no rows", setup=empty_val),
    Probe("baseline-empty-val-mapping", B, "the val mapping has no rows", setup=empty_val),
    # ---- memory follows the data, never a claimed size
    Probe("baseline-huge-cardinality", B, "of memory", setup=wide_ids("cat_4.bin", 2**40)),
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
def test_hostile_dataset(ws, probe: Probe):  # noqa: F811 - the imported fixture
    check_probe(ws, probe)


# ---- inputs that must be accepted, with what the result holds --------------------------------------
@dataclass
class Accepted:
    id: str
    argv: tuple
    check: Callable[[Path, CliResult], None]
    setup: Callable[[Path], None] | None = None


def transcoded(rows: int) -> Callable[[Path, CliResult], None]:
    def check(root: Path, r: CliResult) -> None:
        doc = yaml.safe_load((root / "o" / SPEC).read_text())
        assert doc["metadata"]["rows"] == {"train": rows, "test": 0}
        assert doc["metadata"]["preprocess"]["report"]["rows_read"] == rows

    return check


def summarized(phrase: str) -> Callable[[Path, CliResult], None]:
    def check(root: Path, r: CliResult) -> None:
        assert phrase in r.out, r.out

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
    Accepted(  # a file's type from its suffix in any case
        "transcode-upper-case-suffix",
        ("transcode", "--input", "{ws}/ROWS.TSV", *TR[3:], "--out", "{ws}/o"),
        transcoded(40),
        setup=lambda root: (root / "ROWS.TSV").write_text((root / "rows.csv").read_text().replace(",", "\t")),
    ),
    # 2**40 ids claimed, 5,000 rows: the summary counts the ids seen, never 8 TiB of zeros
    Accepted("validate-huge-cardinality", V, summarized("1,099,511,627,776"), setup=wide_ids("cat_4.bin", 2**40)),
    Accepted(  # synth writes NaN when the test mapping has one class: undefined, not invalid
        "validate-undefined-optimal-auc",
        V,
        summarized(": OK"),
        setup=edit_spec(lambda d: d["metadata"].update(optimal_auc=float("nan"))),
    ),
    Accepted(
        "validate-empty-test",
        V,
        summarized("test: 0 rows"),
        setup=both(empty_mapping("test"), edit_spec(lambda d: d["metadata"]["rows"].update(test=0))),
    ),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_input(ws, case: Accepted):  # noqa: F811 - the imported fixture
    if case.setup:
        case.setup(ws)
    r = run_cli(*[a.replace("{ws}", str(ws)) for a in case.argv], cwd=ws)
    assert r.code == 0, r.err
    case.check(ws, r)


def test_no_probe_repeats_the_first_table():
    from test_hostile_inputs import PROBES as FIRST

    assert not {p.id for p in PROBES} & {p.id for p in FIRST}
    assert len({p.id for p in PROBES}) == len(PROBES)


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


@pytest.mark.parametrize(
    "edit, phrase",
    [
        (lambda t: t.replace("files:", "filez:"), "files must name one file of this folder"),
        (lambda t: t.replace("- cat_0.arrow", "- ../../rows.csv"), "files must name one file of this folder"),
        (lambda t: t.replace("frequency_threshold: 1", "frequency_threshold: x"), "frequency_threshold must be"),
        (lambda t: t.replace("columns:", "columns: 5"), "not valid YAML"),
        (lambda t: "- a list\n", "expected a mapping"),
        (None, "not a vocabulary table"),
    ],
    ids=["no-files", "file-outside", "threshold-text", "not-yaml", "a-list", "table-garbage"],
)
def test_vocabulary_of_a_dataset_is_checked(tmp_path, edit, phrase):
    """`predict --data D` reads D's vocabulary: a broken one is one DatasetError naming the file."""
    from dlrmkit.data.encoder import VOCAB_DIR, VOCAB_FILE, Vocabulary
    from dlrmkit.errors import DatasetError

    (tmp_path / "rows.csv").write_text("y,a,c\n" + "".join(f"{i % 2},{i},k{i % 3}\n" for i in range(20)))
    r = run_cli(
        "transcode",
        "--input",
        tmp_path / "rows.csv",
        "--label",
        "y",
        "--numerical",
        "a",
        "--categorical",
        "c",
        "--out",
        tmp_path / "d",
    )
    assert r.code == 0, r.err
    assert Vocabulary.load(str(tmp_path / "d")).cardinalities == [4]
    doc = tmp_path / "d" / VOCAB_DIR / VOCAB_FILE
    if edit is None:
        (tmp_path / "d" / VOCAB_DIR / "cat_0.arrow").write_bytes(b"garbage")
    else:
        doc.write_text(edit(doc.read_text()))
    with pytest.raises(DatasetError, match=phrase):
        Vocabulary.load(str(tmp_path / "d"))


def test_own_features_loader_checks_every_row_of_its_tables(dataset_copy):
    """Under --loader own-features a rank reads its tables' ids for the whole batch, beyond its
    own slice: an id out of range there is the same one line on that rank, not an index error."""
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.errors import DatasetError
    from dlrmkit.parallel.loader import DistBatchLoader

    ids = np.fromfile(dataset_copy / "train" / "cat_4.bin", np.int8)
    ids[200] = 125  # cardinality 120; row 200 is in rank 1's half of the first batch of 250
    ids.tofile(dataset_copy / "train" / "cat_4.bin")
    _, train, _ = open_dataset(str(dataset_copy))
    loader = DistBatchLoader(train, 250, rank=0, world_size=2, id_tables=[4], strategy="own-features")
    with pytest.raises(
        DatasetError, match=r"train/cat_4.bin: feature 'cat_4.bin' row 200 has id 125, outside \[0, 120\)"
    ):
        loader.read_global(0, 250)
    loader.read_global(250, 500)  # a batch without the bad id reads as before


@pytest.mark.parametrize("command", ["validate", "synth-force"])
def test_a_fifo_named_like_a_spec_is_never_read(dataset_copy, tmp_path, command):
    """A FIFO blocks its reader until someone writes: refused as not a regular file, without
    opening it (a subprocess with a timeout, so a regression fails instead of hanging)."""
    from conftest import run_cli_subprocess

    (dataset_copy / SPEC).unlink()
    os.mkfifo(dataset_copy / SPEC)
    if command == "validate":
        r = run_cli_subprocess("validate", "--data", dataset_copy, timeout=60)
        assert r.code == 2 and "feature_spec.yaml: is not a regular file" in r.err, r.err
    else:
        r = run_cli_subprocess("synth", "--out", dataset_copy, "--force", "--rows", 10, "--test-rows", 10, timeout=60)
        assert r.code == 2 and "not a dlrmkit dataset" in r.err, r.err
    assert sorted(os.listdir(dataset_copy)) == [SPEC, "test", "train"]
