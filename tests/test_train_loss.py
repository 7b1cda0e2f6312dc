"""The training loss stays a tensor between log points: without --skip-nonfinite the loop reads it
on the host (a sync that stalls a GPU's queue) only at log points, evaluations, checkpoints and
the end; a non-finite loss is still reported with its step, at the next of those points."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dlrmkit.config import TrainConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.train.trainer import Trainer
from dlrmkit.train.train_loss import TrainLoss


class HostReads(torch.Tensor):
    """A tensor that records the trainer's step whenever it, or any tensor computed from it, is
    read on the host (every way a tensor becomes a Python number or list)."""

    steps: list[int] = []
    trainer: Trainer | None = None

    def _read(self) -> None:
        HostReads.steps.append(HostReads.trainer.step if HostReads.trainer is not None else -1)

    def item(self):
        self._read()
        return super().item()

    def tolist(self):
        self._read()
        return super().tolist()

    def numpy(self, *args, **kwargs):
        self._read()
        return super().numpy(*args, **kwargs)

    def __float__(self):
        self._read()
        return super().__float__()

    def __int__(self):
        self._read()
        return super().__int__()

    def __bool__(self):
        self._read()
        return super().__bool__()

    def __index__(self):
        self._read()
        return super().__index__()


def watched_trainer(data, **kw) -> Trainer:
    cfg = TrainConfig.of(
        data=str(data),
        preset="tiny",
        batch_size=64,
        max_steps=12,
        log_every=5,
        eval_every=0,
        progress=False,
        shuffle=False,
        **kw,
    )
    trainer = Trainer(cfg)
    step_fn = trainer.step_fn
    trainer.step_fn = lambda batch: step_fn(batch).as_subclass(HostReads)
    HostReads.steps, HostReads.trainer = [], trainer
    return trainer


def test_the_subclass_sees_every_kind_of_host_read():
    HostReads.steps, HostReads.trainer = [], None
    t = torch.tensor(0.5).as_subclass(HostReads)
    derived = torch.where(torch.isfinite(t), t * 2, t)  # results of ops on it are watched too
    float(t), t.item(), derived.tolist(), bool(derived > 0), int(derived), torch.stack([t, derived]).tolist()
    assert len(HostReads.steps) == 6


def test_loss_is_read_on_the_host_only_at_log_points_without_skipping(tiny_data):
    trainer = watched_trainer(tiny_data)
    m = trainer.fit()
    assert m["steps"] == 12 and math.isfinite(m["train_loss"])
    # log points 5 and 10, then the end of training (step 12); never steps 1-4, 6-9, 11
    assert set(HostReads.steps) == {5, 10, 12}, HostReads.steps
    assert len(HostReads.steps) <= 3 * 3  # the non-finite check and the mean at each


def test_skipping_reads_the_loss_every_step(tiny_data):
    """The trade-off: the skip decision needs the value before the update, so it syncs each step."""
    trainer = watched_trainer(tiny_data, skip_nonfinite=1)
    trainer.fit()
    assert set(range(1, 13)) <= set(HostReads.steps)


def test_nonfinite_loss_without_skipping_stops_at_the_next_log_point_naming_its_step(tiny_data, monkeypatch):
    monkeypatch.setenv("DLRMKIT_FAULT", "train:nan-loss-3")  # step 3's loss reads as NaN
    trainer = watched_trainer(tiny_data)
    with pytest.raises(DlrmkitError, match=r"loss is nan at step 3; .*--skip-nonfinite"):
        trainer.fit()
    assert trainer.step == 5  # found at the first log point after it, not before
    assert trainer.last_eval is None  # nothing evaluated the weights it touched


def test_train_loss_window_mean_and_first_nonfinite():
    tl = TrainLoss(window=3)
    assert math.isnan(tl.mean()) and tl.first_nonfinite() is None
    for step, v in enumerate([0.9, 0.7, 0.5, 0.3], start=1):
        tl.add(torch.tensor(v), step)
    assert tl.mean() == pytest.approx(np.mean(np.float32([0.7, 0.5, 0.3])), rel=1e-7)
    assert tl.first_nonfinite() is None
    tl.add(torch.tensor(float("inf")), 5)
    tl.add(torch.tensor(0.2), 6)
    tl.add(torch.tensor(float("nan")), 7)
    assert tl.first_nonfinite() == (5, float("inf"))  # the first one, not the latest


def test_train_loss_finds_the_first_nonfinite_across_folded_chunks():
    from dlrmkit.train.train_loss import FOLD

    tl = TrainLoss()
    values = torch.rand(3 * FOLD + 17)
    values[FOLD + 5] = float("-inf")
    values[2 * FOLD + 1] = float("nan")
    for i, v in enumerate(values):
        tl.add(v, 1000 + i)
    assert tl.first_nonfinite() == (1000 + FOLD + 5, float("-inf"))
    assert tl.first_nonfinite() is None  # a check consumes what it checked
    assert tl.mean() == pytest.approx(float(np.mean(values[-100:].tolist())))


def test_restored_window_mixes_with_losses_of_another_device():
    """--resume on a GPU: the checkpoint's window comes back as CPU tensors, the steps' losses are
    GPU tensors; one tensor of both (what mean and recent_values stack) is refused by torch.stack.
    'meta' stands in for the GPU here."""
    tl = TrainLoss(window=3)
    tl.restore([0.9, 0.7])
    tl.add(torch.tensor(0.5, device="meta"), 3)
    assert tl._window().device.type == "meta" and tl._window().shape == (3,)
    cpu = TrainLoss(window=3)
    cpu.restore([0.9, 0.7])
    cpu.add(torch.tensor(0.5), 3)
    assert cpu.recent_values() == pytest.approx([0.9, 0.7, 0.5]) and cpu.mean() == pytest.approx(0.7)
