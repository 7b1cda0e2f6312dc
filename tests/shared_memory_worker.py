"""torchrun worker for test_shared_memory.py: SharedMemorySum (parallel/shared_memory.py) over
gloo for a few requests (both halves of the slots, then the first again), coalesced sums and an
all-gather, one op too large for a slot, and a request started before the previous one was
waited for; records the size of every gloo collective and this process's open memory files;
then the cases where no slots may be made. With DLRMKIT_FAULT set, a rank dies during setup."""

import os
import sys

import torch
import torch.distributed as dist

import dlrmkit.parallel.shared_memory as shared_memory
from dlrmkit.parallel.transport import AllGather, AllReduce, TorchCollectives

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sizes: list[int] = []  # elements each gloo collective carried
for name in ("all_to_all_single", "all_reduce", "all_gather_into_tensor"):
    fn = getattr(dist, name)
    setattr(dist, name, lambda t, *a, _fn=fn, **k: sizes.append(a[0].numel() if a else t.numel()) or _fn(t, *a, **k))


def mine(n: int, seed: int) -> torch.Tensor:
    """Rank `rank`'s values; every rank can make every other rank's."""
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + 100 * rank))


def memory_files() -> list[str]:
    """This process's open file descriptors that name a memory file."""
    fds = os.listdir("/proc/self/fd")
    return [
        t
        for t in (os.readlink(f"/proc/self/fd/{fd}") for fd in fds if os.path.exists(f"/proc/self/fd/{fd}"))
        if "memfd" in t or "/dev/shm" in t
    ]


out: dict = {"steps": []}
shared = shared_memory.SharedMemorySum.create(TorchCollectives(), 4096)
out["shared"], out["open_files"] = shared is not None, memory_files()
for step in range(3):
    before = len(sizes)
    loss = torch.tensor([rank + 1.0], dtype=torch.float64)
    ops = [AllReduce(mine(300, step)), AllReduce(mine(100, 10 + step)), AllReduce(loss), AllGather(mine(5, 20 + step))]
    out["steps"].append((shared.start(ops).wait(), sizes[before:]))
before = len(sizes)
out["large"] = (shared.all_reduce(mine(2000, 30)).wait(), sizes[before:])  # 8,000 bytes: through gloo
first = shared.all_reduce(mine(50, 40))
second = shared.all_reduce(mine(50, 41))  # starts only after `first` was waited for (same half two ahead)
third = shared.all_reduce(mine(50, 42))
out["unwaited"] = [third.wait(), first.wait(), second.wait()]
out["two_hosts"] = None
shared_memory.host_identity = lambda: (f"host{rank}", "boot")  # as if each rank ran on its own host
out["two_hosts"] = shared_memory.SharedSlots.create(64) is not None
torch.save(out, f"{sys.argv[1]}/rank{rank}.pt")
dist.destroy_process_group()
