"""torchrun worker for test_parallel_sum.py: sums buffers over ranks with comm.sum_started
(fp32 and a bf16 wire, a routed tail) and with comm.all_reduce_sum, then GradBuckets with a
rider that can ride and one that cannot; notes which collectives carried them."""

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
if world == 2:  # a tail rides to the peer unsummed: rank r sends 3 + 2r elements
    tails = [torch.arange(3.0) + 100, torch.arange(5.0) + 200]
    routed = torch.cat([mine(50, 50), tails[rank]])
    out["routed"] = (routed, comm.sum_started(routed, tail=(len(tails[rank]), len(tails[1 - rank])))())
if world == 2:  # GradBuckets' riders: pooled gradients (blocks of 2 + r elements to rank r) go with the sum
    from dlrmkit.parallel.grad_buckets import GradBuckets

    for name, dtype in (("rides", torch.float32), ("alone", torch.bfloat16)):  # bf16 cannot ride fp32
        w = torch.nn.Parameter(torch.zeros(4))
        w.grad = mine(4, 60)
        buckets = GradBuckets([w], 1 << 20, None, comm.CommStats())
        data = (torch.arange(5.0) + 10 * rank).to(dtype)  # [to rank 0: 2 | to rank 1: 3]
        back = torch.empty(2 * (2 + rank), dtype=dtype)  # [from rank 0 | from rank 1]
        recv = [2 + rank, 2 + rank]
        buckets.riders.append(comm.PooledRider(comm.Carried(data, [2, 3], recv, "pooled_bwd"), back, None))
        before = len(calls)
        buckets.finish()
        out[name] = (w.grad.clone(), back, calls[before:])
out["calls"] = calls
torch.save(out, f"{sys.argv[1]}/rank{rank}.pt")
dist.destroy_process_group()
