"""The `--simulate` options of `dlrmkit plan` (see dlrmkit.perf.simulate for the model)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dlrmkit.cli_types import small_file
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.perf.simulate import PROFILES


@dataclass
class SimulateOptions:
    simulate: bool = option(
        False, "estimate step time, samples/s and communication share for 8..1024 ranks (or --world-size)"
    )
    hardware: str | None = option(
        None,
        f"hardware profile: {', '.join(PROFILES)}, 'measured' (this machine) or a JSON file (default a100-80gb)",
        parse=small_file,
    )
    precision: str | None = option(None, "with --simulate: fp32/TF32 or AMP (default fp32)", choices=("fp32", "amp"))
    weak: bool = option(False, "with --simulate: --batch-size is per rank (weak scaling)")
    anchors: bool = option(False, "with --simulate: compare with NVIDIA's published DLRM figures")


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, SimulateOptions)


def check_simulate_options(args: argparse.Namespace) -> None:
    """--hardware, --precision, --weak and --anchors shape a simulation: without --simulate they
    would be ignored, so they are an error."""
    if args.simulate:
        return
    given = {"--hardware": args.hardware, "--precision": args.precision, "--weak": args.weak, "--anchors": args.anchors}
    named = [flag for flag, value in given.items() if value not in (None, False)]
    if named:
        raise DlrmkitError(f"{named[0]} applies with --simulate: add --simulate, or leave {named[0]} out")


def run_simulate(
    args: argparse.Namespace,
    rows: list[int],
    dim: int,
    bags: list[int] | None = None,
    cross: tuple[int, int | None] | None = None,
) -> int:
    from dlrmkit.perf.simulate import anchor_errors, format_table, load_profile, simulate_scaling

    args.hardware = args.hardware or "a100-80gb"
    args.precision = args.precision or "fp32"
    hw = load_profile(args.hardware)
    sizes = [args.world_size] if args.world_size else [8, 16, 32, 64, 128, 256, 512, 1024]
    if any(n < 1 for n in sizes):
        raise DlrmkitError("--world-size must be at least 1")
    results = simulate_scaling(
        rows, dim, hw, sizes, args.batch_size, args.precision, args.sharding, args.weak, bags, cross
    )
    kind = "per-rank" if args.weak else "global"
    print(
        f"simulated on {hw.name} ({args.precision}), {kind} batch {args.batch_size}, sharding {args.sharding}; "
        f"no compute/communication overlap assumed"
        + (f"; multi-hot, {sum(bags)} ids per sample" if bags else "")
        + (f"; DCNv2 interaction, {cross[0]} layers of rank {cross[1] or 'full'}" if cross else "")
    )
    print(format_table(results))
    out = {"hardware": vars(hw) if hasattr(hw, "__dict__") else hw, "runs": results}
    if args.anchors:
        errs = anchor_errors(rows, dim)
        for a in errs:
            print(
                f"anchor {a['label']}: published {a['samples_per_s'] / 1e6:.2f}M samples/s, "
                f"simulated {a['estimate'] / 1e6:.2f}M ({100 * a['error']:+.0f}%)"
            )
        out["anchors"] = errs
    if args.json:
        from dlrmkit.atomic_io import write_json

        write_json(args.json, out, indent=1)
    return 0
