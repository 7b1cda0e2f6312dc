"""One training step in one process (the `Step` protocol, dlrmkit.model.step): forward under the
autocast context, the loss (`bce_loss`), backward (with fp16, of the loss times the loss scale,
every gradient then unscaled, and a step whose gradients overflowed skipped), the optimizers' steps. The trainer,
`dlrmkit bench` (CPU and GPU) and the benchmark scripts take their one-process steps from here;
under torchrun the trainer takes `parallel/hybrid_step.py` `HybridStep` instead."""

from __future__ import annotations

from typing import Callable

import torch

from dlrmkit.model.step import Step, bce_loss
from dlrmkit.precision import LossScaler, autocast


class OneProcessStep:
    """`step(batch) -> loss`. `amp()` is the autocast context (default: CPU autocast at
    `precision`); `move(batch)`, if given, copies the batch where the model is first;
    `loss_ok(loss)`, if given, may veto the update (a non-finite loss that is to be skipped);
    `scaler`: fp16's loss scaling (default: one, where `precision` is fp16)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: list,
        precision: str = "fp32",
        amp=None,
        move=None,
        loss_ok: Callable[[torch.Tensor], bool] | None = None,
        scaler: LossScaler | None = None,
    ):
        self.model, self.optimizers, self.move, self.loss_ok = model, optimizers, move, loss_ok
        self.amp = amp or (lambda: autocast(precision))
        if scaler is None and precision == "fp16":
            scaler = LossScaler(next(model.parameters()).device)
        self.scaler = scaler

    def __call__(self, batch) -> torch.Tensor:
        if self.move is not None:
            batch = self.move(batch)
        with self.amp():
            loss, _ = bce_loss(self.model(batch.dense, batch.ids), batch.labels, len(batch.labels))
        if self.loss_ok is not None and not self.loss_ok(loss):
            return loss.detach()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            finite = self.scaler.unscale(self.optimizers)
            self.scaler.update(finite)
            if not finite:  # an overflow: no weight moves, and the next step tries a smaller scale
                for opt in self.optimizers:
                    opt.zero_grad(set_to_none=True)
                return loss.detach()
        for opt in self.optimizers:
            opt.step()
        return loss.detach()


def training_step(
    model: torch.nn.Module, optimizers: list, precision: str = "fp32", amp=None, move=None, loss_ok=None
) -> Step:
    """The one-process step (OneProcessStep), as callers that only step build it."""
    return OneProcessStep(model, optimizers, precision, amp, move, loss_ok)
