"""`dlrmkit report RUN`: PNG plots with real content and a Markdown summary of a finished run."""

import numpy as np
import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def finished_run(tiny_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("report") / "run"
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--max-steps",
        40,
        "--eval-every",
        10,
        "--log-every",
        5,
        "--no-progress",
        "--run-dir",
        run,
    )
    assert result.code == 0, result.err
    return run


def test_report_writes_plots_and_summary(finished_run):
    result = run_cli("report", finished_run)
    assert result.code == 0, result.err
    import matplotlib.image as mpimg

    for name in ("train_loss.png", "test_auc.png", "test_logloss.png", "throughput.png"):
        img = mpimg.imread(finished_run / name)
        assert img.shape[0] > 100 and img.shape[1] > 100, name
        assert np.std(img[..., :3]) > 0.01, f"{name} is blank"
    text = (finished_run / "report.md").read_text()
    assert "status: finished" in text and "test AUC" in text
    assert text.count("\n| 40 |") == 1  # the last evaluation, once
    assert "![test_auc](test_auc.png)" in text


def test_report_on_a_non_run_folder_is_a_one_line_error(tmp_path):
    result = run_cli("report", tmp_path)
    assert result.code == 2 and "not a run folder" in result.err


def read_scalars(logdir):
    """tag -> [(step, value)] of the TensorBoard event files in logdir."""
    ea = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="reading TensorBoard events needs tensorboard (pip install 'dlrmkit[report]')",
    )
    acc = ea.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_report_tensorboard_events_hold_the_log(finished_run, tmp_path):
    pytest.importorskip("tensorboard", reason="--tensorboard needs tensorboard (pip install 'dlrmkit[report]')")
    result = run_cli("report", finished_run, "--out", tmp_path / "out", "--tensorboard", tmp_path / "tb")
    assert result.code == 0, result.err
    scalars = read_scalars(tmp_path / "tb")
    assert {"train/loss", "eval/auc", "eval/logloss"} <= set(scalars)
    assert [s for s, _ in scalars["eval/auc"]] == [10, 20, 30, 40]
    import json

    evals = [
        r for r in map(json.loads, (finished_run / "log.jsonl").read_text().splitlines()) if r.get("event") == "eval"
    ]
    np.testing.assert_allclose([v for _, v in scalars["eval/auc"]], [r["auc"] for r in evals], rtol=1e-6)


def test_train_tensorboard_writes_events(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="--tensorboard needs tensorboard (pip install 'dlrmkit[report]')")
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--max-steps",
        10,
        "--eval-every",
        5,
        "--log-every",
        5,
        "--no-progress",
        "--run-dir",
        tmp_path / "R",
        "--tensorboard",
        tmp_path / "tb",
    )
    assert result.code == 0, result.err
    scalars = read_scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["eval/auc"]] == [5, 10]
    assert "train/loss" in scalars
    assert "tensorboard" not in (tmp_path / "R" / "config.yaml").read_text()  # an output path, not a recipe option
