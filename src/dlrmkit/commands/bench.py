"""Measure training throughput on random in-memory data (ids uniform over each table, bag
lengths uniform in 1..10) and compare it with this machine's compute bound: the time the
model's own GEMMs take at this batch size, measured in the same run."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.model.dlrm import DLRM, ModelConfig, flops_per_sample
from dlrmkit.precision import compute_dtype
from dlrmkit.optim.build import build_optimizers
from dlrmkit.perf.workload import BENCH_MODELS, RandomBatch, random_batches
from dlrmkit.train.step import training_step


def gemm_shapes(cfg: ModelConfig, batch_size: int) -> list[tuple[int, int, int, int]]:
    """(batch count, m, k, n) of every matrix multiply in one training step: forward, grad-input
    and grad-weight of each Linear, and the interaction's batched products."""
    shapes = []
    model = DLRM(cfg)
    for layer in list(model.bottom_mlp) + list(model.top_mlp):
        if isinstance(layer, torch.nn.Linear):
            out_f, in_f = layer.weight.shape
            shapes += [(1, batch_size, in_f, out_f), (1, batch_size, out_f, in_f), (1, out_f, batch_size, in_f)]
    if cfg.interaction == "dot":
        t, d = len(cfg.table_sizes) + 1, cfg.embedding_dim
        shapes += [(batch_size, t, d, t), (batch_size, t, t, d)]  # F F^T, and PairDots' one-bmm backward
    return shapes


def measure_compute_bound(
    cfg: ModelConfig, batch_size: int, dtype: torch.dtype, repeats: int = 5, device: torch.device | str = "cpu"
) -> float:
    """Seconds the model's GEMMs take for one step on `device` (median of `repeats`)."""
    mats = [
        (
            torch.randn(b, m, k, dtype=dtype, device=device).squeeze(0),
            torch.randn(b, k, n, dtype=dtype, device=device).squeeze(0),
        )
        for b, m, k, n in gemm_shapes(cfg, batch_size)
    ]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        for a, b in mats:
            torch.matmul(a, b)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def timed_windows(
    step, batches: list[RandomBatch], warmup: int, steps: int, windows: int, after_window=None, sync=None
) -> list[float]:
    """Samples/s of each window of `steps` steps, after `warmup` steps; `after_window()` runs
    after each window, untimed (bench measures the compute bound there, side by side). `sync()`,
    if given, runs before each clock read (a GPU's queued work must finish inside the window)."""
    sync = sync or (lambda: None)
    i = 0
    for _ in range(warmup):
        step(batches[i % len(batches)])
        i += 1
    rates = []
    for _ in range(windows):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(batches[i % len(batches)])
            i += 1
        sync()
        rates.append(steps * len(batches[0].labels) / (time.perf_counter() - t0))
        if after_window is not None:
            after_window()
    return rates


def fp32_sgd_step(cfg: ModelConfig, args: argparse.Namespace):
    """A step of the fp32 model with plain SGD (--compare-fp32), compiled or eager as the run
    itself (--compile), so the ratio compares precision alone."""
    from dlrmkit.perf.bench_perf import compile_dense

    model = DLRM(cfg)
    model.reset_parameters(args.seed)
    if getattr(args, "compile", False):
        compile_dense(model)
    return training_step(model, build_optimizers(model, "sgd", args.lr))


BASELINE_NAMES = {"fp32": "fp32 sgd", "reference": "plain-PyTorch reference (fp32, per-table EmbeddingBag, sparse SGD)"}


def baseline_steps(cfg: ModelConfig, args: argparse.Namespace, batches: list[RandomBatch]) -> dict:
    """The steps that --compare-fp32 and --reference time beside dlrmkit's, warmed up. One window
    of each runs after every window of dlrmkit's (once the GEMM bounds are timed), so each ratio
    compares windows seconds apart: this VM drifts by 10-20% over minutes, and timing them after all of dlrmkit's windows
    let that drift into the ratio."""
    steps = {}
    if args.compare_fp32:
        steps["fp32"] = fp32_sgd_step(cfg, args)
    if getattr(args, "reference", False):
        from dlrmkit.perf.reference import reference_step_fn

        steps["reference"] = reference_step_fn(cfg, args.lr, args.seed)[0]
    for step in steps.values():
        timed_windows(step, batches, args.warmup, 1, 1)
    return steps


@dataclass
class BenchOptions:
    """bench's own options; those it shares with train come from TrainConfig's fields."""

    model: str = option("small", "model shape (default {default})", choices=lambda: tuple(BENCH_MODELS))
    steps: int = option(10, "steps per timed window (default {default})", parse=ct.positive_int)
    windows: int = option(5, "timed windows; the median is reported (default {default})", parse=ct.positive_int)
    warmup: int = option(5, "untimed warm-up steps (default {default})", parse=ct.nonneg_int)
    json: str | None = option(None, "write the figures as one JSON object to this file", parse=ct.path)
    compare_fp32: bool = option(
        False,
        "also time the fp32 SGD model, one window after each of this run's, and print the "
        "speed-up over it (median of the window ratios); at bf16 also how much faster the "
        "model's GEMMs run than in fp32",
    )
    cuda_graphs: bool = option(
        True,
        "with --device cuda: capture the bottom and top MLPs in CUDA graphs after warm-up (default on; "
        "--no-cuda-graphs on the CPU: an error)",
        paired=True,
    )
    overlap: bool = option(
        True,
        "under torchrun: overlap communication with compute as training does (the default: ids a "
        "batch ahead, pooled all-to-alls during the bottom MLP and backward, bucketed all-reduce "
        "during backward); --no-overlap makes every collective block",
        paired=True,
    )
    breakdown: bool = option(
        False,
        "under torchrun: also print bytes/step vs the analytic minimum and a step breakdown "
        "(lookup, all-to-all, dense, all-reduce, optimizer), blocking and overlapped",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """bench's own options (BenchOptions), then those it shares with train (validators, choices
    from TrainConfig's fields, with bench's own defaults and help), then the perf extras."""
    from dlrmkit.config import TrainConfig

    add_options(p, BenchOptions)
    add_options(
        p,
        TrainConfig,
        {
            "batch_size": {"default": 2048, "help": "batch size (default {default})"},
            "lr": {"default": 0.01, "help": "SGD learning rate (default {default})"},
            "threads": {"help": "intra-op threads (default: cores / LOCAL_WORLD_SIZE)"},
            "seed": {"help": "seed of the random data and weights (default {default})"},
            "precision": {"choices": ("fp32", "bf16"), "help": "autocast precision (default {default})"},
            "optimizer": {
                "default": "sgd",
                "help": "dense optimizer; split-sgd (needs --precision bf16) also updates the tables (default {default})",
            },
            "device": {
                "help": "where a single-process run trains: cpu (default, so the documented figures mean the same "
                "everywhere), cuda (MLPs on the GPU, tables there or in host memory per --table-placement, "
                "CUDA graphs), or auto: the GPU if there is one and no CPU-only option is given "
                "(torchrun, --compare-fp32, --reference, --embedding-backend fbgemm, --profile)"
            },
            "sharding": {"help": "under torchrun: table sharding (global samples/s reported)"},
            "backend": {
                "help": "under torchrun: process-group backend (default gloo: bench runs its sharded step on the CPU)"
            },
            "bind_cores": {},
        },
    )
    from dlrmkit.perf.bench_perf import add_perf_arguments  # --reference, --profile, --plot, kernels

    add_perf_arguments(p)


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import text_to_stderr

    with text_to_stderr(args.json):  # `--json -`: standard output is the JSON, the figures in words go to stderr
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import check_distinct, check_output_file
    from dlrmkit.parallel.options import refuse_outside_torchrun, torchrun_env

    torchrun_env()  # a garbage RANK or WORLD_SIZE: one line before any work
    refuse_outside_torchrun(
        (
            (f"--sharding {args.sharding}", args.sharding != "auto"),
            (f"--backend {args.backend}", args.backend is not None),
            ("--no-bind-cores", not args.bind_cores),
            ("--no-overlap", not args.overlap),
            ("--breakdown", args.breakdown),
        )
    )
    if getattr(args, "trace", None) and not args.profile:
        raise DlrmkitError("--trace writes the trace of --profile: add --profile")
    check_distinct(
        {"--json": args.json, "--trace": getattr(args, "trace", None), "--plot": getattr(args, "plot", None)}
    )

    for flag, path in (
        ("--json", args.json),
        ("--trace", getattr(args, "trace", None)),
        ("--plot", getattr(args, "plot", None)),
    ):
        check_output_file(path, flag)  # before the timed windows, not after
    from dlrmkit.parallel.dist import launched_by_torchrun
    from dlrmkit import device as dev
    from dlrmkit.perf import gpu_step as gpu
    from dlrmkit.perf.bench_perf import collect_profile, default_threads, perf_extras, prepare_model

    torch.set_num_threads(default_threads(args.threads))
    parallel = launched_by_torchrun()
    wants_baselines = bool(args.compare_fp32 or getattr(args, "reference", False))
    profiling = bool(getattr(args, "profile", False) or getattr(args, "plot", None))
    cpu_only = parallel or wants_baselines or profiling or getattr(args, "embedding_backend", "native") == "fbgemm"
    device = torch.device("cpu") if cpu_only and args.device == "auto" else dev.resolve_device(args.device)
    gpu.check_device_options(device, parallel, wants_baselines, profiling)
    if device.type != "cuda" and not args.cuda_graphs:  # it would change nothing
        raise DlrmkitError("--no-cuda-graphs needs --device cuda (on the CPU no step is captured in CUDA graphs)")
    cfg = BENCH_MODELS[args.model]
    model = DLRM(cfg)
    model.reset_parameters(args.seed)
    prepare_model(args, model, parallel=parallel, device=device)
    from dlrmkit.perf.bench_parallel import parallel_setup  # torchrun: shard the model

    par = parallel_setup(
        model, args.batch_size, args.sharding, args.backend, args.overlap, args.seed, bind=args.bind_cores
    )
    optimizers = build_optimizers(model, args.optimizer, args.lr, precision=args.precision)

    batches = (
        par.batches(cfg, args.batch_size, 4, args.seed) if par else random_batches(cfg, args.batch_size, 4, args.seed)
    )
    batches = dev.pin_batches(batches, device)
    ids_device = device if args._placement[0] == "device" else torch.device("cpu")
    local_step = (
        gpu.gpu_training_step(model, optimizers, args.precision, device, ids_device, batches)
        if device.type == "cuda"
        else training_step(model, optimizers, args.precision)
    )

    def step(batch: RandomBatch) -> None:
        return par.step(batch, optimizers) if par is not None else local_step(batch)

    if device.type == "cuda" and args.cuda_graphs:  # capture after warm-up, as NVIDIA's DLRM does
        timed_windows(step, batches, args.warmup, 1, 0)
        gpu.graph_mlps(model, batches[0], args.precision, device, ids_device)
    # each rank times its own GEMMs at its local batch (all ranks at once, as they train), so the
    # bound is the global samples/s of N ranks computing only their MLPs; measured after every
    # window, so each window's rate is compared with a bound taken under the same machine state
    local_batch = len(batches[0].labels)
    gemm_times: list[float] = []
    if par is not None and wants_baselines:
        print("--compare-fp32/--reference: skipped under torchrun (the baselines are single-process)")
    baselines = baseline_steps(cfg, args, batches) if par is None else {}
    base_rates: dict[str, list[float]] = {name: [] for name in baselines}
    # with --compare-fp32 at a lower precision, the fp32 GEMMs too (after the run's own, before the
    # baselines' windows): how much faster this CPU runs the model's GEMMs (MLPs and interaction) at
    # that precision, what the GEMM part of a step can gain over fp32 (the bf16/fp32 GEMM ratio)
    fp32_gemm_times: list[float] = []
    time_fp32_gemms = "fp32" in baselines and compute_dtype(args.precision) != torch.float32

    def after_window() -> None:
        gemm_times.append(measure_compute_bound(cfg, local_batch, compute_dtype(args.precision), 3, device))
        if time_fp32_gemms:
            fp32_gemm_times.append(measure_compute_bound(cfg, local_batch, torch.float32, 3))
        for name, base_step in baselines.items():
            base_rates[name].extend(timed_windows(base_step, batches, 0, args.steps, 1))

    rates = timed_windows(step, batches, args.warmup, args.steps, args.windows, after_window, dev.synchronizer(device))
    if par is not None:  # global samples/s: every rank steps its slice of the global batch together
        rates = [r * args.batch_size / len(batches[0].labels) for r in rates]
    rate = statistics.median(rates)
    world = par.ctx.world_size if par else 1
    gemm_s = statistics.median(gemm_times)
    flops = flops_per_sample(cfg)
    bound = world * local_batch / gemm_s
    # the fraction is the median over windows of (window rate / the bound measured right after it)
    fraction = statistics.median(r * g / (world * local_batch) for r, g in zip(rates, gemm_times))
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "precision": args.precision,
        "optimizer": args.optimizer,
        "threads": torch.get_num_threads(),
        "samples_per_s": rate,
        "window_samples_per_s": rates,
        "flops_per_sample": flops,
        "gemm_gflops": flops * local_batch / gemm_s / 1e9,  # per rank
        "compute_bound_samples_per_s": bound,
        "compute_bound_fraction": fraction,
        "window_compute_bounds": [world * local_batch / g for g in gemm_times],
        "world_size": par.ctx.world_size if par else 1,
        "device": dev.device_name(device),
        "sharding": args.sharding if par else "none",
    }
    collect_profile(args, model, optimizers, step, batches, par, result)  # all ranks, before shutdown
    if par is not None and args.breakdown:  # dlrmkit.perf.bench_parallel: bytes/step, step breakdown
        par.report(step, batches, args, result)
    if par is not None:
        from dlrmkit.parallel.dist import shutdown

        par.close()
        shutdown()
        if par.ctx.rank != 0:
            return 0
        print(f"{par.ctx.world_size} ranks, sharding {args.sharding}, same data as one process: global samples/s below")
    print(
        f"{args.model} batch {args.batch_size} {args.precision} {args.optimizer}, "
        f"{result['device'] if device.type == 'cuda' else str(result['threads']) + ' threads'}: "
        f"{rate:,.0f} samples/s "
        f"(median of {args.windows} windows x {args.steps} steps)\n"
        f"model {flops / 1e6:.2f} MFLOP/sample; GEMMs at its shapes run at {result['gemm_gflops']:.1f} GFLOP/s"
        f"{' per rank' if world > 1 else ''} "
        f"-> compute bound {bound:,.0f} samples/s; reached {100 * fraction:.1f}% "
        f"(median over windows of the rate / the bound timed right after that window)"
    )
    if fp32_gemm_times:
        gemm_ratio = statistics.median(f / g for f, g in zip(fp32_gemm_times, gemm_times))
        result["gemm_speedup_vs_fp32"] = gemm_ratio
        print(
            f"{args.precision} GEMMs at the model's shapes run {gemm_ratio:.2f}x as fast as fp32 GEMMs here "
            f"(median of the window ratios): what the GEMM part of a step can gain over fp32"
        )
    for name, base in base_rates.items():  # the ratio: median over windows of (rate / the baseline's next window)
        speedup = statistics.median(r / b for r, b in zip(rates, base))
        result.update(
            {
                f"{name}_samples_per_s": statistics.median(base),
                f"speedup_vs_{name}": speedup,
                f"window_{name}_samples_per_s": base,
            }
        )
        print(
            f"{BASELINE_NAMES[name]}, a window after each of dlrmkit's: {statistics.median(base):,.0f} samples/s; "
            f"dlrmkit {args.precision} {args.optimizer} is {speedup:.2f}x (median of the window ratios)"
        )
    perf_extras(args, result)
    if args.json:
        from dlrmkit.atomic_io import write_json

        write_json(args.json, result)
    return 0
