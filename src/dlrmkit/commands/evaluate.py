"""Compute test AUC and log loss of a checkpoint on a dataset's test mapping."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import check_not_inside, check_output_file
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, build, given, option
from dlrmkit.parallel.options import ParallelOptions


@dataclass
class EvaluateOptions:
    """evaluate's own options; the torchrun ones are train's (the parallel section)."""

    data: str = option(help="dataset folder holding feature_spec.yaml", parse=ct.path, required=True)
    checkpoint: str = option(help="checkpoint folder, or a checkpoint dir with 'latest'", parse=ct.path, required=True)
    mapping: str = option("test", "mapping to evaluate (default {default})")
    batch_size: int = option(16384, "evaluation batch size (default {default})", parse=ct.batch_size)
    metrics_json: str | None = option(None, "write {auc, logloss, rows, world_size} to this file", parse=ct.path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, EvaluateOptions)
    add_options(
        p,
        ParallelOptions,
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

    import numpy as np

    from dlrmkit.atomic_io import hold_output_lock, is_stdout
    from dlrmkit.data.numerical_buckets import model_view, reads
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.split_binary import SplitBinaryDataset
    from dlrmkit.checkpoint.save_load import load_single_process_model
    from dlrmkit.train.evaluation import evaluate_model, scores
    from dlrmkit.commands.train import check_plan_file

    from dlrmkit.parallel.dist import launched_by_torchrun
    from dlrmkit.parallel.options import changed_torchrun_options, refuse_outside_torchrun, torchrun_env

    torchrun_env()  # a garbage RANK or WORLD_SIZE: one line before any work
    check_not_inside(args.metrics_json, "--metrics-json", {"--data": args.data, "--checkpoint": args.checkpoint})
    check_output_file(args.metrics_json, "--metrics-json")
    if args.metrics_json and torchrun_env().rank == 0:  # one writer per output, before any work
        hold_output_lock(args.metrics_json, "--metrics-json")
    check_plan_file(args.plan)  # a bad file is named first, as under torchrun
    opts = build(ParallelOptions, given(ParallelOptions, args))  # the torchrun options, as train's
    refuse_outside_torchrun(changed_torchrun_options(opts))
    if not os.path.isdir(args.data):
        raise DlrmkitError(f"--data {args.data}: no such dataset folder")
    spec = FeatureSpec.from_yaml(args.data)
    dataset = SplitBinaryDataset(spec, args.mapping)
    if not len(dataset):
        raise DlrmkitError(f"{args.data}: the {args.mapping} mapping has no rows; nothing to evaluate")

    def check(cfg) -> None:  # before the model is built: a wrong pairing costs nothing
        fits = reads(cfg, spec.cardinalities)
        if not fits or cfg.num_numerical != dataset.num_numerical:
            raise DlrmkitError(
                f"{args.checkpoint}: model was trained for {cfg.num_numerical} numerical features and tables "
                f"{cfg.table_sizes}, but {args.data} has {dataset.num_numerical} and {spec.cardinalities}"
            )

    from dlrmkit.checkpoint.save_load import check_bags
    from dlrmkit.train import blend

    par = None
    if blend.is_blend(args.checkpoint):  # members scored each as it was trained, their logits averaged
        if launched_by_torchrun():
            raise DlrmkitError(f"{args.checkpoint}: a blend is evaluated in one process; run it without torchrun")
        b = blend.read_blend(args.checkpoint)
        for folder in b.folders:  # each member trained on bags of the sizes it is to score
            check_bags(folder, args.data, spec.categorical_names, spec.hotness)
        with np.errstate(invalid="ignore"):  # NaN logits: refused below
            metrics = blend.metrics_of(*blend.blend_logits(b, blend.load_members(b, check), dataset, args.batch_size))
    else:
        check_bags(args.checkpoint, args.data, spec.categorical_names, spec.hotness)
        if launched_by_torchrun():  # sharded evaluation: every rank loads only its shards
            from dlrmkit.checkpoint.save_load import load_parallel_model

            model, cfg, par = load_parallel_model(args.checkpoint, opts, args.batch_size, check)
            metrics = scores(*par.predict(model_view(dataset, cfg), args.batch_size))
        else:
            model, cfg = load_single_process_model(args.checkpoint, check)
            # --min-id-count, --numerical-buckets: the rows as training read them
            metrics = evaluate_model(model, model_view(dataset, cfg), args.batch_size, progress=True)
    if math.isnan(metrics["logloss"]):  # the rows are checked finite: the model's weights or statistics are not
        raise DlrmkitError(
            f"{args.checkpoint}: the model scores {args.mapping} rows as NaN (its manifest.json's model_config or "
            f"its weights are not a trained model's); refused"
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
