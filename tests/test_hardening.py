"""What the hostile-input table cannot show in one line: bad rows counted exactly, values kept
from being silently changed, outputs replaced atomically, faults of the disk (full, read-only)
reported as one line with the previous file intact, and strict JSON."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from helpers import run_cli
from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.split_binary import open_dataset


def one_line(result, code=2):
    assert result.code == code, (result.code, result.err)
    lines = result.err.strip("\n").splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    return lines[0]


def transcode(tmp_path, text: bytes, *extra):
    src = tmp_path / "in.csv"
    src.write_bytes(text)
    r = run_cli(
        "transcode",
        "--input",
        src,
        "--out",
        tmp_path / "o",
        "--label",
        "y",
        "--numerical",
        "a",
        "--categorical",
        "c",
        *extra,
    )
    assert r.code == 0, r.err
    spec = FeatureSpec.from_yaml(str(tmp_path / "o"))
    return r, spec.metadata["preprocess"]["report"]


def test_transcode_counts_every_bad_row_exactly(tmp_path):
    rows = [f"{i % 2},{i},k{i % 3}" for i in range(100)]
    for i in range(0, 60, 5):  # 12 bad labels, more than the 5 listed positions
        rows[i] = f"7,{i},k"
    for i in range(61, 70):  # 9 numbers beyond float16 (65504): bad rows there, never +-inf
        rows[i] = f"1,{70000 + i},k"
    rows[70] = "1,-1e400,k"  # overflows even float64
    text = ("y,a,c\n" + "\n".join(rows) + "\n").encode()
    r, rep = transcode(tmp_path, text, "--numerical-dtype", "float16")
    assert rep["rows_skipped"]["bad_label"] == 12 and rep["rows_skipped"]["out_of_range"] == 10
    assert "10 rows were skipped for numbers beyond float16" in r.out and "--log-transform" in r.out
    assert rep["rows_read"] == 100 and rep["rows_written"] == 78
    assert len(rep["first_bad_rows"]) == 5
    _, train, _ = open_dataset(str(tmp_path / "o"))
    assert train.read(0, 1).dense.dtype == np.float16
    assert np.isfinite(train.read(0, len(train)).dense.astype(np.float32)).all()
    # stored as float32 (the default), the 9 are kept exactly; only the float64 overflow is skipped
    r, rep = transcode(tmp_path, text, "--force")
    assert rep["rows_skipped"]["bad_label"] == 12 and rep["rows_skipped"]["out_of_range"] == 1
    assert rep["rows_written"] == 87 and "float16" not in r.out
    _, train, _ = open_dataset(str(tmp_path / "o"))
    dense = train.read(0, len(train)).dense
    assert dense.dtype == np.float32 and sorted(dense[:, 0])[-9:] == [70000.0 + i for i in range(61, 70)]


def test_transcode_trims_whitespace_and_keeps_rows_after_a_stray_quote(tmp_path):
    text = b'y,a,c\n 1 , 2.5 , red \n0,"3,blue\n1,4,green\n0,5,"red"\n1,6,red\n'
    r, rep = transcode(tmp_path, text)
    # the stray quote makes its own row bad (a count), never the rows after it
    assert rep["rows_read"] == 5 and rep["rows_written"] == 4 and sum(rep["rows_skipped"].values()) == 1
    assert rep["rows_skipped"]["bad_number"] == 1
    _, train, _ = open_dataset(str(tmp_path / "o"))
    batch = train.read(0, len(train))
    np.testing.assert_array_equal(batch.dense[:, 0].astype(np.float32), [2.5, 4, 5, 6])
    ids = batch.ids[:, 0]
    assert ids[0] == ids[2] == ids[3]  # " red ", "red" and '"red"' are one category


def test_force_replaces_a_dataset_and_an_empty_folder_is_usable(tmp_path):
    out = tmp_path / "ds"
    assert run_cli("synth", "--out", out, "--rows", 50, "--test-rows", 20).code == 0
    r = run_cli("synth", "--out", out, "--rows", 70, "--test-rows", 20, "--force")
    assert r.code == 0, r.err
    assert FeatureSpec.from_yaml(str(out)).metadata["rows"]["train"] == 70
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # no .tmp, .old or .lock left beside it
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("synth", "--out", empty, "--rows", 30, "--test-rows", 10).code == 0
    assert (empty / "feature_spec.yaml").exists()


def test_strict_json_names_what_is_not_a_number(tmp_path):
    from dlrmkit.train.run_dir import write_metrics_json

    path = tmp_path / "m.json"
    write_metrics_json(str(path), {"auc": float("nan"), "logloss": 0.5, "best_auc": float("inf"), "steps": 3})
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert doc["auc"] is None and doc["best_auc"] is None and doc["nonfinite"] == ["auc", "best_auc"]


def test_metrics_json_of_a_one_class_test_set_is_valid_json(dataset_copy, tmp_path):
    (dataset_copy / "test" / "label.bin").write_bytes(b"\x00" * 1000)  # AUC undefined
    m = tmp_path / "m.json"
    r = run_cli(
        "train",
        "--data",
        dataset_copy,
        "--no-progress",
        "--max-steps",
        2,
        "--metrics-json",
        m,
        "--run-dir",
        tmp_path / "run",
    )
    assert r.code == 0, r.err
    assert "AUC undefined" in r.out and "Warning" not in r.err
    doc = json.loads(m.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert doc["auc"] is None and "auc" in doc["nonfinite"]


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_export_on_a_failing_disk_keeps_the_old_file(tiny_data, tmp_path, monkeypatch, err):
    run = tmp_path / "run"
    r = run_cli("train", "--data", tiny_data, "--no-progress", "--max-steps", 2, "--run-dir", run, "--search-budget", 0)
    assert r.code == 0
    out = tmp_path / "model.pt"
    out.write_bytes(b"the previous model")
    import torch

    def failing_save(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"half")
        raise OSError(err, os.strerror(err), str(f))

    monkeypatch.setattr(torch, "save", failing_save)
    line = one_line(run_cli("export", "--checkpoint", run / "checkpoints", "--out", out))
    assert str(out) in line and os.strerror(err) in line
    assert out.read_bytes() == b"the previous model"
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "run"]  # the temporary file is gone


def test_os_errors_and_bugs_are_one_line(tmp_path, monkeypatch):
    from dlrmkit.commands import synth as synthetic_cli

    def raise_(exc):
        def f(*a, **k):
            raise exc

        return f

    monkeypatch.setattr(synthetic_cli, "generate", raise_(OSError(errno.ENOSPC, "No space left on device", "/x/y.bin")))
    line = one_line(run_cli("synth", "--out", tmp_path / "o", "--rows", 5, "--test-rows", 5))
    assert "/x/y.bin" in line and "No space left on device" in line
    monkeypatch.setattr(synthetic_cli, "generate", raise_(KeyError("surprise")))
    line = one_line(run_cli("synth", "--out", tmp_path / "o", "--rows", 5, "--test-rows", 5), code=1)
    assert "internal error KeyError" in line and "DLRMKIT_DEBUG=1" in line
    monkeypatch.setattr(synthetic_cli, "generate", raise_(KeyboardInterrupt()))
    assert run_cli("synth", "--out", tmp_path / "o", "--rows", 5, "--test-rows", 5).code == 130


def test_predict_output_is_written_whole(tmp_path, tiny_data, monkeypatch):
    """A failure while scoring leaves no partial CSV and the previous output as it was."""
    from dlrmkit.commands import predict

    out = tmp_path / "scores.csv"
    out.write_text("old\n")

    def failing_score(*a, **k):
        yield from ()
        raise OSError(errno.EIO, "Input/output error", "rows.tsv")

    monkeypatch.setattr(predict, "score", failing_score)
    (tmp_path / "rows.tsv").write_text("x\n")
    one_line(run_cli("predict", "--checkpoint", tmp_path, "--input", tmp_path / "rows.tsv", "--output", out))
    assert out.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["rows.tsv", "scores.csv"]


def test_force_where_folders_cannot_be_swapped_never_removes_a_users_out_old(tmp_path, monkeypatch):
    """Without renameat2's exchange the old dataset waits beside `<out>` while the new one is put in
    place: a `<out>.old` already there is the user's, and stays (it was removed, whatever it held),
    and the dataset just written is put in place all the same (it was thrown away at the end)."""
    from dlrmkit.data import output_dir

    out = tmp_path / "ds"
    assert run_cli("synth", "--out", out, "--rows", 50, "--test-rows", 20).code == 0
    monkeypatch.setattr(output_dir, "_exchange", lambda a, b: False)
    (tmp_path / "ds.old").mkdir()
    (tmp_path / "ds.old" / "mine.txt").write_text("the user's own file\n")
    r = run_cli("synth", "--out", out, "--rows", 70, "--test-rows", 20, "--force")
    assert r.code == 0, r.err
    assert (tmp_path / "ds.old" / "mine.txt").read_text() == "the user's own file\n"
    assert FeatureSpec.from_yaml(str(out)).metadata["rows"]["train"] == 70
    assert sorted(os.listdir(tmp_path)) == ["ds", "ds.old"]  # no .tmp, .lock or .old-1 left beside them
    (tmp_path / "ds.old" / "mine.txt").unlink()
    (tmp_path / "ds.old").rmdir()
    r = run_cli("synth", "--out", out, "--rows", 60, "--test-rows", 20, "--force")
    assert r.code == 0, r.err
    assert FeatureSpec.from_yaml(str(out)).metadata["rows"]["train"] == 60
    assert sorted(os.listdir(tmp_path)) == ["ds"]
