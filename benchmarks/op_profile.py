"""Op-level profile of one `dlrmkit bench` configuration: the ops that take a step's time (self
CPU, summed over 4 profiled steps), after a plain timing of 10 steps. What the profile notes in
docs/BENCHMARKS.md quote as "profile before/after".

    THP_MEM_ALLOC_ENABLE=1 python benchmarks/op_profile.py mlperf-shape bf16 split-sgd [--no-compile]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dlrmkit.allocator import keep_freed_memory
from dlrmkit.commands.bench import BENCH_MODELS, random_batches
from dlrmkit.train.step import training_step
from dlrmkit.model.dlrm import DLRM
from dlrmkit.optim.build import build_optimizers
from dlrmkit.perf.bench_perf import prepare_model


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model", choices=list(BENCH_MODELS))
    p.add_argument("precision", choices=["fp32", "bf16"])
    p.add_argument("optimizer", choices=["sgd", "split-sgd", "adagrad", "lamb"])
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=25, help="ops to list (default 25)")
    a = p.parse_args()
    keep_freed_memory()  # as the CLI does
    torch.set_num_threads(a.threads)
    cfg = BENCH_MODELS[a.model]
    model = DLRM(cfg)
    model.reset_parameters(0)
    prepare_model(
        argparse.Namespace(
            compile=a.compile, embedding_backend="native", optimizer=a.optimizer, precision=a.precision, lr=0.01
        ),
        model,
        False,
    )
    step = training_step(model, build_optimizers(model, a.optimizer, 0.01, precision=a.precision), a.precision)
    batches = random_batches(cfg, 2048, 4, 0)
    for i in range(6):
        step(batches[i % 4])
    t0 = time.perf_counter()
    for i in range(10):
        step(batches[i % 4])
    print(f"{a.model} {a.precision} {a.optimizer}: step {(time.perf_counter() - t0) / 10 * 1e3:.1f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(4):
            step(batches[i % 4])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
