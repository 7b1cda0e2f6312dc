"""The trainer's side of checkpoints: what a save records beside the weights (step, place in the
epoch, best AUC, skipped batches, the train dataset's fingerprint), the end-of-run save, and the
checks before a run resumes from one (same model, same dataset). dlrmkit.checkpoint.save_load does the
storage (DCP files, manifest, checksums); the training loop only says when."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from dataclasses import replace
from typing import Any, Protocol

from dlrmkit.errors import DatasetError, DlrmkitError, RunEnded
from dlrmkit.checkpoint import save_load as ckpt
from dlrmkit.options import flatten



class TrainerState(Protocol):
    """What a checkpoint reads from, and a resume restores into, the training loop
    (dlrmkit.train.trainer's Trainer): its config, model and optimizers, and where it stands."""

    cfg: Any
    model: Any
    model_cfg: Any
    optimizers: list
    dist: Any
    spec: Any
    loader: Any
    epoch: int
    step: int
    batch_in_epoch: int
    best_auc: float
    skipped_nonfinite: int
    samples_seen: int
    schedule: Any  # dlrmkit.optim.schedule.LRSchedule: its plateau scale is saved
    refit: Any  # dlrmkit.train.refit.Refit, or None: a refit's checkpoints say so, and are not resumed
    loss_scaler: Any  # dlrmkit.precision.LossScaler (fp16), or None: its scale is saved
    losses: Any  # dlrmkit.train.train_loss.TrainLoss: the logged mean's window is saved
    run_id: str | None
    last_saved_step: int
    last_save_time: float
    data_fingerprint: str | None
    vocabulary_fingerprint: str | None  # "": the dataset has no vocabulary (or none that loads)

    def check_loss(self) -> None: ...


def save(trainer: TrainerState, final: bool = False) -> str:
    """A checkpoint of the trainer now, into --checkpoint-dir; returns its folder. `final`: the
    end-of-run checkpoint, holding the model the run scored (best weights, temperature folded in),
    which --resume does not train on."""
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
        lr_scale=trainer.schedule.scale,
        recent_losses=trainer.losses.recent_values(),  # checked finite just above
        refit=trainer.refit is not None,
        final=final,
        **loss_scale_fields(trainer.loss_scaler),
        **extras,
        dataset={"path": os.path.abspath(cfg.data), "fingerprint": fingerprint(trainer), **vocabulary(trainer)},
        run_id=run_id(trainer),
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


def ended(trainer: TrainerState, meta: dict) -> bool:
    """A final checkpoint (this run's, on this data) ends the run --resume continues: the schedule
    is the one it ran (it reached its end, or stopped early), or ends at or before its step.
    A larger --max-steps or --epochs trains on from it."""
    train, schedule = meta.get("train_config"), trainer.cfg.schedule
    same = isinstance(train, dict) and (train.get("max_steps"), train.get("epochs")) == (schedule.max_steps, schedule.epochs)
    step = meta.get("step")
    return same or (isinstance(step, int) and step >= total_steps(trainer))


def run_ended(path: str, meta: dict, trains_on: bool) -> str:
    """What --resume says of a run that ended (`trains_on`: a longer schedule would train on from it)."""
    return (
        f"--resume: the run ended at step {meta.get('step')}: {path} is its final checkpoint, the model it "
        "scored (its figures: the run's metrics.json); nothing to resume (`dlrmkit evaluate --checkpoint "
        f"{path}` scores it again{'; a larger --max-steps or --epochs trains on from it' if trains_on else ''})"
    )


def total_steps(trainer: TrainerState) -> int:
    """The step the run's schedule ends at: --max-steps, else --epochs of the loader's batches."""
    schedule = trainer.cfg.schedule
    return schedule.max_steps if schedule.max_steps else len(trainer.loader) * schedule.epochs


def fingerprint(trainer: TrainerState) -> str:
    """The train dataset's fingerprint (dlrmkit.data.fingerprint), computed once per trainer."""
    if trainer.data_fingerprint is None:
        from dlrmkit.data.fingerprint import dataset_fingerprint

        trainer.data_fingerprint = dataset_fingerprint(trainer.spec)
    return trainer.data_fingerprint


def vocabulary(trainer: TrainerState) -> dict[str, str]:
    """{"vocabulary": its fingerprint} of a dataset with a vocabulary, which `predict` compares
    with the dataset it encodes raw rows by (dlrmkit.data.fingerprint); computed once per trainer,
    on rank 0 only (the rank that writes the manifest): the vocabulary is loaded for it."""
    if trainer.dist.rank != 0:
        return {}
    if trainer.vocabulary_fingerprint is None:
        from dlrmkit.data.fingerprint import dataset_vocabulary_fingerprint

        try:
            trainer.vocabulary_fingerprint = dataset_vocabulary_fingerprint(trainer.spec.base_directory) or ""
        except DatasetError:  # a vocabulary that does not load: predict refuses the dataset anyway
            trainer.vocabulary_fingerprint = ""
    return {"vocabulary": trainer.vocabulary_fingerprint} if trainer.vocabulary_fingerprint else {}


def save_final(trainer: TrainerState, hint: bool = True) -> None:
    """The end-of-run checkpoint (unless --no-final-checkpoint, or the last step is saved already
    with these weights), with a line on screen naming it (and, with `hint`, how to skip it: once
    for a blend's many member runs)."""
    cfg = trainer.cfg
    if not cfg.checkpoint.checkpoint_dir or not cfg.checkpoint.final_checkpoint:
        return
    if trainer.last_saved_step == trainer.step:  # saved along the way at this very step: said, not saved twice
        if trainer.dist.rank == 0:
            mark_final(os.path.join(cfg.checkpoint.checkpoint_dir, f"step_{trainer.step}"))
            print(
                f"saved checkpoint {ckpt.latest_checkpoint(cfg.checkpoint.checkpoint_dir)} (at the last step, "
                "by --checkpoint-every/--checkpoint-every-seconds: the run's final checkpoint)",
                file=sys.stderr,
            )
        return
    t0 = time.monotonic()
    path = save(trainer, final=True)
    if trainer.dist.rank == 0:
        size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        print(
            f"saved checkpoint {path} ({size / 2**20:,.1f} MiB, {time.monotonic() - t0:.1f} s"
            + ("; --no-final-checkpoint skips it)" if hint else ")"),
            file=sys.stderr,
        )


def mark_final(path: str) -> None:
    """The checkpoint at `path`, saved along the way at the run's last step with the weights the run
    scored, recorded as its final one (its manifest's `final`), as a final save would have: --resume
    then leaves the run as it ended."""
    from dlrmkit.atomic_io import atomic_write

    manifest = os.path.join(path, ckpt.MANIFEST)
    with open(manifest, encoding="utf-8") as f:
        meta = json.load(f)
    if meta.get("final") is True:
        return
    with atomic_write(manifest) as f:
        json.dump({**meta, "final": True}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def run_id(trainer: TrainerState) -> str:
    """The run's identifier, recorded in each checkpoint it writes (pruning removes only these):
    new for a fresh run, the checkpoint's own for a resumed one."""
    if getattr(trainer, "run_id", None) is None:
        trainer.run_id = uuid.uuid4().hex
    return trainer.run_id


def resume_from_dir(trainer: TrainerState) -> tuple[str, bool]:
    """--resume: load the checkpoint `latest` names in --checkpoint-dir; without a `latest`, the
    newest step_N folder that verifies (a run killed after its folder was renamed into place but
    before `latest` was written); with none, a fresh start only where there is no step folder at
    all. Never starts over another run's checkpoints. Returns (the line to show, whether the run
    starts fresh)."""
    directory = trainer.cfg.checkpoint.checkpoint_dir
    assert directory
    if ckpt.latest_checkpoint(directory):
        path = resume(trainer, directory)
        return f"resumed from {path} (step {trainer.step}, epoch {trainer.epoch})", False
    steps = ckpt.step_folders(directory)
    if not steps:
        return f"no checkpoint in {directory} yet: starting fresh", True
    reasons = []
    for name in steps:
        path = os.path.join(directory, name)
        if os.path.islink(path):  # read only from the directory's own folders, as `latest` is
            reasons.append(f"{path}: is a symbolic link, not a step_N folder of {directory}")
            continue
        try:
            manifest = ckpt.verify_checkpoint(path, show=trainer.cfg.output.progress)
        except DlrmkitError as exc:
            reasons.append(str(exc))
            continue
        resume(trainer, path, manifest)
        return (
            f"resumed from {path} (step {trainer.step}, epoch {trainer.epoch}; no '{ckpt.LATEST}' in "
            f"{directory}: the newest checkpoint that verifies)"
        ), False
    raise DlrmkitError(
        f"--resume: {directory} holds {', '.join(steps[:3])}{'...' if len(steps) > 3 else ''} but no "
        f"'{ckpt.LATEST}', and none of them verifies ({reasons[0][:160]}); write the name of a good one "
        f"into {os.path.join(directory, ckpt.LATEST)}, or give a fresh --checkpoint-dir"
    )


def resume(trainer: TrainerState, path: str, verified: dict | None = None) -> str:
    """Loads the checkpoint at `path` (or the one its `latest` names) into the trainer, after
    checking its checksums (`verified`: its manifest, checked already), that it holds this run's
    model, that it was trained on this --data, and that its counters fit this run."""
    cfg = trainer.cfg
    path = ckpt.resolve_checkpoint(path)
    meta = verified if verified is not None else ckpt.verify_checkpoint(path, show=cfg.output.progress)
    saved = ckpt.model_config_of(path, meta)
    data = meta.get("dataset")
    if isinstance(data, dict) and data.get("fingerprint") != fingerprint(trainer):
        raise DlrmkitError(
            f"{path}: checkpoint was trained on {data.get('path')} (fingerprint "
            f"{str(data.get('fingerprint'))[:12]}), but --data {cfg.data} is another dataset "
            f"(fingerprint {fingerprint(trainer)[:12]}); resume with the same --data or start a "
            f"fresh --checkpoint-dir"
        )
    if saved.hotness is None and isinstance(data, dict):  # older checkpoints: bag sizes of this (same) dataset
        saved = replace(saved, hotness=trainer.model_cfg.hotness)
    if saved != trainer.model_cfg:  # after the dataset: the model keeps figures of its data
        raise DlrmkitError(f"{path}: checkpoint model does not match this run's model: {model_difference(saved, trainer.model_cfg)}; "
                           "resume with the run's own options (its config.yaml: --config RUN/config.yaml --resume)")  # fmt: skip
    refitted = meta.get("refit") is not False and "refit" in meta  # a refit's is the end of a finished run
    if meta.get("final") is True and ended(trainer, meta):  # nothing of it is loaded: the run ended
        raise RunEnded(run_ended(path, meta, trains_on=not refitted))
    if refitted:
        raise DlrmkitError(
            f"{path}: the checkpoint of a refit (--refit: the run's model trained again on its training and "
            "validation rows once it had ended), which is not resumed; evaluate or predict with it, or train again "
            "into a fresh --checkpoint-dir"
        )
    missing = [k for k in ("step", "epoch", "batch_in_epoch") if k not in meta]
    if missing:
        raise DlrmkitError(f"{path}/{ckpt.MANIFEST}: no {missing[0]} to resume from; refused")
    check_counters(trainer, path, meta)
    ckpt.restore_model_state(path, meta, trainer.model, trainer.optimizers, show=cfg.output.progress)
    trainer.step, trainer.epoch, trainer.batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
    trainer.last_saved_step = trainer.step  # the loaded checkpoint holds these weights: not saved again
    trainer.best_auc = float("nan") if meta.get("best_auc") is None else float(meta["best_auc"])
    trainer.skipped_nonfinite = meta.get("skipped_nonfinite", 0)
    saved_samples = meta.get("samples_seen")  # older checkpoints: every step a full batch
    trainer.samples_seen = (
        int(saved_samples) if isinstance(saved_samples, int) else trainer.step * cfg.schedule.batch_size
    )
    trainer.schedule.scale = lr_scale(meta, f"{path}/{ckpt.MANIFEST}")
    trainer.losses.restore(recent_losses(meta, f"{path}/{ckpt.MANIFEST}"))
    restore_loss_scale(trainer.loss_scaler, meta, f"{path}/{ckpt.MANIFEST}")
    trainer.run_id = meta.get("run_id") or uuid.uuid4().hex  # older checkpoints: never pruned by this run
    return path


def model_difference(saved: Any, mine: Any, show: int = 3) -> str:
    """The fields in which two model configs differ, each as `name checkpoint X, this run Y`
    (values cut to 40 characters; the first `show` fields, then how many more)."""
    from dataclasses import fields

    def cut(v: Any) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    names = [f.name for f in fields(saved) if getattr(saved, f.name) != getattr(mine, f.name)]
    said = [f"{n} checkpoint {cut(getattr(saved, n))}, this run {cut(getattr(mine, n))}" for n in names[:show]]
    more = f" and {len(names) - show} more" if len(names) > show else ""
    return "; ".join(said) + more if said else "the same fields, unequal"


def lr_scale(meta: dict, where: str) -> float:
    """The learning-rate scale --lr-decay-on-plateau had reached (older checkpoints: 1), checked:
    a number in (0, 1], else refused naming the field."""
    value = meta.get("lr_scale", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise DlrmkitError(f"{where}: field 'lr_scale' is {value!r}, not a number in (0, 1]; refused")
    return float(value)


def recent_losses(meta: dict, where: str) -> list[float]:
    """The training losses of the logged mean's window a checkpoint kept (older checkpoints: none),
    checked: a list of at most 100,000 finite numbers, else refused naming the field."""
    values = meta.get("recent_losses", [])
    if not isinstance(values, list) or len(values) > 100_000 or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        raise DlrmkitError(f"{where}: field 'recent_losses' is not a list of finite numbers; refused")
    return [float(v) for v in values]


def loss_scale_fields(scaler: Any) -> dict[str, Any]:
    """fp16's loss scale and its count of finite steps since the last change, for the manifest ({} without fp16)."""
    if scaler is None:
        return {}
    return {"loss_scale": scaler.value, "loss_scale_growth": scaler.growth_tracker}


def restore_loss_scale(scaler: Any, meta: dict, where: str) -> None:
    """The loss scale a checkpoint recorded, checked whatever this run's precision: a number in
    [LossScaler.MIN_SCALE, MAX_SCALE] and a whole count below the growth interval, else refused
    naming the field; an fp16 checkpoint must record them. A checkpoint of another precision has
    none: an fp16 run (`scaler`) then keeps its start."""
    from dlrmkit.precision import LossScaler

    train = meta.get("train_config")
    fp16 = isinstance(train, dict) and train.get("precision") == "fp16"
    if "loss_scale" not in meta:
        if fp16:
            raise DlrmkitError(f"{where}: an fp16 checkpoint without its field 'loss_scale'; refused")
        return
    value, growth = meta["loss_scale"], meta.get("loss_scale_growth")
    lo, hi = LossScaler.MIN_SCALE, LossScaler.MAX_SCALE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise DlrmkitError(f"{where}: field 'loss_scale' is {value!r}, not a number in [2**-24, 2**127]; refused")
    interval = LossScaler.GROWTH_INTERVAL
    if isinstance(growth, bool) or not isinstance(growth, int) or not 0 <= growth < interval:
        raise DlrmkitError(
            f"{where}: field 'loss_scale_growth' is {growth!r}, not a whole number in [0, {interval}); refused"
        )
    if scaler is not None:
        scaler.scale_t.fill_(float(value))
        scaler.tracker.fill_(growth)


def check_counters(trainer: TrainerState, path: str, meta: dict) -> None:
    """The place in training a checkpoint records is one this run can reach: an epoch past
    --epochs, more epochs than steps, or a batch past the end of an epoch is refused, naming it."""
    fp, cfg = f"{path}/{ckpt.MANIFEST}", trainer.cfg
    step, epoch, batch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
    per_epoch = len(trainer.loader)
    if epoch > step:
        raise DlrmkitError(f"{fp}: field 'epoch' is {epoch}, more than its step {step}: every epoch takes a step; refused")
    if not cfg.schedule.max_steps and epoch > cfg.schedule.epochs:
        raise DlrmkitError(f"{fp}: field 'epoch' is {epoch}, past --epochs {cfg.schedule.epochs}; refused")
    if batch > per_epoch:
        raise DlrmkitError(
            f"{fp}: field 'batch_in_epoch' is {batch}, past the {per_epoch} batches of an epoch of --data; refused"
        )
