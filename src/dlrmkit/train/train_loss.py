"""The training loss between log points, kept as tensors where the step computed it (on a GPU:
on the GPU). Reading a loss on the host waits for every queued kernel, so a loop that read it
each step would stall the GPU's queue once a step; here the values are read at log, evaluation
and checkpoint points only, and keeping them costs no tensor op per step."""

from __future__ import annotations

import math
import os
from collections import deque

import numpy as np
import torch

from dlrmkit.checkpoint.dirs import LATEST
from dlrmkit.errors import NonFiniteLoss

FOLD = 1024  # unchecked losses stacked into one tensor this many at a time (bounded object count)


def nonfinite_error(value: float, step: int, checkpoint_dir: str | None, advice: str = "") -> NonFiniteLoss:
    """The one line for a NaN/Inf loss: its step, the last good checkpoint (where one was saved),
    what to try (`advice`: a first thing to try for this model, or '')."""
    where = ""
    if checkpoint_dir:
        saved = os.path.lexists(os.path.join(checkpoint_dir, LATEST))
        where = (
            f"; the last good checkpoint is {checkpoint_dir}/{LATEST}" if saved else "; no checkpoint saved before it"
        )
    return NonFiniteLoss(
        f"loss is {value} at step {step}{where}; {advice}lower --lr, check the data, or allow skipping with "
        "--skip-nonfinite N"
    )


class TrainLoss:
    """The last `window` losses (their mean is the logged train loss) and every loss added since
    the last `first_nonfinite` check, with its step, so a check finds the first NaN/Inf one."""

    def __init__(self, window: int = 100):
        self.recent: deque[torch.Tensor] = deque(maxlen=window)
        self._losses: list[torch.Tensor] = []  # unchecked, not yet folded
        self._steps: list[int] = []
        self._chunks: list[tuple[np.ndarray, torch.Tensor]] = []  # unchecked, folded: (steps, losses)

    def add(self, loss: torch.Tensor, step: int) -> None:
        """Records step `step`'s loss (a detached scalar tensor): no host sync, no op per step."""
        self.recent.append(loss)
        self._losses.append(loss)
        self._steps.append(step)
        if len(self._losses) >= FOLD:
            self._fold()

    def _fold(self) -> None:
        if self._losses:
            self._chunks.append((np.asarray(self._steps, dtype=np.int64), torch.stack(self._losses).reshape(-1)))
            self._losses, self._steps = [], []

    def first_nonfinite(self) -> tuple[int, float] | None:
        """(step, loss) of the first NaN/Inf loss added since the last check, or None; one host
        sync (two when there is one)."""
        self._fold()
        if not self._chunks:
            return None
        steps = np.concatenate([s for s, _ in self._chunks])
        values = torch.cat([v for _, v in self._chunks]) if len(self._chunks) > 1 else self._chunks[0][1]
        self._chunks = []
        bad = ~torch.isfinite(values)
        if not bool(bad.any()):
            return None
        i = int(torch.argmax(bad.to(torch.uint8)))  # the first True
        return int(steps[i]), float(values[i])

    def check_finite(self, checkpoint_dir: str | None, advice: str = "") -> None:
        """Raises for the first NaN/Inf loss added since the last check; one host sync."""
        bad = self.first_nonfinite()
        if bad is not None:
            raise nonfinite_error(bad[1], bad[0], checkpoint_dir, advice)

    def recent_values(self) -> list[float]:
        """The losses of the logged mean's window, oldest first (a checkpoint keeps them, so a
        resumed run logs the mean an uninterrupted one would); one host sync."""
        return self._window().tolist() if self.recent else []

    def restore(self, values: list[float]) -> None:
        """The window a checkpoint kept (recent_values), before any loss of this process."""
        self.recent.clear()
        self.recent.extend(torch.tensor(v, dtype=torch.float32) for v in values[-(self.recent.maxlen or 0) :])

    def _window(self) -> torch.Tensor:
        """The window's losses as one tensor, on the device of the newest: a restored window's are
        on the CPU, a GPU step's losses on the GPU (torch.stack refuses a mix)."""
        device = self.recent[-1].device
        return torch.stack([v if v.device == device else v.to(device) for v in self.recent]).reshape(-1)

    def mean(self) -> float:
        """Mean of the recent losses (float64, as numpy sums them); one host sync. NaN when none."""
        if not self.recent:
            return math.nan
        return float(np.mean(self._window().tolist()))
