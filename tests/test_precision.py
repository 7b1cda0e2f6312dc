"""Mixed precision: bf16 autocast on CPU, fp16 with dynamic loss scaling on CUDA (on CPU: tests/test_fp16.py)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dlrmkit.errors import DlrmkitError
from helpers import needs_gpu
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.precision import LossScaler, autocast, check_precision, enable_tf32
from dlrmkit.train.step import OneProcessStep

CFG = ModelConfig(num_numerical=5, table_sizes=[50, 7], embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[32, 1])
CUDA = torch.cuda.is_available()


def batch(device="cpu"):
    gen = torch.Generator().manual_seed(0)
    dense = torch.rand(32, 5, generator=gen)
    ids = torch.stack([torch.randint(0, 50, (32,), generator=gen), torch.randint(0, 7, (32,), generator=gen)], 1)
    labels = torch.randint(0, 2, (32,), generator=gen).float()
    return dense.to(device), ids.to(device), labels.to(device)


def test_bf16_autocast_on_cpu_runs_mlps_in_bf16_and_loss_in_fp32():
    model = DLRM(CFG)
    model.reset_parameters(0)
    dense, ids, labels = batch()
    with autocast("bf16", "cpu"):
        logits = model(dense, ids)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    loss.backward()
    assert model.top_mlp[0].weight.grad.dtype == torch.float32  # fp32 weights keep fp32 grads
    with autocast("fp32", "cpu"):
        assert model(dense, ids).dtype == torch.float32


def test_a_bad_precision_is_a_user_error():
    with pytest.raises(DlrmkitError, match="unknown precision"):
        check_precision("fp8")
    with autocast("fp16", "cpu"):
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float16
    assert not enable_tf32("cpu")


@needs_gpu("fp16 autocast and loss scaling on CUDA need a CUDA GPU; none here")
def test_fp16_on_cuda_with_dynamic_loss_scaling():
    model = DLRM(CFG).cuda()
    model.reset_parameters(0)
    dense, ids, labels = batch("cuda")
    scaler = LossScaler("cuda")
    opt = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    step = OneProcessStep(model, [opt], "fp16", amp=lambda: autocast("fp16", "cuda"), scaler=scaler)
    before = model.top_mlp[0].weight.detach().clone()
    with autocast("fp16", "cuda"):
        assert model(dense, ids).dtype == torch.float16
    for _ in range(3):
        step(SimpleNamespace(dense=dense, ids=ids, labels=labels))
    assert scaler.value == LossScaler.INIT_SCALE and scaler.skipped == 0
    assert torch.isfinite(model.top_mlp[0].weight).all()
    assert not torch.equal(before, model.top_mlp[0].weight.detach())


@needs_gpu("TF32 needs a CUDA GPU; none here")
def test_tf32_enabled_on_ampere_and_newer():
    major, _ = torch.cuda.get_device_capability()
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        assert enable_tf32("cuda") == (major >= 8)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
