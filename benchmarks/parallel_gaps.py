"""Where a hybrid-parallel step waits: per rank, the step's wall time, the time covered by
top-level profiler events on the main thread (ops, and the named collective waits
"all_to_all wait (...)" / "allreduce wait (...)"), and the uncovered gaps, each named by the
events around it. What located the waits that docs/BENCHMARKS.md quotes.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 benchmarks/parallel_gaps.py [--sharding table_wise]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from parallel_pingpong import MODELS, sharded_training  # benchmarks/, on sys.path when run as a script


def top_level(events: list[dict]) -> list[dict]:
    """Events of the busiest thread that no other event of that thread encloses, in time order."""
    main = collections.Counter(e["tid"] for e in events).most_common(1)[0][0]
    out, end = [], -1.0
    for e in sorted((e for e in events if e["tid"] == main), key=lambda e: e["ts"]):
        if e["ts"] >= end:
            out.append(e)
        end = max(end, e["ts"] + e["dur"])
    return out


def summary(tops: list[dict], steps: int, rows: int) -> tuple[list[str], float, float]:
    covered, gaps = collections.Counter(), collections.Counter()
    prev_end, prev = tops[0]["ts"], "start"
    for e in tops:
        if e["ts"] > prev_end:
            gaps[f"before {e['name'][:40]} (after {prev[:30]})"] += e["ts"] - prev_end
        covered[e["name"][:60]] += e["dur"]
        prev_end, prev = max(prev_end, e["ts"] + e["dur"]), e["name"]
    lines = [f"  op  {k:60s} {v / steps / 1e3:6.2f} ms" for k, v in covered.most_common(rows)]
    lines += [f"  gap {k:80s} {v / steps / 1e3:6.2f} ms" for k, v in gaps.most_common(rows)]
    return lines, sum(covered.values()) / steps / 1e3, sum(gaps.values()) / steps / 1e3


def collectives(events: list[dict]) -> dict[str, int]:
    """Collective launches (c10d ops, on any thread) by name."""
    return dict(collections.Counter(e["name"] for e in events if e["name"].startswith("c10d::")).most_common())


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="small", choices=list(MODELS))
    p.add_argument("--one-hot", action="store_true", help="one id per (sample, table), as Criteo data")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--sharding", default="table_wise")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rows", type=int, default=10, help="ops and gaps listed per rank")
    a = p.parse_args()
    torch.set_num_threads(1)
    par, step, batches = sharded_training(MODELS[a.model], a.batch_size, a.sharding, seed=0, one_hot=a.one_hot)
    for i in range(10):
        step(batches[i % 4])
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(batches[i % 4])
        wall = (time.perf_counter() - t0) / a.steps * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)["traceEvents"]
    events = [e for e in trace if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    lines, busy, idle = summary(top_level(events), a.steps, a.rows)
    lines.append(
        "  collectives launched per step (all threads): "
        + ", ".join(f"{k} {v / a.steps:g}" for k, v in collectives(events).items())
    )
    text = "\n".join(
        [f"rank {par.ctx.rank}: wall {wall:.2f} ms/step; top-level events {busy:.2f} ms; gaps {idle:.2f} ms"] + lines
    )
    texts = [None] * par.ctx.world_size
    dist.all_gather_object(texts, text)
    if par.ctx.rank == 0:
        print(f"{a.model} batch {a.batch_size} {a.sharding}, {a.steps} profiled steps, per step:")
        print("\n".join(texts))
    par.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
