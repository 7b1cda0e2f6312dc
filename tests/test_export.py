"""`dlrmkit export`: the exported TorchScript (and pt) model gives the checkpoint model's outputs."""

import json

import numpy as np
import pytest
import torch

from dlrmkit.commands.export import example_inputs, load_model
from dlrmkit.data.multi_hot import materialize
from dlrmkit.data.split_binary import open_dataset
from dlrmkit.metrics import log_loss, roc_auc

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


def test_multi_hot_exports_read_the_bags_and_score_as_evaluate(tiny_data, tmp_path):
    """A model trained on fixed-size bags (and bucket tables of its numerical features) records
    its bag sizes; its TorchScript and ONNX exports read the rows as stored, ids [B, sum of the
    sizes], pool each bag as training did, and score the test rows as `evaluate` does."""
    sizes = [3, 2, 1, 5, 4]
    data = tmp_path / "mh"
    materialize(str(tiny_data), str(data), sizes, seed=0, progress=False)
    r = run_cli(
        *("train", "--data", data, "--max-steps", 10, "--no-progress", "--run-dir", tmp_path / "R"),
        *("--search-budget", 0, "--numerical-buckets", 3),
    )
    assert r.code == 0, r.err
    ckpt = tmp_path / "R" / "checkpoints"
    _, cfg = load_model(str(ckpt))
    assert cfg.hotness == sizes + [1] * cfg.num_numerical  # the bucket tables: one id each
    r = run_cli("evaluate", "--checkpoint", ckpt, "--data", data, "--metrics-json", tmp_path / "m.json")
    assert r.code == 0, r.err
    want = json.loads((tmp_path / "m.json").read_text())
    _, _, test = open_dataset(str(data))
    rows = test.read(0, len(test))
    dense, ids = torch.as_tensor(rows.dense).float(), torch.as_tensor(rows.ids.astype(np.int64))
    assert ids.shape == (len(test), sum(sizes))

    def check(logits) -> None:
        probs = 1 / (1 + np.exp(-np.asarray(logits, dtype=np.float64)))
        assert roc_auc(rows.labels, probs) == pytest.approx(want["auc"], abs=1e-6)
        assert log_loss(rows.labels, probs) == pytest.approx(want["logloss"], abs=1e-6)

    assert run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.ts", "--format", "torchscript").code == 0
    with torch.no_grad():
        check(torch.jit.load(str(tmp_path / "m.ts"))(dense, ids).numpy())
    pytest.importorskip("onnx", reason="--format onnx needs onnx (pip install 'dlrmkit[onnx]')")
    ort = pytest.importorskip("onnxruntime", reason="running the ONNX model needs onnxruntime")
    r = run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.onnx", "--format", "onnx")
    assert r.code == 0, r.err
    runner = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    check(runner.run(["logits"], {"dense": dense.numpy(), "ids": ids.numpy()})[0])


def test_a_run_folder_as_checkpoint_names_its_checkpoints(tiny_data, tiny_run, tmp_path):
    """export (and evaluate, which resolve --checkpoint alike) given a run folder: one line naming the
    checkpoint folder inside it."""
    for argv in (("export", "--out", tmp_path / "m.pt"), ("evaluate", "--data", tiny_data)):
        r = run_cli(*argv, "--checkpoint", tiny_run)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and len(lines) == 1, r.err
        assert lines[0].endswith(f"{tiny_run}: no checkpoint there (expected manifest.json or a 'latest' pointer); "
                                 f"a run folder? its checkpoints are in {tiny_run / 'checkpoints'}")  # fmt: skip
    assert not (tmp_path / "m.pt").exists()


def test_a_model_of_numerical_columns_only_exports(tmp_path):
    """A dataset without categorical columns trains on bucket tables alone (the recipe's
    --numerical-buckets): its TorchScript export reads ids [B, 0] and appends the bucket ids
    itself, scoring the test rows as `evaluate` does."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 2))
    y = (x[:, 0] + rng.normal(size=600) > 0).astype(int)
    csv = tmp_path / "num.csv"
    csv.write_text("label,a,b\n" + "".join(f"{l},{a:.4f},{b:.4f}\n" for l, (a, b) in zip(y, x)))
    data = tmp_path / "num"
    assert run_cli("transcode", "--input", csv, "--out", data, "--label", "label", "--numerical", "a,b",
                   "--test-rows", 100).code == 0  # fmt: skip
    r = run_cli("train", "--data", data, "--max-steps", 5, "--no-progress", "--run-dir", tmp_path / "R",
                "--search-budget", 0)  # fmt: skip
    assert r.code == 0, r.err
    ckpt = tmp_path / "R" / "checkpoints"
    _, cfg = load_model(str(ckpt))
    assert cfg.numerical_buckets and len(cfg.table_sizes) == len(cfg.numerical_buckets)
    r = run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.ts", "--format", "torchscript")
    assert r.code == 0, r.err
    assert run_cli("evaluate", "--checkpoint", ckpt, "--data", data, "--metrics-json", tmp_path / "m.json").code == 0
    _, _, test = open_dataset(str(data))
    rows = test.read(0, len(test))
    with torch.no_grad():
        logits = torch.jit.load(str(tmp_path / "m.ts"))(torch.as_tensor(rows.dense).float(),
                                                        torch.zeros(len(test), 0, dtype=torch.int64))  # fmt: skip
    probs = 1 / (1 + np.exp(-logits.numpy().astype(np.float64)))
    assert roc_auc(rows.labels, probs) == pytest.approx(json.loads((tmp_path / "m.json").read_text())["auc"], abs=1e-6)
