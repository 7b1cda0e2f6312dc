"""The training loss between log points, kept as tensors where the step computed it (on a GPU:
on the GPU). Reading a loss on the host waits for every queued kernel, so a loop that read it
each step would stall the GPU's queue once a step; here the values are read at log, evaluation
and checkpoint points only."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch


class TrainLoss:
    """The last `window` losses (their mean is the logged train loss) and, without a host sync,
    the first non-finite loss added (its step and value), for a check at the next read."""

    def __init__(self, window: int = 100):
        self.recent: deque[torch.Tensor] = deque(maxlen=window)
        self._bad_step: torch.Tensor | None = None  # 0: none yet
        self._bad_loss: torch.Tensor | None = None

    def add(self, loss: torch.Tensor, step: int) -> None:
        """Records step `step`'s loss: a few tiny ops on its device, no host sync."""
        loss = loss.detach().reshape(())
        self.recent.append(loss)
        if self._bad_step is None or self._bad_loss is None:
            self._bad_step = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        keep = torch.isfinite(loss) | (self._bad_step > 0)
        self._bad_step = torch.where(keep, self._bad_step, step)
        self._bad_loss = torch.where(keep, self._bad_loss, loss)

    def first_nonfinite(self) -> tuple[int, float] | None:
        """(step, loss) of the first non-finite loss added, or None; one host sync."""
        if self._bad_step is None or self._bad_loss is None:
            return None
        step = int(self._bad_step.item())
        return (step, float(self._bad_loss.item())) if step else None

    def mean(self) -> float:
        """Mean of the recent losses (float64, as numpy sums them); one host sync. NaN when none."""
        if not self.recent:
            return math.nan
        return float(np.mean(torch.stack(list(self.recent)).tolist()))
