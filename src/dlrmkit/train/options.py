"""The training loop's sections of `dlrmkit train`'s options: its length and LR schedule, model
selection on validation rows (dlrmkit.train.selection), checkpoints (dlrmkit.train.run_checkpoint)
and outputs (dlrmkit.train.run_dir, run_log). Imports no torch: the parser is built before a
command is chosen."""

from __future__ import annotations

from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.options import option

SEARCH_BUDGET = 7  # --search-budget's default: every candidate of dlrmkit.train.recipe_search
BLEND_SEEDS = 2  # --blend-seeds' default
TIME_LIMIT = 4.5  # --time-limit's default, in minutes: a 46,000-row log's run within 5 (docs/BENCHMARKS.md)


@dataclass
class ScheduleOptions:
    """How long the loop runs, with which batch, and the LR schedule's steps (unset: the preset's)."""

    batch_size: int | None = option(None, "global batch size (default: the preset's)", parse=ct.batch_size)
    epochs: int | None = option(
        None, "passes over the train mapping (default: the preset's)", parse=ct.positive_int, group="length"
    )
    max_steps: int | None = option(None, "stop after this many steps instead", parse=ct.positive_int, group="length")
    warmup_steps: int | None = option(None, "linear LR warm-up steps (0: none)", parse=ct.nonneg_int)
    decay_start: int | None = option(None, "step where polynomial LR decay starts (0: no decay)", parse=ct.nonneg_int)
    decay_steps: int | None = option(None, "steps of polynomial (power 2) decay to 0", parse=ct.nonneg_int)
    skip_nonfinite: int = option(
        0,
        "skip up to N batches whose loss is NaN/Inf (counted in the log) before stopping (default {default})",
        parse=ct.nonneg_int,
    )


MAX_BLEND_MEMBERS, MAX_BLEND_WEIGHT = 16, 1000  # what --blend may hold
MAX_BLEND_SEEDS = 4  # --blend-seeds
MAX_FOLDS = 10  # --folds: a blend.yaml holds at most MAX_BLEND_MEMBERS * MAX_FOLDS runs


def blend_members(text: str) -> list[tuple[str, int]]:
    """--blend 'NAME=W; NAME=W' as [(name, weight)]; ValueError naming what is wrong (the names
    are checked against the search's candidates where the recipe is chosen)."""
    members = []
    for i, item in enumerate(str(text).split(";")):
        name, eq, weight = item.strip().rpartition("=")
        if not eq or not name.strip() or not weight.strip().isascii() or not weight.strip().isdigit():
            raise ValueError(f"item {i + 1} ({item.strip()!r}) is not NAME=WEIGHT")
        if not 1 <= int(weight) <= MAX_BLEND_WEIGHT:
            raise ValueError(f"item {i + 1}: weight {int(weight)} is outside 1..{MAX_BLEND_WEIGHT}")
        members.append((name.strip(), int(weight)))
    names = [n for n, _ in members]
    if len(set(names)) != len(names) or not 1 <= len(members) <= MAX_BLEND_MEMBERS:
        raise ValueError(f"needs 1 to {MAX_BLEND_MEMBERS} different members, got {names}")
    return members


def blend_text(text: str) -> str:
    """--blend's value, checked as the command line is parsed."""
    import argparse

    try:
        blend_members(ct.text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclass
class SelectionOptions:
    """Evaluation on validation rows, early stop, the best weights, their calibration and the
    search over candidate recipes that the validation rows decide (dlrmkit.train.recipe)."""

    eval_every: int = option(
        0, "evaluate on the validation rows every N steps (default: each epoch end)", parse=ct.nonneg_int
    )
    evals_per_epoch: int | None = option(
        None,
        "evaluate on the validation rows N times per epoch, unless --eval-every is given (default: the preset's; "
        "mlperf-dcnv2: 20, every 0.05 epoch)",
        parse=ct.nonneg_int,
    )
    val_fraction: float | None = option(
        None,
        "hold out the last F of the train mapping for model selection (default: "
        "the dataset's val mapping, else 0.1 of the train rows, at most 1M; 0: none, not even the val mapping)",
        parse=ct.float_range(0.0, 1.0, hi_open=True),
    )
    patience: int | None = option(
        None, "stop after N evaluations without a better validation AUC (0: never)", parse=ct.nonneg_int
    )
    restore_best: bool | None = option(None, "end with the weights of the best validation AUC (true/false)")
    lr_decay_on_plateau: float | None = option(
        None,
        "multiply the learning rate by F at each evaluation without a better validation AUC (as FuxiCTR and "
        "Keras' ReduceLROnPlateau do; default: none)",
        parse=ct.float_range(0.0, 1.0, lo_open=True, hi_open=True),
    )
    refit: bool | None = option(
        None,
        "once selection has chosen on the validation rows, train the same recipe again on the training and "
        "validation rows together, for the epochs selection chose, and keep that model (true/false; default: true "
        "after --preset auto's search, else false)",
    )
    folds: int | None = option(
        None,
        "cross-validation: cut the train mapping's rows, then the val mapping's, into K contiguous folds, each "
        "the validation rows of a model trained on the others; with --preset auto, every candidate is trained K "
        "times, chosen and blended on all K folds' validation logits, and the run is the K models of each kept "
        "candidate, averaged, or with --refit true each kept candidate trained again on all rows as its median fold "
        "chose (1: none; default: 5 on up to 20,000 train and val rows together, and, refitted, on up to 40,000 "
        "where the validation rows hold fewer than 500 of their rarer label; else none)",
        parse=ct.int_range(1, MAX_FOLDS),
    )
    fold: int | None = option(
        None,
        "with --folds K: the fold (1..K) whose rows are this run's validation rows; the others train it "
        "(a run of one of the K models; --preset auto trains them all)",
        parse=ct.int_range(1, MAX_FOLDS),
    )
    eval_batch_size: int = option(16384, "batch size for evaluation (default {default})", parse=ct.batch_size)
    target_auc: float | None = option(None, "stop as soon as a validation AUC reaches this", parse=ct.auc)
    calibration: str | None = option(
        None,
        "temperature: fit one temperature on the validation rows after selection, folded into the "
        "model's last weights (default none)",
        choices=("none", "temperature"),
    )
    search_budget: int | None = option(
        None,
        "--preset auto: how many candidate recipes to try on the validation rows (0: none, the base recipe; "
        f"default {SEARCH_BUDGET})",
        parse=ct.nonneg_int,
    )
    blend: str | None = option(
        None,
        "--preset auto: train these candidate recipes of the search, each as a run of its own, and average "
        "their logits with these weights, 'NAME=W; NAME=W' ('NAME, N epochs': the candidate trained for N "
        "epochs; the search writes what it chose into config.yaml; default: the search decides)",
        parse=blend_text,
    )
    blend_seeds: int | None = option(
        None,
        "a blend: train each member weighing a tenth of the blend or more N times, with seeds --seed, "
        "--seed+1, ..., each a run of its own, and average their logits (the mean of two seeds ranks better "
        "than one; a blend of one member, --blend NAME=1, too; a run that is no blend, or --folds without "
        f"--refit: unused; default {BLEND_SEEDS}, or 1 where --time-limit says so)",
        parse=ct.int_range(1, MAX_BLEND_SEEDS),
    )
    time_limit: float | None = option(
        None,
        "--preset auto's search: the wall-clock minutes the run aims its training at; candidates after the "
        "first start only in the first 75%% of them, a candidate's training ends at an epoch end by 90%% of them "
        "(not where --epochs or --max-steps is given, nor with --folds), and a blend leaves out its second "
        "seeds, then its refits (a single choice its refit), where their time, estimated from the search's runs, "
        "would pass them (options given are kept; what is left out is printed and config.yaml records it; 0: no "
        f"limit; default {TIME_LIMIT:g} on up to 100,000 training rows, else none)",
        metavar="MINUTES",
        parse=ct.float_range(0.0, 1e6),
    )


@dataclass
class CheckpointOptions:
    """Where and when the run saves checkpoints, how many it keeps, and whether it resumes."""

    checkpoint_dir: str | None = option(
        None,
        "write checkpoints (and log.jsonl) here; a folder holding another run's "
        "checkpoints or log needs --resume (default: <run folder>/checkpoints)",
        parse=ct.path,
    )
    checkpoint_every: int = option(0, "also checkpoint every N steps (default: only at the end)", parse=ct.nonneg_int)
    checkpoint_every_seconds: float = option(
        0.0, "also checkpoint when this many seconds passed since the last one (default: off)", parse=ct.seconds
    )
    keep_checkpoints: int = option(
        2,
        "checkpoints kept in --checkpoint-dir: the one 'latest' names and the newest others (default {default})",
        parse=ct.positive_int,
        flag="--keep",
    )
    final_checkpoint: bool = option(
        True,
        "do not save a checkpoint when training ends (default: save one into "
        "--checkpoint-dir, else <run folder>/checkpoints, in one process and under "
        "torchrun alike)",
        flag="--no-final-checkpoint",
        negate=True,
    )
    resume: bool = option(
        False,
        "continue from the latest checkpoint in --checkpoint-dir (needed, or the --run-dir of the run "
        "to continue), or start fresh when there is none; stderr says which. A run that ended (its final "
        "checkpoint, with the same --max-steps/--epochs) is left as it is, saying so, exit 0",
    )


@dataclass
class OutputOptions:
    """What the run writes besides checkpoints, and where: a config file never sets these paths
    (dlrmkit.train.config_file)."""

    run_dir: str | None = option(
        None, "run folder: config.yaml, plan.json, log.jsonl, checkpoints/ (default runs/<timestamp>)", parse=ct.path
    )
    metrics_json: str | None = option(None, "write the final metrics as one JSON object to this file", parse=ct.path)
    log_jsonl: str | None = option(
        None,
        "JSON-lines log of steps and evaluations (default: log.jsonl in --checkpoint-dir, else in the run "
        "folder); without --resume, a file holding another run's log is refused",
        parse=ct.path,
    )
    tensorboard: str | None = option(
        None, "at the end, also write the run's scalars as TensorBoard events into DIR", metavar="DIR", parse=ct.path
    )
    log_every: int = option(
        50, "steps between train-loss records in the log (default {default})", parse=ct.positive_int
    )
    progress: bool = option(True, "no progress bar", flag="--no-progress", negate=True)


# the paths that say where a run writes: from the command line only, never from a config file
OUTPUT_PATHS = ("run_dir", "checkpoint_dir", "metrics_json", "log_jsonl", "tensorboard")
