"""`dlrmkit train --data D` without --preset: a base recipe chosen from the dataset's size, and,
up to LARGE_ROWS training rows, a search over candidate recipes on the validation rows (select;
the candidates: dlrmkit.train.recipe_search), whose best, or a blend of several (member_configs;
dlrmkit.train.blend), is the run. Small data (up to SMALL_ROWS training rows, the sample a user tries
first) overfits a plain DLRM within an epoch, so its base adds a first-order (wide) term, trains
the tables with Adagrad and lazy L2, keeps them narrow, evaluates every epoch on the validation
rows, stops early and restores the best weights; seven candidates are tried over it. Medium data
gets the tiny preset's recipe, tried against the regression; larger data the DLRM reference's. Each
choice and its measurement: docs/RECIPES.md. Options given on the command line or in --config
always win.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlrmkit.config import AUTO, get_preset, own_lr
from dlrmkit.errors import DlrmkitError
from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.id_counts import by_count, id_counts
from dlrmkit.data.split_binary import RAW_NUMERICAL, SplitBinaryDataset, numerical_scale
from dlrmkit.optim.names import lr_family
from dlrmkit.train import blend
from dlrmkit.train.options import BLEND_SEEDS, SEARCH_BUDGET, TIME_LIMIT

SMALL_ROWS = 100_000
LARGE_ROWS = 10_000_000
SELECTION = ("patience", "restore_best", "lr_decay_on_plateau")  # options that act on the validation rows
NO_TABLE_BUCKETS = 32  # numerical features only: the buckets that give the model its tables
SEARCHED = ("small-data", "medium-data")  # the base recipes tried against their candidates on validation rows
# cross-validation (--folds) by default: K folds on up to FOLD_ROWS rows (the train and val
# mappings' together), where the validation rows otherwise are a few hundred to 2,000, the run the
# kept candidates' fold models averaged; and on up to FOLD_REFIT_ROWS where the validation rows
# hold fewer than FEW_VAL_LABELS of their rarer label (clicks, or non-clicks), too few to choose
# on, the kept candidates then refitted on all rows (there the fold models' mean gains less than
# one model on every row). docs/RECIPES.md measures both.
FOLDS, FOLD_ROWS, FOLD_REFIT_ROWS, FEW_VAL_LABELS = 5, 20_000, 40_000, 500


@dataclass
class Recipe:
    name: str
    values: dict[str, Any] = field(default_factory=dict)  # TrainConfig option (flat name) -> value
    reasons: list[str] = field(default_factory=list)


FOLDS_WHY = (
    "cross-validation (--folds {k}): {rows:,} rows{both}, so the validation rows would be few; each candidate "
    "is trained {k} times, each fold of the rows the validation rows of the model trained on the others, and "
    "the choice and blend are made on all {rows:,} rows' validation logits"
)
FOLDS_BAG = (
    "; the run averages the kept candidates' {k} models (each has seen {seen} of {k} folds; no refit: up to "
    "{limit:,} rows the mean of the fold models beats one model on all rows)"
)
FOLDS_REFIT = (
    " (the validation rows hold {rarer:,} of their rarer label, under {few:,}); then each kept candidate is trained "
    "again on all {rows:,} rows, repeating what its median fold (by the epochs selected) chose (--refit true: over "
    "{limit:,} rows one model on all rows beats the fold models' mean)"
)
REFIT_WHY = (
    "refit: each model kept is trained again on the training and validation rows together, for the epochs "
    "selection chose (--refit true): the rows selection held back train it too (more rows; in a log kept in time "
    "order, the latest)"
)


def choose(spec: FeatureSpec, train: SplitBinaryDataset) -> Recipe:
    rows, cards = len(train), spec.cardinalities
    scale = numerical_scale(train)
    ids_per_row = sum(cards) / max(rows, 1)
    if rows <= SMALL_ROWS:
        r = Recipe(
            "small-data",
            {
                "wide": True,
                "embedding_dim": 8,
                "bottom_mlp": [32, 8] if train.num_numerical else [],
                "top_mlp": [32, 1],
                "optimizer": "adagrad",
                "lr": 0.05,
                "embedding_weight_decay": 0.01,
                "batch_size": 64,
                "epochs": 30,
                "patience": 3,
                "restore_best": True,
                "embedding_init_scale": 0.1,
                "threads": 1,
            },
        )
        r.values["standardize_numerical"] = bool(train.num_numerical)
        counts = id_counts(train) if cards else []
        singles = sum(int((c[1:] == 1).sum()) for c in counts)
        if counts and by_count(counts) is None:  # ids numbered by count, as preprocess/transcode number them
            r.values["min_id_count"] = 2
        r.reasons += [
            f"{rows:,} training rows (<= {SMALL_ROWS:,}): a plain DLRM overfits within an epoch here",
            f"{sum(cards):,} ids in {len(cards)} tables ({ids_per_row:.2f} per training row): narrow tables "
            "(dim 8), Adagrad 0.05 with lazy L2 (weight decay 0.01 on touched rows), batch 64",
            "wide term: a first-order weight per id and numerical feature beside the DLRM (the logistic regression "
            "it must at least match); tables start at 0.1 of the usual init (quiet rare ids, less seed variance)",
            "up to 30 epochs, evaluated on the validation rows each epoch, stop after 3 without improvement, "
            "restore the best weights",
            "one thread: steps of 64 rows through MLPs this narrow gain nothing from a second",
        ]
        if "min_id_count" in r.values:
            r.reasons.append(
                f"{singles:,} of {sum(cards):,} ids are seen once in the training rows: ids seen fewer than 2 times share "
                "id 0, which then learns what a rare or new value means (--min-id-count 2)"
            )
        if train.num_numerical:
            r.reasons.append("numerical inputs standardized with the training rows' mean and deviation")
    elif rows <= LARGE_ROWS:
        r = Recipe(
            "medium-data",
            {
                "embedding_dim": 16,
                "bottom_mlp": [64, 16] if train.num_numerical else [],
                "top_mlp": [64, 32, 1],
                "optimizer": "sgd",
                "lr": 1.0,
                "batch_size": 256,
                "epochs": 6,
                "patience": 2,
                "restore_best": True,
            },
        )
        r.reasons.append(
            f"{rows:,} training rows ({SMALL_ROWS:,} to {LARGE_ROWS:,}): the tiny preset's recipe (dim 16, "
            "SGD 1.0, batch 256, 6 epochs), evaluated on the validation rows each epoch, stop after 2 "
            "without improvement, restore the best weights"
        )
        if train.num_numerical:  # raw counts, even after their log, stall SGD 1.0 at a constant
            r.values["standardize_numerical"] = True
            r.reasons.append("numerical inputs standardized with the training rows' mean and deviation")
        r.values["calibration"] = "temperature"
        r.reasons.append("one temperature fitted on the validation rows after training")
    else:
        r = Recipe(
            "large-data",
            {
                "embedding_dim": 16,
                "bottom_mlp": [512, 256, 64, 16] if train.num_numerical else [],
                "top_mlp": [512, 256, 1],
                "optimizer": "sgd",
                "lr": 0.1,
                "batch_size": 128,
                "epochs": 1,
                "restore_best": True,
            },
        )
        r.reasons.append(
            f"{rows:,} training rows (> {LARGE_ROWS:,}): the DLRM reference's Criteo Kaggle recipe "
            "(dim 16, SGD 0.1, batch 128, one epoch)"
        )
    if scale > RAW_NUMERICAL:
        r.values["numerical_transform"] = "signed-log"
        seen = "over 65,504 (float16 infinities)" if np.isinf(scale) else f"up to {scale:,.0f}"
        r.reasons.append(f"numerical values {seen}: raw, so the model takes sign(x) log(1+|x|)")
    else:
        r.values["numerical_transform"] = "none"
    if not cards and train.num_numerical:  # a model needs a table: the numbers become categories too
        r.values["numerical_buckets"] = NO_TABLE_BUCKETS
        r.reasons.append(
            f"no categorical features: each numerical feature is also a category ({NO_TABLE_BUCKETS} quantile buckets "
            "and the frequent values), so the model has tables to look up"
        )
    return r


def apply(values: dict[str, Any], recipe: Recipe) -> list[str]:
    """Fill the options the user left unset in `values` ({TrainConfig option (flat name): value},
    dlrmkit.options.flatten); returns the names it filled."""
    filled = []
    if values.get("val_fraction") == 0 and any(k in recipe.values for k in SELECTION):
        for key in SELECTION:  # no validation rows: nothing to stop early on or restore from
            recipe.values.pop(key, None)
        recipe.reasons.append("--val-fraction 0: no validation rows, so no early stop; the last weights are kept")
    # the recipe's learning rate and table L2 belong to its optimizer: a user's optimizer keeps its own
    own_optimizer = any(values.get(k) is not None for k in ("optimizer", "embedding_optimizer"))
    for key, value in recipe.values.items():
        if own_optimizer and key in ("optimizer", "embedding_optimizer", "lr", "dense_lr", "embedding_weight_decay"):
            continue
        if values.get(key) is None:
            values[key] = value
            filled.append(key)
    opt, emb = values.get("optimizer"), values.get("embedding_optimizer")
    lr = own_lr(opt, emb, get_preset(AUTO)) if own_optimizer and values.get("lr") is None else None
    if lr is not None:  # what TrainConfig.resolved would fill, shown with the recipe's choices
        values["lr"] = recipe.values["lr"] = lr
        filled.append("lr")
        chosen = " ".join(f"--{k} {v}" for k, v in (("optimizer", opt), ("embedding-optimizer", emb)) if v)
        kind = "Adam" if lr_family(opt or get_preset(AUTO).optimizer, emb) == "adam" else "Adagrad"
        recipe.reasons.append(f"{chosen} without --lr: lr {lr}, an {kind} rate (the recipe's is for its own optimizer)")
    dim, bottom = values.get("embedding_dim"), values.get("bottom_mlp")
    if "bottom_mlp" in filled and bottom and dim and bottom[-1] != dim:  # --embedding-dim given alone
        values["bottom_mlp"] = [*bottom[:-1], dim]
    return filled


def describe(recipe: Recipe, filled: list[str], val_source: str | None = None) -> str:
    # the search budget config.yaml records (0: a repeat does not search again) is the search
    # line's to tell, not the recipe's
    shown = [k for k in recipe.values if k in filled and k != "search_budget"]
    lines = [
        f"recipe {recipe.name} (no --preset): "
        + ", ".join(f"{k.replace('_', '-')} {format_value(recipe.values[k])}" for k in shown)
    ]
    overridden = [k for k in recipe.values if k not in filled]
    if overridden:
        lines.append("  kept from the command line/config: " + ", ".join(k.replace("_", "-") for k in overridden))
    lines += [f"  why: {reason}" for reason in recipe.reasons]
    if val_source:
        lines.append(f"  validation rows: {val_source}")
    return "\n".join(lines)


def format_value(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(str(x) for x in v) or "none"
    return str(v).lower() if isinstance(v, bool) else str(v)


def fill(cfg: Any, recipe: Recipe) -> list[str]:
    """`apply` on a TrainConfig instance (through its flat names); returns the names it filled."""
    from dlrmkit.options import assign, flatten

    values = flatten(cfg)
    filled = apply(values, recipe)
    assign(cfg, {name: values[name] for name in filled})
    return filled


def select(cfg: Any) -> tuple[str, list[tuple[Any, Any]], tuple | None]:
    """--preset auto: the base recipe for the dataset's size; on data up to LARGE_ROWS training
    rows (the SEARCHED bases) with validation rows, in one process, a search over candidate
    recipes on the validation rows (dlrmkit.train.recipe_search) picks the values, leaving out
    what would pass --time-limit (dlrmkit.train.time_limit). Fills `cfg`'s
    unset options (they reach config.yaml with --search-budget 0, so `train --config` repeats the
    run without the search);
    returns what was chosen and why, for rank 0 to print; where the run is a blend (chosen by
    the search, or --blend), its members (member_configs), else []; and where the search chose one
    candidate, its trained run (recipe_search.Candidate.trained: the run's first training, which
    a refit takes over instead of training it again), else None."""
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.parallel.dist import launched_by_torchrun
    from dlrmkit.train import recipe_search
    from dlrmkit.train.selection import cross_folds, validation_split
    from dlrmkit.train.time_limit import Clock, refit_seconds, unrefitted

    sel, start = cfg.selection, time.perf_counter()
    given = {"blend_seeds": sel.blend_seeds is not None, "refit": sel.refit is not None}  # the time limit keeps them
    spec, train, _ = open_dataset(cfg.data)
    base = choose(spec, train)
    minutes = sel.time_limit if sel.time_limit is not None else TIME_LIMIT if base.name == "small-data" else 0
    clock = Clock(60.0 * minutes, start)
    check_folds(cfg)
    budget = sel.search_budget if sel.search_budget is not None else SEARCH_BUDGET
    lines: list[str] = []
    taken = None
    if sel.blend is not None:  # a blend given (a blend's config.yaml): its members, unsearched
        if launched_by_torchrun():
            raise DlrmkitError(
                "--blend trains its members in one process; run it without torchrun, or give torchrun one "
                "member's config.yaml (--config <checkpoint folder>/<member>/config.yaml)"
            )
        if cfg.checkpoint.resume:
            raise DlrmkitError("--blend with --resume: a blend's members are not resumed; train it again")
        if validation_split(spec, train, sel.val_fraction)[1] is None:
            raise DlrmkitError(f"--blend: {cfg.data} gives no validation rows to fit the blend's temperature on")
        sel.search_budget = 0
        sel.blend_seeds = sel.blend_seeds or BLEND_SEEDS
        members = member_configs(cfg, base, train.num_numerical)
        if cross_folds(cfg):
            head = f"blend of {len(members)} (--blend, no search), each member trained once per fold (--folds {sel.folds}):"
        else:
            head = (f"blend of {len(members)} (--blend, no search), each member weighing a tenth of it or more "
                    f"trained with {cfg.selection.blend_seeds} seed(s) from --seed on, the others with one:")  # fmt: skip
        text = "\n".join(
            [describe(base, fill(copy.deepcopy(cfg), base)), head]
            + [f"  {m.name} (weight {m.weight}): {describe_values(c)}" for m, c, _ in members]
        )
        return text, members, None
    if base.name in SEARCHED:
        if budget == 0:  # asked for (a run's config.yaml says so too): the reason, under torchrun as well
            why_not = "--search-budget 0"
        elif launched_by_torchrun():
            why_not = "under torchrun: search in one process, then repeat its config.yaml"
        elif train.multi_hot:
            why_not = "multi-hot ids: the regression candidate reads one-hot datasets"
        elif validation_split(spec, train, sel.val_fraction)[1] is None:
            why_not = "no validation rows"
        else:
            why_not = None
        if why_not is None:
            # as if given: the members and config.yaml keep it
            rows, rarer = default_folds(cfg, spec, train) if sel.folds is None else (0, None)
            if rows:
                sel.folds = FOLDS
                if rows > FOLD_ROWS:
                    sel.refit = True
                both = " in the train and val mappings" if rows > len(train) else ""
                how = FOLDS_REFIT if sel.refit else FOLDS_BAG
                base.reasons.append(FOLDS_WHY.format(k=FOLDS, rows=rows, both=both) + how.format(
                    k=FOLDS, seen=FOLDS - 1, rows=rows, limit=FOLD_ROWS, rarer=rarer, few=FEW_VAL_LABELS))  # fmt: skip
            winner, tried, left_out = recipe_search.search(cfg, base, budget, train, fill, clock)
            lines = recipe_search.describe(winner, tried, budget, cross_folds(cfg)) + left_out
            refit_why = [f"  {REFIT_WHY}"] if sel.refit is None and not cross_folds(cfg) else []
            if refit_why:  # as if given: a blend's members and config.yaml keep it (unless the time limit drops it)
                sel.refit = True
            members = recipe_search.blend_of(tried) if not cfg.checkpoint.resume else []
            if cross_folds(cfg) and not members:  # one candidate: its fold models, averaged
                members = [blend.Member(winner.name, 1)]
            unrefit = []  # one candidate whose refit would pass the limit: its search run, a blend of one
            if not members and sel.refit and not cfg.checkpoint.resume:  # (a blend is not resumed)
                unrefit = unrefitted(clock, winner.name, refit_seconds(winner), given["refit"])
            if unrefit:
                members, sel.refit = [blend.Member(winner.name, 1)], False
                sel.blend_seeds = sel.blend_seeds or 1
            recipe_search.release(tried, keep={m.name for m in members} or {winner.name})
            if members:  # the run is the blend; config.yaml repeats it (member_configs)
                sel.blend, sel.search_budget = blend.spec(members), 0
                timed = unrefit + within_time(cfg, members, tried, clock, given)
                lines += refit_why if sel.refit else []
                said = blend.describe(members, tried, sel.blend_seeds, cross_folds(cfg), bool(sel.refit))
                text = "\n".join([describe(base, fill(copy.deepcopy(cfg), base)), *lines, said, *timed])
                trained = {c.name: c.trained for c in tried}  # each member's first run: the search's
                return text, member_configs(cfg, base, train.num_numerical, trained), None
            lines += refit_why
            if base.values.get("calibration") != "temperature":
                base.reasons.append("one temperature fitted on the validation rows after selection")
            base.values.update(winner.values)
            base.values["calibration"] = "temperature"
            base.name = f"{base.name}, {winner.name}"
            taken = winner.trained[0] if winner.trained else None
            # the search is done: a --search-budget given gives way to the 0 filled below, so that
            # config.yaml repeats the choice without searching again (as a blend's does)
            sel.search_budget = None
        else:
            if cross_folds(cfg):
                raise DlrmkitError(f"--folds trains a candidate of the search once per fold, and the search is off "
                                   f"({why_not}): give --blend NAME=1 to name the candidate, or drop --folds")  # fmt: skip
            lines = [f"search: off ({why_not}): the base recipe"]
        base.values["search_budget"] = 0
    text = describe(base, fill(cfg, base))
    return ("\n".join([text, *lines]) if lines else text), [], taken


def within_time(cfg: Any, members: list, tried: list, clock: Any, given: dict[str, bool]) -> list[str]:
    """--time-limit on the blend the search chose (dlrmkit.train.time_limit): fills --blend-seeds
    (its default, or 1 where the second seeds would pass the limit) and, where the refits would,
    --refit false, unless given; returns the lines saying what was left out."""
    from dlrmkit.train.refit import wanted
    from dlrmkit.train.selection import cross_folds
    from dlrmkit.train.time_limit import blend_time, trim

    sel = cfg.selection
    seeds = sel.blend_seeds or BLEND_SEEDS
    total = sum(m.weight for m in members)
    runs = {m.name: len(blend.seeded(m, total, seeds, cfg.seed)) for m in members}
    cost = blend_time(runs, tried, wanted(cfg, parallel=False, say=False), bool(cross_folds(cfg)))
    drop_seeds, drop_refits, lines = trim(clock, cost, given["blend_seeds"], given["refit"])
    sel.blend_seeds = 1 if drop_seeds else seeds
    if drop_refits:
        sel.refit = False
    return lines


def default_folds(cfg: Any, spec: FeatureSpec, train: SplitBinaryDataset) -> tuple[int, int | None]:
    """(the rows a searched run cross-validates over by default, the train mapping's and the val
    mapping's where there is one (fold_rows), or 0; over FOLD_ROWS rows, the count of the rarer
    label in the validation rows it would otherwise choose on, else None): up to FOLD_ROWS rows, or
    up to FOLD_REFIT_ROWS where that count is under FEW_VAL_LABELS and --refit false is not given;
    no --val-fraction, --refit true not asked for (a refit of the model chosen on held-out rows),
    and no checkpoints along the way or --resume (a run of K models is not resumed)."""
    from dlrmkit.data.split_binary import open_val
    from dlrmkit.train.refit import skipped
    from dlrmkit.train.selection import validation_split

    sel, val = cfg.selection, open_val(spec)
    rows = len(train) + (len(val) if val is not None else 0)
    limit = FOLD_ROWS if sel.refit is False else FOLD_REFIT_ROWS
    if sel.val_fraction is not None or rows > limit or sel.refit or skipped(cfg, parallel=False) is not None:
        return 0, None
    if rows <= FOLD_ROWS:
        return rows, None
    held = validation_split(spec, train, None)[1]
    if held is None:
        return 0, None
    clicks = int(np.count_nonzero(held.label.read(0, len(held))))
    rarer = min(clicks, len(held) - clicks)
    return (rows, rarer) if rarer < FEW_VAL_LABELS else (0, None)


def check_folds(cfg: Any) -> None:
    """--folds given with what it cannot go with: one line."""
    from dlrmkit.train.selection import cross_folds

    sel = cfg.selection
    if not cross_folds(cfg):
        return
    if sel.val_fraction is not None:
        raise DlrmkitError("--folds and --val-fraction both say which rows validate; give one")
    if cfg.checkpoint.resume:
        raise DlrmkitError("--folds with --resume: a run of one model per fold is not resumed; train it again")


def member_configs(cfg: Any, base: Recipe, num_numerical: int, trained: dict | None = None) -> list[tuple]:
    """(blend.Member, its TrainConfig, its trained run or None) for each member of --blend: the
    candidate's recipe over `base` filled into a copy of `cfg` as the search fills it (options
    given win), with its temperature; `trained`: the search's run of each candidate (on the run's
    seed, outputs off: recipe_search.Candidate.trained), which the blend takes over."""
    from dataclasses import replace

    from dlrmkit.train import recipe_search

    pool = recipe_search.candidates(num_numerical, base.name)
    out = []
    for m in blend.parse_spec(cfg.selection.blend):
        cand = recipe_search.named(pool, m.name)
        if cand is None:
            raise DlrmkitError(
                f"--blend: no candidate named {m.name!r} for {cfg.data} (candidates: "
                f"{', '.join(c.name for c in pool)}; a candidate of N epochs: 'NAME, N epochs')"
            )
        trial = copy.deepcopy(cfg)
        trial.selection.blend = None
        values = {**base.values, **cand.values, "calibration": "temperature", "search_budget": 0}
        fill(trial, replace(base, values=values, reasons=[]))
        out.append((m, trial, (trained or {}).get(m.name)))
    return out


def describe_values(cfg: Any) -> str:
    """The recipe values of a member's config, as `describe` prints a recipe's."""
    from dlrmkit.options import flatten

    values = flatten(cfg)
    keys = ("embedding_dim", "bottom_mlp", "top_mlp", "deep", "fm", "interaction", "optimizer", "lr",
            "batch_size", "numerical_buckets")  # fmt: skip
    return ", ".join(f"{k.replace('_', '-')} {format_value(values[k])}" for k in keys if values.get(k) is not None)
