"""Writers that never lose or mix data: --resume without `latest` continues the newest verified
checkpoint (never starts fresh over another run's, never prunes what this run did not write), one
writer per output folder (`<out>.lock`, a dead holder's taken over), no write through a link planted
in an output folder, a save stopped by SIGTERM/SIGINT (fault points and real signals) leaves no
temporary folder, and DLRMKIT_FAULT's grammar is parsed strictly."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_cli, scratch_cwd
from dlrmkit.checkpoint import save_load as ckpt
from test_checkpoint_trust import assert_one_line_error


def train(data, *extra, steps=3):
    return run_cli("train", "--data", data, "--no-progress", "--max-steps", steps, "--search-budget", 0, *extra)


@pytest.fixture(scope="module")
def run_c(tiny_data, tmp_path_factory) -> Path:
    """A checkpoint folder with step_2 and step_4 (--checkpoint-every 2, --keep 5)."""
    c = tmp_path_factory.mktemp("writers") / "C"
    r = train(tiny_data, "--checkpoint-dir", c, "--checkpoint-every", 2, "--keep", 5, steps=4)
    assert r.code == 0, r.err
    return c


@pytest.fixture
def c(run_c, tmp_path) -> Path:
    dst = tmp_path / "C"
    shutil.copytree(run_c, dst)
    return dst


# ---- resume never deletes ------------------------------------------------------------------------------
def test_resume_without_latest_continues_the_newest_complete_step(tiny_data, c):
    os.remove(c / "latest")  # killed after step_4 was renamed into place, before `latest` named it
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", "--keep", 1, steps=6)
    assert r.code == 0, r.err
    assert f"resumed from {c}/step_4 (step 4, epoch 0; no 'latest'" in r.err
    assert (c / "latest").read_text() == "step_6"
    assert sorted(n for n in os.listdir(c) if n.startswith("step_")) == ["step_6"]  # its own run's steps pruned


def test_resume_without_latest_skips_a_step_that_does_not_verify(tiny_data, c):
    os.remove(c / "latest")
    with open(c / "step_4" / "data_0.bin", "r+b") as f:
        f.write(b"\xff\xff")
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert r.code == 0, r.err
    assert f"resumed from {c}/step_2 (step 2" in r.err


def test_resume_without_latest_and_nothing_verifying_is_refused(tiny_data, c):
    os.remove(c / "latest")
    for s in ("step_2", "step_4"):
        (c / s / "manifest.json").write_text("{}")
    before = sorted(os.listdir(c))
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert_one_line_error(r, "--resume", "step_4, step_2", "none of them verifies")
    assert sorted(os.listdir(c)) == before


def test_pruning_never_removes_another_runs_step(tiny_data, c, tmp_path):
    foreign = tmp_path / "other"
    assert train(tiny_data, "--checkpoint-dir", foreign, steps=1).code == 0
    shutil.copytree(foreign / "step_1", c / "step_1")  # another run's checkpoint in this folder
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", "--keep", 1, steps=6)
    assert r.code == 0, r.err
    assert sorted(n for n in os.listdir(c) if n.startswith("step_")) == ["step_1", "step_6"]


def test_a_save_never_replaces_another_runs_step(tiny_data, c, tmp_path):
    foreign = tmp_path / "other"
    assert train(tiny_data, "--checkpoint-dir", foreign, steps=5).code == 0
    shutil.copytree(foreign / "step_5", c / "step_5")
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert_one_line_error(r, "step_5", "not this run's checkpoint")
    assert ckpt.read_manifest(str(c / "step_5"))["run_id"] == ckpt.read_manifest(str(foreign / "step_5"))["run_id"]
    assert not [n for n in os.listdir(c) if n.startswith(".tmp-")]


# ---- one writer per folder -------------------------------------------------------------------------------
def hold(lock: Path):
    """Hold `lock` as a live dlrmkit process would (flock on an open file)."""
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"pid {os.getpid()} boot x\n".encode())
    return fd


def writers(tiny_data, c, tmp_path):
    csv = tmp_path / "rows.csv"
    return {
        "train-checkpoint-dir": (
            ["train", "--data", tiny_data, "--no-progress", "--checkpoint-dir", c, "--resume", "--max-steps", 5,
             "--search-budget", 0],  # fmt: skip
            c,
        ),
        "train-run-dir": (
            ["train", "--data", tiny_data, "--no-progress", "--run-dir", tmp_path / "run", "--max-steps", 1],
            tmp_path / "run",
        ),
        "evaluate": (
            ["evaluate", "--data", tiny_data, "--checkpoint", c, "--metrics-json", tmp_path / "m.json"],
            tmp_path / "m.json",
        ),
        "export": (["export", "--checkpoint", c, "--out", tmp_path / "model.pt"], tmp_path / "model.pt"),
        "predict": (["predict", "--checkpoint", c, "--input", csv, "--output", tmp_path / "p.csv"], tmp_path / "p.csv"),
        "report": (["report", str(tmp_path / "run"), "--out", tmp_path / "rep"], tmp_path / "rep"),
        "tune": (["tune", "--data", tiny_data, "--out", tmp_path / "t", "--trials", 1], tmp_path / "t"),
    }


@pytest.mark.parametrize(
    "which", ["train-checkpoint-dir", "train-run-dir", "evaluate", "export", "predict", "report", "tune"]
)
def test_a_second_writer_of_an_output_stops_before_any_work(tiny_data, c, tmp_path, which):
    argv, out = writers(tiny_data, c, tmp_path)[which]
    (tmp_path / "rows.csv").write_text("x\n")
    fd = hold(Path(str(out) + ".lock"))
    try:
        t0 = time.monotonic()
        r = run_cli(*argv)
    finally:
        os.close(fd)
    assert r.code == 2 and "Traceback" not in r.err, r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "another dlrmkit process" in lines[0] and f"pid {os.getpid()}" in lines[0], r.err
    assert time.monotonic() - t0 < 30


def test_a_link_to_an_output_folder_takes_the_folders_own_lock(tiny_data, c, tmp_path):
    """Two names of one checkpoint folder (a symbolic link to it) are one output: a run writing
    through the link stops while another holds the folder."""
    os.symlink(c, tmp_path / "alias")
    fd = hold(Path(str(c) + ".lock"))
    try:
        r = train(tiny_data, "--checkpoint-dir", tmp_path / "alias", "--checkpoint-every", 1, "--resume", steps=6)
    finally:
        os.close(fd)
    assert r.code == 2 and "another dlrmkit process" in r.err and f"pid {os.getpid()}" in r.err, r.err
    assert not (tmp_path / "alias.lock").exists() and not (c / "step_5").exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tiny_data, c, tmp_path):
    (tmp_path / "m.json.lock").write_text("pid 999999999 boot 00000000-dead\n")  # no one holds it
    r = run_cli("evaluate", "--data", tiny_data, "--checkpoint", c, "--metrics-json", tmp_path / "m.json")
    assert r.code == 0, r.err
    assert "took over the lock" in r.err and "999999999" in r.err
    assert json.loads((tmp_path / "m.json").read_text())["rows"] > 0
    assert not (tmp_path / "m.json.lock").exists()


# ---- no write through a link -----------------------------------------------------------------------------
def test_a_log_link_in_the_checkpoint_folder_is_never_appended_through(tiny_data, c, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone's file\n")
    os.remove(c / "log.jsonl")
    os.symlink(target, c / "log.jsonl")
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert_one_line_error(r, "log.jsonl", "symbolic link")
    assert target.read_text() == "someone's file\n"


def test_a_link_planted_as_the_latest_pointers_temporary_is_not_written_through(tiny_data, c, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone's file\n")
    os.symlink(target, c / ".latest.tmp")
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert r.code == 0, r.err
    assert target.read_text() == "someone's file\n" and (c / "latest").read_text() == "step_5"


# ---- nothing left behind ---------------------------------------------------------------------------------
def subprocess_train(data, c, env_extra, steps=6, **kw):
    args = [
        sys.executable,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        str(data),
        "--no-progress",
        "--checkpoint-dir",
        str(c),
        "--checkpoint-every",
        "1",
        "--max-steps",
        str(steps),
        "--keep",
        "2",
        "--search-budget",
        "0",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.Popen(
        args, cwd=scratch_cwd(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


@pytest.mark.parametrize("point", ["save:after-data", "save:before-rename"])
@pytest.mark.parametrize("sig, code", [("SIGTERM", 128 + 15), ("SIGINT", 130)])
def test_a_signal_during_a_save_removes_its_temporary_folder(tiny_data, tmp_path, point, sig, code):
    c = tmp_path / "C"
    proc = subprocess_train(tiny_data, c, {"DLRMKIT_FAULT": f"{point}@:{sig}"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert not [n for n in os.listdir(c) if n.startswith(".tmp-")], os.listdir(c)


@pytest.mark.slow  # three runs saving at every step
def test_sigterm_at_random_moments_never_leaves_a_temporary_folder(tiny_data, tmp_path):
    import random

    rng = random.Random(0)
    for k in range(3):
        c = tmp_path / f"C{k}"
        proc = subprocess_train(tiny_data, c, {}, steps=400)
        deadline = time.monotonic() + 60
        while not (c / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))  # saving at every step: most moments are inside a save
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert not [n for n in os.listdir(c) if n.startswith(".tmp-")], os.listdir(c)
        ckpt.load_single_process_model(str(c))  # `latest` names a whole checkpoint


def test_the_next_save_removes_what_a_killed_save_left_saying_so(tiny_data, c):
    shutil.copytree(c / "step_2", c / ".tmp-step_9")  # as a SIGKILL mid-save leaves it
    r = train(tiny_data, "--checkpoint-dir", c, "--resume", steps=5)
    assert r.code == 0, r.err
    assert f"removed {c}/.tmp-step_9, left by an interrupted save" in r.err
    assert not (c / ".tmp-step_9").exists()


# ---- the fault-injection grammar -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, needle",
    [
        ("save:after-dat", "expected POINT"),
        ("train:step-x", "expected POINT"),
        ("train:step-3@one", "expected POINT"),
        ("train:step-3@1:SIGNOPE", "unknown signal"),
        ("train:step-3@1:SIGKILL:extra", "expected POINT"),
        (" save:after-data", "expected POINT"),
    ],
)
def test_a_malformed_fault_variable_is_one_line(tiny_data, tmp_path, monkeypatch, value, needle):
    monkeypatch.setenv("DLRMKIT_FAULT", value)
    r = train(tiny_data, "--checkpoint-dir", tmp_path / "C")
    assert_one_line_error(r, "DLRMKIT_FAULT", needle)
    assert not (tmp_path / "C").exists()


def test_the_documented_examples_parse():
    from dlrmkit import faults

    for value in ("save:after-data", "train:step-3@1:SIGSTOP", "save:before-rename@:SIGTERM", "train:nan-loss-4"):
        assert faults.parse(value).point in value
    assert faults.parse("train:step-3@1:SIGSTOP") == faults.Fault("train:step-3", "1", signal.SIGSTOP)
