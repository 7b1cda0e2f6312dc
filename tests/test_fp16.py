"""--precision fp16: autocast in fp16 and dynamic loss scaling (precision.LossScaler) whose scale
reaches every gradient of a step, the tables' deferred ones included; an overflow skips the step
(no weight moves) and halves the scale; finite steps grow it; a checkpoint keeps it and --resume
takes it back. Runs on CPU (fp16 arithmetic in software there: slow, so the models are tiny)."""

import json
import os

from types import SimpleNamespace

import pytest
import torch

from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.optim import split_sgd_kernel
from dlrmkit.optim.build import build_optimizers
from dlrmkit.precision import LossScaler
from dlrmkit.train.step import OneProcessStep
from helpers import run_cli

CFG = ModelConfig(
    num_numerical=4, table_sizes=[40, 9, 25], embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[16, 1], wide=True, fm=True
)


class Batch:
    def __init__(self, seed: int = 0, rows: int = 64):
        gen = torch.Generator().manual_seed(seed)
        self.dense = torch.rand(rows, 4, generator=gen)
        self.ids = torch.stack([torch.randint(0, n, (rows,), generator=gen) for n in CFG.table_sizes], 1)
        self.labels = torch.randint(0, 2, (rows,), generator=gen).float()


def model_and_optimizers(embedding_optimizer: str):
    model = DLRM(CFG)
    model.reset_parameters(0)
    return model, build_optimizers(model, "sgd", 0.5, embedding_optimizer)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("embedding_optimizer", ["sgd", "adagrad", "rowwise-adagrad"])
def test_the_scale_reaches_every_gradient(embedding_optimizer):
    """One fp16 step at scale 2**16 moves every weight, the tables too, as the fp32 step does (to
    fp16's rounding): a table gradient left scaled would move its rows 65,536 times as far."""
    ref_model, ref_opts = model_and_optimizers(embedding_optimizer)
    model, opts = model_and_optimizers(embedding_optimizer)
    tables = [p for p in model.parameters() if getattr(p, "bag_grads", None) is not None]
    assert bool(tables) == (split_sgd_kernel.fused_kernel() is not None)  # the deferred path, where it is built
    before = weights(model)
    scaler = LossScaler(scale=2.0**16)
    OneProcessStep(ref_model, ref_opts, "fp32")(Batch())
    OneProcessStep(model, opts, "fp16", scaler=scaler)(Batch())
    after, ref = weights(model), weights(ref_model)
    assert scaler.skipped == 0 and scaler.value == 2.0**16
    for name in before:
        moved, expected = after[name] - before[name], ref[name] - before[name]
        if name.startswith("embeddings"):
            assert expected.abs().max() > 0, name  # the batch touched these tables
        # fp16's rounding (a ReLU unit near 0 may flip) moves a step by percents, a scale left in by 2**16
        ratio = moved.norm().item() / expected.norm().item()
        assert 0.8 < ratio < 1.25, (name, ratio)
        if name.startswith("embeddings"):
            torch.testing.assert_close(moved, expected, atol=0.02 * expected.abs().max().item(), rtol=0.02)
    assert all(not p.bag_grads for p in tables)  # consumed


def test_an_overflow_skips_the_step_and_halves_the_scale():
    model, opts = model_and_optimizers("adagrad")
    before = weights(model)
    scaler = LossScaler(scale=2.0**120)  # the scaled loss is finite in fp32; its fp16 gradients are not
    loss = OneProcessStep(model, opts, "fp16", scaler=scaler)(Batch())
    assert torch.isfinite(loss)
    assert scaler.skipped == 1 and scaler.value == 2.0**119
    for name, w in weights(model).items():
        assert torch.equal(w, before[name]), name
    assert all(not getattr(p, "bag_grads", None) for p in model.parameters())  # dropped, not carried over
    assert all(p.grad is None for p in model.parameters())
    OneProcessStep(model, opts, "fp16", scaler=LossScaler())(Batch(1))  # the next step at a sane scale moves them
    assert any(not torch.equal(w, before[n]) for n, w in weights(model).items())


def test_finite_steps_grow_the_scale_and_an_overflow_resets_the_count():
    scaler = LossScaler(scale=8.0)
    scaler.GROWTH_INTERVAL = 3
    for _ in range(3):
        scaler.update(True)
    assert scaler.value == 16.0 and scaler.growth_tracker == 0
    scaler.update(True)
    scaler.update(False)
    assert scaler.value == 8.0 and scaler.growth_tracker == 0 and scaler.skipped == 1


def test_sparse_gradients_are_unscaled_too():
    """Tables on a device without the fused kernel keep sparse gradients (F.embedding(sparse=True))."""
    w = torch.nn.Parameter(torch.zeros(10, 4))
    rows = torch.tensor([[1, 1, 7]])
    w.grad = torch.sparse_coo_tensor(rows, torch.full((3, 4), 8.0), (10, 4), check_invariants=True)
    opt = torch.optim.SGD([w], lr=1.0)
    dense = torch.nn.Parameter(torch.zeros(3))
    dense.grad = torch.full((3,), 8.0)
    scaler = LossScaler(scale=4.0)
    assert scaler.unscale([opt, torch.optim.SGD([dense], lr=1.0)])
    assert torch.equal(w.grad.to_dense()[1], torch.full((4,), 4.0)) and torch.equal(dense.grad, torch.full((3,), 2.0))
    dense.grad[0] = float("inf")
    assert not scaler.unscale([torch.optim.SGD([dense], lr=1.0)])


def _train(tiny_data, tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    r = run_cli(
        "train", "--data", tiny_data, "--preset", "tiny", "--precision", "fp16", "--no-progress",
        "--run-dir", tmp_path / name, "--metrics-json", out, "--log-every", "1", *extra,
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    return json.loads(out.read_text()), r


def test_train_fp16_learns_keeps_its_scale_in_checkpoints_and_resumes_it(tiny_data, tmp_path):
    """`train --precision fp16` ends at fp32's AUC (to 0.01), reports its scale and overflow steps;
    the checkpoint records the scale, --resume continues from it to the uninterrupted run's figures,
    and a crafted scale is refused naming the field."""
    from dlrmkit.checkpoint import save_load as ckpt

    full, r = _train(tiny_data, tmp_path, "full", "--max-steps", "60")
    assert "note: --precision fp16 on the CPU" in r.err  # the CPU's half precision is bf16
    fp32 = tmp_path / "fp32.json"
    r = run_cli("train", "--data", tiny_data, "--preset", "tiny", "--no-progress", "--run-dir", tmp_path / "fp32",
                "--metrics-json", fp32, "--max-steps", "60")  # fmt: skip
    assert r.code == 0, r.err
    assert full["auc"] == pytest.approx(json.loads(fp32.read_text())["auc"], abs=0.01)
    assert full["loss_scale"] == 2.0**16 and full["overflow_steps"] == 0
    ck = tmp_path / "ck"
    _train(tiny_data, tmp_path, "half", "--max-steps", "30", "--checkpoint-dir", ck)
    path = ckpt.latest_checkpoint(str(ck))
    manifest = ckpt.read_manifest(path)
    assert manifest["loss_scale"] == 2.0**16 and manifest["loss_scale_growth"] == 30
    resumed, r = _train(tiny_data, tmp_path, "resumed", "--max-steps", "60", "--checkpoint-dir", ck, "--resume")
    assert "resumed from" in r.err + r.out
    assert resumed["logloss"] == pytest.approx(full["logloss"], abs=1e-6)
    # the resumed run went on from the saved count: 60 finite steps in all
    path = ckpt.latest_checkpoint(str(ck))
    manifest = ckpt.read_manifest(path)
    assert manifest["loss_scale_growth"] == 60
    manifest["loss_scale"] = -1.0
    json.dump(manifest, open(os.path.join(path, ckpt.MANIFEST), "w"))
    r = run_cli("train", "--data", tiny_data, "--preset", "tiny", "--precision", "fp16", "--no-progress",
                "--run-dir", tmp_path / "bad", "--max-steps", "70", "--checkpoint-dir", ck, "--resume")  # fmt: skip
    assert r.code == 2 and "field 'loss_scale' is -1.0" in r.err, r.err


class OneRankReportsAnOverflow:
    """A transport whose sum adds another rank's overflow flag to this rank's."""

    def all_reduce(self, tensor, kind="allreduce"):
        return SimpleNamespace(wait=lambda: tensor + 1)


def test_an_overflow_on_another_rank_skips_this_ranks_step():
    """Under torchrun the ranks sum their overflow flags: this rank's gradients are finite, another
    rank's are not, so no weight moves here either and the scale halves as it does there."""
    from dlrmkit.parallel.hybrid_step import HybridStep

    model, opts = model_and_optimizers("sgd")
    sharded = SimpleNamespace(replicated_parameters=lambda: [], exchanged_replicas=lambda: [])
    par = SimpleNamespace(sharded=sharded, transport=OneRankReportsAnOverflow(), to_device=None)
    scaler = LossScaler(scale=2.0**10)
    step = HybridStep(par, opts, scaler=scaler)
    before = weights(model)
    batch = Batch()
    scaler.scale(torch.nn.functional.binary_cross_entropy_with_logits(model(batch.dense, batch.ids), batch.labels)).backward()
    assert not step.unscaled_everywhere(torch.device("cpu"))
    assert scaler.value == 2.0**9 and scaler.skipped == 1
    assert all(p.grad is None and not getattr(p, "bag_grads", None) for p in model.parameters())
    for o in opts:
        o.step()  # nothing left to apply
    for name, w in weights(model).items():
        assert torch.equal(w, before[name]), name


def test_loss_scale_stays_where_its_reciprocal_is_finite():
    """A run of overflows halves the scale down to LossScaler.MIN_SCALE and no further: below it
    the float32 reciprocal that unscales the gradients would be infinite."""
    scaler = LossScaler()
    for _ in range(60):  # 2**16 halved 60 times would be 2**-44
        scaler.update(False)
    assert scaler.value == LossScaler.MIN_SCALE and scaler.skipped == 60
    assert torch.isfinite(scaler.scale_t.double().reciprocal().float()).all()
    scaler.update(True)
    assert scaler.value == LossScaler.MIN_SCALE and scaler.growth_tracker == 1


@pytest.mark.parametrize(
    "fields, scaler, needle",
    [
        ({"loss_scale": 1e-30, "loss_scale_growth": 0}, True, "field 'loss_scale' is 1e-30"),  # 1/scale: inf in float32
        ({"loss_scale": 2.0**-25, "loss_scale_growth": 0}, True, "field 'loss_scale'"),
        ({"loss_scale": "abc", "loss_scale_growth": [1]}, False, "field 'loss_scale' is 'abc'"),  # an fp32 run resuming
        ({"loss_scale": 1024.0}, True, "field 'loss_scale_growth' is None"),
        ({"train_config": {"precision": "fp16"}}, True, "an fp16 checkpoint without its field 'loss_scale'"),
    ],
)
def test_resume_refuses_a_loss_scale_it_could_not_train_with(fields, scaler, needle):
    from dlrmkit.errors import DlrmkitError
    from dlrmkit.train.run_checkpoint import restore_loss_scale

    with pytest.raises(DlrmkitError, match="manifest.json: ") as err:
        restore_loss_scale(LossScaler() if scaler else None, fields, "ck/step_5/manifest.json")
    assert needle in str(err.value) and "refused" in str(err.value)


def test_resume_takes_the_recorded_scale_or_keeps_the_start_for_another_precision():
    from dlrmkit.train.run_checkpoint import restore_loss_scale

    scaler = LossScaler()
    restore_loss_scale(scaler, {"loss_scale": 2.0**-24, "loss_scale_growth": 7}, "m")
    assert scaler.value == 2.0**-24 and scaler.growth_tracker == 7
    scaler = LossScaler()
    restore_loss_scale(scaler, {"train_config": {"precision": "fp32"}}, "m")  # an fp32 checkpoint
    assert scaler.value == LossScaler.INIT_SCALE and scaler.growth_tracker == 0
