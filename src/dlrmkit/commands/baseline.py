"""`dlrmkit baseline --data D`: a logistic regression on one-hot categorical features plus the
numerical features of the same dataset, same loader and same splits as `train` (the same
validation rows), so a user sees what the deep model adds. The objective is scikit-learn's
default LogisticRegression (L2, C=1): sum of log losses + ||w||^2 / (2C), bias unpenalized,
minimized full-batch with L-BFGS; the gradient of each step streams over the training rows, so
memory is the weights (one float per id), not the data. Numerical features are standardized with
the training rows' mean and deviation (after sign(x) log(1+|x|) when they are raw, as `train`'s
recipe does). The result is written to <data>/baseline.json, and `train` prints its lift over it."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any
from dataclasses import dataclass

import numpy as np

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import check_not_inside, check_output_file, write_json
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.train.baseline_result import RESULT_FILE

LBFGS_HISTORY = 20  # past steps L-BFGS keeps (two vectors of the weights' size each)


@dataclass
class BaselineOptions:
    data: str = option(help="dataset folder holding feature_spec.yaml", parse=ct.path, required=True)
    c: float = option(1.0, "inverse L2 strength, as scikit-learn's C (default {default})", parse=ct.positive_float)
    val_fraction: float | None = option(
        None,
        "validation rows as `train` takes them (default: the val mapping, else the last 0.1 of train)",
        parse=ct.float_range(0.0, 1.0, hi_open=True),
    )
    max_iter: int = option(200, "L-BFGS iterations at most (default {default})", parse=ct.int_range(1, 100_000))
    batch_size: int = option(65536, "rows per streamed batch (default {default})", parse=ct.batch_size)
    out: str | None = option(
        None, f"where to write the result (default <data>/{RESULT_FILE}; 'none': nowhere)", parse=ct.path
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, BaselineOptions)


class LogisticRegression:
    """Width-1 embedding bags (one weight per id) + a linear term on standardized numericals + a bias."""

    def __init__(
        self, cardinalities: list[int], num_numerical: int, mean: np.ndarray, std: np.ndarray, signed_log: bool
    ):
        import torch

        self.offsets = torch.tensor(np.concatenate([[0], np.cumsum(cardinalities)[:-1]]), dtype=torch.int64)
        self.ids = torch.zeros(int(sum(cardinalities)), dtype=torch.float64, requires_grad=True)
        self.num = torch.zeros(num_numerical, dtype=torch.float64, requires_grad=True)
        self.bias = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        self.mean, self.std = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
        self.signed_log = signed_log

    def parameters(self) -> list:
        return [self.ids, self.num, self.bias]

    def features(self, dense):
        import torch

        from dlrmkit.model.dlrm import signed_log

        x = signed_log(dense) if self.signed_log else torch.nan_to_num(dense.float(), posinf=65504.0, neginf=-65504.0)
        return (x.double() - self.mean) / self.std

    def logits(self, dense, ids):
        out = self.ids[ids.long() + self.offsets].sum(1) + self.bias
        if len(self.num):
            out = out + self.features(dense) @ self.num
        return out

    def penalty(self):
        return 0.5 * (self.ids.square().sum() + self.num.square().sum())


def numerical_stats(dataset, batch_size: int, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the (transformed) numerical features over `dataset`."""
    import torch

    from dlrmkit.data.loader import BatchLoader
    from dlrmkit.model.dlrm import signed_log

    f = dataset.num_numerical
    s, s2, n = np.zeros(f), np.zeros(f), 0
    for batch in BatchLoader(dataset, batch_size).epoch(0):
        x = (
            signed_log(batch.dense)
            if signed
            else torch.nan_to_num(batch.dense.float(), posinf=65504.0, neginf=-65504.0)
        )
        x = x.double().numpy()
        s, s2, n = s + x.sum(0), s2 + (x * x).sum(0), n + len(x)
    mean = s / max(n, 1)
    std = np.sqrt(np.maximum(s2 / max(n, 1) - mean * mean, 0.0))
    return mean, np.where(std > 1e-12, std, 1.0)


def fit(
    data: str, c: float = 1.0, val_fraction: float | None = None, max_iter: int = 200, batch_size: int = 65536
) -> dict[str, Any]:
    """Train the baseline on the train rows (without the validation rows); score val and test."""
    import torch
    import torch.nn.functional as F

    from dlrmkit.data.loader import BatchLoader
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.metrics import log_loss, roc_auc
    from dlrmkit.train.recipe import RAW_NUMERICAL, numerical_scale
    from dlrmkit.train.selection import validation_split

    if c <= 0:
        raise DlrmkitError(f"--c must be positive, got {c}")
    if max_iter < 1 or batch_size < 1:
        raise DlrmkitError("--max-iter and --batch-size must be >= 1")
    spec, train, test = open_dataset(data)
    if train.multi_hot:
        raise DlrmkitError(f"{data}: multi-hot (bags of {spec.hotness} ids); the baseline reads one-hot datasets")
    if len(train) == 0:
        raise DlrmkitError(f"{data}: the train mapping has no rows")
    from dlrmkit.resources import check_memory

    ids = sum(spec.cardinalities)  # one float64 weight each, plus L-BFGS's gradient and history
    check_memory(ids * 8 * (2 * LBFGS_HISTORY + 6), f"{data}: {ids:,} ids in the tables")
    train, val, val_source = validation_split(spec, train, val_fraction)
    signed = numerical_scale(train) > RAW_NUMERICAL

    def train_on(rows) -> LogisticRegression:
        mean, std = numerical_stats(rows, batch_size, signed) if rows.num_numerical else (np.zeros(0), np.ones(0))
        model = LogisticRegression(spec.cardinalities, rows.num_numerical, mean, std, signed)
        loader = BatchLoader(rows, batch_size)
        # small data: the batches once, in memory; large data: streamed again for every gradient
        cached = (
            list(loader.epoch(0)) if len(rows) * (len(spec.cardinalities) + rows.num_numerical) < 20_000_000 else None
        )
        opt = torch.optim.LBFGS(
            model.parameters(),
            lr=1.0,
            max_iter=max_iter,
            history_size=LBFGS_HISTORY,
            tolerance_grad=1e-7,
            tolerance_change=1e-10,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            total = model.penalty() / c
            total.backward()
            value = float(total.detach())
            for batch in cached if cached is not None else loader.epoch(0):  # full gradient, batch by batch
                loss = F.binary_cross_entropy_with_logits(
                    model.logits(batch.dense, batch.ids), batch.labels.double(), reduction="sum"
                )
                loss.backward()
                value += float(loss.detach())
            return torch.tensor(value)

        opt.step(closure)
        return model

    def score(dataset) -> dict[str, float]:
        if dataset is None or len(dataset) == 0:
            return {"auc": float("nan"), "logloss": float("nan")}
        probs, labels = [], []
        with torch.no_grad():
            for batch in BatchLoader(dataset, batch_size).epoch(0):
                probs.append(torch.sigmoid(model.logits(batch.dense, batch.ids)).numpy())
                labels.append(batch.labels.numpy())
        p, y = np.concatenate(probs), np.concatenate(labels)
        return {"auc": roc_auc(y, p), "logloss": log_loss(y, p)}

    model = train_on(train)
    v = score(val)
    if val is not None:  # C is fixed, nothing was selected on the validation rows: the test
        model = train_on(concat_rows(train, val))  # figure is the regression on every training row
    t = score(test)
    return {
        "model": "logistic regression (one-hot ids + standardized numerical features, L2)",
        "c": c,
        "train_rows": len(train),
        "validation": val_source,
        "test_fit_rows": len(train) + (len(val) if val is not None else 0),
        "val_auc": v["auc"],
        "val_logloss": v["logloss"],
        "test_auc": t["auc"],
        "test_logloss": t["logloss"],
        "numerical_transform": "signed-log" if signed else "none",
    }


def concat_rows(train, val):
    """Train and validation rows as one dataset: the held-out tail of train is its own window
    (contiguous, so the whole train mapping); a val mapping is read through a small view."""
    if (
        val.mapping == "val"
        and getattr(val, "label", None) is not None
        and val.label.offset == len(train)
        and val.label.files == train.label.files
    ):
        return train.window(0, len(train) + len(val), train.mapping)
    return Concat(train, val)


class Concat:
    """Two mappings read as one (rows of `a`, then rows of `b`), for the loader's `read`."""

    def __init__(self, a, b):
        self.a, self.b, self.rows, self.num_numerical = a, b, len(a) + len(b), a.num_numerical

    def __len__(self) -> int:
        return self.rows

    def read(self, start: int, end: int, check_ids: bool = True):
        from dlrmkit.data.split_binary import RawBatch

        n = len(self.a)
        parts = [
            p
            for p in (
                self.a.read(min(start, n), min(end, n), check_ids) if start < n else None,
                self.b.read(max(start - n, 0), end - n, check_ids) if end > n else None,
            )
            if p is not None
        ]
        if len(parts) == 1:
            return parts[0]
        return RawBatch(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("dense", "ids", "labels")))


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")
    out = args.out or os.path.join(args.data, RESULT_FILE)
    if out != "none" and os.path.realpath(out) != os.path.realpath(os.path.join(args.data, RESULT_FILE)):
        check_not_inside(out, "--out", {"--data": args.data})  # <data>/baseline.json is the one file allowed
    if out != "none":
        check_output_file(out, "--out")  # before the fit: a bad path is found now
    result = fit(args.data, args.c, args.val_fraction, args.max_iter, args.batch_size)
    fmt = lambda x: "n/a" if math.isnan(x) else f"{x:.4f}"  # noqa: E731
    print(
        f"logistic regression (C={args.c}) on {result['train_rows']:,} train rows; validation: {result['validation']}; "
        f"the test figure refits on all {result['test_fit_rows']:,} training rows (C is fixed, nothing is selected)"
    )
    print(
        f"val AUC {fmt(result['val_auc'])}  val logloss {fmt(result['val_logloss'])}  "
        f"test AUC {fmt(result['test_auc'])}  test logloss {fmt(result['test_logloss'])}"
    )
    if out != "none":
        write_json(out, result)  # temporary name, then renamed; NaN as null
        print(f"wrote {out}")
    return 0
