"""Train a DLRM on a FeatureSpec dataset: BCE loss, SGD or Adagrad (sparse row updates for the
embedding tables), the MLPerf LR schedule, AUC/log-loss evaluation, early stop at a target AUC,
checkpoints that --resume continues from, and a JSON summary of the run."""

from __future__ import annotations

import argparse
import json
import math

from dlrmkit.config import PRESETS, TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="dataset folder holding feature_spec.yaml")
    p.add_argument("--preset", default="tiny", help=f"model shape and recipe: {', '.join(PRESETS)} (default tiny)")
    p.add_argument("--batch-size", type=int, help="global batch size (default: the preset's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=int, help="passes over the train mapping (default: the preset's)")
    g.add_argument("--max-steps", type=int, help="stop after this many steps instead")
    p.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    p.add_argument("--optimizer", choices=["sgd", "adagrad"], help="optimizer (default: the preset's)")
    p.add_argument("--warmup-steps", type=int, help="linear LR warm-up steps (0: none)")
    p.add_argument("--decay-start", type=int, help="step where polynomial LR decay starts (0: no decay)")
    p.add_argument("--decay-steps", type=int, help="steps of polynomial (power 2) decay to 0")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (default: each epoch end)")
    p.add_argument("--eval-batch-size", type=int, default=16384, help="batch size for evaluation (default 16384)")
    p.add_argument("--target-auc", type=float, help="stop as soon as an evaluation reaches this AUC")
    p.add_argument("--checkpoint-dir", help="write checkpoints (and log.jsonl) here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N steps (default: at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir, if any")
    p.add_argument("--metrics-json", help="write the final metrics as one JSON object to this file")
    p.add_argument("--log-jsonl", help="JSON-lines log of steps and evaluations (default: <checkpoint-dir>/log.jsonl)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialization and batch order (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="read batches in file order")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        data=args.data, preset=args.preset, batch_size=args.batch_size, epochs=args.epochs,
        max_steps=args.max_steps, lr=args.lr, optimizer=args.optimizer, warmup_steps=args.warmup_steps,
        decay_start=args.decay_start, decay_steps=args.decay_steps, eval_every=args.eval_every,
        eval_batch_size=args.eval_batch_size, target_auc=args.target_auc, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, resume=args.resume, metrics_json=args.metrics_json,
        log_jsonl=args.log_jsonl, seed=args.seed, shuffle=not args.no_shuffle, progress=not args.no_progress,
        threads=args.threads,
    )


def summary_line(m: dict) -> str:
    line = (
        f"steps {m['steps']}  samples/s {m['samples_per_s']:,.0f}  train loss {m['train_loss']:.4f}  "
        f"test logloss {m['logloss']:.4f}  test AUC {m['auc']:.4f}"
    )
    if "optimal_auc" in m and not math.isnan(m["auc"]):
        line += f"  (optimal {m['optimal_auc']:.4f}, gap {m['optimal_auc'] - m['auc']:.4f})"
    return line


def run(args: argparse.Namespace) -> int:
    from dlrmkit.train.trainer import Trainer

    metrics = Trainer(config_from_args(args)).fit()
    if args.metrics_json:
        with open(args.metrics_json, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
    print(summary_line(metrics))
    return 0
