"""Plan how embedding tables are sharded over ranks: per rank its shards, memory, lookups and
bytes sent per step. Exits 2 with one line naming the table that does not fit."""

from __future__ import annotations

import argparse

from dlrmkit.errors import DlrmkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dlrmkit.parallel.plan import PRESET_TABLES

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=list(PRESET_TABLES), help="table sizes of a known model")
    src.add_argument("--data", help="dataset folder: table sizes from its feature_spec.yaml")
    src.add_argument("--tables", help="comma-separated ROWSxDIM, e.g. 40000000x128,3000x128")
    p.add_argument("--dim", type=int, help="embedding dim with --data (default 128)")
    p.add_argument("--world-size", type=int, help="number of ranks (required unless --simulate)")
    p.add_argument("--device-memory", default=None, help="memory per rank, e.g. 80GiB (default: unlimited)")
    p.add_argument("--batch-size", type=int, default=65536, help="global batch size (default 65536)")
    p.add_argument("--sharding", default="auto", help="auto (default), table_wise, column_wise, row_wise, data_parallel")
    p.add_argument("--optimizer", choices=["sgd", "adagrad"], default="sgd", help="sgd: no state; adagrad: one value per weight")
    p.add_argument("--min-rows-sharded", type=int, default=2048, help="replicate tables with fewer rows (default 2048)")
    p.add_argument("--json", help="save the plan as JSON here (train --plan reads it)")
    from dlrmkit.perf.simulate_cli import add_simulate_arguments  # --simulate, --hardware, ...

    add_simulate_arguments(p)


def table_shapes(args: argparse.Namespace) -> tuple[list[int], int]:
    from dlrmkit.parallel.plan import PRESET_TABLES

    if args.preset:
        return PRESET_TABLES[args.preset]
    if args.data:
        from dlrmkit.data.feature_spec import FeatureSpec

        return list(FeatureSpec.from_yaml(args.data).cardinalities), args.dim or 128
    rows, dims = [], set()
    for i, item in enumerate(args.tables.split(",")):
        try:
            r, d = item.lower().split("x")
            rows.append(int(r))
            dims.add(int(d))
        except ValueError:
            raise DlrmkitError(f"--tables: item {i + 1} '{item}' is not ROWSxDIM") from None
    if len(dims) != 1:
        raise DlrmkitError(f"--tables: all tables need one dim (the dot interaction), got {sorted(dims)}")
    return rows, dims.pop()


def run(args: argparse.Namespace) -> int:
    from dlrmkit.parallel.plan import make_plan, parse_bytes

    rows, dim = table_shapes(args)
    if args.simulate:
        from dlrmkit.perf.simulate_cli import run_simulate

        return run_simulate(args, rows, dim)
    if args.world_size is None:
        raise DlrmkitError("--world-size is required (or give --simulate)")
    memory = parse_bytes(args.device_memory) if args.device_memory else None
    plan = make_plan(rows, dim, args.world_size, args.sharding, memory, args.batch_size,
                     optimizer_state=1 if args.optimizer == "adagrad" else 0, min_rows_sharded=args.min_rows_sharded)
    print(plan.report())
    if args.json:
        plan.save(args.json)
    return 0
