"""The performance options of `dlrmkit bench`, kept out of commands/bench.py: thread defaults, optional
kernels (FBGEMM embeddings, torch.compile of the dense part), table placement, and the
extras that run after the timed windows (--reference, --profile, --plot)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from dlrmkit import cli_types as ct
from dlrmkit.device import place_tables
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.resources import usable_cores


@dataclass
class PerfOptions:
    """The extras and kernels of `dlrmkit bench` (its other options: dlrmkit.commands.bench)."""

    reference: bool = option(
        False,
        "also time a plain-PyTorch fp32 loop (per-table nn.EmbeddingBag, sparse SGD, nn.Linear) "
        "on the same batches, one window after each of dlrmkit's, and print dlrmkit's speed-up "
        "over it (median of the window ratios)",
    )
    profile: bool = option(False, "profile a few steps with torch.profiler and print each phase's share of a step")
    profile_steps: int = option(3, "steps profiled with --profile (default {default})", parse=ct.positive_int)
    trace: str | None = option(
        None, "with --profile: write a Chrome trace here (open in ui.perfetto.dev)", parse=ct.path
    )
    plot: str | None = option(
        None, "draw throughput and step-breakdown bars to this PNG (implies --profile)", parse=ct.path
    )
    embedding_backend: str = option(
        "native",
        "native (dlrmkit's fused lookup) or fbgemm (table-batched embedding, fused exact SGD; "
        "needs fbgemm-gpu-cpu; single process only)",
        choices=("native", "fbgemm"),
    )
    compile: bool = option(
        True,
        "torch.compile the interaction (the MLPs stay eager: compiled they measured slower); "
        "the default, as it measured fastest (docs/BENCHMARKS.md); --no-compile times the eager path",
        paired=True,
    )


def add_perf_arguments(p: argparse.ArgumentParser) -> None:
    from dlrmkit.config import TrainConfig

    add_options(p, PerfOptions)
    add_options(
        p,
        TrainConfig,
        {
            "table_placement": {
                "help": "GPU runs: keep tables on the GPU (device), in host memory (host), or let the planner decide (auto); "
                "on the CPU every table is in host memory (device and host: errors)"
            }
        },
    )


def default_threads(requested: int | None) -> int:
    """Intra-op threads: `requested` if given, else usable cores / local ranks (LOCAL_WORLD_SIZE),
    so co-located torchrun ranks do not oversubscribe the machine."""
    if requested is not None and requested < 0:
        raise DlrmkitError(f"--threads must be positive, got {requested}")
    if requested:
        return requested
    cores = usable_cores()
    from dlrmkit.parallel.options import MAX_WORLD_SIZE, env_int

    local = env_int("LOCAL_WORLD_SIZE", 1, MAX_WORLD_SIZE, default=1)  # checked: garbage is one line
    return max(1, cores // max(local, 1))


def prepare_model(
    args: argparse.Namespace, model: torch.nn.Module, parallel: bool, device: torch.device | None = None
) -> None:
    """Applies --table-placement (on a GPU), --embedding-backend and --compile to the model before
    its optimizers are built."""
    device = device if device is not None else torch.device("cpu")
    args._placement = place_tables(
        model, device, getattr(args, "table_placement", "auto"), getattr(args, "optimizer", "sgd") == "adagrad"
    )
    if getattr(args, "embedding_backend", "native") == "fbgemm":
        if device.type != "cpu":
            raise DlrmkitError("--embedding-backend fbgemm: CPU only (the fbgemm-gpu-cpu wheel); use --device cpu")
        if parallel:
            raise DlrmkitError("--embedding-backend fbgemm: single process only (the sharded tables are dlrmkit's)")
        if getattr(args, "optimizer", "sgd") != "sgd" or getattr(args, "precision", "fp32") != "fp32":
            raise DlrmkitError("--embedding-backend fbgemm: fused exact SGD in fp32 only (use --optimizer sgd)")
        from dlrmkit.perf.fbgemm_embedding import use_fbgemm

        use_fbgemm(model, args.lr)
    if getattr(args, "compile", False):
        compile_dense(model)


def compile_dense(model: torch.nn.Module) -> None:
    """torch.compile the interaction (bmm, triangle gather, concat fused). The MLPs stay eager:
    compiled, mlperf-shape fp32 ran slower (docs/BENCHMARKS.md, optional kernels), as
    Inductor's Linear+ReLU graphs on CPU lose to oneDNN's addmm. The tables stay eager too."""
    model.interaction.compile(dynamic=False)


def collect_profile(args: argparse.Namespace, model, optimizers, step, batches, par, result: dict) -> None:
    """--profile/--plot: profile a few more steps on every rank (before torchrun's shutdown);
    the shares go into `result`, the trace is written by rank 0."""
    if not (getattr(args, "profile", False) or getattr(args, "plot", None)):
        return
    from dlrmkit.perf.profile import instrument, profile_steps

    rank0 = par is None or par.ctx.rank == 0
    instrument(model, optimizers, par)
    it = iter(range(1 << 30))
    shares, step_s = profile_steps(
        step, lambda: batches[next(it) % len(batches)], args.profile_steps, trace=args.trace if rank0 else None
    )
    result.update(profile_shares=shares, profile_step_s=step_s)


def perf_extras(args: argparse.Namespace, result: dict) -> None:
    """The profile's printout and --plot, after bench's own figures are printed (rank 0 only under
    torchrun); adds the run's options to `result`. (--reference is timed beside bench's windows.)"""
    result["embedding_backend"] = getattr(args, "embedding_backend", "native")
    result["compile"] = bool(getattr(args, "compile", False))
    if getattr(args, "_placement", None):
        result["table_placement"] = args._placement[0]
    if "profile_shares" in result:
        from dlrmkit.perf.profile import format_breakdown

        print(format_breakdown(result["profile_shares"], result["profile_step_s"]))
        if args.trace:
            print(f"Chrome trace: {args.trace} (open in ui.perfetto.dev or chrome://tracing)")
    if getattr(args, "plot", None):
        from dlrmkit.perf.plots import plot_bench

        plot_bench(result, args.plot)
        print(f"plot: {args.plot}")
