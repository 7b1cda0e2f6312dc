"""The MLPerf DLRM learning-rate schedule: linear warm-up, constant, polynomial (power 2) decay;
all of it scaled down by --lr-decay-on-plateau's factors."""

from __future__ import annotations

from dataclasses import dataclass

from torch.optim import Optimizer


@dataclass
class LRSchedule:
    base_lr: float
    warmup_steps: int = 0
    decay_start: int = 0  # step at which decay begins; 0 disables decay
    decay_steps: int = 0
    power: float = 2.0
    end_lr: float = 0.0
    scale: float = 1.0  # --lr-decay-on-plateau's product of factors so far (kept in checkpoints)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        return self.scale * self._scheduled(step)

    def _scheduled(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.decay_start and self.decay_steps and step >= self.decay_start:
            done = min(step - self.decay_start, self.decay_steps) / self.decay_steps
            return self.end_lr + (self.base_lr - self.end_lr) * (1.0 - done) ** self.power
        return self.base_lr

    def apply(self, optimizers: list[Optimizer], step: int) -> float:
        lr = self.lr_at(step)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        return lr
