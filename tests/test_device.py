"""`dlrmkit bench --device`: option checks on any machine; the GPU step itself (tables on the GPU
or in host memory, pinned batches, CUDA graphs) against the CPU step where a CUDA GPU is present."""

import copy
import json

import pytest
import torch

from helpers import needs_gpu, run_cli
from dlrmkit.errors import DlrmkitError
from dlrmkit import device as dev
from dlrmkit.perf import gpu_step as gpu

TINY_CFG = dict(num_numerical=13, table_sizes=[1000] * 4, embedding_dim=16, bottom_mlp=[32, 16], top_mlp=[32, 1])


NEEDS_GPU = needs_gpu("the GPU step needs a CUDA GPU; none here")


def test_resolve_device():
    assert dev.resolve_device("cpu") == torch.device("cpu")
    assert dev.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DlrmkitError, match="--device must be"):
        dev.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DlrmkitError, match="--device cuda needs a CUDA GPU"):
            dev.resolve_device("cuda")


def test_gpu_step_limits_are_one_line_errors():
    cuda = torch.device("cuda")  # a device object needs no GPU
    gpu.check_device_options(cuda, parallel=False, baselines=False, profile=False)  # the supported case
    gpu.check_device_options(torch.device("cpu"), parallel=True, baselines=True, profile=True)  # CPU: not this check's
    for kwargs, message in (
        (dict(parallel=True, baselines=False, profile=False), "single process only"),
        (dict(parallel=False, baselines=True, profile=False), "time CPU loops"),
        (dict(parallel=False, baselines=False, profile=True), "--profile/--plot not yet"),
    ):
        with pytest.raises(DlrmkitError, match=message):
            gpu.check_device_options(cuda, **kwargs)


def test_device_tables_of_mixed_widths_are_refused_before_any_copy():
    from dlrmkit.model.embedding import EmbeddingCollection

    model = torch.nn.Module()  # DLRM has one width; an EmbeddingCollection may hold several
    model.embeddings = EmbeddingCollection([100, 100, 50], [16, 16, 8])
    with pytest.raises(DlrmkitError, match="mixed widths"):
        dev.place_model(model, torch.device("cuda"), "device")
    assert model.embeddings.tables[0].weight.device.type == "cpu"


def test_cpu_placement_changes_nothing():
    from dlrmkit.perf.workload import random_batches
    from dlrmkit.model.dlrm import DLRM, ModelConfig

    cfg = ModelConfig(**TINY_CFG)
    model = DLRM(cfg)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    dev.place_model(model, torch.device("cpu"), "host")
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert not model.embeddings._forward_hooks
    batches = random_batches(cfg, 8, 1, 0)
    assert dev.pin_batches(batches, torch.device("cpu")) is batches
    assert dev.synchronizer(torch.device("cpu")) is None


@pytest.mark.parametrize("placement", ["device", "host"])
def test_every_tensor_but_host_tables_moves_to_the_device(placement):
    """The meta device stands in for a GPU: every parameter and buffer of the model moves, its own
    (the numerical features' mean and deviation, which the model holds itself) included; tables in
    host memory stay."""
    from dlrmkit.model.dlrm import DLRM, ModelConfig

    model = DLRM(ModelConfig(**TINY_CFG, wide=True, fm=True, numerical_mean=[0.0] * 13, numerical_std=[1.0] * 13))
    dev.place_model(model, torch.device("meta"), placement)
    tables = {id(t) for t in [*model.embeddings.parameters(), *model.embeddings.buffers()]}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        expected = "cpu" if placement == "host" and id(t) in tables else "meta"
        assert t.device.type == expected, name
    assert model.numerical_mean.device.type == "meta"


def test_gpu_step_function_on_the_cpu_is_the_cpu_step():
    """The GPU step's own code (batch copy, CUDA autocast context, BCE, optimizers) run on the CPU,
    where every copy is a no-op and CUDA autocast does not apply: the same bits as bench's step."""
    from dlrmkit.perf.workload import random_batches
    from dlrmkit.train.step import training_step
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.optim.build import build_optimizers

    cfg = ModelConfig(**TINY_CFG)
    a = DLRM(cfg)
    a.reset_parameters(0)
    b = copy.deepcopy(a)
    init = copy.deepcopy(a.state_dict())
    cpu = torch.device("cpu")
    step_a = training_step(a, build_optimizers(a, "sgd", 0.1))
    step_b = gpu.gpu_training_step(b, build_optimizers(b, "sgd", 0.1), "fp32", cpu, cpu)
    for batch in random_batches(cfg, 64, 3, 0):
        step_a(batch)
        step_b(batch)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    assert not torch.equal(a.state_dict()["top_mlp.0.weight"], init["top_mlp.0.weight"])  # it trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without a GPU gives")
def test_bench_device_cuda_without_gpu_says_so():
    r = run_cli("bench", "--device", "cuda", "--steps", "1", "--windows", "1")
    assert r.code != 0 and "--device cuda needs a CUDA GPU" in r.err
    r = run_cli("bench", "--device", "cpu", "--table-placement", "device", "--steps", "1", "--windows", "1")
    assert r.code != 0 and "--table-placement device needs --device cuda" in r.err


def _steps(placement: str, graphs: bool, steps: int = 3):
    """Weights after `steps` SGD steps: the CPU step, and the GPU step with tables on the device or
    in host memory (the caller turns TF32 off, so the GPU computes in fp32 as the CPU does)."""
    from dlrmkit.perf.workload import random_batches
    from dlrmkit.train.step import training_step
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.model.embedding import FusedTable
    from dlrmkit.optim.build import build_optimizers

    cfg = ModelConfig(**TINY_CFG)
    cpu_model = DLRM(cfg)
    cpu_model.reset_parameters(0)
    gpu_model = copy.deepcopy(cpu_model)
    cuda = torch.device("cuda")
    dev.place_model(gpu_model, cuda, placement)
    ids_device = cuda if placement == "device" else torch.device("cpu")
    batches = random_batches(cfg, 64, steps, 0)
    cpu_step = training_step(cpu_model, build_optimizers(cpu_model, "sgd", 0.1))
    pinned = dev.pin_batches(batches, cuda)  # the next batch is prefetched on a side stream
    gpu_step = gpu.gpu_training_step(
        gpu_model, build_optimizers(gpu_model, "sgd", 0.1), "fp32", cuda, ids_device, pinned
    )
    # GPU tables keep their gradients by bag (SparseSGD's index_add_ path); host tables, by the CPU kernel's rule
    tables = [m for m in gpu_model.embeddings.modules() if isinstance(m, FusedTable)]
    assert tables and (placement == "host" or all(t.deferred for t in tables))
    if graphs:
        gpu.graph_mlps(gpu_model, pinned[0], "fp32", cuda, ids_device)
        assert "forward" in vars(gpu_model.top_mlp) and "forward" in vars(gpu_model.bottom_mlp)  # graphed
    for b, p in zip(batches, pinned):
        cpu_step(b)
        gpu_step(p)
    torch.cuda.synchronize()
    return cpu_model.state_dict(), {k: v.cpu() for k, v in gpu_model.state_dict().items()}


@NEEDS_GPU
@pytest.mark.parametrize("placement", ["device", "host"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_gpu_step_matches_cpu_step(placement, graphs, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cpu_state, gpu_state = _steps(placement, graphs)
    assert cpu_state.keys() == gpu_state.keys()
    for k in cpu_state:
        torch.testing.assert_close(gpu_state[k], cpu_state[k], rtol=1e-4, atol=1e-5, msg=k)


@NEEDS_GPU
@pytest.mark.parametrize(
    "precision,optimizer,placement",
    [
        ("fp32", "sgd", "auto"),
        ("bf16", "split-sgd", "auto"),
        ("bf16", "split-sgd", "host"),
        ("fp32", "adagrad", "host"),
    ],
)
def test_bench_runs_on_the_gpu(tmp_path, monkeypatch, precision, optimizer, placement):
    from dlrmkit.commands import bench
    from dlrmkit.model.dlrm import ModelConfig

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    monkeypatch.setitem(bench.BENCH_MODELS, "test-tiny", ModelConfig(**TINY_CFG))
    out = tmp_path / "bench.json"
    r = run_cli(
        "bench",
        "--device",
        "cuda",
        "--model",
        "test-tiny",
        "--batch-size",
        "256",
        "--steps",
        "2",
        "--windows",
        "2",
        "--warmup",
        "2",
        "--precision",
        precision,
        "--optimizer",
        optimizer,
        "--table-placement",
        placement,
        "--json",
        out,
    )
    assert r.code == 0, r.err
    res = json.loads(out.read_text())
    assert res["device"] == torch.cuda.get_device_name() and res["samples_per_s"] > 0
    assert res["table_placement"] == ("device" if placement == "auto" else placement)
