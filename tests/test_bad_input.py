"""Bad input through the real command line (a subprocess): exit code 2, exactly one line on
stderr naming the file or feature at fault, and never a traceback."""

import os

import numpy as np
import pytest

from dlrmkit.data.feature_spec import FeatureSpec


def assert_one_line_error(result, *needles):
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err and "Traceback" not in result.out
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    line = lines[0]
    assert line.startswith("dlrmkit ") and ": error: " in line, line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def train_args(data, *extra, steps=20):
    # the tiny preset's batch of 256: 20 steps read every train batch (15 per epoch, the last 10%
    # of the 4,000 rows validate) and evaluate the test mapping once
    return ("train", "--data", data, "--no-progress", "--preset", "tiny", "--max-steps", str(steps), *extra)


def test_cat_file_shorter_than_label_file(dataset_copy, cli_subprocess):
    path = dataset_copy / "train" / "cat_2.bin"  # cardinality 20 -> int8, one byte per row
    path.write_bytes(path.read_bytes()[:3000])
    result = cli_subprocess(*train_args(dataset_copy))
    line = assert_one_line_error(result, os.path.join("train", "cat_2.bin"), "3000", "4000")
    assert line.startswith("dlrmkit train: error:")


def test_spec_naming_missing_file(dataset_copy, cli_subprocess):
    spec = FeatureSpec.from_yaml(str(dataset_copy))
    for chunk in spec.source_spec["test"]:
        if chunk["features"] == ["cat_1.bin"]:
            chunk["files"] = ["test/cat_1_renamed.bin"]
    spec.write(str(dataset_copy))
    result = cli_subprocess(*train_args(dataset_copy))
    assert_one_line_error(result, "test/cat_1_renamed.bin", "does not exist")


@pytest.mark.parametrize(
    "mapping, feature, dtype, row, value, cardinality",
    [
        ("train", "cat_2.bin", np.int8, 2500, 20, 20),  # exactly the cardinality
        ("test", "cat_0.bin", np.int8, 999, 3, 3),  # only read at evaluation
        ("train", "cat_3.bin", np.int8, 7, -1, 50),  # negative
    ],
)
def test_id_out_of_range(dataset_copy, cli_subprocess, mapping, feature, dtype, row, value, cardinality):
    path = dataset_copy / mapping / feature
    ids = np.fromfile(path, dtype=dtype)
    assert dtype == FeatureSpec.from_yaml(str(dataset_copy)).dtype(feature)
    ids[row] = value
    ids.tofile(path)
    result = cli_subprocess(*train_args(dataset_copy))
    assert_one_line_error(
        result, f"{mapping}/{feature}", f"'{feature}'", f"row {row}", f"id {value}", f"[0, {cardinality})"
    )


def test_id_out_of_range_in_evaluate(dataset_copy, cli, cli_subprocess, tmp_path):
    ckpt = tmp_path / "C"
    ok = cli(*train_args(dataset_copy, "--checkpoint-dir", ckpt, steps=3))
    assert ok.code == 0, ok.err
    path = dataset_copy / "test" / "cat_1.bin"
    ids = np.fromfile(path, dtype=np.int8)
    ids[512] = 8
    ids.tofile(path)
    result = cli_subprocess("evaluate", "--data", dataset_copy, "--checkpoint", ckpt)
    assert_one_line_error(result, "test/cat_1.bin", "'cat_1.bin'", "row 512", "[0, 8)")


@pytest.mark.parametrize("command", ["synth", "train"])
def test_unknown_preset(cli_subprocess, tmp_path, tiny_data, command):
    if command == "synth":
        result = cli_subprocess("synth", "--preset", "enormous", "--out", tmp_path / "out")
        assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    else:
        result = cli_subprocess("train", "--data", tiny_data, "--preset", "enormous", "--no-progress")
    assert_one_line_error(result, "'enormous'", "tiny")


def test_missing_dataset_folder(cli_subprocess, tmp_path):
    result = cli_subprocess(*train_args(tmp_path / "nowhere"))
    assert_one_line_error(result, str(tmp_path / "nowhere"))


def test_synth_refuses_existing_output(cli_subprocess, tiny_data):
    result = cli_subprocess("synth", "--out", tiny_data, "--rows", "10", "--test-rows", "10")
    assert_one_line_error(result, str(tiny_data), "already exists")
    assert (tiny_data / "feature_spec.yaml").exists()  # the existing dataset is untouched


def test_id_out_of_range_with_progress_bar(dataset_copy, cli_subprocess):
    path = dataset_copy / "train" / "cat_2.bin"
    ids = np.fromfile(path, dtype=np.int8)
    ids[2500] = 20
    ids.tofile(path)
    result = cli_subprocess("train", "--data", dataset_copy, "--preset", "tiny", "--max-steps", "20")  # progress bar on
    assert result.code == 2
    assert "row 2500" in result.err
    errors = [line for line in result.err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("dlrmkit train: error:"), result.err
