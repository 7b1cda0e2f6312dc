"""Write a synthetic FeatureSpec dataset drawn from a hidden teacher model. Its metadata records
the Bayes-optimal test AUC, which `dlrmkit train` reports next to the AUC it reaches."""

from __future__ import annotations

import argparse
import dataclasses

from dlrmkit import cli_types
from dlrmkit.data.feature_spec import categorical_dtype
from dlrmkit.data.synthetic import SYNTH_PRESETS, generate
from dlrmkit.errors import DlrmkitError
from dlrmkit.resources import check_disk, check_memory


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output dataset folder")
    p.add_argument("--preset", default="tiny", help=f"dataset shape: {', '.join(SYNTH_PRESETS)} (default tiny)")
    p.add_argument("--rows", type=cli_types.rows, help="training rows (default: the preset's)")
    p.add_argument("--test-rows", type=cli_types.rows, help="test rows (default: the preset's)")
    p.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the teacher and the samples (default 0)")
    p.add_argument("--force", action="store_true", help="replace an existing dataset (or empty folder) at --out")


def run(args: argparse.Namespace) -> int:
    if args.preset not in SYNTH_PRESETS:
        raise DlrmkitError(f"unknown --preset '{args.preset}' (choose from: {', '.join(SYNTH_PRESETS)})")
    cfg = SYNTH_PRESETS[args.preset]
    cfg = dataclasses.replace(
        cfg, rows=args.rows if args.rows is not None else cfg.rows,
        test_rows=args.test_rows if args.test_rows is not None else cfg.test_rows,
    )
    row_bytes = 1 + 2 * cfg.num_numerical + sum(categorical_dtype(c).itemsize for c in cfg.table_sizes)
    check_disk(args.out, (cfg.rows + cfg.test_rows) * row_bytes, "--rows/--test-rows")
    check_memory(cfg.test_rows * 24, "--test-rows")  # test probabilities and labels, for the optimal AUC
    spec = generate(args.out, cfg, seed=args.seed, preset=args.preset, overwrite=args.force)
    rows = spec.metadata["rows"]
    print(
        f"wrote {args.out}: {rows['train']} train + {rows['test']} test rows, "
        f"{len(cfg.table_sizes)} tables, optimal test AUC {spec.metadata['optimal_auc']:.4f}"
    )
    return 0
