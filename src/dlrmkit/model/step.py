"""What a training step is, for one process and for hybrid parallelism alike: the `Step` protocol
(train/step.py `OneProcessStep`, parallel/hybrid_step.py `HybridStep`) and the one definition of
the loss it back-propagates."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class Step(Protocol):
    """One training step: forward, loss, backward, the optimizers' updates (all of them or, for
    a non-finite loss that may be skipped, none). Returns the global batch's mean loss, detached
    and still a tensor (no host sync). Nothing passes from one call to the next."""

    optimizers: list

    def __call__(self, batch) -> torch.Tensor: ...


def bce_loss(logits: torch.Tensor, labels: torch.Tensor, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, sum of BCE over these rows): the loss is this rank's share of the global batch's
    mean, sum(BCE over the local rows) / global batch, so gradients summed over ranks are one
    process's. In one process (global batch = local rows) it is the mean, bit for bit."""
    total = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum")
    return total / global_batch, total
