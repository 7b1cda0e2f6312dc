"""Train a DLRM on a FeatureSpec dataset: BCE loss, SGD or Adagrad (sparse row updates for the
embedding tables), the MLPerf LR schedule, AUC/log-loss evaluation, early stop at a target AUC,
checkpoints that --resume continues from, and a JSON summary of the run."""

from __future__ import annotations

import argparse
import math
import os

from dlrmkit import cli_types as ct
from dlrmkit.config import AUTO, PRESETS, TrainConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.options import add_parallel_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="dataset folder holding feature_spec.yaml (required, here or in --config)")
    p.add_argument("--preset", default=AUTO,
                   help=f"model shape and recipe: {AUTO}, {', '.join(PRESETS)} (default {AUTO}: chosen from the dataset's "
                        "size and printed; docs/RECIPES.md)")
    p.add_argument("--batch-size", type=ct.batch_size, help="global batch size (default: the preset's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=ct.positive_int, help="passes over the train mapping (default: the preset's)")
    g.add_argument("--max-steps", type=ct.positive_int, help="stop after this many steps instead")
    p.add_argument("--lr", type=ct.learning_rate, help="learning rate (default: the preset's)")
    p.add_argument("--optimizer", choices=["sgd", "adagrad", "split-sgd", "lamb"],
                   help="dense (MLP) optimizer; split-sgd also updates the tables and needs --precision bf16 "
                        "(default: the preset's)")
    p.add_argument("--embedding-optimizer", choices=["sgd", "adagrad", "rowwise-adagrad"],
                   help="sparse optimizer of the tables (default: sgd, or adagrad with --optimizer adagrad)")
    p.add_argument("--lamb-lr", type=ct.learning_rate, help="LAMB's peak LR (default --lr); the LR schedule scales both")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="autocast precision: bf16 on CPU/GPU; fp16 not yet (its loss scaling does not reach "
                        "the tables) (default fp32)")
    p.add_argument("--comm-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="under torchrun: send all-to-all payloads and gradient all-reduces in this dtype (default fp32)")
    p.add_argument("--warmup-steps", type=ct.nonneg_int, help="linear LR warm-up steps (0: none)")
    p.add_argument("--decay-start", type=ct.nonneg_int, help="step where polynomial LR decay starts (0: no decay)")
    p.add_argument("--decay-steps", type=ct.nonneg_int, help="steps of polynomial (power 2) decay to 0")
    p.add_argument("--eval-every", type=ct.nonneg_int, default=0,
                   help="evaluate on the validation rows every N steps (default: each epoch end)")
    p.add_argument("--val-fraction", type=ct.float_range(0.0, 1.0, hi_open=True),
                   help="hold out the last F of the train mapping for model selection (default: the dataset's val "
                        "mapping, else 0.1 of the train rows, at most 1M; 0: none)")
    p.add_argument("--patience", type=ct.nonneg_int, help="stop after N evaluations without a better validation AUC (0: never)")
    p.add_argument("--restore-best", type=on_off, metavar="BOOL",
                   help="end with the weights of the best validation AUC (true/false)")
    p.add_argument("--embedding-weight-decay", type=ct.nonneg_float, help="L2 on the table rows a batch touches (Adagrad tables)")
    p.add_argument("--wide", type=on_off, metavar="BOOL",
                   help="add a first-order term per id and numerical feature (Wide&Deep-style) (true/false)")
    p.add_argument("--embedding-init-scale", type=ct.positive_float,
                   help="tables start at this fraction of the usual uniform +-sqrt(1/rows) init (default 1)")
    p.add_argument("--numerical-transform", choices=["none", "signed-log"],
                   help="applied by the model to numerical inputs (signed-log: sign(x) log(1+|x|), for raw values)")
    p.add_argument("--eval-batch-size", type=ct.batch_size, default=16384, help="batch size for evaluation (default 16384)")
    p.add_argument("--target-auc", type=ct.auc, help="stop as soon as a validation AUC reaches this")
    p.add_argument("--checkpoint-dir", help="write checkpoints (and log.jsonl) here; a folder holding another "
                   "run's checkpoints needs --resume (default: <run folder>/checkpoints)")
    p.add_argument("--checkpoint-every", type=ct.nonneg_int, default=0, help="also checkpoint every N steps (default: only at the end)")
    p.add_argument("--checkpoint-every-seconds", type=ct.nonneg_float, default=0.0,
                   help="also checkpoint when this many seconds passed since the last one (default: off)")
    p.add_argument("--collective-timeout", type=ct.timeout, default=1800.0,
                   help="under torchrun: seconds a collective may wait for a peer before the job fails (default 1800)")
    p.add_argument("--keep", type=ct.positive_int, default=2,
                   help="checkpoints kept in --checkpoint-dir: the one 'latest' names and the newest others (default 2)")
    p.add_argument("--no-final-checkpoint", action="store_true",
                   help="do not save a checkpoint when training ends (default: save one into --checkpoint-dir, "
                        "else <run folder>/checkpoints, in one process and under torchrun alike)")
    p.add_argument("--skip-nonfinite", type=ct.nonneg_int, default=0,
                   help="skip up to N batches whose loss is NaN/Inf (counted in the log) before stopping (default 0)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir, if any")
    p.add_argument("--metrics-json", help="write the final metrics as one JSON object to this file")
    p.add_argument("--log-jsonl", help="JSON-lines log of steps and evaluations (default: <checkpoint-dir>/log.jsonl)")
    p.add_argument("--seed", type=ct.seed, default=0, help="seed of initialization and batch order (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="read batches in file order")
    p.add_argument("--threads", type=ct.threads, default=0, help="intra-op threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--config", help="YAML file of options (keys as the flags, e.g. batch-size: 512); flags given here win")
    p.add_argument("--run-dir", help="run folder: config.yaml, plan.json, log.jsonl, checkpoints/ (default runs/<timestamp>)")
    p.add_argument("--tensorboard", metavar="DIR", help="at the end, also write the run's scalars as TensorBoard events into DIR")
    p.add_argument("--log-every", type=ct.positive_int, default=50, help="steps between train-loss records in the log (default 50)")
    p.add_argument("--embedding-dim", type=ct.dim, help="embedding width (default: the preset's)")
    p.add_argument("--bottom-mlp", type=ct.int_list, help="bottom MLP sizes, e.g. 64,16; must end at the embedding dim")
    p.add_argument("--top-mlp", type=ct.int_list, help="top MLP sizes, e.g. 64,32,1; must end in 1")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                   help="where to train: cpu, cuda (under torchrun GPU LOCAL_RANK, with NCCL) or auto "
                        "(the GPU if torch sees one) (default cpu)")
    p.add_argument("--table-placement", choices=["auto", "device", "host"], default="auto",
                   help="one process on a GPU: tables on the GPU, in host memory (looked up there), or auto "
                        "(the GPU when they fit in 80%% of its free memory) (default auto)")
    add_parallel_arguments(p, "under torchrun: how tables are sharded (default auto: the planner decides)")
    p.set_defaults(_parser=p)


def on_off(text: str) -> bool:
    """true/false, yes/no, on/off, 1/0 (for options a recipe may set either way)."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        data=args.data, preset=args.preset, batch_size=args.batch_size, epochs=args.epochs,
        max_steps=args.max_steps, lr=args.lr, optimizer=args.optimizer, warmup_steps=args.warmup_steps,
        decay_start=args.decay_start, decay_steps=args.decay_steps, eval_every=args.eval_every,
        eval_batch_size=args.eval_batch_size, target_auc=args.target_auc, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, resume=args.resume, metrics_json=args.metrics_json,
        log_jsonl=args.log_jsonl, seed=args.seed, shuffle=not args.no_shuffle, progress=not args.no_progress,
        threads=args.threads, keep_checkpoints=getattr(args, "keep", 2),
        final_checkpoint=not getattr(args, "no_final_checkpoint", False),
        checkpoint_every_seconds=getattr(args, "checkpoint_every_seconds", 0.0),
        skip_nonfinite=getattr(args, "skip_nonfinite", 0),
        collective_timeout=getattr(args, "collective_timeout", 1800.0), log_every=getattr(args, "log_every", 50),
        embedding_dim=getattr(args, "embedding_dim", None), bottom_mlp=getattr(args, "bottom_mlp", None),
        top_mlp=getattr(args, "top_mlp", None),
        embedding_optimizer=getattr(args, "embedding_optimizer", None), lamb_lr=getattr(args, "lamb_lr", None),
        precision=getattr(args, "precision", "fp32"), comm_dtype=getattr(args, "comm_dtype", "fp32"),
        sharding=getattr(args, "sharding", "auto"), plan=getattr(args, "plan", None),
        loader=getattr(args, "loader", "exchange"), backend=getattr(args, "backend", None),
        device=getattr(args, "device", "cpu"), table_placement=getattr(args, "table_placement", "auto"),
        val_fraction=getattr(args, "val_fraction", None), patience=getattr(args, "patience", None),
        restore_best=getattr(args, "restore_best", None),
        embedding_weight_decay=getattr(args, "embedding_weight_decay", None), wide=getattr(args, "wide", None),
        numerical_transform=getattr(args, "numerical_transform", None),
        embedding_init_scale=getattr(args, "embedding_init_scale", None),
    )


def check_outputs(args: argparse.Namespace) -> None:
    """Every path this run will write: creatable and writable, a file or a folder as needed."""
    from dlrmkit.atomic_io import check_output_dir, check_output_file

    from dlrmkit.atomic_io import check_not_inside

    data = {"--data": args.data}
    for option, path in (("--metrics-json", args.metrics_json), ("--log-jsonl", args.log_jsonl),
                         ("--checkpoint-dir", args.checkpoint_dir), ("--run-dir", args.run_dir)):
        check_not_inside(path, option, data)
    check_output_file(args.metrics_json, "--metrics-json")
    check_output_file(args.log_jsonl, "--log-jsonl", append=True)
    check_output_dir(args.checkpoint_dir, "--checkpoint-dir")
    check_output_dir(args.run_dir, "--run-dir")
    check_output_dir(getattr(args, "tensorboard", None), "--tensorboard")
    if not args.run_dir:
        check_output_dir("runs", "the default run folder (runs/; or pass --run-dir)")
    for option, path in (("--plan", args.plan),):
        if path and not os.path.isfile(path):
            raise DlrmkitError(f"{option} {path}: no such file")
    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")


def check_tables_fit(cfg: TrainConfig) -> None:
    """The embedding tables (and their optimizer state) of this process fit in memory, or one line."""
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.resources import check_memory

    res = cfg.resolved()
    rows = sum(FeatureSpec.from_yaml(cfg.data).cardinalities)
    state = 2 if "adagrad" in f"{res.optimizer} {res.embedding_optimizer}" else 1
    world = max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    dim = int(res.embedding_dim)
    check_memory(rows * dim * 4 * state // world, f"{cfg.data}: {rows:,} table rows x --embedding-dim {dim}")
    bottom, top = list(res.bottom_mlp or []), list(res.top_mlp or [])
    widths = [16, *bottom, 1 << 12, *top]  # the MLPs' widths (inputs rounded up): weights, gradients, state
    check_memory(sum(a * b for a, b in zip(widths, widths[1:])) * 4 * 4, "--bottom-mlp/--top-mlp")


def summary_line(m: dict) -> str:
    val = f"val AUC {m['val_auc']:.4f}  " if not math.isnan(m.get("val_auc", float("nan"))) else ""
    line = (
        f"steps {m['steps']}  samples/s {m['samples_per_s']:,.0f}  train loss {m['train_loss']:.4f}  {val}"
        f"test logloss {m['logloss']:.4f}  test AUC {m['auc']:.4f}"
    )
    if math.isnan(m["auc"]):
        line += "  (AUC undefined: the test mapping has no rows or one class only)"
    if "optimal_auc" in m and not math.isnan(m["auc"]):
        line += f"  (optimal {m['optimal_auc']:.4f}, gap {m['optimal_auc'] - m['auc']:.4f})"
    return line


def run(args: argparse.Namespace) -> int:
    from dlrmkit.train.trainer import Trainer

    from dlrmkit.train import run_dir
    from dlrmkit.train.config_file import apply_config

    if getattr(args, "config", None):
        args = apply_config(args)
    if not args.data:
        raise DlrmkitError("--data is required (on the command line or in --config)")
    recipe_text = choose_recipe(args)
    cfg = config_from_args(args)
    check_outputs(args)  # before any expensive work: a bad path is found now, not after training
    check_tables_fit(cfg)
    if getattr(args, "tensorboard", None):
        from dlrmkit.report import summary_writer_class

        summary_writer_class()  # a missing package is an error before training, not after
    run_folder = run_dir.setup(args, cfg)
    trainer = Trainer(cfg)
    run_dir.share_checkpoint_dir(run_folder, trainer)
    if trainer.dist.rank == 0:
        print(recipe_text + "\n" if recipe_text else "", end="")
        print(f"validation rows: {trainer.val_source}")
    run_dir.write_plan(run_folder, trainer)
    try:
        metrics = trainer.fit()
    except RuntimeError as exc:  # a dead or stopped peer: one line naming the collective
        from dlrmkit.train.faults import collective_failure

        message = collective_failure(exc, cfg.collective_timeout)
        if message is None:
            raise
        raise DlrmkitError(message) from None
    run_dir.write_metrics(run_folder, metrics)
    if trainer.dist.rank == 0:  # under torchrun only rank 0 writes and prints
        if args.metrics_json:
            run_dir.write_metrics_json(args.metrics_json, metrics)
        print(summary_line(metrics))
        lift = baseline_lift(args.data, metrics)
        if lift:
            print(lift)
        if getattr(args, "tensorboard", None):
            from dlrmkit.report import read_log, tensorboard

            tensorboard(read_log(cfg.log_jsonl), args.tensorboard)
    from dlrmkit.parallel.dist import shutdown

    if trainer.par is not None:
        trainer.par.close()
    shutdown()
    return 0


def choose_recipe(args: argparse.Namespace) -> str:
    """--preset auto: fill unset options from the dataset's recipe (they reach config.yaml, so
    `train --config` repeats the run); returns what was chosen and why, for rank 0 to print."""
    if args.preset != AUTO:
        return ""
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.train import recipe

    spec, train, _ = open_dataset(args.data)
    chosen = recipe.choose(spec, train)
    return recipe.describe(chosen, recipe.apply(args, chosen))


def baseline_lift(data: str, metrics: dict) -> str:
    """The line comparing this run with `dlrmkit baseline` on the same dataset, when one was run."""
    from dlrmkit.baseline import read_baseline

    base = read_baseline(data)
    if base is None or math.isnan(metrics["auc"]):
        return ""
    return (f"logistic-regression baseline ({base['path']}): test AUC {base['test_auc']:.4f}, "
            f"lift {metrics['auc'] - base['test_auc']:+.4f}")
