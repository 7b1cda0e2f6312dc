"""Plan how embedding tables are sharded over ranks: per rank its shards, memory, lookups and
bytes sent per step. Exits 2 with one line naming the table that does not fit. With --data the
model and batch are resolved exactly as `dlrmkit train --data` resolves them (same preset,
same options, dlrmkit.config.resolve_run), so the plan is the one a torchrun job then uses.
With --config they come from train's config file, read as `train --config` reads it, the
flags given over it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.config import AUTO, PRESETS
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.parallel.plan import PRESET_TABLES

LEGACY_BATCH = 65536  # global batch with --tables / --tables-preset (no training recipe to take it from)
# train's options plan takes as flags too (besides --data and --preset, which are plan's own fields)
TRAIN_FLAGS = (
    "embedding_dim",
    "batch_size",
    "optimizer",
    "embedding_optimizer",
    "sharding",
    "wide",
    "min_id_count",
    "numerical_buckets",
)

# ---- multi-hot table presets (MLPerf DLRM-DCNv2: docs/RECIPES.md) --------------------------------------
# name -> (rows of each table in feature order, dim, ids per sample of each table, cross network (layers, rank))
MULTI_HOT_TABLES: dict[str, tuple[list[int], int, list[int], tuple[int, int]]] = {
    "criteo-1tb-mlperf-multihot": (
        # --num_embeddings_per_feature of mlcommons/training recommendation_v2/torchrec_dlrm (40M-row caps)
        [40_000_000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40_000_000, 3067956, 405282, 10]
        + [2209, 11938, 155, 4, 976, 14, 40_000_000, 40_000_000, 40_000_000, 590152, 12973, 108, 36],
        128,
        [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1],
        (3, 512),
    ),
}


@dataclass
class PlanOptions:
    """plan's own options; the model and batch ones are train's (TrainConfig), with what they
    mean for a plan. One of --data, --tables-preset, --tables is required (checked in run, after
    --preset's hint)."""

    data: str | None = option(
        None, "dataset folder: the model and batch `train --data` would use", parse=ct.path, group="source"
    )
    tables_preset: str | None = option(
        None,
        "table sizes of a known model (criteo-1tb-mlperf-multihot: MLPerf DLRM-DCNv2's, with its bag sizes)",
        choices=tuple(PRESET_TABLES) + tuple(MULTI_HOT_TABLES),
        group="source",
    )
    tables: str | None = option(None, "comma-separated ROWSxDIM, e.g. 40000000x128,3000x128", group="source")
    preset: str | None = option(
        None,
        f"with --data: train's model and recipe preset ({AUTO}, {', '.join(PRESETS)}; default as "
        f"train: {AUTO}, the recipe chosen from the dataset)",
    )
    world_size: int | None = option(None, "number of ranks (required unless --simulate)", parse=ct.world_size)
    device_memory: int | None = option(
        None,
        "memory per rank, e.g. 80GiB (default: a CPU job with its ranks on this host, where auto may "
        "replicate every table, within half the host's memory shared by the ranks, at up to 256 samples "
        "per rank, as train does)",
        parse=ct.byte_size,
    )
    min_rows_sharded: int = option(
        2048,
        "replicate tables with fewer rows than this and than the global batch (default {default})",
        parse=ct.nonneg_int,
    )
    json: str | None = option(None, "save the plan as JSON here (train --plan reads it)", parse=ct.path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dlrmkit.commands.train import ConfigFile
    from dlrmkit.config import TrainConfig
    from dlrmkit.perf.simulate_options import add_simulate_arguments  # --simulate, --hardware, ...

    add_options(p, PlanOptions)
    add_options(
        p,
        ConfigFile,
        {
            "config": {
                "help": "train's YAML file of options (what `train --config` reads, e.g. a run folder's config.yaml): "
                "its dataset (data:, unless --data), model and batch; flags given here win"
            }
        },
    )
    add_options(  # left off the namespace unless given, so that --config can fill them (train_options)
        p,
        TrainConfig,
        {  # as train's options, with what they mean for a plan
            "embedding_dim": {
                "aliases": ["--dim"],
                "help": "with --data: embedding width (default: the preset's, as train)",
            },
            "batch_size": {
                "help": f"global batch size (default: with --data the preset's, as train; else {LEGACY_BATCH})"
            },
            "optimizer": {
                "help": "as train's --optimizer (with --data default: the preset's; else sgd); the tables' "
                "optimizer state counts in memory"
            },
            "embedding_optimizer": {
                "help": "as train's: tables' optimizer (adagrad: one value per weight, rowwise-adagrad: one per row)"
            },
            "sharding": {"help": "auto (default), table_wise, column_wise, row_wise, data_parallel"},
            # the options that change train's tables: planned as train builds them (data/model_tables.py)
            "wide": {
                "help": "with --data: as train's --wide, a first-order weight per id: one more column in every table"
            },
            "min_id_count": {
                "help": "with --data: as train's, the tables keep the ids seen K or more times in the training rows"
            },
            "numerical_buckets": {
                "help": "with --data: as train's, one more table per numerical feature (its N quantile buckets)"
            },
        },
        unset_absent=True,
    )
    add_simulate_arguments(p)


def train_options(args: argparse.Namespace) -> None:
    """train's options as `train --config FILE FLAGS` takes them (dlrmkit.train.config_file: the
    same loader and checks, the flags given over the file), kept whole in `args.train_values`
    for resolved_from_data; `args` gets each of plan's train flags (its default where neither
    gives it), --data and --preset."""
    from dlrmkit.config import AUTO, TrainConfig
    from dlrmkit.options import spec_map
    from dlrmkit.train.config_file import config_values

    flags = {k: getattr(args, k, None) for k in ("data", "preset", *TRAIN_FLAGS)}
    values = config_values(args.config, {k: v for k, v in flags.items() if v is not None})
    if args.config:
        if args.tables or args.tables_preset:
            flag = "--tables" if args.tables else "--tables-preset"
            raise DlrmkitError(
                f"--config gives train's options for a dataset (--data, or data: in the file); {flag} takes none"
            )
        if not values.get("data"):
            raise DlrmkitError(f"{args.config}: no 'data': give the dataset there or as --data")
        if values.get("blend"):  # train fills each member's recipe over these options, not the base one
            raise DlrmkitError(
                f"{args.config}: a blend ('blend: {str(values['blend'])[:60]}'): train trains its members one after "
                "another in one process, each a model of its own tables; plan a member: --config "
                "<checkpoint folder>/<member>/config.yaml"
            )
        if flags["preset"] is None and values.get("preset") not in (None, AUTO, *PRESETS):
            raise DlrmkitError(
                f"{args.config}: option 'preset': unknown preset {str(values['preset'])[:40]!r} "
                f"(choose from: {AUTO}, {', '.join(PRESETS)})"
            )
    by_name = spec_map(TrainConfig)
    for name in TRAIN_FLAGS:
        setattr(args, name, values.get(name, by_name[name].default))
    args.data, args.preset = values.get("data") or None, values.get("preset")
    args.train_values = values


def check_legacy(args: argparse.Namespace) -> None:
    """`--preset` names train's presets here too; table-size presets moved to --tables-preset."""

    if args.preset is not None and args.data is None:
        hint = (
            f"; for the table sizes of '{args.preset}' use --tables-preset {args.preset}"
            if args.preset in PRESET_TABLES
            else ""
        )
        raise DlrmkitError(f"--preset names train's model and recipe preset and needs --data{hint}")
    if args.preset is not None and args.preset not in (AUTO, *PRESETS):
        hint = f" (table sizes: --tables-preset {args.preset})" if args.preset in PRESET_TABLES else ""
        raise DlrmkitError(f"unknown --preset '{args.preset}' (choose from: {AUTO}, {', '.join(PRESETS)}){hint}")
    if not (args.data or args.tables_preset or args.tables):
        raise DlrmkitError("give --data, --tables-preset or --tables")
    if args.data is None:
        for name in ("embedding_dim", "wide", "min_id_count", "numerical_buckets"):
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise DlrmkitError(f"{flag} applies with --data (--tables gives ROWSxDIM, --tables-preset its own)")


def resolved_from_data(args: argparse.Namespace) -> tuple[list[int], int, object]:
    """(table sizes, dim, resolved TrainConfig) exactly as `train --data` resolves them: the same
    options (the --config file's too, args.train_values), the same preset (`auto`: the recipe
    chosen from the dataset, dlrmkit.train.recipe), then resolve_run."""
    from dlrmkit.config import TrainConfig, resolve_run
    from dlrmkit.data.model_tables import model_tables
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.options import spec_map
    from dlrmkit.train import recipe

    spec, train, _ = open_dataset(args.data)
    chosen = {
        **dict.fromkeys(spec_map(TrainConfig)),
        **args.train_values,
        "data": args.data,
        "preset": args.preset or AUTO,
    }
    if chosen["preset"] == AUTO:
        recipe.apply(chosen, recipe.choose(spec, train))
    cfg = TrainConfig.of(**{k: v for k, v in chosen.items() if v is not None})
    # the tables train builds: kept ids (--min-id-count), bucket tables (--numerical-buckets)
    tables = model_tables(args.data, train, cfg.model.min_id_count, cfg.model.numerical_buckets)
    args.bucket_tables = len(tables.buckets or [])
    cfg, model = resolve_run(cfg, tables.sizes, train.num_numerical)
    args.cross = (model.dcn_layers, model.dcn_rank) if model.interaction == "dcn" else None
    return model.table_sizes, model.table_dim, cfg


def multi_hot_shape(args: argparse.Namespace) -> tuple[list[int] | None, tuple[int, int | None] | None]:
    """(ids per sample of each table, the cross network's (layers, rank)) of a multi-hot table
    preset, or of a --data dataset and its resolved model; (None, None) for one-hot dot models."""
    if args.tables_preset in MULTI_HOT_TABLES:
        _, _, bags, cross = MULTI_HOT_TABLES[args.tables_preset]
        return bags, cross
    if args.data:
        from dlrmkit.data.feature_spec import FeatureSpec

        bags = list(FeatureSpec.from_yaml(args.data).hotness) + [1] * getattr(args, "bucket_tables", 0)
        return (bags if any(k != 1 for k in bags) else None), getattr(args, "cross", None)
    return None, None


def table_shapes(args: argparse.Namespace) -> tuple[list[int], int]:
    if args.tables_preset in MULTI_HOT_TABLES:
        rows, dim, _, _ = MULTI_HOT_TABLES[args.tables_preset]
        return list(rows), dim
    if args.tables_preset:
        return PRESET_TABLES[args.tables_preset]
    rows, dims = [], set()
    items = args.tables.split(",")
    if len(items) > 100_000:
        raise DlrmkitError(f"--tables: {len(items):,} tables; at most 100,000")
    for i, item in enumerate(items):
        try:
            r, d = item.strip().lower().split("x")
            r_val, d_val = int(r), int(d)
        except ValueError:
            raise DlrmkitError(f"--tables: item {i + 1} '{item}' is not ROWSxDIM") from None
        if not (1 <= r_val <= 1 << 48 and 1 <= d_val <= ct.MAX_DIM):
            raise DlrmkitError(
                f"--tables: item {i + 1} '{item}': rows must be in [1, 2^48] and dim in [1, {ct.MAX_DIM}]"
            )
        rows.append(r_val)
        dims.add(d_val)
    if len(dims) != 1:
        raise DlrmkitError(f"--tables: all tables need one dim (the dot interaction), got {sorted(dims)}")
    return rows, dims.pop()


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import text_to_stderr

    with text_to_stderr(args.json):  # `--json -`: standard output is the JSON, the plan in words goes to stderr
        return plan_run(args)


def plan_run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import check_not_inside, check_output_file
    from dlrmkit.config import TrainConfig, table_state_per_row, table_state_per_weight
    from dlrmkit.optim.names import resolve_embedding_optimizer
    from dlrmkit.parallel.plan import host_replica_budget, make_plan

    from dlrmkit.perf.simulate_options import check_simulate_options

    check_simulate_options(args)
    train_options(args)  # --config's and the flags'
    check_not_inside(args.json, "--json", {"--data": args.data, "--config": args.config, "--hardware": args.hardware})
    check_output_file(args.json, "--json")
    check_legacy(args)
    if args.data:
        rows, dim, cfg = resolved_from_data(args)
        args.batch_size = cfg.schedule.batch_size
    else:
        rows, dim = table_shapes(args)
        args.batch_size = args.batch_size or LEGACY_BATCH
        default = "adagrad" if args.tables_preset in MULTI_HOT_TABLES else "sgd"  # MLPerf DCNv2's tables: Adagrad
        cfg = TrainConfig.of(
            data="",
            optimizer=args.optimizer or default,
            embedding_optimizer=args.embedding_optimizer,
            embedding_dim=dim,
        )
    state = table_state_per_weight(cfg)
    bags, cross = multi_hot_shape(args)
    if args.simulate:
        from dlrmkit.perf.simulate_options import run_simulate

        return run_simulate(args, rows, dim, bags, cross)
    if args.world_size is None:
        raise DlrmkitError("--world-size is required (or give --simulate)")
    from dlrmkit.parallel.options import check_batch_per_rank

    check_batch_per_rank(args.batch_size, args.world_size)  # as train refuses it
    memory = args.device_memory
    plan = make_plan(
        rows,
        dim,
        args.world_size,
        args.sharding,
        memory,
        args.batch_size,
        optimizer_state=state,
        row_state=table_state_per_row(cfg),
        min_rows_sharded=args.min_rows_sharded,
        # a CPU job (no --device-memory), its ranks on this host: what train's planner sees there
        replicate_memory=host_replica_budget(args.world_size) if memory is None else None,
        # a table preset's bag sizes: placement balances lookups too (train's planner sees no bags)
        bags=bags if not args.data else None,
    )
    for tp, k in zip(plan.tables, bags or []):  # lookups, id bytes and buffers per id of each bag
        tp.bag = k
    if bags:
        print(f"multi-hot: {sum(bags)} ids per sample (bag sizes {','.join(map(str, bags))})")
    if args.data:
        emb = resolve_embedding_optimizer(cfg.optimizer.optimizer, cfg.optimizer.embedding_optimizer)
        width = f" (table width {dim} with the wide term)" if dim != cfg.model.embedding_dim else ""
        if (cfg.model.min_id_count or 1) > 1:
            width += f", ids seen {cfg.model.min_id_count}+ times kept"
        if getattr(args, "bucket_tables", 0):
            width += f", {args.bucket_tables} bucket tables (--numerical-buckets {cfg.model.numerical_buckets})"
        given = f"--config {args.config} --data {args.data}" if args.config else f"--data {args.data}"
        print(
            f"as `dlrmkit train {given}` resolves it: preset {cfg.preset}, embedding dim "
            f"{cfg.model.embedding_dim}{width}, "
            f"global batch {cfg.schedule.batch_size}, tables' optimizer {emb} ({state_words(state)})"
        )
    print(plan.report())
    if args.json:
        plan.save(args.json)
    return 0


def state_words(state: float) -> str:
    """Optimizer state a table keeps per weight, in words: "no optimizer state", "1 state value per weight",
    "1/16 state value per weight" (row-wise Adagrad: one per row of 16 weights)."""
    if state == 0:
        return "no optimizer state"
    if state >= 1:
        return f"{state:g} state value{'s' if state != 1 else ''} per weight"
    return f"1/{round(1 / state)} state value per weight (one per row)"
