"""`dlrmkit export`: the exported TorchScript (and pt) model gives the checkpoint model's outputs."""

import numpy as np
import pytest
import torch

from dlrmkit.commands.export import example_inputs, load_model

from helpers import run_cli


def test_torchscript_and_pt_exports_match_checkpoint(tiny_data, tmp_path):
    result = run_cli(
        "train", "--data", tiny_data, "--max-steps", 10, "--no-progress", "--run-dir", tmp_path / "R", "--search-budget", 0
    )
    assert result.code == 0, result.err
    ckpt = tmp_path / "R" / "checkpoints"
    model, cfg = load_model(str(ckpt))
    dense, ids = example_inputs(cfg, batch=33)
    with torch.no_grad():
        want = model(dense, ids)

    assert run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.ts", "--format", "torchscript").code == 0
    scripted = torch.jit.load(str(tmp_path / "m.ts"))
    with torch.no_grad():
        got = scripted(dense, ids)
    assert got.shape == want.shape == (33,)
    torch.testing.assert_close(got, want)

    assert run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.pt").code == 0
    saved = torch.load(tmp_path / "m.pt", weights_only=True)  # plain containers and tensors: no pickle needed
    assert saved["model_config"]["table_sizes"] == cfg.table_sizes
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(saved["model"][name], tensor)


def test_onnx_export_matches_checkpoint(tiny_data, tmp_path):
    onnx = pytest.importorskip("onnx", reason="--format onnx needs onnx (pip install 'dlrmkit[onnx]')")
    result = run_cli(
        "train", "--data", tiny_data, "--max-steps", 10, "--no-progress", "--run-dir", tmp_path / "R", "--search-budget", 0
    )
    assert result.code == 0, result.err
    ckpt = tmp_path / "R" / "checkpoints"
    out = tmp_path / "m.onnx"
    r = run_cli("export", "--checkpoint", ckpt, "--out", out, "--format", "onnx")
    assert r.code == 0, r.err
    onnx.checker.check_model(onnx.load(str(out)))
    ort = pytest.importorskip(
        "onnxruntime", reason="running the ONNX model needs onnxruntime (pip install 'dlrmkit[onnx]')"
    )
    model, cfg = load_model(str(ckpt))
    dense, ids = example_inputs(cfg, batch=37)  # another batch size than the export's example: dynamic axis
    with torch.no_grad():
        want = model(dense, ids).numpy()
    runner = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (got,) = runner.run(["logits"], {"dense": dense.numpy(), "ids": ids.numpy()})
    assert got.shape == (37,)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
