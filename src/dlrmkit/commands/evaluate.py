"""Compute test AUC and log loss of a checkpoint on a dataset's test mapping."""

from __future__ import annotations

import argparse
import os

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import check_not_inside, check_output_file
from dlrmkit.errors import DlrmkitError
from dlrmkit.config import TrainConfig
from dlrmkit.options import add_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, type=ct.path, help="dataset folder holding feature_spec.yaml")
    p.add_argument(
        "--checkpoint", required=True, type=ct.path, help="checkpoint folder, or a checkpoint dir with 'latest'"
    )
    p.add_argument("--mapping", default="test", help="mapping to evaluate (default test)")
    p.add_argument("--batch-size", type=ct.batch_size, default=16384, help="evaluation batch size (default 16384)")
    p.add_argument("--metrics-json", type=ct.path, help="write {auc, logloss, rows, world_size} to this file")
    add_options(
        p,
        TrainConfig,
        {  # the torchrun options, as train's
            "sharding": {"help": "under torchrun: how tables are sharded (any plan loads any checkpoint)"},
            "plan": {},
            "loader": {},
            "backend": {},
            "bind_cores": {},
        },
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from dlrmkit.atomic_io import hold_output_lock, is_stdout
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.split_binary import SplitBinaryDataset
    from dlrmkit.checkpoint.save_load import load_single_process_model
    from dlrmkit.train.evaluation import evaluate_model
    from dlrmkit.commands.train import check_plan_file

    from dlrmkit.parallel.dist import launched_by_torchrun
    from dlrmkit.parallel.options import refuse_outside_torchrun, torchrun_env

    torchrun_env()  # a garbage RANK or WORLD_SIZE: one line before any work
    check_not_inside(args.metrics_json, "--metrics-json", {"--data": args.data, "--checkpoint": args.checkpoint})
    check_output_file(args.metrics_json, "--metrics-json")
    if args.metrics_json and torchrun_env().rank == 0:  # one writer per output, before any work
        hold_output_lock(args.metrics_json, "--metrics-json")
    check_plan_file(args.plan)  # a bad file is named first, as under torchrun
    refuse_outside_torchrun(
        (
            (f"--sharding {args.sharding}", args.sharding != "auto"),
            (f"--plan {args.plan}", args.plan is not None),
            (f"--loader {args.loader}", args.loader != "exchange"),
            (f"--backend {args.backend}", args.backend is not None),
            ("--no-bind-cores", not args.bind_cores),
        )
    )
    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")
    spec = FeatureSpec.from_yaml(args.data)
    dataset = SplitBinaryDataset(spec, args.mapping)
    if not len(dataset):
        raise DlrmkitError(f"{args.data}: the {args.mapping} mapping has no rows; nothing to evaluate")

    def check(cfg) -> None:  # before the model is built: a wrong pairing costs nothing
        if cfg.table_sizes != spec.cardinalities or cfg.num_numerical != dataset.num_numerical:
            raise DlrmkitError(
                f"{args.checkpoint}: model was trained for {cfg.num_numerical} numerical features and tables "
                f"{cfg.table_sizes}, but {args.data} has {dataset.num_numerical} and {spec.cardinalities}"
            )

    par = None
    if launched_by_torchrun():  # sharded evaluation: every rank loads only its shards
        from dlrmkit.checkpoint.save_load import load_parallel_model

        model, cfg, par = load_parallel_model(args.checkpoint, args, check)
    else:
        model, cfg = load_single_process_model(args.checkpoint, check)
    metrics = (
        par.evaluate(dataset, args.batch_size)
        if par
        else evaluate_model(model, dataset, args.batch_size, progress=True)
    )
    result = {**metrics, "rows": len(dataset), "world_size": par.ctx.world_size if par else 1}
    if par is not None:
        from dlrmkit.parallel.dist import shutdown

        shutdown()
        if par.ctx.rank != 0:
            return 0
    shown = sys.stderr if is_stdout(args.metrics_json) else sys.stdout  # `--metrics-json -`: stdout is the JSON
    print(f"{args.mapping}: {result['rows']} rows  AUC {result['auc']:.6f}  logloss {result['logloss']:.6f}", file=shown)
    if args.metrics_json:
        from dlrmkit.train.run_dir import write_metrics_json

        write_metrics_json(args.metrics_json, result)
    return 0
