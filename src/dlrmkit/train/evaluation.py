"""Scoring a model on a dataset: click probabilities in order, then AUC and log loss. The
trainer's evaluations, `dlrmkit evaluate` and `predict`'s tests read rows through here."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from dlrmkit.data.loader import Batch, BatchLoader
from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.metrics import log_loss, roc_auc


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    dataset: SplitBinaryDataset,
    batch_size: int,
    move: Callable[[Batch], Batch] | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Click probabilities and labels for every row of `dataset`, in order; `move` takes each
    batch to where the model is (a GPU). `progress`: a bar on a terminal once it takes over 2 s."""
    was_training = model.training
    model.eval()
    probs, labels = [], []
    loader = BatchLoader(dataset, batch_size)
    batches = tqdm(
        loader.epoch(0),
        total=len(loader),
        desc="evaluating",
        unit="batch",
        delay=2.0,
        leave=False,
        disable=None if progress else True,
        dynamic_ncols=True,
    )
    for batch in batches:
        moved = move(batch) if move is not None else batch
        probs.append(torch.sigmoid(model(moved.dense, moved.ids).float()).cpu().numpy())
        labels.append(batch.labels.numpy())
    model.train(was_training)
    if not probs:
        return np.empty(0), np.empty(0)
    return np.concatenate(probs), np.concatenate(labels)


def evaluate_model(
    model: torch.nn.Module,
    dataset: SplitBinaryDataset,
    batch_size: int,
    move: Callable[[Batch], Batch] | None = None,
    progress: bool = False,
    bins: bool = False,
) -> dict:
    """AUC, log loss and expected calibration error; `bins`: the reliability table too."""
    probs, labels = predict(model, dataset, batch_size, move, progress)
    return scores(probs, labels, bins)


def scores(probs: np.ndarray, labels: np.ndarray, bins: bool = False) -> dict:
    """AUC, log loss and expected calibration error of click probabilities (in any row order:
    under torchrun, every rank's); `bins`: the reliability table too."""
    from dlrmkit.train.calibration import expected_calibration_error, reliability

    out = {"auc": roc_auc(labels, probs), "logloss": log_loss(labels, probs)}
    if np.isnan(probs).any():  # a model that scores NaN has no calibration bins (nor a log loss)
        return {**out, "ece": float("nan"), **({"reliability": []} if bins else {})}
    out["ece"] = expected_calibration_error(labels, probs)
    if bins:
        out["reliability"] = reliability(labels, probs)
    return out
