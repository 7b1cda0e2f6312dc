"""The two implementations of the training step (dlrmkit.model.step.Step): one process
(train/step.py OneProcessStep) and hybrid parallel (parallel/hybrid_step.py HybridStep, here
on one rank without a process group, where every collective is the identity). Both take the
one loss definition, so they train alike; a vetoed loss updates nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlrmkit.data.loader import Batch
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.model.step import Step, bce_loss
from dlrmkit.optim.build import build_optimizers
from dlrmkit.parallel.dist import DistContext
from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig
from dlrmkit.parallel.plan import make_plan
from dlrmkit.parallel.sharded_embedding import DistIds
from dlrmkit.train.step import OneProcessStep

TABLES = [5, 40, 300]
CFG = ModelConfig(3, TABLES, 8, [8], [8, 1])


def batches(n: int, size: int = 16) -> list[Batch]:
    g = torch.Generator().manual_seed(3)
    return [
        Batch(
            torch.rand(size, 3, generator=g),
            torch.stack([torch.randint(0, t, (size,), generator=g) for t in TABLES], 1),
            torch.randint(0, 2, (size,), generator=g).float(),
        )
        for _ in range(n)
    ]


def test_the_loss_is_the_mean_in_one_process_and_a_share_of_it_on_a_rank():
    logits, labels = torch.randn(50), torch.randint(0, 2, (50,)).float()
    loss, total = bce_loss(logits, labels, 50)
    assert torch.equal(loss, F.binary_cross_entropy_with_logits(logits, labels))  # bit for bit
    share, _ = bce_loss(logits[:20], labels[:20], 50)
    rest, _ = bce_loss(logits[20:], labels[20:], 50)
    torch.testing.assert_close(share + rest, loss)
    assert torch.equal(total, F.binary_cross_entropy_with_logits(logits, labels, reduction="sum"))


def test_one_process_and_hybrid_steps_train_alike():
    one = DLRM(CFG)
    one.reset_parameters(1)
    single = OneProcessStep(one, build_optimizers(one, "adagrad", 0.1))
    model = DLRM(CFG, embedding_device="meta")
    plan = make_plan(TABLES, 8, 1, "auto", batch_size=16, min_rows_sharded=16)
    par = HybridParallel(model, plan, DistContext(), ParallelConfig(bucket_bytes=256), seed=1)
    hybrid = par.make_step(build_optimizers(model, "adagrad", 0.1), gate=False)
    assert isinstance(single, Step) and isinstance(hybrid, Step)
    losses = []
    for b in batches(4) * 2:
        a = single(b)
        h = hybrid(Batch(b.dense, DistIds(b.ids, [len(b)]), b.labels))
        torch.testing.assert_close(h, a, rtol=1e-6, atol=1e-7)
        losses.append(float(a))
    assert losses[4] < losses[0], "training must move the loss"
    for p, q in zip(one.dense_parameters(), model.dense_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_a_vetoed_loss_updates_nothing():
    for make in ("one", "hybrid"):
        model = DLRM(CFG, embedding_device="meta" if make == "hybrid" else None)
        if make == "one":
            model.reset_parameters(2)
            step = OneProcessStep(model, build_optimizers(model, "sgd", 0.5), loss_ok=lambda loss: False)
        else:
            plan = make_plan(TABLES, 8, 1, "table_wise", batch_size=16, min_rows_sharded=1)
            par = HybridParallel(model, plan, DistContext(), seed=2)
            step = par.make_step(build_optimizers(model, "sgd", 0.5), loss_ok=lambda loss: False, gate=True)
        before = [p.detach().clone() for p in model.parameters()]
        b = batches(1)[0]
        loss = step(b if make == "one" else Batch(b.dense, DistIds(b.ids, [len(b)]), b.labels))
        assert torch.isfinite(loss)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before)), make
