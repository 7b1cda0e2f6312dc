"""Materialize MLPerf DLRM-DCNv2's synthetic multi-hot dataset from a one-hot FeatureSpec dataset:
the same rows, numerical features and labels; each categorical id i of a table becomes the bag
[i, k - 1 uniform ids drawn once per id] (mlcommons/training recommendation_v2/torchrec_dlrm's
`materialize_synthetic_multihot_dataset.py --multi_hot_distribution_type uniform`, docs/MLPERF.md).
Streams in blocks (memory bounded by --block-rows); the same input and seed give the same bytes."""

from __future__ import annotations

import argparse

from dlrmkit import cli_types


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, type=cli_types.path, help="one-hot dataset folder (feature_spec.yaml)")
    p.add_argument("--out", required=True, type=cli_types.path, help="output dataset folder")
    p.add_argument(
        "--multi-hot-sizes",
        metavar="K1,K2,...",
        type=cli_types.text,
        default="mlperf",
        help="ids per bag of each table, or mlperf: 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1 (default)",
    )
    p.add_argument(
        "--num-embeddings",
        metavar="N1,N2,...",
        type=cli_types.cardinalities,
        help="rows of each output table; ids are taken modulo them (MLPerf: 40M-row caps) (default: the dataset's)",
    )
    p.add_argument("--seed", type=cli_types.seed, default=0, help="seed of the lookup draws (default 0, as MLPerf's)")
    p.add_argument(
        "--block-rows",
        type=cli_types.positive_int,
        default=1 << 15,
        help="rows read, expanded and written at a time: bounds memory (default 32768)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing dataset (or empty folder) at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


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
