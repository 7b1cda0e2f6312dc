"""Where the time of `dlrmkit bench --device cuda`'s step goes: the same step (tables on the GPU,
MLPs in CUDA graphs), timed, then profiled: the kernels that take the GPU's time, summed over a few
steps, beside the step's wall time. `--table-grads` compares the tables' gradient paths side by
side: `bag` (what SparseSGD does on a GPU: the pooled gradient kept by bag, added to the rows by
one atomic index_add_) and `coo` (a sparse COO gradient sorted by row, added by torch's
dense += sparse, which on a GPU runs the same index_add_ kernel).

    python benchmarks/gpu_profile.py --batch-size 65536 --precision bf16 --table-grads bag,coo
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from dlrmkit import device as dev
from dlrmkit.commands.bench import timed_windows
from dlrmkit.model.dlrm import DLRM
from dlrmkit.model.embedding import FusedTable
from dlrmkit.optim.build import build_optimizers
from dlrmkit.perf import gpu_step as gpu
from dlrmkit.perf.bench_perf import prepare_model
from dlrmkit.perf.workload import BENCH_MODELS, random_batches


def run(a: argparse.Namespace, table_grads: str, device: torch.device) -> None:
    cfg = BENCH_MODELS[a.model]
    model = DLRM(cfg)
    model.reset_parameters(0)
    options = argparse.Namespace(
        compile=a.compile, embedding_backend="native", optimizer="sgd", precision=a.precision, lr=0.01
    )
    prepare_model(options, model, False, device)
    optimizers = build_optimizers(model, "sgd", 0.01, precision=a.precision)
    if table_grads == "coo":  # the tables' gradients as sparse COO tensors, not kept by bag
        for table in model.embeddings.modules():
            if isinstance(table, FusedTable):
                table.deferred = False
    batches = dev.pin_batches(random_batches(cfg, a.batch_size, 4, 0), device)
    step = gpu.gpu_training_step(model, optimizers, a.precision, device, device, batches)
    sync = dev.synchronizer(device)
    timed_windows(step, batches, 3, 1, 0)
    if device.type == "cuda" and a.graphs:
        gpu.graph_mlps(model, batches[0], a.precision, device, device)
    rates = timed_windows(step, batches, 3, a.steps, 3, sync=sync)
    rate = statistics.median(rates)
    print(
        f"{a.model} batch {a.batch_size} {a.precision} sgd, table gradients {table_grads}: "
        f"{rate:,.0f} samples/s, {a.batch_size / rate * 1e3:.2f} ms/step (median of 3 windows x {a.steps} steps)"
    )
    if not a.profile_steps:
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(a.profile_steps):
            step(batches[i % len(batches)])
        if sync:
            sync()
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(
        f"  times summed over {a.profile_steps} profiled steps (their total on the last line); a step's wall time above"
    )
    print(events.table(sort_by=key, row_limit=a.rows, max_name_column_width=70))


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=list(BENCH_MODELS), default="mlperf-shape")
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--table-grads", default="bag,coo", help="comma-separated: bag, coo (default both, in turn)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed window (default 10)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps profiled after the timing (0: none)")
    p.add_argument("--rows", type=int, default=18, help="kernels to list (default 18)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu, to try the script without a GPU")
    a = p.parse_args()
    device = torch.device(a.device)
    for table_grads in a.table_grads.split(","):
        if table_grads not in ("bag", "coo"):
            p.error(f"--table-grads: {table_grads!r} is not bag or coo")
        run(a, table_grads, device)


if __name__ == "__main__":
    main()
