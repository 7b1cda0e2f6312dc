"""Write a synthetic FeatureSpec dataset drawn from a hidden teacher model. Its metadata records
the Bayes-optimal test AUC, which `dlrmkit train` reports next to the AUC it reaches."""

from __future__ import annotations

import argparse
from dataclasses import replace

from dlrmkit import cli_types
from dlrmkit.data.feature_spec import categorical_dtype
from dlrmkit.data.split_binary import allow_open_files
from dlrmkit.data.synthetic import SYNTH_PRESETS, generate
from dlrmkit.data.synthetic_shapes import resolve_config
from dlrmkit.resources import check_disk, check_memory


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=cli_types.path, help="output dataset folder")
    p.add_argument(
        "--preset",
        type=cli_types.text,
        help=f"dataset shape: {', '.join(SYNTH_PRESETS)} (default tiny); kaggle: Criteo "
        "Kaggle's 26 table sizes (33.8M rows), terabyte: MLPerf's Criteo Terabyte tables (40M-row cap)",
    )
    p.add_argument(
        "--cardinalities",
        metavar="N1,N2,...",
        type=cli_types.cardinalities,
        help="table sizes of any shape (13 numerical features), instead of --preset",
    )
    p.add_argument(
        "--scale",
        type=cli_types.positive_float,
        default=1.0,
        help="multiply every table size by F (at least 1 row each), e.g. --preset terabyte --scale 0.1 (default 1)",
    )
    p.add_argument(
        "--rows", type=cli_types.rows, help="training rows (default: the preset's; 1,000,000 with --cardinalities)"
    )
    p.add_argument(
        "--test-rows", type=cli_types.rows, help="test rows (default: the preset's; 100,000 with --cardinalities)"
    )
    p.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the teacher and the samples (default 0)")
    # ---- the teacher's interaction and multi-hot bags (DLRM-DCNv2's data) ----------------------
    p.add_argument(
        "--teacher",
        choices=("dot", "cross"),
        default="dot",
        help="the hidden model's interaction: pairwise dots, or a DCNv2 cross layer (default dot)",
    )
    p.add_argument(
        "--multi-hot",
        metavar="K1,K2,...",
        type=cli_types.text,
        help="bags of K ids per table by MLPerf DCNv2's synthetic expansion of the ids (mlperf: its 26 "
        "sizes, for --preset terabyte or kaggle); the optimal AUC still holds",
    )
    p.add_argument("--force", action="store_true", help="replace an existing dataset (or empty folder) at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    name, cfg = resolve_config(args.preset, args.cardinalities, args.scale, args.rows, args.test_rows)
    cfg = replace(cfg, teacher=args.teacher, multi_hot=multi_hot_sizes(args.multi_hot, len(cfg.table_sizes)))
    hot = cfg.multi_hot or [1] * len(cfg.table_sizes)
    row_bytes = 1 + 2 * cfg.num_numerical + sum(categorical_dtype(c).itemsize * k for c, k in zip(cfg.table_sizes, hot))
    lookup_bytes = sum(4 * c * (k - 1) for c, k in zip(cfg.table_sizes, hot))
    check_disk(args.out, (cfg.rows + cfg.test_rows) * row_bytes + lookup_bytes, "--rows/--test-rows")
    check_memory(cfg.test_rows * 24, "--test-rows")  # test probabilities and labels, for the optimal AUC
    allow_open_files(2 * (len(cfg.table_sizes) + 2), f"{len(cfg.table_sizes):,} tables")  # before the teacher
    spec = generate(
        args.out, cfg, seed=args.seed, preset=name, overwrite=args.force, progress=False if args.no_progress else None
    )
    rows = spec.metadata["rows"]
    print(
        f"wrote {args.out}: {rows['train']} train + {rows['test']} test rows, "
        f"{len(cfg.table_sizes)} tables ({sum(cfg.table_sizes):,} rows in all, largest {max(cfg.table_sizes):,}"
        f"{f', {sum(cfg.multi_hot)} ids per sample' if cfg.multi_hot else ''}), "
        f"optimal test AUC {spec.metadata['optimal_auc']:.4f}"
    )
    return 0


def multi_hot_sizes(text: str | None, tables: int) -> list[int] | None:
    """--multi-hot: None (one-hot), "mlperf" (DCNv2's 26 bag sizes) or one size per table."""
    from dlrmkit.data.multi_hot import MLPERF_MULTI_HOT_SIZES, parse_sizes

    if text is None:
        return None
    if text == "mlperf":
        text = ",".join(map(str, MLPERF_MULTI_HOT_SIZES))
    return parse_sizes(text, tables, "--multi-hot")
