"""`dlrmkit validate`, and NVIDIA DLRM's own FeatureSpec layout (written by hand, as their
preprocessing writes it) loading, validating and training unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers import run_cli

CARDS = [3, 200, 40000]  # int8, int16, int32 under NVIDIA's "cardinality < dtype max" rule
DTYPES = ["int8", "int16", "int32"]

NVIDIA_SPEC = """channel_spec:
  categorical:
  - cat_0.bin
  - cat_1.bin
  - cat_2.bin
  label:
  - label
  numerical:
  - num_0
  - num_1
feature_spec:
  cat_0.bin:
    cardinality: 3
    dtype: int8
  cat_1.bin:
    cardinality: 200
    dtype: int16
  cat_2.bin:
    cardinality: 40000
    dtype: int32
  label:
    dtype: bool
  num_0:
    dtype: float16
  num_1:
    dtype: float16
metadata: {}
source_spec:
"""


def nvidia_dataset(root: Path, rows: dict[str, int]) -> Path:
    """Their layout: <mapping>/numerical.bin (float16 row-major), label.bin (bool), cat_i.bin."""
    rng = np.random.default_rng(0)
    text = NVIDIA_SPEC
    for mapping in ("test", "train"):  # their yaml lists mappings alphabetically
        text += f"  {mapping}:\n"
        text += f"  - features:\n    - num_0\n    - num_1\n    files:\n    - {mapping}/numerical.bin\n    type: split_binary\n"
        text += f"  - features:\n    - label\n    files:\n    - {mapping}/label.bin\n    type: split_binary\n"
        for i in range(3):
            text += (
                f"  - features:\n    - cat_{i}.bin\n    files:\n    - {mapping}/cat_{i}.bin\n    type: split_binary\n"
            )
        (root / mapping).mkdir(parents=True)
        n = rows[mapping]
        ids = [rng.integers(0, c, n).astype(d) for c, d in zip(CARDS, DTYPES)]
        dense = rng.normal(size=(n, 2)).astype(np.float16)
        logit = dense[:, 0].astype(np.float32) + (ids[1] % 2) * 1.5 - 0.7
        label = rng.random(n) < 1 / (1 + np.exp(-logit))
        dense.tofile(root / mapping / "numerical.bin")
        label.astype(np.bool_).tofile(root / mapping / "label.bin")
        for i, a in enumerate(ids):
            a.tofile(root / mapping / f"cat_{i}.bin")
    (root / "feature_spec.yaml").write_text(text)
    return root


def test_nvidia_layout_validates_and_trains(tmp_path):
    d = nvidia_dataset(tmp_path / "nv", {"train": 4096, "test": 1024})
    v = run_cli("validate", "--data", d)
    assert v.code == 0, v.err
    assert "train: 4,096 rows" in v.out and "40,000" in v.out
    t = run_cli("train", "--data", d, "--preset", "tiny", "--epochs", "1", "--no-progress")
    assert t.code == 0, t.err
    assert "test AUC" in t.out


def test_validate_reports_bad_label_and_id(tmp_path):
    d = nvidia_dataset(tmp_path / "nv", {"train": 300, "test": 100})
    lab = d / "train" / "label.bin"
    b = bytearray(lab.read_bytes())
    b[17] = 2
    lab.write_bytes(bytes(b))
    r = run_cli("validate", "--data", d)
    assert r.code == 2 and "row 17" in r.err and len(r.err.strip().splitlines()) == 1
    d2 = nvidia_dataset(tmp_path / "nv2", {"train": 300, "test": 100})
    ids = np.fromfile(d2 / "test" / "cat_1.bin", dtype=np.int16)
    ids[5] = 200
    ids.tofile(d2 / "test" / "cat_1.bin")
    r = run_cli("validate", "--data", d2)
    assert r.code == 2 and "cat_1.bin" in r.err and "row 5" in r.err
    (d2 / "train" / "cat_2.bin").write_bytes(b"\x00" * 7)
    r = run_cli("validate", "--data", d2)
    assert r.code == 2 and "cat_2.bin" in r.err


def test_validate_names_each_table_by_the_column_transcode_made_it_from(tmp_path):
    """A transcoded dataset's tables are files cat_0.bin, cat_1.bin, ...: validate says which
    column each came from (the spec's metadata); a spec without that list prints none."""
    rows = ["y,price,city,device"] + [f"{i % 2},{i},c{i % 7},d{i % 3}" for i in range(60)]
    (tmp_path / "x.csv").write_text("\n".join(rows) + "\n")
    r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
                "--numerical", "price", "--categorical", "city,device")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("validate", "--data", tmp_path / "d")
    assert r.code == 0, r.err
    lines = [ln.split() for ln in r.out.splitlines() if ln.strip().startswith("cat_")]
    assert [(ln[0], ln[1], ln[-1]) for ln in lines] == [("cat_0.bin", "8", "city)"), ("cat_1.bin", "4", "device)")]  # id 0: rare or unseen
    nvidia = nvidia_dataset(tmp_path / "n", {"train": 256, "test": 64})
    r = run_cli("validate", "--data", nvidia)
    assert r.code == 0 and "(column" not in r.out, r.out


def test_validate_gives_each_tables_share_of_test_ids_new_to_training_and_names_a_time_stamp(tmp_path):
    """A column whose test values no training row holds (a time stamp, a row id) reads as id 0 on
    every test row: validate gives each table that share, and a note names the column (transcode's
    too)."""
    rows = ["y,ts,city"] + [f"{i % 2},{14102100 + i // 10},c{i % 7}" for i in range(400)]
    (tmp_path / "x.csv").write_text("\n".join(rows) + "\n")
    r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
                "--categorical", "ts,city", "--test-rows", "100")  # fmt: skip
    assert r.code == 0, r.err
    notes = [ln for ln in r.out.splitlines() if ln.startswith("note:")]  # transcode says so too
    assert len(notes) == 1 and "column ts: 100% of the test rows' ids are new" in notes[0], r.out
    r = run_cli("validate", "--data", tmp_path / "d")
    assert r.code == 0, r.err
    shares = {ln.split()[-1]: float(ln.split()[-3]) for ln in r.out.splitlines() if ln.strip().startswith("cat_")}
    assert shares == {"ts)": 1.0, "city)": 0.0}, r.out
    notes = [ln for ln in r.out.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "(column ts): 100% of the test rows' ids are new" in notes[0], r.out


def test_ids_new_to_training_are_counted_alike_from_a_mask_or_sorted_ids():
    from dlrmkit.commands.validate import SeenIds

    ids = np.array([0, 1, 2, 5, 10, 9, 9])
    mask = np.zeros(11, bool)
    mask[[0, 1, 5, 9]] = True
    assert SeenIds(mask, None).new(ids) == 3  # 0 (the unknown value), 2, 10
    assert SeenIds(None, np.array([0, 1, 5, 9])).new(ids) == 3
    assert SeenIds(None, np.zeros(0, np.int64)).new(ids) == 7


def test_id_0_is_new_only_where_it_is_a_vocabularys_unknown_value(tmp_path):
    """In a dataset transcode or preprocess did not make (NVIDIA's, synth's), id 0 is an id like any
    other: test rows all of id 0, which the training rows hold, are not new, and get no note."""
    d = nvidia_dataset(tmp_path / "nv", {"train": 300, "test": 100})
    np.zeros(100, np.int8).tofile(d / "test" / "cat_0.bin")
    r = run_cli("validate", "--data", d)
    assert r.code == 0, r.err
    shares = {ln.split()[0]: float(ln.split()[-1]) for ln in r.out.splitlines() if ln.strip().startswith("cat_")}
    assert shares["cat_0.bin"] == 0.0 and "note: cat_0.bin" not in r.out, r.out
    assert "(test ids new: the test rows' lookups of an id no training row holds)" in r.out, r.out
