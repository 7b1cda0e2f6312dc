"""Honest model selection: the validation set (the dataset's val mapping, or the last rows of the
train mapping held out at run time), the best weights seen on it, and early stopping. The test
mapping never enters here: it is scored once, after training, on the selected model."""

from __future__ import annotations

import math

import torch

from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryDataset, open_val
from dlrmkit.errors import DlrmkitError
from dlrmkit.train.snapshot import WeightSnapshot

DEFAULT_VAL_FRACTION = 0.1  # held out when a dataset has no val mapping
MAX_HELD_OUT = 1_000_000  # ... at most this many rows: enough for AUC to +-0.001, cheap to evaluate


def validation_split(
    spec: FeatureSpec, train: SplitBinaryDataset, fraction: float | None
) -> tuple[SplitBinaryDataset, SplitBinaryDataset | None, str]:
    """(train rows, validation rows or None, where the validation rows come from).
    `fraction` None: the val mapping, else the last 10% (at most 1M rows) of train; 0: none."""
    if fraction is not None and not 0 <= fraction < 1:
        raise DlrmkitError(f"--val-fraction must be in [0, 1), got {fraction}")
    val = open_val(spec)
    if val is not None and fraction is None:
        return train, val, f"the dataset's val mapping ({len(val):,} rows)"
    if fraction == 0:
        return train, None, "none (--val-fraction 0): no selection, the last weights are kept"
    n = len(train)
    held = int(round(n * fraction)) if fraction is not None else min(int(round(n * DEFAULT_VAL_FRACTION)), MAX_HELD_OUT)
    if held < 1 or held >= n:
        return train, None, f"none (too few train rows, {n}, to hold any out)"
    return (
        train.window(0, n - held),
        train.window(n - held, n, "val"),
        f"the last {held:,} train rows, held out (the dataset has no val mapping; --val-fraction)"
        if val is None
        else f"the last {held:,} train rows (--val-fraction)",
    )


class BestWeights:
    """A copy of the weights (and nothing else) at the best validation AUC so far; `restore`
    puts them back. Under torchrun each rank keeps its own shards and replicas. Large weights are
    kept in an unlinked file in `folder` (the run's output folder), not in memory (WeightSnapshot)."""

    def __init__(self, folder: str | None = None, show: bool = False) -> None:
        self.auc, self.step, self.metrics = float("nan"), -1, None
        self.snapshot = WeightSnapshot(folder, show)
        self.since = 0  # evaluations without improvement

    @property
    def kept(self) -> bool:
        """Whether weights were kept (update with keep=True at an improvement)."""
        return self.snapshot.taken

    def update(self, model: torch.nn.Module, step: int, metrics: dict[str, float], keep: bool) -> bool:
        auc = metrics["auc"]
        if math.isnan(auc) or auc <= self.auc:
            self.since += 1
            return False
        self.auc, self.step, self.metrics, self.since = auc, step, dict(metrics), 0
        if keep:
            self.snapshot.take(model)
        return True

    def restore(self, model: torch.nn.Module) -> None:
        self.snapshot.restore(model)

    def close(self) -> None:
        """Drops the kept copy (its temporary file, if on disk)."""
        self.snapshot.close()
