"""Honest model selection: the validation set (the dataset's val mapping, or the last rows of the
train mapping held out at run time), the best weights seen on it, and early stopping. The test
mapping never enters here: it is scored once, after training, on the selected model."""

from __future__ import annotations

from dataclasses import dataclass
import math
from collections.abc import Iterable

import torch

from dlrmkit.config import TrainConfig
from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryDataset, open_val
from dlrmkit.errors import DlrmkitError
from dlrmkit.train.snapshot import WeightSnapshot

DEFAULT_VAL_FRACTION = 0.1  # held out when a dataset has no val mapping
MAX_HELD_OUT = 1_000_000  # ... at most this many rows: enough for AUC to +-0.001, cheap to evaluate


def held_out_from_train(spec: FeatureSpec, fraction: float | None, fold: tuple[int, int] | None = None) -> bool:
    """Whether the validation rows are rows of the train mapping (validation_split), not the
    dataset's val mapping."""
    return fraction is not None or fold is not None or open_val(spec) is None


def cross_folds(cfg: TrainConfig) -> int | None:
    """K where the run cross-validates (--folds K, K >= 2, without --fold: one model per fold),
    else None (--folds 1 turns the default off; --fold F trains the one model of fold F)."""
    sel = cfg.selection
    return sel.folds if sel.folds is not None and sel.folds > 1 and sel.fold is None else None


def fold_of(cfg: TrainConfig) -> tuple[int, int] | None:
    """(--fold, --folds) of a run that holds out one fold of its rows (fold_rows), else None; one line
    where only one is given (a run of --folds without --fold is the search's, dlrmkit.train.recipe)."""
    sel = cfg.selection
    if sel.fold is None:
        return None
    folds = sel.folds
    if folds is None or folds < 2 or not 1 <= sel.fold <= folds:
        raise DlrmkitError(f"--fold {sel.fold} needs --folds K with K >= {max(sel.fold, 2)} (the folds it is one of)")
    if sel.val_fraction is not None:
        raise DlrmkitError("--fold and --val-fraction both say which rows validate; give one")
    return sel.fold, folds


def fold_rows(
    spec: FeatureSpec, train: SplitBinaryDataset, counts: list | None
) -> tuple[SplitBinaryDataset, list | None]:
    """The rows --folds cuts into folds: the train mapping's (`train`), then the val mapping's
    where the dataset has one, read as `train` reads its own rows; and `counts` (the train
    mapping's id_counts, or None) with the val mapping's added, so that a fold's rows are read as
    held-out rows against the ids of all the other rows."""
    from dlrmkit.data.id_counts import id_counts

    val = open_val(spec)
    if val is None:
        return train, counts
    if counts is not None:
        counts = [c + h for c, h in zip(counts, id_counts(val))]
    return train.joined(val), counts


def validation_split(
    spec: FeatureSpec, train: SplitBinaryDataset, fraction: float | None, fold: tuple[int, int] | None = None
) -> tuple[SplitBinaryDataset, SplitBinaryDataset | None, str]:
    """(train rows, validation rows or None, where the validation rows come from).
    `fraction` None: the val mapping, else the last 10% (at most 1M rows) of train; 0: none.
    `fold` (i, k): the i-th (from 1) of k contiguous folds of `train`, the others train (`train`: the
    rows fold_rows gives)."""
    if fraction is not None and not 0 <= fraction < 1:
        raise DlrmkitError(f"--val-fraction must be in [0, 1), got {fraction}")
    if fold is not None:
        (i, k), n = fold, len(train)
        lo, hi = n * (i - 1) // k, n * i // k
        if hi - lo < 1 or hi - lo >= n:
            return train, None, f"none (too few train rows, {n}, for {k} folds)"
        before, after = train.window(0, lo), train.window(hi, n)
        rest = after if lo == 0 else before if hi == n else before.joined(after)
        both = "the train and val mappings' rows" if open_val(spec) is not None else "the train rows"
        source = f"fold {i} of {k} of {both}, {hi - lo:,} rows (--folds)"
        return rest, train.window(lo, hi, "val"), source
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


def one_label(rows: SplitBinaryDataset, chunk: int = 1 << 22) -> int | None:
    """The label every one of `rows` holds (0 or 1), or None where both occur (read until both are
    seen: at once, on a click log); None for no rows."""
    clicks = non_clicks = False
    for lo in range(0, len(rows), chunk):
        v = rows.label.read(lo, min(lo + chunk, len(rows)))[:, 0] != 0
        clicks, non_clicks = clicks or bool(v.any()), non_clicks or not bool(v.all())
        if clicks and non_clicks:
            return None
    return int(clicks) if clicks or non_clicks else None


def check_both_labels(
    data: str,
    train: SplitBinaryDataset,
    val: SplitBinaryDataset | None,
    val_source: str,
    ways: str = "a val mapping, --val-fraction F, or --folds K",
) -> None:
    """Rows of one label cannot train a click model, and validation rows of one label have no AUC,
    which early stopping, the recipe search, the blend, the regression's C and the temperature
    choose by: one line naming the rows and where they come from."""
    kind = ("non-clicks (label 0)", "clicks (label 1)")
    label = one_label(train)
    if label is not None:
        raise DlrmkitError(
            f"{data}: the {len(train):,} training rows are all {kind[label]}: a click model learns from both labels"
        )
    label = one_label(val) if val is not None else None
    if label is not None:
        raise DlrmkitError(
            f"{data}: the validation rows ({val_source}) are all {kind[label]}: they have no AUC, which the "
            "choices made on them go by (early stopping, the recipe search, the regression's C, the temperature); "
            f"give validation rows holding both labels ({ways})"
        )


def selection_options_on(cfg: TrainConfig) -> list[tuple[str, str]]:
    """The model-selection options that are on, as (field, how the command line shows it): they
    select on validation rows and do nothing without them."""
    return [
        (name, shown)
        for name, shown, on in (
            ("patience", f"--patience {cfg.selection.patience}", bool(cfg.selection.patience)),
            ("restore_best", "--restore-best true", bool(cfg.selection.restore_best)),
            ("target_auc", f"--target-auc {cfg.selection.target_auc}", cfg.selection.target_auc is not None),
            (
                "lr_decay_on_plateau",
                f"--lr-decay-on-plateau {cfg.selection.lr_decay_on_plateau}",
                cfg.selection.lr_decay_on_plateau is not None,
            ),
            ("refit", "--refit true", bool(cfg.selection.refit)),
        )
        if on
    ]


def check_selection_options(cfg: TrainConfig, config: str | None = None, flags: Iterable[str] = ()) -> None:
    """--val-fraction 0 leaves no validation rows (the val mapping too is unused), so an early stop
    or best-weight option the user gave would silently do nothing: one line naming both (and the
    --config file, for a value from there: not among `flags`, the fields given on the command
    line). Call it before a recipe fills its own (dlrmkit.train.recipe leaves them out here)."""
    if cfg.selection.val_fraction != 0:
        return
    offending = selection_options_on(cfg)
    if not offending:
        return
    one, flags = len(offending) == 1, set(flags)
    named = " and ".join(
        shown + ("" if name in flags or not config else f" (from --config {config})") for name, shown in offending
    )
    raise DlrmkitError(
        f"{named} {'acts' if one else 'act'} on validation rows, and --val-fraction 0 leaves none (the "
        f"val mapping is not used either): {'it' if one else 'they'} would do nothing; drop "
        f"{'it' if one else 'them'}, or give --val-fraction > 0"
    )


@dataclass(frozen=True)
class Refit:
    """What a refit (dlrmkit.train.refit) repeats of its run's selection."""

    epochs: float  # the run's selected step, in epochs of its training rows
    lr_scales: tuple[tuple[float, float], ...]  # (epoch, learning-rate scale from then on): the run's decays
    wide_c: float | None  # --wide-init regression: the C the run chose on the validation rows
    scale: float  # 1/T of the temperature the run fitted on the validation rows (1: none)
    selected: dict  # the run's validation figures and selected step, which the refit reports as its own


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
