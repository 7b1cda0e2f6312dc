"""Materialize MLPerf DLRM-DCNv2's synthetic multi-hot dataset from a one-hot FeatureSpec dataset:
the same rows, numerical features and labels; each categorical id i of a table becomes the bag
[i, k - 1 uniform ids drawn once per id] (mlcommons/training recommendation_v2/torchrec_dlrm's
`materialize_synthetic_multihot_dataset.py --multi_hot_distribution_type uniform`, docs/RECIPES.md).
Streams in blocks (memory bounded by --block-rows); the same input and seed give the same bytes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dlrmkit import cli_types
from dlrmkit.options import add_options, option


@dataclass
class MultihotOptions:
    data: str = option(help="one-hot dataset folder (feature_spec.yaml)", parse=cli_types.path, required=True)
    out: str = option(help="output dataset folder", parse=cli_types.path, required=True)
    multi_hot_sizes: str = option(
        "mlperf",
        "ids per bag of each table, or mlperf: 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1 (default)",
        parse=cli_types.text,
        metavar="K1,K2,...",
    )
    num_embeddings: str | None = option(
        None,
        "rows of each output table; ids are taken modulo them (MLPerf: 40M-row caps) (default: the dataset's)",
        parse=cli_types.cardinalities,
        metavar="N1,N2,...",
    )
    seed: int = option(0, "seed of the lookup draws (default {default}, as MLPerf's)", parse=cli_types.seed)
    block_rows: int = option(
        1 << 15,
        "rows read, expanded and written at a time: bounds memory (default {default})",
        parse=cli_types.positive_int,
    )
    force: bool = option(False, "replace an existing dataset (or empty folder) at --out")
    no_progress: bool = option(False, "no progress bar")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, MultihotOptions)


def run(args: argparse.Namespace) -> int:
    from dlrmkit.data.feature_spec import FeatureSpec, categorical_dtype
    from dlrmkit.data.multi_hot import MLPERF_MULTI_HOT_SIZES, materialize, parse_sizes
    from dlrmkit.resources import check_disk

    from dlrmkit.atomic_io import check_not_inside

    check_not_inside(args.out, "--out", {"--data": args.data})  # never replaces the dataset it reads
    spec = FeatureSpec.from_yaml(args.data)
    tables = len(spec.categorical_names)
    if args.multi_hot_sizes == "mlperf":
        sizes = list(MLPERF_MULTI_HOT_SIZES)
        if tables != len(sizes):
            msg = f"the mlperf bag sizes are for 26 tables, {args.data} has {tables}; give --multi-hot-sizes"
            from dlrmkit.errors import DlrmkitError

            raise DlrmkitError(msg)
    else:
        sizes = parse_sizes(args.multi_hot_sizes, tables, "--multi-hot-sizes")
    rows = parse_sizes(args.num_embeddings, tables, "--num-embeddings") if args.num_embeddings else None
    cards = rows or spec.cardinalities
    samples = sum(int(v) for v in (spec.metadata.get("rows") or {}).values())
    id_bytes = sum(categorical_dtype(c).itemsize * k for c, k in zip(cards, sizes))
    lookup_bytes = sum(4 * c * (k - 1) for c, k in zip(cards, sizes))
    check_disk(args.out, samples * (id_bytes + 1 + 2 * len(spec.numerical_names)) + lookup_bytes, "--out")
    out = materialize(
        args.data,
        args.out,
        sizes,
        seed=args.seed,
        num_embeddings=rows,
        overwrite=args.force,
        block_rows=args.block_rows,
        progress=False if args.no_progress else None,
    )
    counts = out.metadata["rows"]
    print(
        f"wrote {args.out}: {', '.join(f'{n:,} {m}' for m, n in counts.items())} rows, "
        f"{sum(sizes)} ids per sample over {tables} tables (bag sizes {','.join(map(str, sizes))})"
    )
    return 0
