"""`dlrmkit report RUN`: PNG plots with real content and a Markdown summary of a finished run."""

import numpy as np
import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def finished_run(tiny_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("report") / "run"
    result = run_cli("train", "--data", tiny_data, "--max-steps", 40, "--eval-every", 10, "--log-every", 5,
                     "--no-progress", "--run-dir", run)
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
