"""--refit: once a run has chosen its weights on the validation rows, the same recipe is trained
again, from the same seed, on the training and validation rows together, for as many epochs as
selection chose (its selected step, in epochs of the training rows), and that model is the
run's. It repeats everything the first run chose on the validation rows rather than choosing
again: the learning-rate decays --lr-decay-on-plateau made (at the same point of training), the
C of --wide-init regression, the temperature. The validation figures the run reports are the
first run's (the refit has seen those rows); the test rows are read once, by the refit. A
careful user refits so on the rows selection held back; docs/RECIPES.md measures it.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from dlrmkit.train.selection import Refit

# the selection options a refit turns off: it has no validation rows to select on
OFF = {
    "patience": 0,
    "restore_best": False,
    "lr_decay_on_plateau": None,
    "target_auc": None,
    "calibration": "none",
    "eval_every": 0,
    "evals_per_epoch": 0,
}


def skipped(cfg: Any, parallel: bool) -> str | None:
    """Why a run with --refit keeps its selected model instead, or None: a refit trains in one
    process, and a run that saves checkpoints along the way or resumes is one --resume continues,
    which a refit (a second training, into the same folder) would not be."""
    ck = cfg.checkpoint
    if parallel:
        return "under torchrun: a refit trains in one process"
    if ck.resume:
        return "--resume: a resumed run keeps its selected model"
    if ck.checkpoint_every or ck.checkpoint_every_seconds:
        return (
            "checkpoints along the way (--checkpoint-every, --checkpoint-every-seconds) are for --resume, which "
            "continues the selected model"
        )
    return None


def wanted(cfg: Any, parallel: bool, say: bool = True) -> bool:
    """Whether a run with validation rows refits: --refit, unless `skipped`, which it says (`say`)."""
    why = skipped(cfg, parallel) if cfg.selection.refit else None
    if why is not None and say:
        print(f"refit: skipped ({why}); the model is the one selection chose", file=sys.stderr)
    return bool(cfg.selection.refit) and why is None


def plan(trainer: Any, metrics: dict[str, Any]) -> Refit:
    """The refit of a trained run (`metrics`: its Trainer.fit's)."""
    per_epoch = len(trainer.loader)
    selected = int(metrics["selected_step"])
    return Refit(
        epochs=selected / per_epoch,
        lr_scales=tuple((step / per_epoch, scale) for step, scale in trainer.lr_scales if step <= selected),
        wide_c=trainer.wide_init["c"] if trainer.wide_init is not None else None,
        scale=1 / trainer.temperature,
        selected={k: metrics[k] for k in ("val_auc", "val_logloss", "selected_step", "best_auc")},
    )


def refit(
    trainer: Any, metrics: dict[str, Any], read_test: bool, changes: dict[str, Any] | None = None
) -> tuple[Any, Any, dict[str, Any]]:
    """(the refit's Trainer, its test rows, its metrics) of a trained run that has not read its
    test rows (`metrics`: its fit's). The refit writes where the run does (its log continues the
    run's, after a `refit` record), from the same seed; `changes`: options (flat names) it takes
    instead of the run's (a fold's run refitted into a folder of its own, on a seed of its own:
    dlrmkit.train.blend.refit_folds). `read_test`: the refit reads the test rows and saves its
    final checkpoint at its end, as a run does; else the caller does both (a blend, once every
    member is trained). Its metrics (Trainer.fit's) carry the run's validation figures and
    selected step."""
    from dlrmkit.options import assign
    from dlrmkit.train.trainer import Trainer

    cfg = copy.deepcopy(trainer.cfg)
    assign(cfg, {**OFF, **(changes or {})})
    how = plan(trainer, metrics)
    trainer.log({"event": "refit", "epochs": how.epochs, "lr_scales": [list(x) for x in how.lr_scales],
                 "wide_c": how.wide_c, "temperature": 1 / how.scale})  # fmt: skip
    again = Trainer(cfg, refit=how)
    again.samples_seen = trainer.samples_seen  # its log's x axis goes on from the run's
    test = again.test_set
    if not read_test:
        again.test_set = test.window(0, 0, "test")
    out = again.fit(save=read_test)
    if not again.step:  # the run's start was its choice (a regression): no step, no training loss of its own
        out["train_loss"] = metrics["train_loss"]
    return again, test, out
