"""Calibrated click probabilities: one temperature T fitted on the validation rows after model
selection (Guo et al., 2017: minimize the log loss of sigmoid(logit / T), the ranking and so the
AUC unchanged), folded into the model's last weights (the top MLP's output layer, the wide
column of every table, or under torchrun of each shard holding it, the numerical linear term,
the FM weight), so a checkpoint, `evaluate`,
`predict` and `export` carry it with nothing else to read. And the measures of calibration:
expected calibration error and the reliability table `dlrmkit report` plots."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

BINS = 10  # equal-width probability bins of the reliability table and the ECE
MIN_SCALE, MAX_SCALE = 0.02, 50.0  # the 1/T searched: beyond, the model is not worth calibrating
MIN_LABEL_ROWS = 10  # fewer validation rows of either label than this: no temperature


def unfitted(logits: np.ndarray, labels: np.ndarray) -> str | None:
    """Why no temperature is fitted on these validation logits, or None. A handful of clicks (or
    non-clicks) gives a temperature that follows their noise; and where every click's logit is
    above every non-click's, the log loss keeps falling as T falls (no best T exists), so a fit
    would make the model as confident as the search allows on the test rows too."""
    y = labels.astype(bool)
    clicks, others = int(y.sum()), int((~y).sum())
    if min(clicks, others) < MIN_LABEL_ROWS:
        return (f"the validation rows hold {clicks:,} click{'s' * (clicks != 1)} and {others:,} "
                f"non-click{'s' * (others != 1)}, fewer than {MIN_LABEL_ROWS} of one")  # fmt: skip
    if float(logits[y].min()) > float(logits[~y].max()):
        return "the validation logits rank every click above every non-click: no temperature minimizes their log loss"
    return None


def fit_scale(logits: np.ndarray, labels: np.ndarray, iters: int = 50) -> float:
    """The a = 1/T minimizing mean log loss of sigmoid(a * logit): Newton's method on a convex
    function of one variable, started at 1 (no change); 1 where `unfitted` says why not."""
    z, y = logits.astype(np.float64), labels.astype(np.float64)
    if unfitted(z, y) is not None:
        return 1.0
    a = 1.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(a * z, -500, 500)))
        grad, hess = float(np.mean((p - y) * z)), float(np.mean(p * (1 - p) * z * z))
        if hess <= 1e-12:
            break
        step = grad / hess
        a = min(max(a - step, MIN_SCALE), MAX_SCALE)
        if abs(step) < 1e-8:
            break
    return a


@torch.no_grad()
def logits_of(model: torch.nn.Module, dataset, batch_size: int, move=None) -> tuple[np.ndarray, np.ndarray]:
    """The model's logits (before the sigmoid: no float rounding at p = 0 or 1) and the labels."""
    from dlrmkit.data.loader import BatchLoader

    was_training = model.training
    model.eval()
    out, labels = [], []
    for batch in BatchLoader(dataset, batch_size).epoch(0):
        moved = move(batch) if move is not None else batch
        out.append(model(moved.dense, moved.ids).float().cpu().numpy())
        labels.append(batch.labels.numpy())
    model.train(was_training)
    return np.concatenate(out) if out else np.empty(0), np.concatenate(labels) if labels else np.empty(0)


@torch.no_grad()
def fold_scale(model: torch.nn.Module, a: float) -> None:
    """Multiply the model's logit by `a` through its weights: every term of the DLRM's logit is
    linear in one of these (the top MLP's last layer, the tables' wide column, the numerical
    linear term, the FM weight)."""
    cfg = model.cfg
    if cfg.deep:
        last = [m for m in model.top_mlp if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(a)
        last.bias.mul_(a)
    if cfg.wide:  # the tables' last column: under torchrun, in the shards (column slices) that hold it
        for piece in model.embeddings.logical_shards():
            if piece.weight is not None and piece.col_end == cfg.table_dim:
                piece.data[:, -1].mul_(a)
        if model.linear is not None:
            model.linear.weight.mul_(a)
            model.linear.bias.mul_(a)
    if model.fm is not None:
        model.fm.weight.mul_(a)


def kept_scale(z: np.ndarray, y: np.ndarray) -> float:
    """fit_scale's a, or 1 (no change) where it does not lower the mean log loss measurably."""
    a = fit_scale(z, y)
    return a if log_loss_of_logits(a * z, y) < log_loss_of_logits(z, y) else 1.0


def val_logits(trainer) -> tuple[np.ndarray, np.ndarray]:
    """The trainer's validation logits and labels (under torchrun every rank's, gathered)."""
    from dlrmkit.precision import autocast

    batch_size = trainer.cfg.selection.eval_batch_size
    with autocast(trainer.cfg.device.precision, trainer.device.type):
        if trainer.par is not None:
            return trainer.par.predict(trainer.val_set, batch_size, logits=True)
        return logits_of(trainer.model, trainer.val_set, batch_size, trainer.move)


def calibrate(model: torch.nn.Module, z: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Fit the temperature on the validation logits `z` (labels `y`) and fold it into `model`;
    returns what was done."""
    a = kept_scale(z, y)
    before, after = log_loss_of_logits(z, y), log_loss_of_logits(a * z, y)
    fold_scale(model, a)
    return {"temperature": 1.0 / a, "val_logloss_before": before, "val_logloss_after": after}


def log_loss_of_logits(z: np.ndarray, y: np.ndarray) -> float:
    """Mean log loss of sigmoid(z), computed stably from the logits."""
    return float(np.mean(row_log_losses(z, y))) if len(z) else float("nan")


def row_log_losses(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's log loss of sigmoid(z), computed stably from the logits (float64)."""
    z, y = z.astype(np.float64), y.astype(np.float64)
    return np.logaddexp(0.0, z) - y * z


def reliability(labels: np.ndarray, probs: np.ndarray, bins: int = BINS) -> list[list[float]]:
    """[mean predicted probability, observed click rate, rows] of each non-empty equal-width bin."""
    p, y = np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # NaN probabilities (a diverged model): its ECE is NaN, no warning
        which = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    mean_p = np.bincount(which, weights=p, minlength=bins)
    rate = np.bincount(which, weights=y, minlength=bins)
    return [[float(mean_p[b] / count[b]), float(rate[b] / count[b]), int(count[b])] for b in range(bins) if count[b]]


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = BINS) -> float:
    """Sum over bins of (rows in the bin / rows) * |mean predicted - observed rate|."""
    table = reliability(labels, probs, bins)
    n = sum(c for _, _, c in table)
    return float(sum(c * abs(m - r) for m, r, c in table) / n) if n else math.nan


def skipped(trainer) -> str | None:
    """Why a run of `trainer` gets no temperature, or None when it gets one."""
    return (
        "no validation rows"
        if trainer.val_set is None
        else "split-SGD keeps bf16 halves of the weights"
        if trainer.cfg.optimizer.optimizer == "split-sgd"
        else None
    )


def calibrate_run(trainer, val: dict[str, float]) -> dict[str, float]:
    """--calibration temperature at the end of a run: fit on the trainer's validation rows, fold,
    log it; returns the validation metrics of the calibrated model. Under torchrun every rank
    fits the same temperature on all ranks' logits and folds it into its own weights. Without
    validation rows it says so."""
    import sys

    why = skipped(trainer)
    if why is not None:
        if trainer.dist.rank == 0:
            print(f"calibration: skipped ({why}); temperature 1", file=sys.stderr)
        return val
    z, y = val_logits(trainer)
    why = unfitted(z, y)
    if why is not None and trainer.dist.rank == 0:
        print(f"calibration: temperature 1 ({why})", file=sys.stderr)
    fitted = calibrate(trainer.model, z, y)
    trainer.temperature = fitted["temperature"]
    trainer.log({"event": "calibration", "step": trainer.step, "mapping": "val", **fitted})
    return {**val, "logloss": fitted["val_logloss_after"]}
