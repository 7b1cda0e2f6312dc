"""The logistic regression `dlrmkit baseline` reports and `--wide-init regression` starts the
DLRM's wide term from: one-hot categorical features plus the numerical features, same loader and
same splits as `train`. The objective is scikit-learn's LogisticRegression (L2): sum of log losses
+ ||w||^2 / (2C), bias unpenalized, minimized full-batch with L-BFGS on its gradient written out;
up to HELD_VALUES the training rows are held in memory, past it each gradient streams over them,
so memory is the weights (one float per id), not the data. C is
chosen on the validation rows from a small log grid, coarse to fine (`select`), as
LogisticRegressionCV chooses it (best validation AUC, near-ties by log loss). Numerical features
are standardized with the training rows' mean and deviation (after sign(x) log(1+|x|) when they are raw, as `train`'s recipe does)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from dlrmkit.errors import DlrmkitError

LBFGS_HISTORY = 20  # past steps L-BFGS keeps (two vectors of the weights' size each)
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)  # the C values `select` may try, strong to weak
C_COARSE = C_GRID[::2]  # tried first; then the best one's neighbours in C_GRID
GRAD_TOL = 1e-5  # stop when every gradient entry of the mean loss is below this (scikit-learn: 1e-4)
NEAR_TIE_AUC = 0.001  # validation AUCs this close are a tie, broken by the lower log loss
HELD_VALUES = 8_000_000  # training rows x features up to which a fit holds its batches in memory (~40 bytes each)


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


def train_on(
    cards: list[int],
    rows,
    c: float,
    signed: bool,
    batch_size: int = 65536,
    max_iter: int = 200,
    start: LogisticRegression | None = None,
) -> LogisticRegression:
    """The regression with strength `c` fitted on `rows`; `start`: a previous solution to start
    from (a warm start along the C grid)."""
    import torch
    import torch.nn.functional as F

    from dlrmkit.data.loader import BatchLoader

    mean, std = numerical_stats(rows, batch_size, signed) if rows.num_numerical else (np.zeros(0), np.ones(0))
    model = LogisticRegression(cards, rows.num_numerical, mean, std, signed)
    if start is not None:
        with torch.no_grad():
            for p, q in zip(model.parameters(), start.parameters()):
                p.copy_(q)

    def terms(batch, products: bool):
        """What the objective reads of a batch: each row's weight indices, its features, its label,
        and with `products` the rows as a sparse one-hot matrix and its transpose (a product with
        each is 2-3 times faster than the gather and the bincount it replaces; built once, for the
        batches held in memory: the transpose needs a sort)."""
        flat = batch.ids.long() + model.offsets
        x = model.features(batch.dense) if rows.num_numerical else None
        onehot = None
        if products:
            n, k = flat.shape
            ones = torch.ones(flat.numel(), dtype=torch.float64)
            order = torch.argsort(flat.reshape(-1), stable=True)
            ends = torch.cumsum(torch.bincount(flat.reshape(-1), minlength=len(model.ids)), 0)
            with warnings.catch_warnings():  # torch marks sparse CSR as beta
                warnings.simplefilter("ignore", UserWarning)
                onehot = (
                    torch.sparse_csr_tensor(torch.arange(0, n * k + 1, k), flat.reshape(-1), ones, (n, len(model.ids)),
                                            check_invariants=False),
                    torch.sparse_csr_tensor(torch.cat([ends.new_zeros(1), ends]), order // k, ones,
                                            (len(model.ids), n), check_invariants=False),
                )  # fmt: skip
        return flat, x, batch.labels.double(), onehot

    loader = BatchLoader(rows, batch_size)
    # small data: the batches' terms once, in memory; large data: streamed again for every gradient
    small = len(rows) * (len(cards) + rows.num_numerical) < HELD_VALUES
    cached = [terms(b, True) for b in loader.epoch(0)] if small else None
    opt = torch.optim.LBFGS(
        model.parameters(),
        lr=1.0,
        max_iter=max_iter,
        history_size=LBFGS_HISTORY,
        tolerance_grad=GRAD_TOL * len(rows),  # the objective is a sum over rows
        tolerance_change=1e-10,
        line_search_fn="strong_wolfe",
    )
    w, v, b = model.parameters()

    @torch.no_grad()
    def closure():
        # the gradient written out (one-hot rows: a weight's gradient is the sum of its rows'
        # residuals, a bincount), not taken by autograd, whose backward of the gather was most
        # of a fit's time
        value = float(model.penalty()) / c
        gw, gv, gb = w / c, v / c, torch.zeros_like(b)
        for flat, x, y, onehot in cached if cached is not None else (terms(batch, False) for batch in loader.epoch(0)):
            z = (onehot[0] @ w if onehot else w[flat].sum(1)) + b + (x @ v if x is not None else 0.0)
            r = torch.sigmoid(z) - y  # d loss / d z
            value += float(F.binary_cross_entropy_with_logits(z, y, reduction="sum"))
            if onehot:
                gw += onehot[1] @ r
            else:
                gw += torch.bincount(flat.reshape(-1), r.unsqueeze(1).expand_as(flat).reshape(-1), len(w))
            if x is not None:
                gv += x.T @ r
            gb += r.sum()
        w.grad, v.grad, b.grad = gw, gv, gb
        return torch.tensor(value)

    opt.step(closure)
    return model


def score(model: LogisticRegression, dataset, batch_size: int = 65536) -> dict[str, float]:
    """AUC and log loss of the regression on `dataset` (NaN for none)."""
    import torch

    from dlrmkit.data.loader import BatchLoader
    from dlrmkit.metrics import log_loss, roc_auc

    if dataset is None or len(dataset) == 0:
        return {"auc": float("nan"), "logloss": float("nan")}
    probs, labels = [], []
    with torch.no_grad():
        for batch in BatchLoader(dataset, batch_size).epoch(0):
            probs.append(torch.sigmoid(model.logits(batch.dense, batch.ids)).numpy())
            labels.append(batch.labels.numpy())
    p, y = np.concatenate(probs), np.concatenate(labels)
    return {"auc": roc_auc(y, p), "logloss": log_loss(y, p)}


def select(
    cards: list[int],
    train,
    val,
    signed: bool,
    grid=None,
    batch_size: int = 65536,
    max_iter: int = 200,
) -> tuple[dict[str, float], list[dict[str, float]], LogisticRegression]:
    """(the chosen C's entry, every C tried with its validation figures, the regression of the
    chosen C fitted on `train`). `grid`: every one of these values; None: C_GRID coarse to fine
    (every C_COARSE value, then C_GRID's neighbours of the best: at most 6 fits of 7). Each fit
    starts from the fit of the nearest stronger C. Without validation rows: the grid's one value,
    or C=1."""
    if val is None:
        grid = [grid[0] if grid is not None and len(grid) == 1 else 1.0]
    fitted: dict[float, tuple[dict[str, float], LogisticRegression]] = {}

    def run(value: float) -> dict[str, float]:
        stronger = [c for c in fitted if c < value]
        start = fitted[max(stronger)][1] if stronger else None
        model = train_on(cards, train, value, signed, batch_size, max_iter, start)
        entry = {"c": value, **{f"val_{k}": v for k, v in score(model, val, batch_size).items()}}
        fitted[value] = (entry, model)
        return entry

    if grid is not None:
        for value in sorted(grid):
            run(value)
    else:
        for value in C_COARSE:  # every one: on few validation rows AUC can dip at one C and peak at a weaker one
            run(value)
        i = C_GRID.index(choose([e for e, _ in fitted.values()])["c"])
        for value in C_GRID[max(i - 1, 0) : i + 2]:
            if value not in fitted:
                run(value)
    tried = [fitted[c][0] for c in sorted(fitted)]
    best = choose(tried)
    return best, tried, fitted[best["c"]][1]


def fit(
    data: str,
    c: float | None = None,
    val_fraction: float | None = None,
    max_iter: int = 200,
    batch_size: int = 65536,
    c_grid: tuple[float, ...] | list[float] | None = None,
) -> dict[str, Any]:
    """`dlrmkit baseline`: C chosen on the validation rows (or `c`); the test rows scored with
    that C's fit on the train rows, and with its refit on the train and validation rows together
    (`refit_*`), so `train` prints its lift against the regression that saw the rows it saw (the
    train rows, or with --refit both)."""
    from dlrmkit.data.fingerprint import dataset_fingerprint
    from dlrmkit.data.split_binary import check_held_out, open_dataset
    from dlrmkit.resources import check_memory
    from dlrmkit.data.split_binary import RAW_NUMERICAL, numerical_scale
    from dlrmkit.train.selection import check_both_labels, validation_split

    if c is not None and c <= 0:
        raise DlrmkitError(f"--c must be positive, got {c}")
    if max_iter < 1 or batch_size < 1:
        raise DlrmkitError("--max-iter and --batch-size must be >= 1")
    spec, train, test = open_dataset(data)
    check_held_out(spec)  # a bad val or test value found before the fits, not after them
    if train.multi_hot:
        raise DlrmkitError(f"{data}: multi-hot (bags of {spec.hotness} ids); the baseline reads one-hot datasets")
    if len(train) == 0:
        raise DlrmkitError(f"{data}: the train mapping has no rows")
    ids = sum(spec.cardinalities)  # one float64 weight each, plus L-BFGS's gradient and history
    check_memory(ids * 8 * (2 * LBFGS_HISTORY + 8), f"{data}: {ids:,} ids in the tables")
    train, val, val_source = validation_split(spec, train, val_fraction)
    # a given C chooses nothing on the validation rows
    check_both_labels(data, train, val if c is None else None, val_source, "a val mapping, --val-fraction F, or --c C")
    scale = numerical_scale(train)
    signed = scale > RAW_NUMERICAL
    cards = spec.cardinalities
    grid = [c] if c is not None else c_grid
    best, tried, model = select(cards, train, val, signed, grid, batch_size, max_iter)
    for t in tried:
        t["numerical_transform"] = "signed-log" if signed else "none"
    if signed and math.isfinite(scale) and c is None and val is not None:
        # the log as `train`'s recipe takes it, or the numbers as they are: chosen on the validation
        # rows as C is (measurements whose size tells the label lose their tails in the log)
        plain, plain_tried, plain_model = select(cards, train, val, False, grid, batch_size, max_iter)
        for t in plain_tried:
            t["numerical_transform"] = "none"
        tried += plain_tried
        if choose([best, plain]) is plain:
            best, model, signed = plain, plain_model, False
    if c is not None:
        how = "given (--c)"
    elif val is None:
        how = "scikit-learn's default (no validation rows to choose on)"
    else:
        how = f"chosen on the validation rows from {len(tried)} values (best AUC, near-ties by log loss)"
        if len({t["numerical_transform"] for t in tried}) > 1:
            kept = "as they are" if not signed else "as their signed log"
            how = (f"chosen on the validation rows from {len(tried)} fits, the numerical features as their signed log "
                   f"and as they are (best AUC, near-ties by log loss): {kept}")  # fmt: skip
    t = score(model, test, batch_size)
    again = None
    if val is not None and len(val):  # warm-started from the fit on the train rows
        again = score(train_on(cards, train.joined(val), best["c"], signed, batch_size, max_iter, model), test, batch_size)
    return {
        "model": "logistic regression (one-hot ids + standardized numerical features, L2)",
        "c": best["c"],
        "c_chosen": how,
        "c_tried": tried,
        "train_rows": len(train),
        "validation": val_source,
        "test_fit_rows": len(train),
        "refit_rows": len(train) + len(val) if again is not None else None,
        "refit_test_auc": again["auc"] if again is not None else math.nan,
        "refit_test_logloss": again["logloss"] if again is not None else math.nan,
        "val_auc": best["val_auc"],
        "val_logloss": best["val_logloss"],
        "test_auc": t["auc"],
        "test_logloss": t["logloss"],
        "numerical_transform": "signed-log" if signed else "none",
        "dataset_fingerprint": dataset_fingerprint(spec),  # `train` prints a lift only against this dataset's
    }


def choose(tried: list[dict[str, float]]) -> dict[str, float]:
    """The best validation AUC; among those within NEAR_TIE_AUC of it, the lowest log loss (the
    first when AUC is undefined)."""
    scored = [t for t in tried if not math.isnan(t["val_auc"])]
    if not scored:
        return tried[0]
    top = max(t["val_auc"] for t in scored)
    near = [t for t in scored if t["val_auc"] >= top - NEAR_TIE_AUC]
    return min(near, key=lambda t: (t["val_logloss"], -t["val_auc"]))


_CHOSEN: dict[tuple, tuple[dict[str, float], LogisticRegression]] = {}  # per dataset and split, in one process


def init_wide(
    model, train, val, data: str = "", batch_size: int = 65536, c: float | None = None, fold: tuple | None = None
) -> dict[str, float]:
    """`--wide-init regression`: the validated regression (C chosen on `val`, or `c`, fitted on `train`)
    put into the DLRM's wide term (the tables' last column, the numerical linear term and its
    bias), the deep part's output layer zeroed, so training starts at the regression and the deep
    part learns what it leaves. One fused table of one width (one process). Returns the C and the
    regression's validation figures. The fit is kept for the process (a recipe search's
    candidates share it; `fold`: which fold of --folds validates, for the rows of equal-sized folds
    are not the same rows)."""
    import torch

    signed = model.cfg.numerical_transform == "signed-log"
    cards = list(model.cfg.table_sizes)
    key = (data, fold, len(train), len(val) if val is not None else 0, signed, tuple(cards), c)
    if key not in _CHOSEN:
        best, _, fitted = select(cards, train, val, signed, [c] if c is not None else None, batch_size)
        _CHOSEN[key] = (best, fitted)
    best, lr = _CHOSEN[key]
    (table,) = model.embeddings.tables  # one width: the wide column is every row's last
    with torch.no_grad():
        table.weight[:, -1] = lr.ids.detach().to(table.weight.dtype)
        w = lr.num.detach() / lr.std  # on x as the model's transform gives it
        bias = lr.bias.detach() - (w * lr.mean).sum()
        if model.cfg.numerical_mean is not None:  # the model standardizes x itself: x = z * std + mean
            mean = torch.tensor(model.cfg.numerical_mean, dtype=torch.float64)
            bias = bias + (w * mean).sum()
            w = w * torch.tensor(model.cfg.numerical_std, dtype=torch.float64)
        if model.linear is not None:
            model.linear.weight[0] = w.to(model.linear.weight.dtype)
            model.linear.bias[0] = bias.to(model.linear.bias.dtype)
        else:  # every row has one id of the first table: its wide column carries the bias
            table.weight[: cards[0], -1] += bias.to(table.weight.dtype)
        if model.cfg.deep:
            last = [m for m in model.top_mlp if isinstance(m, torch.nn.Linear)][-1]
            last.weight.zero_()
            last.bias.zero_()
    return best


def start_from_regression(model, train, val, cfg, c: float | None = None) -> dict[str, float]:
    """The trainer's `--wide-init regression`: refused where it cannot apply, else init_wide
    (`c`: the C a refit's run chose, dlrmkit.train.refit)."""
    from dlrmkit.parallel.dist import launched_by_torchrun

    if launched_by_torchrun():
        raise DlrmkitError("--wide-init regression runs in one process (the tables are sharded under torchrun)")
    if not model.cfg.wide:
        raise DlrmkitError("--wide-init regression needs the wide term (--wide true)")
    if train.multi_hot:
        raise DlrmkitError("--wide-init regression reads one-hot datasets (this one has bags of ids)")
    from dlrmkit.train.selection import fold_of

    return init_wide(model, train, val, cfg.data, cfg.selection.eval_batch_size, c, fold_of(cfg))
