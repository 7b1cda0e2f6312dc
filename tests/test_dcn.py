"""The DCNv2 cross interaction: the layer against a plain implementation of its formula and
against torchrec's CrossNet / LowRankCrossNet, and the DLRM built with it through training,
precision, checkpoints and exports."""

from __future__ import annotations

import pytest
import torch

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.config import ModelConfig
from dlrmkit.model.dlrm import DLRM, flops_per_sample
from dlrmkit.model.interaction import CrossInteraction, ParallelCrossInteraction

from helpers import run_cli


def plain_cross(x0: torch.Tensor, mats: list[torch.Tensor], biases: list[torch.Tensor]) -> torch.Tensor:
    """x_{l+1} = x_0 * (W_l x_l + b_l) + x_l sample by sample, W_l = U_l V_l (or the full W_l)."""
    x = x0
    for w, b in zip(mats, biases):
        x = x0 * (torch.einsum("ij,bj->bi", w, x) + b) + x
    return x


def layer_inputs(batch: int = 6, tables: int = 3, dim: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, dim, generator=g, dtype=torch.float64, requires_grad=True)
    pooled = torch.randn(batch, tables, dim, generator=g, dtype=torch.float64, requires_grad=True)
    return dense, pooled


@pytest.mark.parametrize("rank", [None, 3])
def test_cross_layer_output_and_gradients_match_the_formula(rank):
    layer = CrossInteraction(4, 4, layers=3, rank=rank).double()
    layer.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():  # non-zero biases, so their gradient and their place in the formula count
        for b in layer.bias:
            b.normal_()
    dense, pooled = layer_inputs()
    out = layer(dense, pooled)
    assert out.shape == (6, layer.output_size(4)) == (6, 16)
    mats = list(layer.W) if rank is None else [u @ v for u, v in zip(layer.U, layer.V)]
    dense2, pooled2 = (t.detach().clone().requires_grad_() for t in (dense, pooled))
    want = plain_cross(torch.cat([dense2, pooled2.flatten(1)], 1), mats, list(layer.bias))
    torch.testing.assert_close(out, want)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    params = list(layer.parameters())
    got = torch.autograd.grad((out * weights).sum(), [dense, pooled, *params])
    ref = torch.autograd.grad((want * weights).sum(), [dense2, pooled2, *params])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
    assert all(float(g.abs().sum()) > 0 for g in got)


def test_cross_layer_without_numerical_features_crosses_the_embeddings_alone():
    layer = CrossInteraction(3, 4, layers=2, rank=2)
    layer.reset_parameters(torch.Generator().manual_seed(0))
    _, pooled = layer_inputs()
    x0 = pooled.float().flatten(1)
    out = layer(None, pooled.float())
    mats = [u @ v for u, v in zip(layer.U, layer.V)]
    torch.testing.assert_close(out, plain_cross(x0, mats, list(layer.bias)))


@pytest.mark.parametrize("rank", [None, 5])
def test_cross_layer_matches_torchrec_given_the_same_weights(rank):
    crossnet = pytest.importorskip(
        "torchrec.modules.crossnet",
        reason="torchrec is not installed (a scratch virtualenv has it: benchmarks/bench_dcn_torchrec.py says how)",
    )
    layers, n = 3, 16
    ours = CrossInteraction(4, 4, layers, rank)
    ours.reset_parameters(torch.Generator().manual_seed(3))
    with torch.no_grad():
        for b in ours.bias:
            b.normal_()
    if rank is None:
        theirs = crossnet.CrossNet(n, layers)
        with torch.no_grad():
            for i in range(layers):
                theirs.kernels[i].copy_(ours.W[i])
                theirs.bias[i].copy_(ours.bias[i].unsqueeze(1))  # torchrec's full-rank bias is [n, 1]
    else:
        theirs = crossnet.LowRankCrossNet(n, layers, rank)
        with torch.no_grad():
            for i in range(layers):
                theirs.V_kernels[i].copy_(ours.V[i])
                theirs.W_kernels[i].copy_(ours.U[i])
                theirs.bias[i].copy_(ours.bias[i])
    dense, pooled = (t.float().detach().requires_grad_() for t in layer_inputs())
    x0 = torch.cat([dense, pooled.flatten(1)], 1).detach().requires_grad_()
    out, want = ours(dense, pooled), theirs(x0)
    torch.testing.assert_close(out, want)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    (out * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(torch.cat([dense.grad, pooled.grad.flatten(1)], 1), x0.grad)
    for i in range(layers):
        torch.testing.assert_close(ours.bias[i].grad, theirs.bias[i].grad.view(-1))
        if rank is None:
            torch.testing.assert_close(ours.W[i].grad, theirs.kernels[i].grad)
        else:
            torch.testing.assert_close(ours.V[i].grad, theirs.V_kernels[i].grad)
            torch.testing.assert_close(ours.U[i].grad, theirs.W_kernels[i].grad)


def test_dcn_model_shape_init_and_flops():
    cfg = ModelConfig(4, [3, 8, 20], 8, [16, 8], [32, 1], interaction="dcn", dcn_layers=2, dcn_rank=4)
    model = DLRM(cfg)
    model.reset_parameters(0)
    assert model.top_mlp[0].in_features == 8 * 4  # the cross network keeps x_0's width
    assert model.interaction in model.modules() and all(float(b.abs().sum()) == 0 for b in model.interaction.bias)
    cross = {id(p) for p in model.interaction.parameters()}
    assert cross and cross <= {id(p) for p in model.dense_parameters()}  # trained by the dense optimizer
    again = DLRM(cfg)
    again.reset_parameters(0)
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        torch.testing.assert_close(a, b)
    full = ModelConfig(**{**cfg.__dict__, "dcn_rank": None})
    assert flops_per_sample(full) - flops_per_sample(cfg) == 3 * 2 * 2 * (32 * 32 - 2 * 32 * 4)
    dense, ids = torch.rand(5, 4), torch.stack([torch.randint(0, n, (5,)) for n in cfg.table_sizes], 1)
    assert model(dense, ids).shape == (5,)


@pytest.mark.parametrize("rank", [None, 3])
def test_parallel_dcn_model_is_the_logit_layer_over_the_cross_network_and_the_mlp_side_by_side(rank):
    """DCNv2's parallel structure: the cross network and the top MLP's hidden layers both read
    x_0 = [bottom-MLP output, pooled embeddings]; the top MLP's last layer reads their outputs,
    concatenated. Checked against the formula, built from the model's own weights."""
    cfg = ModelConfig(4, [3, 8, 20], 8, [16, 8], [32, 16, 1], interaction="dcn", dcn_layers=2, dcn_rank=rank)
    cfg.dcn_structure = "parallel"
    model = DLRM(cfg).double()
    model.reset_parameters(0)
    assert isinstance(model.interaction, ParallelCrossInteraction)
    assert [m.out_features for m in model.top_mlp if isinstance(m, torch.nn.Linear)] == [1]  # the logit's layer
    assert model.top_mlp[0].in_features == 8 * 4 + 16  # the cross network's width and the MLP's last
    g = torch.Generator().manual_seed(5)
    dense = torch.rand(6, 4, generator=g, dtype=torch.float64)
    ids = torch.stack([torch.randint(0, n, (6,), generator=g) for n in cfg.table_sizes], 1)
    out = model(dense, ids)
    x0 = torch.cat([model.bottom_mlp(dense), model.embeddings(ids).flatten(1)], 1)
    cross = model.interaction.cross
    mats = list(cross.W) if rank is None else [u @ v for u, v in zip(cross.U, cross.V)]
    side = x0
    for layer in model.interaction.mlp:
        side = layer(side)
    head = model.top_mlp[0]
    want = torch.cat([plain_cross(x0, mats, list(cross.bias)), side], 1) @ head.weight.T + head.bias
    torch.testing.assert_close(out, want.squeeze(1))
    out.sum().backward()  # every weight of both branches is trained
    assert all(float(p.grad.abs().sum()) > 0 for p in model.interaction.mlp.parameters())
    assert all(float(p.grad.abs().sum()) > 0 for p in cross.parameters() if p.dim() > 1)
    stacked = ModelConfig(**{**cfg.__dict__, "dcn_structure": "stacked"})
    # the MLP's hidden layers read x_0 itself (32 wide, not the top MLP's own input) and the last
    # layer reads 32 + 16: the same count as the stacked model's plus the wider last layer
    assert flops_per_sample(cfg) - flops_per_sample(stacked) == 3 * 2 * 32
    again = DLRM(cfg).double()
    again.reset_parameters(0)
    torch.testing.assert_close(again(dense, ids), out)


@pytest.mark.parametrize(
    "field, value",
    [("dcn_layers", 0), ("dcn_layers", True), ("dcn_rank", 0), ("dcn_rank", "8"), ("interaction", "x"),
     ("dcn_structure", "beside")],
)  # fmt: skip
def test_model_config_refuses_bad_cross_network_fields(field, value):
    cfg = ModelConfig(4, [3], 8, [8], [1], interaction="dcn")
    setattr(cfg, field, value)
    with pytest.raises(DlrmkitError, match={"interaction": "unknown interaction"}.get(field, field)):
        cfg.check()


@pytest.mark.parametrize("structure", ["stacked", "parallel"])
def test_dcn_train_checkpoint_and_exports(tiny_data, tmp_path, structure):
    """bf16 training with Adagrad tables, then the checkpoint reloads as the same DCN model (its
    structure too) and TorchScript and pt exports give its outputs."""
    from dlrmkit.commands.export import example_inputs, load_model

    run = run_cli(
        *("train", "--data", tiny_data, "--max-steps", 12, "--no-progress", "--run-dir", tmp_path / "R", "--search-budget", 0),
        *("--interaction", "dcn", "--dcn-layers", 2, "--dcn-rank", 4, "--precision", "bf16", "--optimizer", "adagrad"),
        *("--dcn-structure", structure, "--top-mlp", "32,16,1"),
    )
    assert run.code == 0, run.err
    ckpt = tmp_path / "R" / "checkpoints"
    model, cfg = load_model(str(ckpt))
    assert (cfg.interaction, cfg.dcn_layers, cfg.dcn_rank, cfg.dcn_structure) == ("dcn", 2, 4, structure)
    parallel = isinstance(model.interaction, ParallelCrossInteraction)
    assert parallel == (structure == "parallel")
    cross, prefix = (model.interaction.cross, "interaction.cross") if parallel else (model.interaction, "interaction")
    assert float(cross.bias[0].abs().sum()) > 0  # trained, and restored
    dense, ids = example_inputs(cfg, batch=9)
    with torch.no_grad():
        want = model(dense, ids)
    assert run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.ts", "--format", "torchscript").code == 0
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.ts"))(dense, ids), want)
    assert run_cli("export", "--checkpoint", ckpt, "--out", tmp_path / "m.pt").code == 0
    saved = torch.load(tmp_path / "m.pt", weights_only=True)
    assert (saved["model_config"]["dcn_rank"], saved["model_config"]["dcn_structure"]) == (4, structure)
    torch.testing.assert_close(saved["model"][f"{prefix}.U.1"], cross.U[1].detach())
    older = {k: v for k, v in cfg.__dict__.items() if k != "dcn_structure"}  # a checkpoint from before the field
    assert ModelConfig(**older).dcn_structure == "stacked"


def test_dcn_onnx_export(tiny_data, tmp_path):
    onnx = pytest.importorskip("onnx", reason="--format onnx needs onnx (pip install 'dlrmkit[onnx]')")
    run = run_cli(
        *("train", "--data", tiny_data, "--max-steps", 4, "--no-progress", "--run-dir", tmp_path / "R", "--search-budget", 0),
        *("--interaction", "dcn", "--dcn-layers", 2),
    )
    assert run.code == 0, run.err
    out = tmp_path / "m.onnx"
    r = run_cli("export", "--checkpoint", tmp_path / "R" / "checkpoints", "--out", out, "--format", "onnx")
    assert r.code == 0, r.err
    onnx.checker.check_model(onnx.load(str(out)))


def test_mlperf_dcnv2_preset_is_the_reference_recipe():
    from dlrmkit.config import PRESETS, TrainConfig, resolve_run

    p = PRESETS["mlperf-dcnv2"]
    assert (p.embedding_dim, p.bottom_mlp, p.top_mlp) == (128, [512, 256, 128], [1024, 1024, 512, 256, 1])
    assert (p.interaction, p.dcn_layers, p.dcn_rank) == ("dcn", 3, 512)
    assert (p.optimizer, p.lr, p.batch_size, p.evals_per_epoch) == ("adagrad", 0.005, 65536, 20)
    assert (p.warmup_steps, p.decay_start, p.decay_steps) == (0, 0, 0)
    cfg, model = resolve_run(TrainConfig.of(data="x", preset="mlperf-dcnv2", dcn_rank=64), [10, 20], 13)
    assert (model.interaction, model.dcn_layers, model.dcn_rank) == ("dcn", 3, 64)
    assert cfg.selection.evals_per_epoch == 20 and cfg.optimizer.lr == 0.005


@pytest.mark.slow  # trains the scaled-down recipe for two epochs (about 35 s on 2 cores)
def test_mlperf_dcnv2_recipe_scaled_down_reaches_the_optimal_auc(tmp_path):
    """Multi-hot bags (MLPerf's expansion) from a cross-network teacher; the mlperf-dcnv2 preset's
    recipe (3 cross layers, Adagrad, 20 evaluations per epoch) at a small width, batch and LR
    scale ends within 0.02 of the Bayes-optimal test AUC."""
    import json

    data = tmp_path / "d"
    r = run_cli(
        *("synth", "--out", data, "--cardinalities", "10,40,200,1000", "--multi-hot", "3,2,1,5"),
        *("--teacher", "cross", "--rows", 200000, "--test-rows", 20000, "--no-progress"),
    )
    assert r.code == 0, r.err
    r = run_cli(
        *("train", "--data", data, "--preset", "mlperf-dcnv2", "--batch-size", 256, "--lr", 0.02, "--epochs", 2),
        *("--embedding-dim", 32, "--bottom-mlp", "64,32", "--top-mlp", "128,64,1", "--dcn-rank", 32),
        *("--threads", 1, "--no-progress", "--no-final-checkpoint", "--run-dir", tmp_path / "R"),
        *("--metrics-json", tmp_path / "m.json"),
    )
    assert r.code == 0, r.err
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["optimal_auc"] > 0.8
    assert m["optimal_auc"] - m["auc"] < 0.02, m
