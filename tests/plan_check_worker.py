"""torchrun worker for test_plan_train_agree.py: ranks that plan the same pass the check; ranks
whose plans differ (as on hosts with different memory) each get the one-line error."""

import sys

import torch.distributed as dist

from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.dist import DistContext
from dlrmkit.parallel.hybrid import check_same_plan
from dlrmkit.parallel.plan import make_plan

dist.init_process_group("gloo")
rank = dist.get_rank()
ctx = DistContext(rank=rank, world_size=dist.get_world_size())
check_same_plan(make_plan([100, 5000], 8, 2, "auto", batch_size=64), ctx)
budget = 1 << 30 if rank == 0 else None  # rank 0 may replicate every table, rank 1 may not
try:
    check_same_plan(make_plan([100, 5000], 8, 2, "auto", batch_size=64, replicate_memory=budget), ctx)
    result = "agreed"
except DlrmkitError as e:
    result = str(e)
with open(f"{sys.argv[1]}/rank{rank}.txt", "w") as f:
    f.write(result)
dist.destroy_process_group()
