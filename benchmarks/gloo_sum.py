"""Summing a buffer over 2 ranks on one host, the two Transports that training may choose
(parallel/transport.py): torch's gloo all-reduce (`TorchCollectives`) against the shared-memory
sum (`SharedMemorySum`, parallel/shared_memory.py), and a plain gloo all-to-all of the same
buffer for scale, per size. Each rank is bound to its own core, as train and bench bind them;
rounds of every case alternate, so the VM's drift hits all alike.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 benchmarks/gloo_sum.py

Prints, per size and case, the median wall time and CPU time (all threads of rank 0, gloo's
included) per call.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist

from dlrmkit.parallel.dist import bind_cores
from dlrmkit.parallel.shared_memory import SharedMemorySum
from dlrmkit.parallel.transport import TorchCollectives


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes-kb", default="4,32,128,512,1024,2048", help="buffer sizes in KiB, comma-separated")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--calls", type=int, default=50, help="calls per case and round")
    p.add_argument("--bind", action=argparse.BooleanOptionalAction, default=True, help="one core per rank")
    a = p.parse_args()
    dist.init_process_group("gloo")
    if dist.get_world_size() != 2:
        raise SystemExit("run under torchrun --nproc_per_node=2")
    torch.set_num_threads(1)
    if a.bind:
        bind_cores(dist.get_rank(), 2)
    cases = {}
    sizes = list(map(int, a.sizes_kb.split(",")))
    gloo = TorchCollectives()
    shared = SharedMemorySum.create(gloo, max(sizes) << 10)
    if shared is None:
        raise SystemExit("no shared memory between the ranks")
    for kb in sizes:
        x = torch.randn(kb << 8)
        out = torch.empty_like(x)
        cases[kb] = {
            "all_reduce": lambda x=x: gloo.all_reduce(x).wait(),
            "shared": lambda x=x: shared.all_reduce(x).wait(),
            "all_to_all": lambda x=x, out=out: dist.all_to_all_single(out, x),
        }
    times: dict = {}
    for _ in range(a.rounds):
        for kb, fns in cases.items():
            for name, fn in fns.items():
                dist.barrier()
                c0, t0 = cpu_seconds(), time.perf_counter()
                for _ in range(a.calls):
                    fn()
                wall, cpu = (time.perf_counter() - t0) / a.calls, (cpu_seconds() - c0) / a.calls
                times.setdefault((kb, name), []).append((wall, cpu))
    if dist.get_rank() == 0:
        print(
            f"{'KiB':>6} {'case':<11} {'wall ms':>8} {'cpu ms':>7}   (medians of {a.rounds} rounds x {a.calls} calls)"
        )
        for (kb, name), v in times.items():
            wall = statistics.median(w for w, _ in v) * 1e3
            cpu = statistics.median(c for _, c in v) * 1e3
            print(f"{kb:>6} {name:<11} {wall:8.3f} {cpu:7.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
