"""`dlrmkit train` / `dlrmkit bench` with --optimizer split-sgd|lamb, --embedding-optimizer and
--precision: each combination trains to a useful AUC; bad combinations are one-line errors."""

import json

import pytest

from helpers import run_cli


@pytest.mark.parametrize(
    "flags",
    [
        ["--optimizer", "sgd", "--precision", "bf16"],
        ["--optimizer", "split-sgd", "--precision", "bf16"],
        ["--optimizer", "lamb", "--lamb-lr", "0.02", "--lr", "0.5"],
        ["--optimizer", "lamb", "--lamb-lr", "0.02", "--lr", "0.1", "--embedding-optimizer", "rowwise-adagrad"],
        ["--optimizer", "sgd", "--lr", "0.1", "--embedding-optimizer", "rowwise-adagrad"],
    ],
    ids=["sgd-bf16", "split-sgd-bf16", "lamb-sgd", "lamb-rowwise", "sgd-rowwise"],
)
def test_train_with_precision_and_optimizers(tiny_data, tmp_path, flags):
    metrics = tmp_path / "m.json"
    r = run_cli(
        "train",
        "--data",
        tiny_data,
        "--epochs",
        "3",
        "--no-progress",
        "--run-dir",
        tmp_path / "run",
        "--metrics-json",
        metrics,
        *flags,
    )
    assert r.code == 0, r.err
    m = json.loads(metrics.read_text())
    assert m["auc"] > 0.6, m  # learned something (random is 0.5)


def test_split_sgd_checkpoint_resume_continues_exactly(tiny_data, tmp_path):
    common = [
        "train",
        "--data",
        tiny_data,
        "--no-progress",
        "--optimizer",
        "split-sgd",
        "--precision",
        "bf16",
        "--no-shuffle",
        "--refit",  # the model selection chose is the one --resume continues; a refit's is not resumed
        "false",
        "--folds",  # one model, not one per fold (a run of several is not resumed)
        "1",
    ]
    full, half = tmp_path / "full.json", tmp_path / "half.json"
    assert run_cli(*common, "--max-steps", "20", "--metrics-json", full, "--run-dir", tmp_path / "a").code == 0
    ck = tmp_path / "ck"
    r = run_cli(*common, "--max-steps", "10", "--checkpoint-dir", ck, "--run-dir", tmp_path / "b")
    assert r.code == 0, r.err
    r = run_cli(
        *common,
        "--max-steps",
        "20",
        "--checkpoint-dir",
        ck,
        "--resume",
        "--metrics-json",
        half,
        "--run-dir",
        tmp_path / "c",
    )
    assert r.code == 0, r.err
    assert json.loads(half.read_text())["logloss"] == json.loads(full.read_text())["logloss"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--optimizer", "split-sgd"], "needs --precision bf16"),
        (
            ["--optimizer", "split-sgd", "--precision", "bf16", "--embedding-optimizer", "adagrad"],
            "--embedding-optimizer sgd",
        ),
    ],
)
def test_bad_combinations_are_one_line_errors(tiny_data, tmp_path, flags, message):
    r = run_cli("train", "--data", tiny_data, "--max-steps", "1", "--no-progress", "--run-dir", tmp_path / "r", *flags)
    assert r.code == 2
    assert message in r.err and "Traceback" not in r.err


def test_bench_bf16_split_sgd_compares_with_fp32(tmp_path, monkeypatch):
    from dlrmkit.commands import bench
    from dlrmkit.model.dlrm import ModelConfig

    monkeypatch.setitem(bench.BENCH_MODELS, "test-tiny", ModelConfig(13, [1000] * 4, 16, [32, 16], [32, 1]))
    out = tmp_path / "bench.json"
    r = run_cli(
        "bench",
        "--no-compile",
        "--model",
        "test-tiny",
        "--batch-size",
        "64",
        "--steps",
        "1",
        "--windows",
        "2",
        "--warmup",
        "1",
        "--precision",
        "bf16",
        "--optimizer",
        "split-sgd",
        "--compare-fp32",
        "--json",
        out,
    )
    assert r.code == 0, r.err
    res = json.loads(out.read_text())
    assert res["precision"] == "bf16" and res["optimizer"] == "split-sgd"
    assert res["fp32_samples_per_s"] > 0 and res["speedup_vs_fp32"] > 0
    assert len(res["window_fp32_samples_per_s"]) == 2  # one fp32 window after each of the run's windows
    assert "fp32 sgd, a window after each of dlrmkit's" in r.out
    assert res["gemm_speedup_vs_fp32"] > 0 and "GEMMs at the model's shapes run" in r.out  # bf16 vs fp32 GEMMs
