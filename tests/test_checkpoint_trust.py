"""Checkpoints as untrusted input and as data not to lose: a crafted checkpoint never runs code
(evaluate, export, train --resume, predict), the manifest's file list is exact and mandatory,
the first (pickled-metadata) format still loads, --resume refuses another dataset, a run never
mixes into another run's checkpoint folder, --keep never removes what `latest` names, and a
failed save (file too large, read-only) is one line that leaves the previous checkpoint."""

from __future__ import annotations

import errno
import json
import os
import pickle
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers import run_cli, scratch_cwd, tiny_config
from dlrmkit.data.synthetic import generate
from dlrmkit.checkpoint import save_load as ckpt


def assert_one_line_error(result, *needles):
    assert result.code == 2, (result.code, result.out, result.err)
    said = ("resumed from ", "no checkpoint in ")  # --resume's line, before any error
    lines = [ln for ln in result.err.strip().splitlines() if ln.strip() and not ln.startswith(said)]
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def train(data, *extra, steps=3):
    """One model (no recipe search: a search may end in a blend, whose folder holds one per member)."""
    result = run_cli("train", "--data", data, "--no-progress", "--max-steps", steps, "--search-budget", 0, *extra)
    assert result.code == 0, result.err
    return result


def rewrite_manifest(path, change):
    fp = os.path.join(path, ckpt.MANIFEST)
    manifest = json.load(open(fp))
    change(manifest)
    json.dump(manifest, open(fp, "w"))


def relist(path):
    """Recompute the manifest's file list, as a forger who can write the folder would."""

    def change(m):
        m["files"] = {
            n: {"bytes": os.path.getsize(os.path.join(path, n)), "sha256": ckpt.file_digest(os.path.join(path, n))}
            for n in sorted(os.listdir(path))
            if n != ckpt.MANIFEST
        }

    rewrite_manifest(path, change)


def to_first_format(path):
    """Rewrite checkpoint `path` in the first format: DCP's own writer (pickled `.metadata`,
    torch.save'd chunks), manifest format dlrmkit-checkpoint/1."""
    import torch.distributed.checkpoint as dcp

    tensors, _ = ckpt.load_logical_state(path)
    for name in os.listdir(path):
        if name != ckpt.MANIFEST:
            os.remove(os.path.join(path, name))
    with ckpt._quiet():
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    rewrite_manifest(path, lambda m: m.update(format=ckpt.LEGACY_FORMAT))
    relist(path)


class Payload:
    """A pickle that runs a shell command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ---- a hostile checkpoint runs nothing -----------------------------------------------------------------
@pytest.fixture(scope="module")
def transcoded(tmp_path_factory):
    """A transcoded CSV dataset (so `predict` reads raw rows) and a checkpoint trained on it."""
    root = tmp_path_factory.mktemp("trust")
    rng = np.random.default_rng(0)
    csv = root / "rows.csv"
    lines = ["label,x,c1,c2"] + [
        f"{rng.integers(2)},{rng.normal():.3f},a{rng.integers(5)},b{rng.integers(9)}" for _ in range(600)
    ]
    csv.write_text("\n".join(lines) + "\n")
    ds = root / "ds"
    r = run_cli(
        "transcode",
        "--input",
        csv,
        "--out",
        ds,
        "--label",
        "label",
        "--numerical",
        "x",
        "--categorical",
        "c1,c2",
        "--test-rows",
        100,
    )
    assert r.code == 0, r.err
    train(ds, "--checkpoint-dir", root / "C", "--batch-size", 100, "--eval-batch-size", 100)
    return ds, root / "C", csv


def commands(ds, c, csv, out):
    return {
        "evaluate": ["evaluate", "--data", ds, "--checkpoint", c],
        "export": ["export", "--checkpoint", c, "--out", out / "m.pt"],
        "train --resume": [
            "train",
            "--data",
            ds,
            "--no-progress",
            "--checkpoint-dir",
            c,
            "--resume",
            "--search-budget",
            0,
            "--max-steps",
            6,
            "--batch-size",
            100,
        ],
        "predict": ["predict", "--checkpoint", c, "--input", csv, "--data", ds, "--output", out / "p.csv"],
    }


@pytest.mark.parametrize("variant", ["first-format-metadata", "extra-metadata-file"])
def test_crafted_pickle_never_runs(transcoded, tmp_path, variant):
    """The attack: a `.metadata` pickle that runs `touch MARKER`, with its SHA-256 put into the
    (unauthenticated) manifest. Loaded as the first format, the allow-listed unpickler refuses
    its global; in the current format no pickle is read and the unexpected file is refused."""
    import shutil

    ds, c0, csv = transcoded
    c = tmp_path / "C"
    shutil.copytree(c0, c)
    path = ckpt.latest_checkpoint(str(c))
    marker = tmp_path / "marker"
    if variant == "first-format-metadata":
        to_first_format(path)
        needles = [".metadata", "refused global", "system"]
    else:
        needles = [".metadata", "refused"]
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(Payload(marker), f)
    relist(path)
    assert pickle.loads(pickle.dumps(Payload(tmp_path / "probe"))) == 0 and (tmp_path / "probe").exists()  # it is live
    for name, argv in commands(ds, c, csv, tmp_path).items():
        assert_one_line_error(run_cli(*argv), *needles)
        assert not marker.exists(), f"{name} ran the payload"
    assert not (tmp_path / "m.pt").exists() and not (tmp_path / "p.csv").exists()


def test_crafted_checkpoint_in_a_fresh_process_is_one_line(transcoded, tmp_path):
    import shutil

    ds, c0, csv = transcoded
    c = tmp_path / "C"
    shutil.copytree(c0, c)
    path = ckpt.latest_checkpoint(str(c))
    to_first_format(path)
    marker = tmp_path / "marker"
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(Payload(marker), f)
    relist(path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "dlrmkit", "evaluate", "--data", str(ds), "--checkpoint", str(c)],
        cwd=scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "refused" in proc.stderr and not marker.exists()


@pytest.mark.parametrize(
    "damage,needle",
    [
        ("no-file-list", "lists no files"),
        ("unlisted-file", "not listed in manifest.json"),
        ("foreign-name", "is not a file of a"),
        ("metadata-outside", "is not a data_<rank>.bin name"),
        ("metadata-bad-dtype", "dtype must be one of"),
    ],
)
def test_altered_checkpoint_is_refused(transcoded, tmp_path, damage, needle):
    import shutil

    ds, c0, csv = transcoded
    c = tmp_path / "C"
    shutil.copytree(c0, c)
    path = ckpt.latest_checkpoint(str(c))
    if damage == "no-file-list":
        rewrite_manifest(path, lambda m: m.pop("files"))
    elif damage == "unlisted-file":
        open(os.path.join(path, "notes.txt"), "w").write("x")
    elif damage == "foreign-name":
        open(os.path.join(path, "../evil"), "w").write("x")
        rewrite_manifest(path, lambda m: m["files"].update({"../evil": {"bytes": 1, "sha256": "0"}}))
    else:
        fp = os.path.join(path, "metadata.json")
        meta = json.load(open(fp))
        first = next(iter(meta["tensors"].values()))
        if damage == "metadata-outside":
            first["chunks"][0]["file"] = "../../etc/passwd"
        else:
            first["dtype"] = "object"
        json.dump(meta, open(fp, "w"))
        relist(path)
    for argv in commands(ds, c, csv, tmp_path).values():
        assert_one_line_error(run_cli(*argv), needle)


def test_manifest_describing_a_huge_model_is_one_line(transcoded, tmp_path):
    import shutil

    ds, c0, csv = transcoded
    c = tmp_path / "C"
    shutil.copytree(c0, c)
    path = ckpt.latest_checkpoint(str(c))
    rewrite_manifest(path, lambda m: m["model_config"].update(table_sizes=[10**13, 10]))
    assert_one_line_error(
        run_cli("export", "--checkpoint", c, "--out", tmp_path / "m.pt"), "table 0 of 10000000000000 rows"
    )
    # consistent with its own tensor list, it is refused by the memory it would need, before allocating
    rewrite_manifest(path, lambda m: m["tensors"]["table.0.weight"].update(shape=[10**13, 9]))
    assert_one_line_error(run_cli("export", "--checkpoint", c, "--out", tmp_path / "m.pt"), "of memory")
    assert_one_line_error(run_cli(*commands(ds, c, csv, tmp_path)["evaluate"]), "model was trained for")


def test_first_format_checkpoint_still_loads_with_equal_results(tiny_data, tmp_path):
    m1, m2 = tmp_path / "a.json", tmp_path / "b.json"
    train(tiny_data, "--checkpoint-dir", tmp_path / "C", "--optimizer", "adagrad", "--lr", "0.05", steps=5)
    assert run_cli("evaluate", "--data", tiny_data, "--checkpoint", tmp_path / "C", "--metrics-json", m1).code == 0
    path = ckpt.latest_checkpoint(str(tmp_path / "C"))
    before, _ = ckpt.load_logical_state(path)
    to_first_format(path)
    assert {".metadata", "__0_0.distcp"} <= set(os.listdir(path))
    after, manifest = ckpt.load_logical_state(path)
    assert manifest["format"] == ckpt.LEGACY_FORMAT and before.keys() == after.keys()
    assert all(bool((before[k] == after[k]).all()) for k in before)
    assert run_cli("evaluate", "--data", tiny_data, "--checkpoint", tmp_path / "C", "--metrics-json", m2).code == 0
    assert json.loads(m1.read_text())["auc"] == json.loads(m2.read_text())["auc"]
    # and a run resumes from it, writing the current format
    train(tiny_data, "--checkpoint-dir", tmp_path / "C", "--optimizer", "adagrad", "--lr", "0.05", "--resume", steps=7)
    assert "metadata.json" in os.listdir(ckpt.latest_checkpoint(str(tmp_path / "C")))


# ---- the dataset a run resumes on ---------------------------------------------------------------------
def test_resume_refuses_another_dataset_of_the_same_shape(tiny_data, tmp_path):
    other = tmp_path / "other"
    generate(str(other), tiny_config(), seed=1, preset="test-tiny")  # same shape, other rows
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c)
    result = run_cli("train", "--data", other, "--no-progress", "--checkpoint-dir", c, "--resume", "--max-steps", 5,
                    "--search-budget", 0)  # fmt: skip
    assert_one_line_error(result, str(tiny_data), str(other), "another dataset", "fingerprint")
    assert (c / "latest").read_text() == "step_3"
    import shutil

    moved = tmp_path / "moved"  # the same bytes elsewhere are the same dataset
    shutil.copytree(tiny_data, moved)
    train(moved, "--checkpoint-dir", c, "--resume", steps=5)
    assert (c / "latest").read_text() == "step_5"


# ---- no checkpoint data loss ----------------------------------------------------------------------------
def test_a_fresh_run_does_not_write_into_another_runs_checkpoints(tiny_data, tmp_path):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=8)
    before = sorted(os.listdir(c))
    result = run_cli("train", "--data", tiny_data, "--no-progress", "--checkpoint-dir", c, "--max-steps", 2)
    assert_one_line_error(result, str(c), "already holds checkpoints", "--resume")
    assert sorted(os.listdir(c)) == before and (c / "latest").read_text() == "step_8"


def test_keep_never_removes_the_checkpoint_latest_names(tiny_data, tmp_path):
    """After pointing `latest` at an older checkpoint (as the corrupt-checkpoint message advises),
    a resumed run's new checkpoint has a lower step than others: --keep 1 keeps it, not them."""
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, "--checkpoint-every", 2, "--keep", 10, steps=10)
    (c / "latest").write_text("step_2")
    train(tiny_data, "--checkpoint-dir", c, "--resume", "--keep", 1, steps=3)
    assert (c / "latest").read_text() == "step_3"
    assert sorted(n for n in os.listdir(c) if n.startswith("step_")) == ["step_3"]
    ckpt.load_single_process_model(str(c))


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # bytes per file: the data file is larger
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write fails with EFBIG instead of killing


def test_save_that_cannot_write_is_one_line_and_keeps_the_previous(tiny_data, tmp_path):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, "--optimizer", "adagrad", steps=2)
    args = [
        sys.executable,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        str(tiny_data),
        "--no-progress",
        "--optimizer",
        "adagrad",
        "--checkpoint-dir",
        str(c),
        "--resume",
        "--search-budget",
        "0",
        "--max-steps",
        "4",
        "--log-jsonl",
        str(tmp_path / "resumed.jsonl"),
    ]
    proc = subprocess.run(
        args,
        cwd=scratch_cwd(),
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
    )
    said, *lines = proc.stderr.strip().splitlines()
    assert said == f"resumed from {c}/step_2 (step 2, epoch 0)"
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot write checkpoint" in lines[0] and "EFBIG" in lines[0] and "step_2 is intact" in lines[0]
    assert sorted(os.listdir(c)) == ["latest", "log.jsonl", "step_2"]  # no .tmp-step_4 left
    assert ckpt.read_manifest(ckpt.latest_checkpoint(str(c)))["step"] == 2
    ckpt.load_single_process_model(str(c))  # checksums verified


def test_save_on_a_read_only_folder_is_one_line(tiny_data, tmp_path, monkeypatch):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=2)
    real = os.makedirs

    def read_only(path, *a, **k):  # as a read-only mount answers (root ignores chmod)
        if ".tmp-step_" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "makedirs", read_only)
    result = run_cli(
        "train", "--data", tiny_data, "--no-progress", "--checkpoint-dir", c, "--resume", "--max-steps", 4, "--search-budget", 0
    )
    assert_one_line_error(result, "cannot write checkpoint", "EROFS", "step_2 is intact")
    assert (c / "latest").read_text() == "step_2"


def test_unwritable_checkpoint_dir_fails_before_training(tiny_data, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--no-progress",
        "--checkpoint-dir",
        tmp_path / "file",
        "--max-steps",
        3,
        "--log-jsonl",
        tmp_path / "log.jsonl",
    )
    assert_one_line_error(result, "--checkpoint-dir", "a folder is needed")
    assert not (tmp_path / "log.jsonl").exists() or "train" not in (tmp_path / "log.jsonl").read_text()


# ---- the end-of-run checkpoint ----------------------------------------------------------------------
def test_final_checkpoint_is_announced_and_can_be_skipped(tiny_data, tmp_path):
    r = train(tiny_data, "--checkpoint-dir", tmp_path / "C")
    assert "saved checkpoint" in r.err and str(tmp_path / "C" / "step_3") in r.err
    r = train(tiny_data, "--checkpoint-dir", tmp_path / "D", "--no-final-checkpoint")
    assert "saved checkpoint" not in r.err and ckpt.existing_checkpoints(str(tmp_path / "D")) == []
    r = train(tiny_data, "--run-dir", tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_3"


@pytest.mark.multirank
def test_final_checkpoint_under_torchrun_without_run_dir(tiny_data, tmp_path):
    """The same default as one process: the ranks checkpoint into rank 0's run folder."""
    sys.path.insert(0, os.path.dirname(__file__))
    from parallel_util import free_port, torchrun_env

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "dlrmkit",
        "train",
        "--data",
        str(tiny_data),
        "--no-progress",
        "--max-steps",
        "3",
        "--batch-size",
        "250",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=torchrun_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [d for d in os.listdir(tmp_path / "runs") if not d.startswith(".")]
    assert len(runs) == 1
    run = tmp_path / "runs" / runs[0]
    assert json.loads((run / "run.json").read_text())["checkpoint_dir"] == "checkpoints"  # relative to the run folder
    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(str(run / "checkpoints")))
    assert manifest["world_size"] == 2 and manifest["step"] == 3
    assert "saved checkpoint" in proc.stderr
