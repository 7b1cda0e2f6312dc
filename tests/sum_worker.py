"""torchrun worker for test_parallel_sum.py: collectives through the Transport seam
(parallel/transport.py) on torch's collectives: sums (float32, a bfloat16 wire), all-gathers,
all-to-alls, and several of them coalesced; notes which torch collectives carried them."""

import sys

import torch
import torch.distributed as dist

from dlrmkit.parallel.transport import AllGather, AllReduce, AllToAll, Bf16Wire, TorchCollectives

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
calls: list[str] = []
for name in ("all_to_all_single", "all_reduce", "all_gather_into_tensor"):
    fn = getattr(dist, name)
    setattr(dist, name, lambda *a, _fn=fn, _name=name, **k: calls.append(_name) or _fn(*a, **k))


def mine(n: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s buffer; every rank can make every other rank's."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + rank))


torch_ops = TorchCollectives()
out = {}
out["fp32"] = torch_ops.all_reduce(mine(1000, 10)).wait()
out["fp32_bytes"] = torch_ops.stats.bytes["allreduce"]
out["bf16"] = Bf16Wire(torch_ops).all_reduce(mine(1000, 20)).wait()
before = len(calls)
a, b, loss = mine(300, 30).view(20, 15), mine(7, 40), torch.tensor([rank + 0.5], dtype=torch.float64)
packed = torch.arange(5, dtype=torch.uint8) + 10 * rank
# rank r sends r + 1 + d elements to rank d: counts differ by direction
ids = torch.arange(sum(rank + 1 + d for d in range(world)), dtype=torch.int64) + 1000 * rank
pooled = torch.arange(sum(2 * d + 1 for d in range(world)), dtype=torch.float32) + 100 * rank
send_ids, recv_ids = [rank + 1 + d for d in range(world)], [s + 1 + rank for s in range(world)]
send_pooled, recv_pooled = [2 * d + 1 for d in range(world)], [2 * rank + 1] * world
ops = [AllReduce(a), AllReduce(b), AllReduce(loss), AllGather(packed)]
out["coalesced"] = torch_ops.start(ops).wait()
out["coalesced_calls"] = calls[before:]
before = len(calls)
out["a2a"] = torch_ops.start([AllToAll(pooled, send_pooled, recv_pooled), AllToAll(ids, send_ids, recv_ids)]).wait()
out["a2a_calls"] = calls[before:]
out["a2a_alone"] = [
    torch_ops.all_to_all_single(pooled, send_pooled, recv_pooled).wait(),
    torch_ops.all_to_all_single(ids, send_ids, recv_ids).wait(),
]
torch.save(out, f"{sys.argv[1]}/rank{rank}.pt")
dist.destroy_process_group()
