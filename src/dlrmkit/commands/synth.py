"""Write a synthetic FeatureSpec dataset drawn from a hidden teacher model. Its metadata records
the Bayes-optimal test AUC, which `dlrmkit train` reports next to the AUC it reaches."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from dlrmkit import cli_types
from dlrmkit.options import add_options, option
from dlrmkit.data.feature_spec import categorical_dtype
from dlrmkit.data.split_binary import allow_open_files
from dlrmkit.data.synthetic import SYNTH_PRESETS, generate
from dlrmkit.data.synthetic_shapes import resolve_config
from dlrmkit.resources import check_disk, check_memory


@dataclass
class SynthOptions:
    out: str = option(help="output dataset folder", parse=cli_types.path, required=True)
    preset: str | None = option(
        None,
        f"dataset shape: {', '.join(SYNTH_PRESETS)} (default tiny); kaggle: Criteo "
        "Kaggle's 26 table sizes (33.8M rows), terabyte: MLPerf's Criteo Terabyte tables (40M-row cap)",
        parse=cli_types.text,
    )
    cardinalities: str | None = option(
        None,
        "table sizes of any shape (13 numerical features), instead of --preset",
        parse=cli_types.cardinalities,
        metavar="N1,N2,...",
    )
    scale: float = option(
        1.0,
        "multiply every table size by F (at least 1 row each), e.g. --preset terabyte --scale 0.1 (default {default})",
        parse=cli_types.positive_float,
    )
    rows: int | None = option(
        None, "training rows (default: the preset's; 1,000,000 with --cardinalities)", parse=cli_types.rows
    )
    test_rows: int | None = option(
        None, "test rows (default: the preset's; 100,000 with --cardinalities)", parse=cli_types.rows
    )
    seed: int = option(0, "seed of the teacher and the samples (default {default})", parse=cli_types.seed)
    force: bool = option(False, "replace an existing dataset (or empty folder) at --out")
    no_progress: bool = option(False, "no progress bar")
    # ---- the teacher's interaction and multi-hot bags (DLRM-DCNv2's data, docs/RECIPES.md) ----------
    teacher: str = option(
        "dot",
        "the hidden model's interaction: pairwise dots, or a DCNv2 cross layer (default {default})",
        choices=("dot", "cross"),
    )
    multi_hot: str | None = option(
        None,
        "bags of K ids per table by MLPerf DCNv2's synthetic expansion of the ids (mlperf: its 26 "
        "sizes, for --preset terabyte or kaggle); the optimal AUC still holds",
        parse=cli_types.text,
        metavar="K1,K2,...",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, SynthOptions)


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
        f"wrote {args.out}: {rows['train']:,} train + {rows['test']:,} test rows, "
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
