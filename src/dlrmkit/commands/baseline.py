"""`dlrmkit baseline --data D`: a logistic regression on one-hot categorical features plus the
numerical features of the same dataset, same loader and same splits as `train` (the same
validation rows), so a user sees what the deep model adds. The model and its fit:
dlrmkit.train.regression (scikit-learn's L2 LogisticRegression, L-BFGS). C is chosen on the
validation rows from a small log grid, coarse to fine, as LogisticRegressionCV chooses it (best
validation AUC, near-ties by log loss), so the figure is the regression at its best, not at a fixed C=1.
Numerical values over 20 are fitted twice, as their signed log (as `train`'s recipe takes them) and
as they are, and the validation rows choose between the two as they choose C. The test
figures are that C's fit on the train rows and its refit on the train and validation rows
together: the lift `train` prints is against the one that saw the rows its model saw (`train
--refit`, the small- and medium-data recipes' default, refits). The result is written to
<data>/baseline.json."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import check_not_inside, check_output_file, write_json
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.train.baseline_result import RESULT_FILE
from dlrmkit.train.regression import C_COARSE, C_GRID, fit


# C below this regularizes so hard that L-BFGS overflows (1e-200: NaN weights, whose scores still
# gave an AUC); at 1e-9 every weight is already 0
c_value = ct.float_range(1e-9, ct.MAX_FLOAT)


def c_values(text: str) -> list[float]:
    """'0.1,1,10' -> [0.1, 1.0, 10.0]: at most 20 values, each in c_value's range."""
    items = [x.strip() for x in str(text).split(",")]
    if not 1 <= len(items) <= 20:
        raise argparse.ArgumentTypeError(f"give 1 to 20 comma-separated values, got {len(items)}")
    return [c_value(x) for x in items]


@dataclass
class BaselineOptions:
    data: str = option(help="dataset folder holding feature_spec.yaml", parse=ct.path, required=True)
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
    # ---- the regularization strength: chosen on the validation rows unless given
    c: float | None = option(
        None,
        "inverse L2 strength, as scikit-learn's C (default: chosen on the validation rows from --c-grid)",
        parse=c_value,
    )
    c_grid: list[float] | None = option(
        None,
        "the C values tried on the validation rows, comma-separated (default: each of "
        + ",".join(f"{c:g}" for c in C_COARSE)
        + ", then the best one's neighbours among "
        + ",".join(f"{c:g}" for c in C_GRID)
        + ")",
        parse=c_values,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, BaselineOptions)


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import text_to_stderr

    if args.c is not None and args.c_grid is not None:
        raise DlrmkitError("--c-grid applies without --c (a given C is not chosen): give one of them")
    with text_to_stderr(args.out):  # `--out -`: standard output is the JSON, the figures in words go to stderr
        return fit_and_write(args)


def fit_and_write(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import is_stdout

    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")
    out = args.out or os.path.join(args.data, RESULT_FILE)
    if out != "none" and os.path.realpath(out) != os.path.realpath(os.path.join(args.data, RESULT_FILE)):
        check_not_inside(out, "--out", {"--data": args.data})  # <data>/baseline.json is the one file allowed
    if out != "none":
        check_output_file(out, "--out")  # before the fit: a bad path is found now
    result = fit(args.data, args.c, args.val_fraction, args.max_iter, args.batch_size, args.c_grid)
    fmt = lambda x: "n/a" if math.isnan(x) else f"{x:.4f}"  # noqa: E731
    if len(result["c_tried"]) > 1:
        both = len({t["numerical_transform"] for t in result["c_tried"]}) > 1  # the log, and the numbers as they are
        for t in result["c_tried"]:
            chosen = t["c"] == result["c"] and t["numerical_transform"] == result["numerical_transform"]
            mark = "  <- chosen" if chosen else ""
            numbers = f"numbers {'signed log' if t['numerical_transform'] == 'signed-log' else 'as they are'}, " * both
            print(f"  {numbers}C={t['c']:<6g} val AUC {fmt(t['val_auc'])}  val logloss {fmt(t['val_logloss'])}{mark}")
    print(
        f"logistic regression (C={result['c']:g}, {result['c_chosen']}) fitted on {result['train_rows']:,} "
        f"train rows; validation: {result['validation']}"
    )
    print(
        f"val AUC {fmt(result['val_auc'])}  val logloss {fmt(result['val_logloss'])}  "
        f"test AUC {fmt(result['test_auc'])}  test logloss {fmt(result['test_logloss'])}"
    )
    if result["refit_rows"] is not None:
        print(
            f"refitted on the train and validation rows ({result['refit_rows']:,}): test AUC "
            f"{fmt(result['refit_test_auc'])}  test logloss {fmt(result['refit_test_logloss'])}"
        )
    if out != "none":
        write_json(out, result)  # temporary name, then renamed; NaN as null
        if not is_stdout(out):
            print(f"wrote {out}")
    return 0
