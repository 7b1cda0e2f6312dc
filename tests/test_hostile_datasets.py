"""Hostile dataset folders, beyond tests/test_hostile_inputs.py, one table row each, run by the
same check (exit 2, one line naming the file/field/option, nothing on disk changed): FeatureSpec
YAML that expands or nests without bound, file names that are not paths, a file named twice,
metadata of the wrong type, empty mappings, claimed sizes the data does not have, a broken
vocabulary, a FIFO where the spec should be. A second table lists dataset folders that must be
accepted, each with what the result must hold. The rows, input files and --out of the commands
that write datasets are in tests/test_hostile_raw_inputs.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from helpers import run_cli
from hostile_util import Accepted, run_accepted, summarized
from test_hostile_inputs import (  # noqa: F401 - ws and trained_run are fixtures
    SPEC,
    Probe,
    both,
    edit_spec,
    poke,
    set_feature,
    set_file,
    trained_run,
    write_bytes,
    ws,
)
from test_hostile_inputs import test_hostile_input as check_probe

V = ("validate", "--data", "{ws}/data")
T = ("train", "--data", "{ws}/data", "--no-progress", "--max-steps", "2", "--run-dir", "{ws}/newrun")
B = ("baseline", "--data", "{ws}/data", "--out", "{ws}/b.json", "--max-iter", "2")


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


def empty_val(root: Path, rows: bool = False) -> None:
    """A val mapping whose files hold no rows (`rows`: the train mapping's rows)."""
    (root / "data" / "val").mkdir()
    for f in (root / "data" / "train").iterdir():
        (root / "data" / "val" / f.name).write_bytes(f.read_bytes() if rows else b"")

    def add(doc: dict) -> None:
        doc["source_spec"]["val"] = [
            {**c, "files": [f.replace("train/", "val/") for f in c["files"]]} for c in doc["source_spec"]["train"]
        ]

    edit_spec(add)(root)


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
]


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_hostile_dataset(ws, probe: Probe):  # noqa: F811 - the imported fixture
    check_probe(ws, probe)


# ---- dataset folders that must be accepted, with what the result holds -----------------------------
ACCEPTED = [
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
    run_accepted(ws, case)


@pytest.mark.parametrize(
    "edit, phrase",
    [
        (lambda t: t.replace("files:", "filez:"), "files must name one file of this folder"),
        (lambda t: t.replace("- cat_0.arrow", "- ../../rows.csv"), "files must name one file of this folder"),
        (lambda t: t.replace("frequency_threshold: 1", "frequency_threshold: x"), "frequency_threshold must be"),
        (lambda t: t.replace("columns:", "columns: 5"), "not valid YAML"),
        (lambda t: "- a list\n", "expected a mapping"),
        (None, "not a vocabulary table"),
        ("link", "points outside the vocabulary folder"),
        ("zstd", "its body is compressed"),
        ("dictionary", "column 'value' is dictionary"),
    ],
    ids=[
        "no-files",
        "file-outside",
        "threshold-text",
        "not-yaml",
        "a-list",
        "table-garbage",
        "table-linked-outside",
        "table-compressed",
        "table-dictionary-encoded",
    ],
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
    elif edit == "link":  # another folder's table of the same shape (it was read as this dataset's)
        os.rename(tmp_path / "d" / VOCAB_DIR / "cat_0.arrow", tmp_path / "elsewhere.arrow")
        os.symlink(tmp_path / "elsewhere.arrow", tmp_path / "d" / VOCAB_DIR / "cat_0.arrow")
    elif edit in ("zstd", "dictionary"):  # the same values, expanding only once read (a 50 KiB zstd table held 1 GB)
        import pyarrow as pa
        import pyarrow.feather as feather

        table = tmp_path / "d" / VOCAB_DIR / "cat_0.arrow"
        t = feather.read_table(table)
        if edit == "dictionary":
            t = t.set_column(0, "value", t["value"].dictionary_encode())
        feather.write_feather(t, table, compression="zstd" if edit == "zstd" else "uncompressed")
        assert isinstance(feather.read_table(table), pa.Table)  # a table Arrow itself reads
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
    from helpers import run_cli_subprocess

    (dataset_copy / SPEC).unlink()
    os.mkfifo(dataset_copy / SPEC)
    if command == "validate":
        r = run_cli_subprocess("validate", "--data", dataset_copy, timeout=60)
        assert r.code == 2 and "feature_spec.yaml: is not a regular file" in r.err, r.err
    else:
        r = run_cli_subprocess("synth", "--out", dataset_copy, "--force", "--rows", 10, "--test-rows", 10, timeout=60)
        assert r.code == 2 and "not a dlrmkit dataset" in r.err, r.err
    assert sorted(os.listdir(dataset_copy)) == [SPEC, "test", "train"]


HELD_OUT = {  # a bad file, or a bad value in rows a run reads only at its evaluations or its end
    "test-file-truncated": (
        lambda root: os.truncate(root / "data/test/numerical.bin", 7999),
        "test/numerical.bin: size 7999 bytes is not a whole number of rows",
    ),
    "test-id": (poke("data/test/cat_4.bin", np.int8, 500, 127), "test/cat_4.bin: feature 'cat_4.bin' row 500 has id 127"),
    "test-numerical-nan": (
        poke("data/test/numerical.bin", np.float16, (4, 1), np.nan, width=4),
        "test/numerical.bin: row 4 feature 'num_1' is nan",
    ),
    "val-id": (
        both(lambda root: empty_val(root, rows=True), poke("data/val/cat_2.bin", np.int8, 7, -3)),
        "val/cat_2.bin: feature 'cat_2.bin' row 7 has id -3",
    ),
}


@pytest.mark.parametrize("command", ["train", "tune", "baseline"])
@pytest.mark.parametrize("case", list(HELD_OUT))
def test_a_bad_value_in_rows_read_after_training_is_refused_before_it(tmp_path, tiny_data, monkeypatch, command, case):
    """`train` (its recipe search by default), `tune` and `baseline` read the val and test rows only
    at evaluations and at the end: a bad id or numerical value there is one line naming the file
    before any model is built (it was after the search and training, minutes to hours; `tune`
    pruned every trial with it and exited 0), nothing written. Their labels are not read early."""
    import shutil

    from dlrmkit.train import regression
    from dlrmkit.train.trainer import Trainer

    if command == "tune":
        pytest.importorskip("optuna", reason="tune needs optuna (pip install 'dlrmkit[tune]')")
    shutil.copytree(tiny_data, tmp_path / "data")
    setup, phrase = HELD_OUT[case]
    setup(tmp_path)

    def trains(*args, **kwargs):
        raise AssertionError("a model was trained before the rows were checked")

    monkeypatch.setattr(Trainer, "__init__", trains)
    monkeypatch.setattr(regression, "train_on", trains)
    out = tmp_path / "out"
    argv = {
        "train": ("--no-progress", "--run-dir", out),  # --preset auto: a search over candidate recipes first
        "tune": ("--trials", 1, "--max-steps", 2, "--out", out),
        "baseline": ("--out", out),
    }[command]
    r = run_cli(command, "--data", tmp_path / "data", *argv, cwd=tmp_path)
    assert r.code == 2 and r.out == "", (r.code, r.out, r.err)
    (line,) = r.err.strip().splitlines()
    assert phrase in line, line
    assert sorted(os.listdir(tmp_path)) == ["data"]  # no run folder, runs/, study or result


def test_the_early_check_of_the_held_out_rows_reads_no_label(dataset_copy):
    """The check before training reads the test rows' ids and numerical values, never their labels:
    a bad label is still found where the rows are read, once, at the end."""
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.split_binary import SplitBinaryDataset, check_held_out
    from dlrmkit.errors import DatasetError

    poke("test/label.bin", np.bool_, 17, 7)(dataset_copy)
    spec = FeatureSpec.from_yaml(str(dataset_copy))
    check_held_out(spec)
    with pytest.raises(DatasetError, match="test/label.bin: row 17 has label 7"):
        SplitBinaryDataset(spec, "test").read(0, 100)
