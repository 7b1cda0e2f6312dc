"""torchrun worker for test_parallel_sum.py: sums buffers over ranks with comm.sum_started
(fp32 and a bf16 wire) and with comm.all_reduce_sum, and notes which collectives carried them."""

import sys

import torch
import torch.distributed as dist

import dlrmkit.parallel.comm as comm

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
calls: list[str] = []
for name in ("all_to_all_single", "all_reduce"):
    fn = getattr(dist, name)
    setattr(dist, name, lambda *a, _fn=fn, _name=name, **k: calls.append(_name) or _fn(*a, **k))


def mine(n: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s buffer; every rank can make every other rank's."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + rank))


out = {}
fp32 = mine(1000, 10)
stats = comm.CommStats()
comm.sum_started(fp32, stats=stats)()
out["fp32"], out["fp32_bytes"] = fp32, stats.bytes["allreduce"]
bf16 = mine(1000, 20)
comm.sum_started(bf16, torch.bfloat16)()
out["bf16"] = bf16
a, b = mine(300, 30).view(20, 15), mine(7, 40)
comm.all_reduce_sum([a, b], bucket_bytes=256)  # two buckets
out["buckets"] = [a, b]
out["calls"] = calls
torch.save(out, f"{sys.argv[1]}/rank{rank}.pt")
dist.destroy_process_group()
