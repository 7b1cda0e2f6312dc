"""The training loop: data, model, optimizers, LR schedule, evaluation, early stop, checkpoints
and metrics. One process here; parallel training reuses these pieces around a sharded model."""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim import Optimizer
from tqdm import tqdm

from dlrmkit.config import TrainConfig, get_preset, model_config
from dlrmkit.data.loader import Batch, BatchLoader
from dlrmkit.data.split_binary import SplitBinaryDataset, open_dataset
from dlrmkit.errors import DlrmkitError
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.optim.schedule import LRSchedule
from dlrmkit.optim.sparse import SparseAdagrad, SparseSGD
from dlrmkit.train import checkpoint as ckpt
from dlrmkit.train.metrics import log_loss, roc_auc


def build_optimizers(model: DLRM, name: str, lr: float) -> list[Optimizer]:
    """Dense optimizer for MLPs, sparse row-update optimizer for the embedding tables."""
    dense, sparse = model.dense_parameters(), list(model.embeddings.parameters())
    if name == "sgd":
        return [torch.optim.SGD(dense, lr=lr), SparseSGD(sparse, lr=lr)]
    if name == "adagrad":
        return [torch.optim.Adagrad(dense, lr=lr, eps=1e-10), SparseAdagrad(sparse, lr=lr, eps=1e-10)]
    raise DlrmkitError(f"unknown optimizer '{name}' (choose sgd or adagrad)")


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: SplitBinaryDataset, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Click probabilities and labels for every row of `dataset`, in order."""
    was_training = model.training
    model.eval()
    probs, labels = [], []
    for batch in BatchLoader(dataset, batch_size).epoch(0):
        probs.append(torch.sigmoid(model(batch.dense, batch.ids)).numpy())
        labels.append(batch.labels.numpy())
    model.train(was_training)
    if not probs:
        return np.empty(0), np.empty(0)
    return np.concatenate(probs), np.concatenate(labels)


def evaluate_model(model: torch.nn.Module, dataset: SplitBinaryDataset, batch_size: int) -> dict[str, float]:
    probs, labels = predict(model, dataset, batch_size)
    return {"auc": roc_auc(labels, probs), "logloss": log_loss(labels, probs)}


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg = cfg.resolved()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.spec, self.train_set, self.test_set = open_dataset(cfg.data)
        if len(self.train_set) == 0:
            raise DlrmkitError(f"{cfg.data}: the train mapping has no rows")
        self.model_cfg: ModelConfig = model_config(
            get_preset(cfg.preset), self.train_set.num_numerical, self.spec.cardinalities
        )
        self.model = DLRM(self.model_cfg)
        self.model.reset_parameters(cfg.seed)
        self.optimizers = build_optimizers(self.model, cfg.optimizer, cfg.lr)
        self.schedule = LRSchedule(cfg.lr, cfg.warmup_steps, cfg.decay_start, cfg.decay_steps)
        self.loader = BatchLoader(self.train_set, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.best_auc = float("nan")
        self.last_eval: tuple[int, dict[str, float]] | None = None
        self.losses: deque[float] = deque(maxlen=100)
        self.log_path = cfg.log_jsonl or (os.path.join(cfg.checkpoint_dir, "log.jsonl") if cfg.checkpoint_dir else None)
        if cfg.resume:
            if not cfg.checkpoint_dir:
                raise DlrmkitError("--resume needs --checkpoint-dir")
            if ckpt.latest_checkpoint(cfg.checkpoint_dir):
                self.load(cfg.checkpoint_dir)

    # ---- one step -----------------------------------------------------------------------
    def train_step(self, batch: Batch) -> torch.Tensor:
        self.schedule.apply(self.optimizers, self.step)
        logits = self.model(batch.dense, batch.ids)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for opt in self.optimizers:
            opt.step()
        self.step += 1
        return loss.detach()

    # ---- state --------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_auc": self.best_auc,
            "rng": torch.get_rng_state(),
        }

    def save(self) -> str:
        meta = {"step": self.step, "model_config": asdict(self.model_cfg), "train_config": asdict(self.cfg)}
        assert self.cfg.checkpoint_dir
        return ckpt.save_checkpoint(self.cfg.checkpoint_dir, self.step, self.state(), meta)

    def load(self, path: str) -> None:
        state, meta = ckpt.load_checkpoint(path)
        saved = ModelConfig(**meta["model_config"])
        if saved != self.model_cfg:
            raise DlrmkitError(f"{path}: checkpoint model {saved} does not match this run's model {self.model_cfg}")
        self.model.load_state_dict(state["model"])
        for opt, s in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(s)
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best_auc = state["best_auc"]
        torch.set_rng_state(state["rng"])

    # ---- logging ------------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        if self.log_path:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def evaluate(self) -> dict[str, float]:
        result = evaluate_model(self.model, self.test_set, self.cfg.eval_batch_size)
        if not math.isnan(result["auc"]) and not (result["auc"] <= self.best_auc):
            self.best_auc = result["auc"]
        self.last_eval = (self.step, result)
        self.log({"event": "eval", "step": self.step, **result})
        return result

    # ---- the loop -----------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        steps_per_epoch = len(self.loader)
        total = cfg.max_steps if cfg.max_steps else steps_per_epoch * cfg.epochs
        bar = tqdm(total=total, initial=min(self.step, total), disable=not cfg.progress, unit="step", dynamic_ncols=True)
        train_time, samples = 0.0, 0
        stop = self.step >= total
        while not stop:
            t0 = time.perf_counter()
            for batch in self.loader.epoch(self.epoch, self.batch_in_epoch):
                loss = self.train_step(batch)
                self.batch_in_epoch += 1
                self.losses.append(float(loss))
                samples += len(batch)
                bar.update(1)
                if not math.isfinite(self.losses[-1]):
                    raise DlrmkitError(f"loss is {self.losses[-1]} at step {self.step}; lower --lr")
                if self.step % 50 == 0:
                    rate = samples / max(train_time + time.perf_counter() - t0, 1e-9)
                    bar.set_postfix(loss=f"{np.mean(self.losses):.4f}", samples_s=f"{rate:,.0f}")
                    self.log({"event": "train", "step": self.step, "loss": float(np.mean(self.losses)),
                              "lr": self.schedule.lr_at(self.step - 1), "samples_per_s": rate})
                if self.step >= total:
                    stop = True
                if cfg.eval_every and self.step % cfg.eval_every == 0 and not stop:
                    train_time += time.perf_counter() - t0
                    auc = self.evaluate()["auc"]
                    t0 = time.perf_counter()
                    if cfg.target_auc is not None and auc >= cfg.target_auc:
                        stop = True
                if cfg.checkpoint_dir and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    train_time += time.perf_counter() - t0
                    self.save()
                    t0 = time.perf_counter()
                if stop:
                    break
            train_time += time.perf_counter() - t0
            if not stop:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                if self.epoch >= cfg.epochs and not cfg.max_steps:
                    stop = True
                elif not cfg.eval_every:
                    auc = self.evaluate()["auc"]
                    if cfg.target_auc is not None and auc >= cfg.target_auc:
                        stop = True
        bar.close()
        last = self.last_eval[1] if self.last_eval and self.last_eval[0] == self.step else self.evaluate()
        if cfg.checkpoint_dir:
            self.save()
        metrics: dict[str, Any] = {
            "auc": last["auc"],
            "logloss": last["logloss"],
            "steps": self.step,
            "samples": samples,
            "samples_per_s": samples / train_time if train_time > 0 else 0.0,
            "train_loss": float(np.mean(self.losses)) if self.losses else float("nan"),
            "world_size": 1,
            "best_auc": self.best_auc,
            "epochs": self.epoch + (self.batch_in_epoch / steps_per_epoch if steps_per_epoch else 0),
        }
        if "optimal_auc" in self.spec.metadata:
            metrics["optimal_auc"] = float(self.spec.metadata["optimal_auc"])
        self.log({"event": "end", **metrics})
        return metrics
