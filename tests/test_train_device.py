"""`dlrmkit train --device`: the backend/device pairs and the option errors on any machine; on a
CUDA GPU, training there (one process, tables on the GPU or in host memory; torchrun with NCCL)
against training on the CPU. The routing of CPU-tensor collectives to their own group, which the
NCCL path relies on, is checked on CPU in test_parallel_equivalence.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import needs_gpu, run_cli
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.dist import check_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_util import torchrun  # noqa: E402

# one recipe, no search: the same model on either device (the search is test_the_search_runs_on_the_gpu's)
ARGS = ["--batch-size", "250", "--no-progress", "--no-shuffle", "--eval-batch-size", "700",
        "--search-budget", "0"]  # fmt: skip
STEPS = ["--max-steps", "6"]  # a resumed run names its own
NEEDS_GPU = needs_gpu("training on a GPU needs a CUDA GPU; none here")


def test_the_device_picks_the_backend():
    assert check_backend(None, "cpu") == "gloo"
    assert check_backend(None, "cuda") == "nccl"
    assert check_backend("mpi", "cpu") == "mpi"
    assert check_backend("nccl", "cuda") == "nccl"
    with pytest.raises(DlrmkitError, match="carries CUDA tensors only"):
        check_backend("nccl", "cpu")
    with pytest.raises(DlrmkitError, match="needs --backend nccl"):
        check_backend("gloo", "cuda")


def test_option_errors_name_the_option(tiny_data):
    r = run_cli("train", "--data", tiny_data, *ARGS, *STEPS, "--table-placement", "device")
    assert r.code != 0 and "--table-placement device needs --device cuda" in r.err
    if not torch.cuda.is_available():
        r = run_cli("train", "--data", tiny_data, *ARGS, *STEPS, "--device", "cuda")
        assert r.code != 0 and "--device cuda needs a CUDA GPU" in r.err


@pytest.mark.multirank
def test_fp16_under_torchrun_matches_one_process(tiny_data, tmp_path):
    """fp16 on 2 ranks (gloo, CPU): the same run as one process to fp16's rounding, the same scale,
    and the scale in the checkpoint the ranks save."""
    ref = _train(tmp_path, tiny_data, "one", "--precision", "fp16", "--preset", "tiny")
    out = tmp_path / "two.json"
    proc = torchrun(2, "-m", "dlrmkit", "train", "--data", tiny_data, *ARGS, *STEPS, "--precision", "fp16",
                    "--preset", "tiny", "--metrics-json", out, "--run-dir", tmp_path / "two")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and got["loss_scale"] == ref["loss_scale"] == 2.0**16
    assert got["overflow_steps"] == 0
    _close(got, ref, rel=1e-3)
    from dlrmkit.checkpoint import save_load as ckpt

    manifest = ckpt.read_manifest(ckpt.latest_checkpoint(str(tmp_path / "two" / "checkpoints")))
    assert manifest["loss_scale"] == 2.0**16 and manifest["loss_scale_growth"] == 6


@NEEDS_GPU
def test_fp16_trains_on_the_gpu_near_fp32(tiny_data, tmp_path, monkeypatch):
    """fp16 autocast with the loss scale (tables on the GPU: sparse gradients, unscaled too)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    ref = _train(tmp_path, tiny_data, "fp32", "--device", "cuda")
    got = _train(tmp_path, tiny_data, "fp16", "--device", "cuda", "--precision", "fp16")
    assert got["overflow_steps"] == 0 and got["loss_scale"] > 1
    _close(got, ref, rel=2e-2)


@pytest.mark.multirank
def test_nccl_on_cpu_is_refused_under_torchrun(tiny_data):
    proc = torchrun(2, "-m", "dlrmkit", "train", "--data", tiny_data, *ARGS, *STEPS, "--backend", "nccl")
    assert proc.returncode != 0
    assert "--backend nccl carries CUDA tensors only" in proc.stderr


def _train(tmp_path: Path, tiny_data: Path, name: str, *extra: str, steps: int = 6) -> dict:
    out = tmp_path / f"{name}.json"
    r = run_cli("train", "--data", tiny_data, *ARGS, "--max-steps", steps, "--metrics-json", out, *extra)
    assert r.code == 0, r.err[-3000:]
    return json.loads(out.read_text())


def _close(got: dict, ref: dict, rel: float = 5e-3) -> None:
    """TF32 is on for the GPU's fp32 matmuls (10-bit mantissa), so agreement is to about 1e-3
    (bf16 autocast: about 1e-2)."""
    assert got["samples"] == ref["samples"]
    assert got["train_loss"] == pytest.approx(ref["train_loss"], rel=rel)
    assert got["auc"] == pytest.approx(ref["auc"], abs=rel)


@NEEDS_GPU
@pytest.mark.parametrize("placement", ["device", "host"])
def test_train_on_the_gpu_matches_the_cpu(tiny_data, tmp_path, placement, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    ref = _train(tmp_path, tiny_data, "cpu")
    got = _train(
        tmp_path,
        tiny_data,
        placement,
        "--device",
        "cuda",
        "--table-placement",
        placement,
        "--checkpoint-dir",
        tmp_path / f"ck-{placement}",
    )
    _close(got, ref)
    again = _train(
        tmp_path,
        tiny_data,
        placement + "-resumed",
        "--device",
        "cuda",
        "--table-placement",
        placement,
        "--checkpoint-dir",
        tmp_path / f"ck-{placement}",
        "--resume",
        steps=8,
    )
    assert again["steps"] == 8  # a GPU checkpoint loads back onto the GPU and training goes on


@NEEDS_GPU
def test_the_search_runs_on_the_gpu(tiny_data, tmp_path, monkeypatch):
    """The default path on small data: the recipe search, then its choice or a blend of its
    candidates, each trained on the GPU; it ends near the same run on the CPU."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    searched = [a for a in ARGS if a not in ("--search-budget", "0")] + STEPS
    results = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.json"
        run = tmp_path / f"run-{device}"
        r = run_cli("train", "--data", tiny_data, *searched, "--device", device, "--metrics-json", out, "--run-dir", run)
        assert r.code == 0, r.err[-3000:]
        assert "search: " in r.out
        results[device] = json.loads(out.read_text())
    assert results["cuda"]["auc"] == pytest.approx(results["cpu"]["auc"], abs=0.02)
    assert results["cuda"]["logloss"] == pytest.approx(results["cpu"]["logloss"], abs=0.02)


@pytest.mark.multirank
@NEEDS_GPU
@pytest.mark.parametrize(
    "world,sharding,extra",
    [
        (1, "row_wise", []),
        (2, "row_wise", []),
        (
            2,
            "auto",
            ["--optimizer", "adagrad", "--loader", "broadcast"],
        ),  # replicated + sharded tables, one-hot fast path
        (2, "table_wise", ["--optimizer", "split-sgd", "--precision", "bf16"]),
    ],
    ids=["1-row_wise", "2-row_wise", "2-auto-adagrad-broadcast", "2-table_wise-split_sgd-bf16"],
)
def test_torchrun_nccl_matches_the_cpu(tiny_data, tmp_path, world, sharding, extra):
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks need {world} GPUs; {torch.cuda.device_count()} here")
    model_args = [a for a in extra if a != "--loader" and a != "broadcast"]
    ref = _train(tmp_path, tiny_data, "cpu", *model_args)
    out, ck = tmp_path / "nccl.json", tmp_path / "ck"
    run = [
        "-m",
        "dlrmkit",
        "train",
        "--data",
        tiny_data,
        *ARGS,
        "--device",
        "cuda",
        "--sharding",
        sharding,
        *extra,
        "--checkpoint-dir",
        ck,
    ]
    proc = torchrun(world, *run, *STEPS, "--metrics-json", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _close(json.loads(out.read_text()), ref, rel=2e-2 if "bf16" in extra else 5e-3)
    proc = torchrun(world, *run, "--resume", "--max-steps", "8", "--metrics-json", out)  # sharded GPU checkpoint
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["steps"] == 8
