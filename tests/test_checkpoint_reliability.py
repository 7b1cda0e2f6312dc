"""Checkpoints in one process: the DCP checkpoint format (logical tables, manifest, checksums), atomic
saves that survive SIGKILL, --keep, --checkpoint-every-seconds, exact resume, NaN/Inf losses,
and one-line errors for corrupt checkpoints and mismatched runs (docs/RELIABILITY.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers import TINY_TABLES, run_cli, run_cli_subprocess
from dlrmkit.checkpoint import save_load as ckpt


def train(data, *extra, steps=6):
    result = run_cli("train", "--data", data, "--no-progress", "--preset", "tiny", "--max-steps", steps, *extra)
    assert result.code == 0, result.err
    return result


def assert_one_line_error(result, *needles):
    assert result.code == 2, (result.code, result.err)
    said = ("resumed from ", "no checkpoint in ")  # --resume's line, before any error
    lines = [ln for ln in result.err.strip().splitlines() if ln.strip() and not ln.startswith(said)]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)


# ---- format --------------------------------------------------------------------------------------
def test_manifest_has_logical_tables_and_checksums(tiny_data, tmp_path):
    train(tiny_data, "--checkpoint-dir", tmp_path / "C", "--optimizer", "adagrad", "--lr", "0.05")
    path = ckpt.latest_checkpoint(str(tmp_path / "C"))
    manifest = ckpt.read_manifest(path)
    assert manifest["step"] == 6 and manifest["epoch"] == 0 and manifest["batch_in_epoch"] == 6
    for t, rows in enumerate(TINY_TABLES):  # one logical tensor per table, with its optimizer state
        assert manifest["tensors"][f"table.{t}.weight"] == {"shape": [rows, 16], "dtype": "float32"}
        assert manifest["tensors"][f"table.{t}.opt.sum"]["shape"] == [rows, 16]
    assert any(k.startswith("dense_opt.") for k in manifest["tensors"])
    assert "rng.0" in manifest["tensors"]
    files = set(os.listdir(path)) - {ckpt.MANIFEST}
    assert files == {"metadata.json", "data_0.bin"} == set(manifest["files"])  # no pickled .metadata
    for name, info in manifest["files"].items():
        assert info["sha256"] == ckpt.file_digest(os.path.join(path, name))


def test_single_process_model_matches_trainer(tiny_data, tmp_path):
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.train.evaluation import evaluate_model

    m = tmp_path / "m.json"
    train(tiny_data, "--checkpoint-dir", tmp_path / "C", "--metrics-json", m, steps=20)
    model, cfg = ckpt.load_single_process_model(str(tmp_path / "C"))
    assert cfg.table_sizes == TINY_TABLES
    result = evaluate_model(model, open_dataset(str(tiny_data))[2], 16384)
    assert result["auc"] == pytest.approx(json.loads(m.read_text())["auc"], abs=1e-12)


def test_interrupted_run_equals_uninterrupted_including_rng(tiny_data, tmp_path):
    extra = [
        "--optimizer",
        "adagrad",
        "--lr",
        "0.05",
        "--warmup-steps",
        "5",
        "--decay-start",
        "20",
        "--decay-steps",
        "10",
    ]
    train(tiny_data, "--checkpoint-dir", tmp_path / "I", *extra, steps=13)
    train(tiny_data, "--checkpoint-dir", tmp_path / "I", "--resume", *extra, steps=30)
    train(tiny_data, "--checkpoint-dir", tmp_path / "S", *extra, steps=30)
    a, ma = ckpt.load_logical_state(str(tmp_path / "I"))
    b, mb = ckpt.load_logical_state(str(tmp_path / "S"))
    assert ma["step"] == mb["step"] == 30 and a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


# ---- atomic saves ---------------------------------------------------------------------------------
@pytest.mark.parametrize("point", ["save:after-data", "save:before-latest"])
def test_kill_mid_save_leaves_previous_checkpoint(tiny_data, tmp_path, point):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=4)
    args = [
        sys.executable,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        str(tiny_data),
        "--no-progress",
        "--preset",
        "tiny",
        "--checkpoint-dir",
        str(c),
        "--resume",
        "--max-steps",
        "8",
    ]
    proc = subprocess.run(args, env=env(DLRMKIT_FAULT=point), capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (c / "latest").read_text() == "step_4"
    model, _ = ckpt.load_single_process_model(str(c))  # verified checksums, loads
    assert ckpt.read_manifest(str(c / "step_4"))["step"] == 4
    # the same command line continues from step 4 and cleans up the half-written folder
    train(tiny_data, "--checkpoint-dir", c, "--resume", steps=8)
    assert (c / "latest").read_text() == "step_8"
    assert not [n for n in os.listdir(c) if n.startswith(".tmp")]


def test_sigkill_at_a_random_moment_leaves_latest_loadable(tiny_data, tmp_path):
    c = tmp_path / "C"
    args = [
        sys.executable,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        str(tiny_data),
        "--no-progress",
        "--preset",
        "tiny",
        "--checkpoint-dir",
        str(c),
        "--checkpoint-every",
        "1",
        "--keep",
        "2",
        "--max-steps",
        "100000",
    ]
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (c / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.73)  # mid-run: saves happen every step, so most likely mid-save
        assert proc.poll() is None, proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    model, _ = ckpt.load_single_process_model(str(c))
    assert ckpt.read_manifest(ckpt.latest_checkpoint(str(c)))["step"] >= 1


def test_keep_n(tiny_data, tmp_path):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, "--checkpoint-every", "2", "--keep", "3", steps=10)
    assert sorted(n for n in os.listdir(c) if n.startswith("step_")) == ["step_10", "step_6", "step_8"]


def test_checkpoint_every_seconds(tiny_data, tmp_path):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, "--checkpoint-every-seconds", "1e-6", "--keep", "100", steps=5)
    assert sorted(n for n in os.listdir(c) if n.startswith("step_")) == [f"step_{i}" for i in range(1, 6)]


def test_a_periodic_save_of_the_last_step_does_not_stand_for_the_final_model(tiny_data, tmp_path):
    """--checkpoint-every saving the last step before the run's end changed its weights (the
    temperature folded in, the best weights restored): the final checkpoint holds the model the
    run scored, so `evaluate` gives the run's test figures."""
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, "--checkpoint-every", "6", "--calibration", "temperature",
          "--metrics-json", tmp_path / "m.json")  # fmt: skip
    run = json.loads((tmp_path / "m.json").read_text())
    assert run["temperature"] != 1.0
    result = run_cli("evaluate", "--data", tiny_data, "--checkpoint", c, "--metrics-json", tmp_path / "e.json")
    assert result.code == 0, result.err
    scored = json.loads((tmp_path / "e.json").read_text())
    assert scored["logloss"] == pytest.approx(run["logloss"], abs=1e-6)
    # the last step saved along the way, unchanged since: the final checkpoint, said so on screen
    result = train(tiny_data, "--checkpoint-dir", tmp_path / "D", "--checkpoint-every", "3")
    assert f"saved checkpoint {tmp_path / 'D' / 'step_6'} (at the last step" in result.err, result.err


# ---- corrupt checkpoints --------------------------------------------------------------------------
def _data_file(path):
    return next(os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".bin"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corrupt_checkpoint_is_one_line_error(tiny_data, tmp_path, damage):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=3)
    path = ckpt.latest_checkpoint(str(c))
    target = _data_file(path)
    if damage == "flip":
        raw = bytearray(open(target, "rb").read())
        raw[len(raw) // 2] ^= 0xFF
        open(target, "wb").write(bytes(raw))
        needles = [target, "corrupt", "SHA-256"]
    elif damage == "truncate":
        os.truncate(target, os.path.getsize(target) // 2)
        needles = [target, "truncated"]
    elif damage == "delete":
        os.remove(target)
        needles = [target, "missing"]
    else:
        target = os.path.join(path, ckpt.MANIFEST)
        open(target, "w").write('{"format": "dlrmkit-checkpoint/2", "step": ')
        needles = [target, "manifest"]
    evaluate = run_cli_subprocess if damage == "flip" else run_cli  # one real CLI process is enough
    assert_one_line_error(evaluate("evaluate", "--data", tiny_data, "--checkpoint", c), *needles)
    resumed = run_cli(
        "train",
        "--data",
        tiny_data,
        "--no-progress",
        "--preset",
        "tiny",
        "--checkpoint-dir",
        c,
        "--resume",
        "--max-steps",
        6,
    )
    assert_one_line_error(resumed, *needles)


def test_latest_naming_a_missing_folder(tiny_data, tmp_path):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=2)
    (c / "latest").write_text("step_99")
    assert_one_line_error(run_cli("evaluate", "--data", tiny_data, "--checkpoint", c), "step_99", "does not exist")


# ---- mismatched runs ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change,needle",
    [
        (["--embedding-dim", "8", "--bottom-mlp", "64,8"], "does not match this run's model: embedding_dim checkpoint 16, this run 8; bottom_mlp"),
        (["--optimizer", "adagrad"], "optimizers"),
    ],
)
def test_resume_into_another_model_or_optimizer(tiny_data, tmp_path, change, needle):
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=2)
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--no-progress",
        "--preset",
        "tiny",
        "--checkpoint-dir",
        c,
        "--resume",
        "--max-steps",
        4,
        *change,
    )
    assert_one_line_error(result, str(c), needle)


def test_tensor_shape_mismatch_is_named(tiny_data, tmp_path):
    """A manifest that disagrees with the model (hand-edited, or another format) names the tensor."""
    c = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", c, steps=2)
    path = ckpt.latest_checkpoint(str(c))
    from dlrmkit.model.dlrm import DLRM, ModelConfig

    manifest = ckpt.read_manifest(path)
    manifest["tensors"]["table.2.weight"]["shape"] = [21, 16]
    model = DLRM(ModelConfig(**manifest["model_config"]))
    tensors, _ = ckpt.model_state(model, [])
    with pytest.raises(ckpt.DlrmkitError, match=r"'table.2.weight' has shape \[21, 16\].*\[20, 16\]"):
        ckpt.load_into(path, tensors, manifest)


# ---- bad numbers ---------------------------------------------------------------------------------
@pytest.fixture
def inf_data(dataset_copy):
    """Rows of batch 3 (file order, batch 256) carry +inf numerical features."""
    p = dataset_copy / "train" / "numerical.bin"
    x = np.fromfile(p, dtype=np.float16).reshape(-1, 4)
    x[3 * 256 : 3 * 256 + 2] = np.inf
    x.tofile(p)
    return dataset_copy


def test_infinite_feature_is_refused_naming_the_row(inf_data, tmp_path):
    c = tmp_path / "C"
    result = run_cli(
        "train",
        "--data",
        inf_data,
        "--no-progress",
        "--preset",
        "tiny",
        "--no-shuffle",
        "--max-steps",
        8,
        "--checkpoint-dir",
        c,
        "--checkpoint-every",
        2,
    )
    assert_one_line_error(result, "train/numerical.bin", "row 768", "inf", "must be finite")


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(dataset_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("DLRMKIT_FAULT", "train:nan-loss-4")  # step 4's loss reads as NaN (a diverged step)
    c = tmp_path / "C"
    result = run_cli(
        "train",
        "--data",
        dataset_copy,
        "--no-progress",
        "--preset",
        "tiny",
        "--no-shuffle",
        "--max-steps",
        8,
        "--checkpoint-dir",
        c,
        "--checkpoint-every",
        2,
    )
    assert_one_line_error(result, "loss is nan at step 4", "last good checkpoint", "--skip-nonfinite")
    assert (c / "latest").read_text() == "step_2"
    model, _ = ckpt.load_single_process_model(str(c))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # nothing saved before the NaN: the line names no checkpoint that is not there
    result = run_cli("train", "--data", dataset_copy, "--no-progress", "--preset", "tiny", "--no-shuffle",
                     "--max-steps", 8, "--checkpoint-dir", tmp_path / "D")  # fmt: skip
    assert_one_line_error(result, "loss is nan at step 4", "no checkpoint saved before it", "--skip-nonfinite")
    assert "last good checkpoint" not in result.err and not (tmp_path / "D" / "latest").exists()
    assert "--optimizer adagrad" not in result.err
    # a cross network under SGD (the tiny preset's): the line says what to try first
    result = run_cli("train", "--data", dataset_copy, "--no-progress", "--preset", "tiny", "--no-shuffle",
                     "--max-steps", 8, "--interaction", "dcn", "--checkpoint-dir", tmp_path / "E")  # fmt: skip
    assert_one_line_error(result, "loss is nan at step 4", "a cross network under SGD: try --optimizer adagrad")


def test_skip_nonfinite_skips_and_counts(dataset_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("DLRMKIT_FAULT", "train:nan-loss-4")
    m, log = tmp_path / "m.json", tmp_path / "log.jsonl"
    train(
        dataset_copy,
        "--no-shuffle",
        "--skip-nonfinite",
        1,
        "--metrics-json",
        m,
        "--log-jsonl",
        log,
        "--checkpoint-dir",
        tmp_path / "C",
        steps=8,
    )
    assert json.loads(m.read_text())["skipped_nonfinite"] == 1
    skips = [json.loads(ln) for ln in log.read_text().splitlines() if "skip_nonfinite" in ln]
    assert [(r["step"], r["skipped"]) for r in skips if r.get("event") == "skip_nonfinite"] == [(4, 1)]
    model, _ = ckpt.load_single_process_model(str(tmp_path / "C"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---- bad options ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--batch-size", "0"], "--batch-size"),
    ],
)
def test_bad_option_values(tiny_data, args, needle):
    base = {"--preset": "tiny", "--max-steps": "1", **dict(zip(args[::2], args[1::2]))}  # each option once
    assert_one_line_error(run_cli("train", "--data", tiny_data, "--no-progress", *sum(base.items(), ())), needle)
