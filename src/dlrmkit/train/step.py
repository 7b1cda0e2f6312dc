"""One training step, written once: forward under the autocast context, BCE loss, backward, the
optimizers' steps. The trainer, `dlrmkit bench` (CPU and GPU) and the benchmark scripts all take
their steps from here; the sharded step (parallel/hybrid.py) wraps the same model call."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from dlrmkit.precision import autocast


def training_step(model: torch.nn.Module, optimizers: list, precision: str = "fp32", amp=None, move=None,
                  loss_ok: Callable[[torch.Tensor], bool] | None = None) -> Callable:
    """A function batch -> loss (detached, still a tensor: no host sync) that takes one step.
    `amp()` is the autocast context (default: CPU autocast at `precision`); `move(batch)`, if
    given, copies the batch where the model is first; `loss_ok(loss)`, if given, may veto the
    update (a non-finite loss that is to be skipped)."""
    amp = amp or (lambda: autocast(precision))

    def step(batch) -> torch.Tensor:
        if move is not None:
            batch = move(batch)
        with amp():
            loss = F.binary_cross_entropy_with_logits(model(batch.dense, batch.ids), batch.labels)
        if loss_ok is not None and not loss_ok(loss):
            return loss.detach()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in optimizers:
            opt.step()
        return loss.detach()

    return step
