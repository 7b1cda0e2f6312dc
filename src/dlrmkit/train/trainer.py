"""The training loop: data, model, optimizers, LR schedule, evaluation, early stop, checkpoints
and metrics. One process here; parallel training reuses these pieces around a sharded model."""

from __future__ import annotations

from dataclasses import replace
import functools
import math
import os
import sys
import time
from typing import Any

import torch
from tqdm import tqdm

from dlrmkit.config import TrainConfig, resolve_run, table_state_per_row, table_state_per_weight
from dlrmkit.data.loader import Batch, BatchLoader
from dlrmkit.data.split_binary import SplitBinaryDataset, open_dataset
from dlrmkit.device import place_run, resolve_device
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.options import check_batch_per_rank, torchrun_env
from dlrmkit.model.dlrm import DLRM
from dlrmkit.optim.schedule import LRSchedule
from dlrmkit.optim.build import build_optimizers
from dlrmkit.precision import LossScaler, autocast
from dlrmkit.checkpoint import save_load as ckpt
from dlrmkit.train import run_checkpoint
from dlrmkit.train.evaluation import evaluate_model, scores
from dlrmkit.train.run_log import append_record, log_line, stop_record
from dlrmkit.data.id_counts import known_ids
from dlrmkit.data.model_tables import model_tables
from dlrmkit.faults import fault_point, nan_loss_injected
from dlrmkit.train.calibration import calibrate_run, fold_scale
from dlrmkit.train.regression import numerical_stats, start_from_regression
from dlrmkit.train.selection import (
    BestWeights,
    Refit,
    check_both_labels,
    fold_of,
    fold_rows,
    held_out_from_train,
    validation_split,
)
from dlrmkit.model.step import Step
from dlrmkit.train.step import OneProcessStep
from dlrmkit.train.train_loss import TrainLoss, nonfinite_error


# options a run may change when it takes over a trained model (Trainer.take_over): where it
# writes, and what happens once training ends (a refit too: another training, after it)
TAKEN_OVER = ("run_dir", "checkpoint_dir", "log_jsonl", "metrics_json", "tensorboard", "final_checkpoint",
              "resume", "progress", "calibration", "checkpoint_every", "checkpoint_every_seconds",
              "search_budget", "blend", "blend_seeds", "refit", "time_limit")  # fmt: skip


def past(deadline: float, epoch_seconds: float) -> bool:
    """Whether another epoch of `epoch_seconds` would end past `deadline` (time.perf_counter())."""
    return time.perf_counter() + epoch_seconds > deadline


# where this process's runs have trained (device, GPU, table placement): a search or a blend builds
# many trainers, and the line is printed once for each place
_SAID: set[tuple] = set()


def check_checkpoint_dir(cfg: TrainConfig) -> None:
    """--checkpoint-dir writable, and holding no other run's checkpoints unless --resume."""
    if cfg.checkpoint.checkpoint_dir:
        if not cfg.checkpoint.resume:
            ckpt.check_fresh_directory(cfg.checkpoint.checkpoint_dir)
        ckpt.check_writable_directory(cfg.checkpoint.checkpoint_dir)


def log_path_of(cfg: TrainConfig) -> str | None:
    """The run's log: --log-jsonl, else log.jsonl in --checkpoint-dir, else none."""
    ck = cfg.checkpoint.checkpoint_dir
    return cfg.output.log_jsonl or (os.path.join(ck, "log.jsonl") if ck else None)


class Trainer:
    def __init__(self, cfg: TrainConfig, keep_log: bool = False, refit: Refit | None = None):
        """`keep_log`: a run without a log keeps its records in memory, for a run that takes it
        over (take_over) to write into its own log. `refit`: this run trains on the training and
        validation rows together, repeating what a run selected on them (dlrmkit.train.refit)."""
        cfg = cfg.resolved()  # option errors before the dataset is opened
        if refit is None:  # a refit writes into its run's folder, after it
            check_checkpoint_dir(cfg)  # before any expensive work
        self.spec, self.train_set, self.test_set = open_dataset(cfg.data)
        if len(self.train_set) == 0:
            raise DlrmkitError(f"{cfg.data}: the train mapping has no rows")
        # --min-id-count: the tables keep the ids seen often enough in the train mapping (data/id_counts.py)
        # the figures the model keeps from the data (kept ids, bucket boundaries, numerical mean and
        # deviation) are label-free and taken over the whole train mapping, as the vocabulary is:
        # the same for any --val-fraction, so a resumed run rebuilds the model it saved
        # --numerical-buckets: boundaries from the training rows (data/numerical_buckets.py); the table
        # sizes are `plan --data`'s too (data/model_tables.py)
        mapping = self.train_set
        min_count = cfg.model.min_id_count or 1
        planned = model_tables(cfg.data, mapping, min_count, cfg.model.numerical_buckets)
        tables, counts, buckets = planned.rows, planned.counts, planned.buckets
        if min_count > 1:
            self.train_set, self.test_set = self.train_set.fold_ids(tables), self.test_set.fold_ids(tables)
        # model selection reads the validation rows only; the test mapping is scored once, at the end
        fold = fold_of(cfg)  # --folds: one fold of the train (and val) mappings' rows validates
        if fold is not None:
            self.train_set, counts = fold_rows(self.spec, self.train_set, counts)
        self.train_set, self.val_set, self.val_source = validation_split(
            self.spec, self.train_set, cfg.selection.val_fraction, fold
        )
        if counts is not None and self.val_set is not None and held_out_from_train(self.spec, cfg.selection.val_fraction, fold):
            # rows held out from the train mapping are read as test rows will be: an id the
            # training rows saw fewer than --min-id-count times reads as 0 there too, though the
            # whole mapping's counts (which include these rows) keep it
            self.val_set = self.val_set.fold_unknown(known_ids(counts, self.val_set, min_count))
        if self.val_set is not None and tables != list(self.spec.cardinalities):
            self.val_set = self.val_set.fold_ids(tables)
        check_both_labels(cfg.data, self.train_set, self.val_set, self.val_source)
        self.refit = refit
        if refit is not None:  # the validation rows join the training rows, read as they are
            if self.val_set is None:
                raise DlrmkitError(f"{cfg.data}: a refit needs the validation rows its run selected on")
            self.train_set, self.val_set = self.train_set.joined(self.val_set), None
            self.val_source = f"none: a refit on the training and validation rows ({len(self.train_set):,})"
        if buckets is not None:
            self.train_set, self.test_set = self.train_set.with_buckets(buckets), self.test_set.with_buckets(buckets)
            self.val_set = self.val_set.with_buckets(buckets) if self.val_set is not None else None
            tables = planned.sizes
        if self.val_set is None and cfg.selection.target_auc is not None:
            raise DlrmkitError("--target-auc needs validation rows (a val mapping, or --val-fraction > 0)")
        # one resolution for train and `plan --data` (dlrmkit.config.resolve_run)
        self.cfg, self.model_cfg = resolve_run(cfg, tables, self.train_set.num_numerical)
        cfg = self.cfg
        if buckets is not None:
            self.model_cfg = replace(self.model_cfg, numerical_buckets=buckets)
        if self.train_set.multi_hot:  # the bag sizes its ids come in (what an exported model reads)
            self.model_cfg = replace(self.model_cfg, hotness=list(self.train_set.hotness))
        if cfg.model.standardize_numerical and self.train_set.num_numerical:  # the training rows' figures
            signed = self.model_cfg.numerical_transform == "signed-log"
            mean, std = numerical_stats(mapping, cfg.selection.eval_batch_size, signed)
            self.model_cfg = replace(self.model_cfg, numerical_mean=mean.tolist(), numerical_std=std.tolist())
        if cfg.device.threads:
            torch.set_num_threads(cfg.device.threads)
        torch.manual_seed(cfg.seed)  # the RNG stream a checkpoint saves and --resume restores
        from dlrmkit.parallel.dist import launched_by_torchrun, small_batch_note
        from dlrmkit.parallel.hybrid import setup_parallel  # torchrun: shard tables (dlrmkit.parallel)

        # under torchrun the tables are never built whole: setup_parallel swaps in shards and
        # initializes them (seeded per table, so values equal the single-process init)
        self.model = DLRM(self.model_cfg, embedding_device="meta" if launched_by_torchrun() else None)
        if not launched_by_torchrun():
            self.model.reset_parameters(cfg.seed)
        self.wide_init: dict[str, float] | None = None  # --wide-init regression: its C and figures
        if cfg.model.wide_init not in (None, "none"):
            c = refit.wide_c if refit is not None else None  # a refit's regression: the C its run chose
            self.wide_init = start_from_regression(self.model, self.train_set, self.val_set, cfg, c)

        check_batch_per_rank(cfg.schedule.batch_size, torchrun_env().world_size)  # before any collective
        if self.model_cfg.dropout and launched_by_torchrun() and torchrun_env().rank == 0:
            # as under DistributedDataParallel: said, so that a run beside one process's is not read as a fault
            print(
                f"note: --dropout {self.model_cfg.dropout:g} under torchrun: each rank draws its own dropout masks "
                "for its rows, so the run matches one process's in distribution, not step for step",
                file=sys.stderr,
            )
        self.dist, self.par, self.plan = setup_parallel(
            self.model,
            cfg.parallel,
            cfg.device.device,
            cfg.schedule.batch_size,
            cfg.seed,
            table_state_per_weight(cfg),
            table_state_per_row(cfg),
        )
        # large best weights wait in an unlinked file in the run's own output folder, not in memory
        self.best = BestWeights(
            cfg.checkpoint.checkpoint_dir or cfg.output.run_dir, show=cfg.output.progress and self.dist.rank == 0
        )
        device = self.dist.device if self.par is not None else resolve_device(cfg.device.device)
        self.device, self.placement, self.move = place_run(
            self.model, device, cfg.device.table_placement, table_state_per_weight(cfg) > 0, self.par is not None
        )
        self.optimizers = build_optimizers(
            self.model,
            cfg.optimizer.optimizer,
            cfg.optimizer.lr,
            cfg.optimizer.embedding_optimizer,
            cfg.device.precision,
            cfg.optimizer.lamb_lr,
            cfg.optimizer.embedding_weight_decay or 0.0,
            cfg.optimizer.dense_lr,
            cfg.optimizer.dense_weight_decay or 0.0,
        )
        self.schedule = LRSchedule(
            cfg.optimizer.lr, cfg.schedule.warmup_steps, cfg.schedule.decay_start, cfg.schedule.decay_steps
        )
        # the skip decision needs the loss on the host before the update: one process with
        # --skip-nonfinite syncs for it each step; without, nothing waits for the loss (track_loss)
        check_each_step = self.par is not None or cfg.schedule.skip_nonfinite > 0
        loss_ok = functools.partial(self.loss_is_finite, agreed=self.par is not None) if check_each_step else None
        amp = functools.partial(autocast, cfg.device.precision, self.device.type)
        # fp16: the loss scale a checkpoint saves and --resume restores
        self.loss_scaler = LossScaler(self.device) if cfg.device.precision == "fp16" else None
        # the Step (dlrmkit.model.step): parallel/hybrid_step.py under torchrun, train/step.py otherwise
        self.step_fn: Step = (
            self.par.make_step(
                self.optimizers, amp, loss_ok=loss_ok, gate=cfg.schedule.skip_nonfinite > 0, scaler=self.loss_scaler
            )
            if self.par is not None
            else OneProcessStep(
                self.model, self.optimizers, cfg.device.precision, amp, self.move, loss_ok, self.loss_scaler
            )
        )
        self.loader = (
            self.par.loader(self.train_set, cfg)
            if self.par
            else BatchLoader(
                self.train_set,
                cfg.schedule.batch_size,
                shuffle=cfg.shuffle,
                seed=cfg.seed,
                pin_memory=self.device.type == "cuda",
            )
        )
        sel = cfg.selection
        if not sel.eval_every and sel.evals_per_epoch:  # the preset's cadence (mlperf-dcnv2: every 0.05 epoch)
            sel.eval_every = max(1, len(self.loader) // sel.evals_per_epoch)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.skipped_nonfinite, self.start_time, self.last_save_time = 0, time.monotonic(), None
        self.last_saved_step: int | None = None
        self.samples_seen = 0  # training samples (global) since the run began: the log's x axis
        self.data_fingerprint: str | None = None  # computed at the first save or resume
        self.vocabulary_fingerprint: str | None = None  # computed at the first save
        self.eval_progress = False  # a progress bar for the final evaluation only
        self.best_auc = float("nan")
        self.lr_scales: list[tuple[int, float]] = []  # --lr-decay-on-plateau: (step, scale from then on)
        self.temperature, self.test_ece = 1.0, float("nan")  # --calibration; the test rows' ECE
        self.last_eval: tuple[int, dict[str, float]] | None = None
        self.losses = TrainLoss(window=100)  # the logged train loss: mean of the last 100 steps
        self.log_path = log_path_of(cfg)
        self.kept_log: list[dict[str, Any]] | None = [] if keep_log and not self.log_path else None
        note = small_batch_note(cfg.schedule.batch_size, self.dist.world_size, self.device.type) if self.par else None
        if note and self.dist.rank == 0:
            print(note, file=sys.stderr)
        if cfg.checkpoint.resume:
            if not cfg.checkpoint.checkpoint_dir:
                raise DlrmkitError("--resume needs --checkpoint-dir (or the --run-dir of the run to continue)")
            said, fresh = run_checkpoint.resume_from_dir(self)
            if self.dist.rank == 0:
                print(said, file=sys.stderr)
            if fresh:  # the log's earlier records are of an attempt
                # that saved no checkpoint: `report` reads what follows this record (run_log.since_restart)
                self.log({"event": "restart", "step": 0, "why": said})
        # after a resume's checks: a refused one leaves the run's log as it was
        if self.device.type == "cuda":  # say where training runs, and why the tables are where they are
            where = {"device": str(self.device), "gpu": torch.cuda.get_device_name(self.device)}
            if self.placement is not None:
                where.update(table_placement=self.placement[0], why=self.placement[1])
            self.log({"event": "device", **where})
            place = (where["device"], where["gpu"], where.get("table_placement"))
            if self.dist.rank == 0 and place not in _SAID:
                _SAID.add(place)
                print("training on " + ", ".join(f"{k} {v}" for k, v in where.items()), file=sys.stderr)

    # ---- one step -----------------------------------------------------------------------
    def train_step(self, batch: Batch) -> torch.Tensor:
        self.schedule.apply(self.optimizers, self.step)
        loss = self.step_fn(batch)  # a skipped non-finite loss still counts as a step
        self.step += 1
        if self.par is not None:
            self.par.steps_taken += 1
        return loss

    def save_is_due(self) -> bool:
        """--checkpoint-every-seconds: rank 0's clock decides, so every rank saves at the same step."""
        if not self.cfg.checkpoint.checkpoint_every_seconds:
            return False
        last = self.last_save_time or self.start_time
        due = torch.tensor([int(time.monotonic() - last >= self.cfg.checkpoint.checkpoint_every_seconds)])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(due, src=0, group=self.dist.cpu_group)
        return bool(due.item())

    def loss_is_finite(self, loss: torch.Tensor, agreed: bool = False) -> bool:
        """False for a NaN/Inf loss that --skip-nonfinite allows to skip (every rank agrees; with
        `agreed` the loss is already the same on every rank, so no collective is needed);
        raises, before any update, once the allowance is spent, so the last checkpoint stays good.
        A host sync (the decision needs the value): one process calls it only with skipping on."""
        if nan_loss_injected(self.step + 1):  # reliability tests only (DLRMKIT_FAULT)
            loss = torch.full_like(loss.detach(), float("nan"))
        bad = (~torch.isfinite(loss.detach())).to(torch.int32).reshape(1)
        if not agreed and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        if not bad.item():
            return True
        self.skipped_nonfinite += 1
        if self.skipped_nonfinite > self.cfg.schedule.skip_nonfinite:
            raise nonfinite_error(float(loss.detach()), self.step + 1, self.cfg.checkpoint.checkpoint_dir, self.advice())
        self.log(
            {
                "event": "skip_nonfinite",
                "step": self.step + 1,
                "loss": float(loss.detach()),
                "skipped": self.skipped_nonfinite,
            }
        )
        return False

    def track_loss(self, loss: torch.Tensor) -> None:
        """Adds the step's loss to the logged mean. With --skip-nonfinite the value is on the host
        already (`loss_is_finite` synced for it) and a skipped step's loss is left out. Without, the
        loss stays a tensor (no sync): a non-finite loss is not stopped before its update, but
        `check_loss` raises for it, naming its step, at the next log point, evaluation or
        checkpoint, before any of them reads the weights it touched."""
        if self.cfg.schedule.skip_nonfinite:
            if math.isfinite(float(loss)):
                self.losses.add(loss, self.step)
            return
        if nan_loss_injected(self.step):  # reliability tests only (DLRMKIT_FAULT)
            loss = torch.full_like(loss.detach(), float("nan"))
        self.losses.add(loss, self.step)

    def check_loss(self) -> None:
        """Raises for the first NaN/Inf loss not yet checked (skipping off); one host sync."""
        self.losses.check_finite(self.cfg.checkpoint.checkpoint_dir, self.advice())

    def advice(self) -> str:
        """What to try first where the loss went non-finite: a cross network under SGD (its terms
        are products of up to layers + 1 inputs; MLPerf's DLRM-DCNv2 trains it with Adagrad)."""
        if self.cfg.model.interaction == "dcn" and self.cfg.optimizer.optimizer == "sgd":
            return "a cross network under SGD: try --optimizer adagrad, or "
        return ""

    def take_over(self, cfg: TrainConfig, metrics: dict[str, Any]) -> dict[str, Any] | None:
        """This trained model as the run `cfg` describes, where `cfg` trains exactly what this
        trainer trained and differs only in where it writes and its calibration (a blend's member
        whose run the recipe search already made, with outputs off: see TAKEN_OVER). Takes `cfg`'s
        checkpoint folder and log, fits the temperature as `finish` would, logs the end; returns
        `metrics` (this trainer's `fit`'s) with the calibrated validation figures. None, with
        nothing changed, where `cfg` would train something else."""
        from dlrmkit.options import flatten

        cfg = cfg.resolved()
        mine, theirs = flatten(self.cfg), flatten(cfg)
        if any(mine[k] != theirs[k] for k in mine if k not in TAKEN_OVER):
            return None
        check_checkpoint_dir(cfg)
        self.cfg, self.log_path = cfg, log_path_of(cfg)
        read_test = any(r["event"] == "test" for r in self.kept_log or [])  # a search's run reads none
        if self.kept_log and self.log_path:  # the training's records (not the outputs-off run's own
            # test and end, logged again below), then the test and end as `finish` logs them
            kept = [r for r in self.kept_log if r["event"] not in ("test", "end")]
            self.write_log("".join(log_line(r) for r in kept))
        self.kept_log = None
        val = {"auc": metrics["val_auc"], "logloss": metrics["val_logloss"]}
        if cfg.selection.calibration == "temperature":
            val = calibrate_run(self, val)
        if read_test:
            test = {"auc": metrics["auc"], "logloss": metrics["logloss"]}
            self.log({"event": "test", "step": self.step, "mapping": "test", **test})
        metrics = {**metrics, "val_logloss": val["logloss"], "temperature": self.temperature}
        self.log({"event": "end", **metrics})
        return metrics

    # ---- state (dlrmkit.train.run_checkpoint: what a checkpoint records, the checks on resume) ----
    def save(self) -> str:
        return run_checkpoint.save(self)

    def save_final(self, hint: bool = True) -> None:
        run_checkpoint.save_final(self, hint)

    def load(self, path: str) -> str:
        """Resume from checkpoint `path` (or the one its `latest` names); returns the folder loaded."""
        return run_checkpoint.resume(self, path)

    # ---- logging ------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        if self.dist.rank == 0 and (self.log_path or self.kept_log is not None):
            record = {**record, "time": time.time(), "samples_seen": self.samples_seen}
            if self.log_path:
                self.write_log(log_line(record))
            else:
                self.kept_log.append(record)

    def log_stop(self, exc: BaseException) -> None:
        """A `failed` (or `interrupted`) record for a run that `exc` stopped (run_log.stop_record);
        never raises: the error that stopped the run is the one reported."""
        record = stop_record(exc, self.cfg.parallel.collective_timeout)
        if record is not None:
            try:
                self.log({"event": record.pop("event"), "step": self.step, **record})
            except (DlrmkitError, OSError):
                pass

    def write_log(self, lines: str) -> None:
        try:  # a full disk (or --log-jsonl /dev/full) is one line naming the log
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
            append_record(self.log_path, lines, (self.cfg.checkpoint.checkpoint_dir, self.cfg.output.run_dir))
        except OSError as exc:
            raise DlrmkitError(f"--log-jsonl {self.log_path}: cannot write ({exc.strerror or exc})") from None

    def score(self, dataset: SplitBinaryDataset, bins: bool = False) -> dict[str, float]:
        with autocast(self.cfg.device.precision, self.device.type):
            return (
                scores(*self.par.predict(dataset, self.cfg.selection.eval_batch_size), bins)
                if self.par
                else evaluate_model(
                    self.model, dataset, self.cfg.selection.eval_batch_size, self.move, self.eval_progress, bins
                )
            )

    def evaluate(self) -> dict[str, float]:
        """AUC and log loss on the validation rows (never the test mapping); keeps the best
        weights when --restore-best. Without validation rows: NaN, nothing selected."""
        if self.val_set is None:
            return {"auc": float("nan"), "logloss": float("nan")}
        self.check_loss()
        result = self.score(self.val_set)
        self.best.update(self.model, self.step, result, keep=self.cfg.selection.restore_best)
        factor = self.cfg.selection.lr_decay_on_plateau
        if factor is not None and self.best.since > 0:  # no better AUC than the best: a plateau
            # never 0: a scale that underflowed would leave checkpoints --resume refuses (lr_scale in (0, 1])
            self.schedule.scale = max(self.schedule.scale * factor, sys.float_info.min)
            self.lr_scales.append((self.step, self.schedule.scale))
            self.log({"event": "lr_decay", "step": self.step, "lr_scale": self.schedule.scale})
        if not math.isnan(result["auc"]) and not (result["auc"] <= self.best_auc):
            self.best_auc = result["auc"]
        self.last_eval = (self.step, result)
        self.log({"event": "eval", "step": self.step, "mapping": "val", **result})
        return result

    def should_stop(self, auc: float) -> bool:
        """Early stop: the target AUC reached, or --patience evaluations without improvement."""
        if self.cfg.selection.target_auc is not None and auc >= self.cfg.selection.target_auc:
            if self.dist.rank == 0:
                print(
                    f"target AUC {self.cfg.selection.target_auc} reached at step {self.step} (AUC {auc:.4f})",
                    file=sys.stderr,
                )
            return True
        return bool(self.cfg.selection.patience) and self.best.since >= self.cfg.selection.patience

    def finish(self) -> tuple[dict[str, float], dict[str, float]]:
        """(validation metrics, test metrics) of the selected model: the best weights on the
        validation rows when --restore-best, else the last ones. The only read of the test mapping."""
        if self.val_set is not None and not (self.last_eval and self.last_eval[0] == self.step):
            self.evaluate()
        val = self.last_eval[1] if self.last_eval else {"auc": float("nan"), "logloss": float("nan")}
        saved = self.last_saved_step  # the step whose checkpoint holds these weights, if any
        if self.cfg.selection.restore_best and self.best.kept and self.best.step != self.step:
            self.best.restore(self.model)
            val = self.best.metrics
            self.log({"event": "restore_best", "step": self.best.step, **val})
            saved = None
        if self.cfg.selection.calibration == "temperature":  # on the validation rows, before the test read
            val = calibrate_run(self, val)
            saved = None
        if self.refit is not None:  # the temperature its run fitted on the validation rows
            fold_scale(self.model, self.refit.scale)
            self.temperature = 1 / self.refit.scale
            saved = None
        # a periodic save of this step holds the weights before these changes: the final save replaces it
        self.last_saved_step = saved
        test = {"auc": float("nan"), "logloss": float("nan")}
        if len(self.test_set):  # no test rows (a search's run, a run to be refitted, a blend's member): no record
            test = self.score(self.test_set, bins=True)
            self.log({"event": "test", "step": self.step, "mapping": "test", **test})
        self.test_ece = test.get("ece", float("nan"))
        return val, test

    # ---- the loop -----------------------------------------------------------------------
    def fit(self, save: bool = True, deadline: float | None = None) -> dict[str, Any]:
        """Train to the end (epochs, max steps or target AUC); returns the final metrics. `save`:
        the final checkpoint at the end (a blend saves its members' once the blend is scored).
        `deadline` (a time.perf_counter() value; one process, a search's candidate): the run ends
        at the first epoch end where another epoch as long as the last would end past it, and is
        then the run of the epochs it trained (its --epochs says so: metrics' `deadline_epochs`)."""
        self._bar: tqdm | None = None
        try:
            return self._fit(save, deadline)
        except (Exception, KeyboardInterrupt) as exc:
            self.log_stop(exc)
            raise
        finally:
            if self._bar is not None:
                self._bar.close()  # so an error message starts on its own line

    def _fit(self, save: bool, deadline: float | None) -> dict[str, Any]:
        cfg = self.cfg
        steps_per_epoch = len(self.loader)
        total = run_checkpoint.total_steps(self)
        scales: dict[int, float] = {}
        if self.refit is not None:  # its run's epochs and decays, in steps of these rows
            total = round(self.refit.epochs * steps_per_epoch)
            scales = {round(epoch * steps_per_epoch): scale for epoch, scale in self.refit.lr_scales}
        # disable=None: no bar when stderr is not a terminal (logs, CI, subprocesses)
        self._bar = bar = tqdm(
            total=total,
            initial=min(self.step, total),
            unit="step",
            dynamic_ncols=True,
            disable=None if cfg.output.progress and self.dist.rank == 0 else True,
        )
        train_time, samples, cut = 0.0, 0, False
        stop = self.step >= total
        if self.wide_init is not None and self.step == 0 and self.val_set is not None:
            self.evaluate()  # the regression it starts from is a candidate for the best weights
        while not stop:
            t0 = epoch_start = time.perf_counter()
            for batch in self.loader.epoch(self.epoch, self.batch_in_epoch):
                loss = self.train_step(batch)
                self.batch_in_epoch += 1
                if self.step in scales:  # a refit: its run's learning-rate decays, at the same point
                    self.schedule.scale = scales[self.step]
                fault_point(f"train:step-{self.step}")  # reliability tests only (DLRMKIT_FAULT)
                self.track_loss(loss)  # no host sync unless --skip-nonfinite
                seen = self.par.global_size(batch) if self.par else len(batch)
                samples, self.samples_seen = samples + seen, self.samples_seen + seen
                bar.update(1)
                if self.step % cfg.output.log_every == 0:  # a log point: the loss is read here
                    self.check_loss()
                    mean_loss = self.losses.mean()
                    rate = samples / max(train_time + time.perf_counter() - t0, 1e-9)
                    bar.set_postfix(loss=f"{mean_loss:.4f}", samples_s=f"{rate:,.0f}")
                    self.log(
                        {
                            "event": "train",
                            "step": self.step,
                            "loss": mean_loss,
                            **(self.par.traffic(self.step) if self.par else {}),
                            "lr": self.schedule.lr_at(self.step - 1),
                            "samples_per_s": rate,
                        }
                    )
                if self.step >= total:
                    stop = True
                if cfg.selection.eval_every and self.step % cfg.selection.eval_every == 0 and not stop:
                    train_time += time.perf_counter() - t0
                    auc = self.evaluate()["auc"]
                    t0 = time.perf_counter()
                    if self.should_stop(auc):
                        stop = True
                if cfg.checkpoint.checkpoint_dir and (
                    (cfg.checkpoint.checkpoint_every and self.step % cfg.checkpoint.checkpoint_every == 0)
                    or self.save_is_due()
                ):
                    train_time += time.perf_counter() - t0
                    self.save()
                    t0 = time.perf_counter()
                if stop:
                    break
            train_time += time.perf_counter() - t0
            if not stop:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                if self.epoch >= cfg.schedule.epochs and not cfg.schedule.max_steps:
                    stop = True
                elif deadline is not None and past(deadline, time.perf_counter() - epoch_start):
                    # as a run of these epochs ends: before this epoch end's evaluation (finish's)
                    stop = cut = True
                    cfg.schedule.epochs, cfg.schedule.max_steps = self.epoch, None
                elif not cfg.selection.eval_every and self.val_set is not None:
                    auc = self.evaluate()["auc"]
                    if self.should_stop(auc):
                        stop = True
        bar.close()
        self.check_loss()
        self.eval_progress = cfg.output.progress  # the final evaluation shows progress (after 2 s, on a terminal)
        val, test = self.finish()
        self.best.close()
        if save:
            self.save_final()
        metrics: dict[str, Any] = {
            "auc": test["auc"],
            "logloss": test["logloss"],
            "val_auc": val["auc"],
            "val_logloss": val["logloss"],
            "ece": self.test_ece,
            "temperature": self.temperature,
            "selected_step": self.best.step if cfg.selection.restore_best and self.best.kept else self.step,
            "steps": self.step,
            "samples": samples,
            "samples_per_s": samples / train_time if train_time > 0 else 0.0,
            "train_loss": self.losses.mean(),
            "world_size": self.dist.world_size,
            "best_auc": self.best_auc,
            "skipped_nonfinite": self.skipped_nonfinite,
            "epochs": self.epoch + (self.batch_in_epoch / steps_per_epoch if steps_per_epoch else 0),
        }
        if cut:
            metrics["deadline_epochs"] = self.epoch
        if "optimal_auc" in self.spec.metadata:
            metrics["optimal_auc"] = float(self.spec.metadata["optimal_auc"])
        if self.loss_scaler is not None:  # fp16: the loss scale reached, steps skipped for an overflow
            metrics.update(loss_scale=self.loss_scaler.value, overflow_steps=self.loss_scaler.skipped)
        if self.refit is not None:  # its run's validation figures: the refit has trained on those rows
            metrics.update(self.refit.selected, refit=True, refit_steps=self.step)
        if self.par is not None:  # per rank: bytes of tables and their optimizer state, held and planned
            metrics.update(self.par.held_bytes(self.optimizers))
        self.log({"event": "end", **metrics})
        return metrics
