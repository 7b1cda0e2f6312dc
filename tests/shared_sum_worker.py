"""torchrun worker for test_shared_slots.py: GradBuckets summing through shared-memory slots
(parallel/shared_slots.py) for a few steps, with and without extras and riders, recording the
size of every gloo collective; then the cases where no slots may be made (ranks on different
hosts, a directory that cannot hold them)."""

import glob
import os
import sys

import torch
import torch.distributed as dist

import dlrmkit.parallel.comm as comm
import dlrmkit.parallel.shared_slots as shared_slots
from dlrmkit.parallel.grad_buckets import GradBuckets

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sizes: list[int] = []  # elements each gloo collective carried
for name in ("all_to_all_single", "all_reduce"):
    fn = getattr(dist, name)
    setattr(dist, name, lambda t, *a, _fn=fn, **k: sizes.append(a[0].numel() if a else t.numel()) or _fn(t, *a, **k))


def mine(n: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s values; every rank can make every other rank's."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + 100 * rank))


out: dict = {"steps": []}
a, b = torch.nn.Parameter(torch.zeros(300)), torch.nn.Parameter(torch.zeros(100))
buckets = GradBuckets([a, b], 256, None, comm.CommStats(), 256, shared=True)  # two buckets: b, then a
out["shared"] = buckets.slots is not None
out["left"] = glob.glob(f"{shared_slots.SHM_DIR}/{buckets.slots.name}*") if buckets.slots else None
for step in range(3):  # both halves of the slots, then the first again
    a.grad, b.grad = mine(300, step), mine(100, 10 + step)
    loss = torch.tensor([float(rank + 1)])
    before = len(sizes)
    rest = buckets.launch_pending([loss])  # the loss travels through gloo, the gradients do not
    buckets.finish()
    out["steps"].append((a.grad.clone(), b.grad.clone(), loss.clone(), rest, sizes[before:]))
if world == 2:  # riders reach the peer through the slots' rider area, or through gloo when it is full
    for name, area in (("rider", buckets.rider_area), ("rider_full", (buckets.rider_area[0],) * 2)):
        buckets.rider_area = area
        a.grad, b.grad = mine(300, 7), mine(100, 8)
        data = torch.arange(5.0) + 10 * rank
        back = torch.empty(2 * (2 + rank))
        buckets.riders.append(comm.PooledRider(comm.Carried(data, [2, 3], [2 + rank] * 2, "pooled_bwd"), back, None))
        before = len(sizes)
        buckets.finish()
        out[name] = (a.grad.clone(), back, sizes[before:])
out["bad_dir"] = shared_slots.SharedSlots.create(64, directory=f"{sys.argv[1]}/missing") is not None
own = f"{sys.argv[1]}/shm{rank}"  # one host name, but each rank its own directory (as containers may)
os.makedirs(own)
out["own_dirs"] = (shared_slots.SharedSlots.create(64, directory=own) is not None, os.listdir(own))
shared_slots.host_identity = lambda: (f"host{rank}", "boot")  # as if each rank ran on its own host
out["two_hosts"] = shared_slots.SharedSlots.create(64) is not None
torch.save(out, f"{sys.argv[1]}/rank{rank}.pt")
dist.destroy_process_group()
