"""The trainer's side of checkpoints: what a save records beside the weights (step, place in the
epoch, best AUC, skipped batches, the train dataset's fingerprint), the end-of-run save, and the
checks before a run resumes from one (same model, same dataset). dlrmkit.checkpoint.save_load does the
storage (DCP files, manifest, checksums); the training loop only says when."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from dlrmkit.errors import DlrmkitError
from dlrmkit.checkpoint import save_load as ckpt
from dlrmkit.options import flatten

if TYPE_CHECKING:
    from dlrmkit.train.trainer import Trainer


def save(trainer: Trainer) -> str:
    """A checkpoint of the trainer now, into --checkpoint-dir; returns its folder."""
    cfg = trainer.cfg
    assert cfg.checkpoint.checkpoint_dir
    trainer.check_loss()  # never a checkpoint of weights a non-finite loss has updated
    tensors, extras = ckpt.model_state(trainer.model, trainer.optimizers)
    meta = ckpt.checkpoint_meta(
        trainer.model_cfg,
        flatten(cfg),  # the options flat, as manifests have always held them
        epoch=trainer.epoch,
        batch_in_epoch=trainer.batch_in_epoch,
        best_auc=trainer.best_auc,
        skipped_nonfinite=trainer.skipped_nonfinite,
        samples_seen=trainer.samples_seen,
        **extras,
        dataset={"path": os.path.abspath(cfg.data), "fingerprint": fingerprint(trainer)},
    )
    path = ckpt.save_checkpoint(
        cfg.checkpoint.checkpoint_dir,
        trainer.step,
        tensors,
        meta,
        keep=cfg.checkpoint.keep_checkpoints,
        show=cfg.output.progress,
    )
    trainer.last_save_time, trainer.last_saved_step = time.monotonic(), trainer.step
    return path


def fingerprint(trainer: Trainer) -> str:
    """The train dataset's fingerprint (dlrmkit.data.fingerprint), computed once per trainer."""
    if trainer.data_fingerprint is None:
        from dlrmkit.data.fingerprint import dataset_fingerprint

        trainer.data_fingerprint = dataset_fingerprint(trainer.spec)
    return trainer.data_fingerprint


def save_final(trainer: Trainer) -> None:
    """The end-of-run checkpoint (unless --no-final-checkpoint, or the last step is saved already),
    with a line on screen."""
    cfg = trainer.cfg
    if (
        not cfg.checkpoint.checkpoint_dir
        or not cfg.checkpoint.final_checkpoint
        or trainer.last_saved_step == trainer.step
    ):
        return
    t0 = time.monotonic()
    path = save(trainer)
    if trainer.dist.rank == 0:
        size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        print(
            f"saved checkpoint {path} ({size / 2**20:,.1f} MiB, {time.monotonic() - t0:.1f} s; "
            f"--no-final-checkpoint skips it)",
            file=sys.stderr,
        )


def resume(trainer: Trainer, path: str) -> str:
    """Loads the checkpoint at `path` (or the one its `latest` names) into the trainer, after
    checking its checksums, that it holds this run's model, and that it was trained on this --data."""
    cfg = trainer.cfg
    path = ckpt.resolve_checkpoint(path)
    meta = ckpt.verify_checkpoint(path, show=cfg.output.progress)
    saved = ckpt.model_config_of(path, meta)
    if saved != trainer.model_cfg:
        raise DlrmkitError(f"{path}: checkpoint model {saved} does not match this run's model {trainer.model_cfg}")
    data = meta.get("dataset")
    if isinstance(data, dict) and data.get("fingerprint") != fingerprint(trainer):
        raise DlrmkitError(
            f"{path}: checkpoint was trained on {data.get('path')} (fingerprint "
            f"{str(data.get('fingerprint'))[:12]}), but --data {cfg.data} is another dataset "
            f"(fingerprint {fingerprint(trainer)[:12]}); resume with the same --data or start a "
            f"fresh --checkpoint-dir"
        )
    missing = [k for k in ("step", "epoch", "batch_in_epoch") if k not in meta]
    if missing:
        raise DlrmkitError(f"{path}/{ckpt.MANIFEST}: no {missing[0]} to resume from; refused")
    ckpt.restore_model_state(path, meta, trainer.model, trainer.optimizers, show=cfg.output.progress)
    trainer.step, trainer.epoch, trainer.batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
    trainer.best_auc = float("nan") if meta.get("best_auc") is None else float(meta["best_auc"])
    trainer.skipped_nonfinite = meta.get("skipped_nonfinite", 0)
    saved_samples = meta.get("samples_seen")  # older checkpoints: every step a full batch
    trainer.samples_seen = (
        int(saved_samples) if isinstance(saved_samples, int) else trainer.step * cfg.schedule.batch_size
    )
    return path
