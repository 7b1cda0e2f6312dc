"""Write a synthetic FeatureSpec dataset drawn from a hidden teacher model. Its metadata records
the Bayes-optimal test AUC, which `dlrmkit train` reports next to the AUC it reaches."""

from __future__ import annotations

import argparse
import dataclasses

from dlrmkit.data.synthetic import SYNTH_PRESETS, generate
from dlrmkit.errors import DlrmkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output dataset folder")
    p.add_argument("--preset", default="tiny", help=f"dataset shape: {', '.join(SYNTH_PRESETS)} (default tiny)")
    p.add_argument("--rows", type=int, help="training rows (default: the preset's)")
    p.add_argument("--test-rows", type=int, help="test rows (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the teacher and the samples (default 0)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")


def run(args: argparse.Namespace) -> int:
    if args.preset not in SYNTH_PRESETS:
        raise DlrmkitError(f"unknown --preset '{args.preset}' (choose from: {', '.join(SYNTH_PRESETS)})")
    cfg = SYNTH_PRESETS[args.preset]
    cfg = dataclasses.replace(
        cfg, rows=args.rows if args.rows is not None else cfg.rows,
        test_rows=args.test_rows if args.test_rows is not None else cfg.test_rows,
    )
    spec = generate(args.out, cfg, seed=args.seed, preset=args.preset, overwrite=args.force)
    rows = spec.metadata["rows"]
    print(
        f"wrote {args.out}: {rows['train']} train + {rows['test']} test rows, "
        f"{len(cfg.table_sizes)} tables, optimal test AUC {spec.metadata['optimal_auc']:.4f}"
    )
    return 0
