"""The run folder `dlrmkit train` writes: a refused --resume leaves it as it was, and run.json's
paths to the folder's own files are relative to it (a moved or copied folder reads its own files)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dlrmkit.data.synthetic import generate
from dlrmkit.errors import DlrmkitError
from dlrmkit.train.run_dir import read_run, stored_path
from helpers import run_cli, tiny_config

RUN_FILES = ("config.yaml", "run.json", "log.jsonl", "metrics.json", "plan.json")


def resume(data, run, *extra):
    return run_cli("train", "--data", data, "--no-progress", "--max-steps", 45, "--eval-every", 10, "--log-every", 5,
                   "--search-budget", 0, "--run-dir", run, "--resume", *extra)  # fmt: skip


def one_line(result, *needles):
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err
    lines = [ln for ln in result.err.splitlines() if ln.strip()]
    assert len(lines) == 1, result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_refused_resume_leaves_the_run_files_byte_identical(tiny_data, tiny_run, tmp_path):
    """Another dataset, or options that make another model: refused, and config.yaml, run.json and
    the log stay byte for byte as they were; an accepted resume then writes its own."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    other = tmp_path / "other"
    generate(str(other), tiny_config(), seed=1, preset="test-tiny")  # same shape, other rows
    before = {name: (run / name).read_bytes() for name in RUN_FILES}
    one_line(resume(other, run), "another dataset")
    assert {name: (run / name).read_bytes() for name in RUN_FILES} == before
    one_line(resume(tiny_data, run, "--embedding-dim", 5), "does not match this run's model")
    assert {name: (run / name).read_bytes() for name in RUN_FILES} == before
    result = resume(tiny_data, run)
    assert result.code == 0, result.err
    assert (run / "config.yaml").read_bytes() != before["config.yaml"]
    assert "max-steps: 45" in (run / "config.yaml").read_text()
    info = json.loads((run / "run.json").read_text())
    assert "--resume" in info["argv"] and info["log_jsonl"] == "log.jsonl" and info["checkpoint_dir"] == "checkpoints"


def test_a_run_refused_before_its_first_step_leaves_no_folder_it_made(tiny_data, tiny_run, tmp_path):
    """A --resume refused into a new --run-dir, or a fresh run whose model cannot be built: the
    folder the command made is gone again; a folder that was there keeps what was in it."""
    one_line(resume(tiny_data, tmp_path / "new", "--checkpoint-dir", tiny_run / "checkpoints", "--embedding-dim", 5),
             "does not match this run's model")  # fmt: skip
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.lock").exists()
    fresh = ("train", "--data", tiny_data, "--no-progress", "--max-steps", 2, "--search-budget", 0,
             "--bottom-mlp", "7,5", "--embedding-dim", 8)  # fmt: skip
    one_line(run_cli(*fresh, "--run-dir", tmp_path / "fresh"))
    assert not (tmp_path / "fresh").exists()
    one_line(run_cli(*fresh, cwd=tmp_path))  # without --run-dir: runs/<time> and runs/, made and removed again
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs").mkdir()  # a runs/ that was there stays
    one_line(run_cli(*fresh, cwd=tmp_path))
    assert os.listdir(tmp_path / "runs") == []
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    one_line(resume(tiny_data, tmp_path / "mine", "--checkpoint-dir", tiny_run / "checkpoints", "--embedding-dim", 5))
    assert sorted(os.listdir(tmp_path / "mine")) == ["notes.txt"]


def test_run_json_keeps_paths_inside_the_run_folder_relative(tmp_path):
    run = str(tmp_path / "R")
    assert stored_path(os.path.join(run, "log.jsonl"), run) == "log.jsonl"
    assert stored_path(os.path.join(run, "ck", "log.jsonl"), run) == os.path.join("ck", "log.jsonl")
    assert stored_path(str(tmp_path / "R2" / "log.jsonl"), run) == str(tmp_path / "R2" / "log.jsonl")
    assert stored_path(None, run) is None


def write_run(folder, **info):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(info))
    (folder / "log.jsonl").write_text("")


def test_read_run_resolves_paths_against_the_folder_given(tmp_path):
    """Relative paths against the folder given; an absolute path outside it kept; one out of the
    folder through '..' refused; older run.json (absolute paths, no format) read from the folder
    given where it holds the same file."""
    moved = tmp_path / "B"
    write_run(moved, format=2, log_jsonl="log.jsonl", checkpoint_dir="checkpoints")
    info = read_run(str(moved))
    assert info["log_jsonl"] == str(moved / "log.jsonl") and info["checkpoint_dir"] == str(moved / "checkpoints")
    outside = tmp_path / "elsewhere" / "log.jsonl"
    write_run(moved, format=2, log_jsonl=str(outside), checkpoint_dir=None)
    assert read_run(str(moved))["log_jsonl"] == str(outside)
    write_run(moved, format=2, log_jsonl="../A/log.jsonl", checkpoint_dir=None)
    with pytest.raises(DlrmkitError, match="out of the run folder"):
        read_run(str(moved))
    # an older run.json: absolute paths into the folder it was written in (runs/A, since moved to B)
    old = tmp_path / "A"
    write_run(moved, log_jsonl=str(old / "log.jsonl"), checkpoint_dir=str(old / "checkpoints"))
    (moved / "checkpoints").mkdir()
    info = read_run(str(moved))
    assert info["log_jsonl"] == str(moved / "log.jsonl") and info["checkpoint_dir"] == str(moved / "checkpoints")
    # ... and its log in the folder's own checkpoint folder (--checkpoint-dir A/ck)
    write_run(moved, log_jsonl=str(old / "ck" / "log.jsonl"), checkpoint_dir=str(old / "ck"))
    (moved / "log.jsonl").unlink()
    (moved / "ck").mkdir()
    (moved / "ck" / "log.jsonl").write_text("")
    assert read_run(str(moved))["log_jsonl"] == str(moved / "ck" / "log.jsonl")
    # an older run.json whose log was outside its folder (--log-jsonl): kept where it is
    write_run(moved, log_jsonl=str(outside), checkpoint_dir=None)
    (moved / "log.jsonl").unlink()
    assert read_run(str(moved))["log_jsonl"] == str(outside)


def test_a_run_dir_holding_a_run_is_refused_naming_the_option_given(tiny_data, tiny_run, tmp_path):
    """The same command again, without --resume: the line names --run-dir, the option given, not
    a --checkpoint-dir the command line never had."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    result = run_cli("train", "--data", tiny_data, "--no-progress", "--max-steps", 5, "--search-budget", 0,
                     "--run-dir", run)  # fmt: skip
    one_line(result, f"--run-dir {run}: {run / 'checkpoints'} already holds checkpoints of another run",
             "pass --resume to continue it, or give a new or empty --run-dir")  # fmt: skip
    assert "--checkpoint-dir" not in result.err


def test_a_run_that_failed_before_logging_anything_else_leaves_its_folder_reusable(tiny_data, tmp_path, monkeypatch):
    """A run stopped at its first step logs only its `failed` record: like an empty log, the folder
    takes a fresh run without --resume (one with other records is another run's, refused)."""
    run = tmp_path / "run"
    common = ("train", "--data", tiny_data, "--preset", "tiny", "--no-progress", "--max-steps", 3, "--run-dir", run)
    monkeypatch.setenv("DLRMKIT_FAULT", "train:nan-loss-1")
    assert run_cli(*common).code == 2
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["failed"] and "loss is nan at step 1" in records[0]["why"], records
    monkeypatch.delenv("DLRMKIT_FAULT")
    result = run_cli(*common)
    assert result.code == 0, result.err
    events = [json.loads(line)["event"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert "failed" not in events and events[-1] == "end", events
    one_line(run_cli(*common), f"--run-dir {run}", "of another run")  # its log and checkpoints
