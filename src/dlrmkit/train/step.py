"""One training step, written once: forward under the autocast context, BCE loss, backward, the
optimizers' steps. The trainer, `dlrmkit bench` (CPU and GPU), the sharded bench and the benchmark
scripts all take their steps from here. Hybrid parallelism plugs in through `StepHooks`
(dlrmkit.parallel.hybrid.HybridParallel implements them): it starts the embedding exchange before
the forward, scales the loss to this rank's share of the global mean, and sums gradients over
ranks between backward and the updates."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from dlrmkit.precision import autocast


class StepHooks:
    """What a parallel wrapper changes in the step. These defaults are one process's step; a
    wrapper provides the same three methods (HybridParallel does, without importing this module,
    as parallel/ sits below train/)."""

    def before_forward(self, batch) -> None:
        """Called with the (moved) batch just before the model runs."""

    def loss(self, logits: torch.Tensor, batch) -> torch.Tensor:
        """The loss that backward takes (under the autocast context)."""
        return F.binary_cross_entropy_with_logits(logits, batch.labels)

    def backward_and_update(
        self, loss: torch.Tensor, optimizers: list, loss_ok: Callable[[torch.Tensor], bool] | None
    ) -> torch.Tensor:
        """Backward and the optimizers' steps (none of them when `loss_ok(loss)` says no).
        Returns the step's loss, detached and still a tensor."""
        if loss_ok is not None and not loss_ok(loss):
            return loss.detach()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in optimizers:
            opt.step()
        return loss.detach()


ONE_PROCESS = StepHooks()


def training_step(
    model: torch.nn.Module,
    optimizers: list,
    precision: str = "fp32",
    amp=None,
    move=None,
    loss_ok: Callable[[torch.Tensor], bool] | None = None,
    hooks: StepHooks = ONE_PROCESS,
) -> Callable:
    """A function batch -> loss (detached, still a tensor: no host sync) that takes one step.
    `amp()` is the autocast context (default: CPU autocast at `precision`); `move(batch)`, if
    given, copies the batch where the model is first; `loss_ok(loss)`, if given, may veto the
    update (a non-finite loss that is to be skipped); `hooks`: the parallel wrapper's changes."""
    amp = amp or (lambda: autocast(precision))

    def step(batch) -> torch.Tensor:
        if move is not None:
            batch = move(batch)
        hooks.before_forward(batch)
        with amp():
            loss = hooks.loss(model(batch.dense, batch.ids), batch)
        return hooks.backward_and_update(loss, optimizers, loss_ok)

    return step
