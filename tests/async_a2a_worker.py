"""torchrun worker for test_parallel_async.py: two copies of a sharded model, one whose tables
defer their gradients (backward all-to-all in flight while autograd goes on) and one with
ordinary sparse gradients (blocking all-to-all), trained on the same batches; writes both."""

import sys

import torch

import dlrmkit.parallel.comm as comm
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.optim.build import build_optimizers
from dlrmkit.parallel.bench_parallel import parallel_setup
from dlrmkit.parallel.dist import shutdown

launched = []
_start = comm.all_to_all_started
comm.all_to_all_started = lambda *a, **k: launched.append(1) or _start(*a, **k)

cfg = ModelConfig(13, [3000, 500, 2000, 800], 16, [32, 16], [32, 1])
out = {}
for name in ("async", "blocking"):
    model = DLRM(cfg)
    model.reset_parameters(0)
    par = parallel_setup(model, 256, sys.argv[2], None, True, 0)
    opts = build_optimizers(model, "sgd", 0.5)
    if name == "blocking":
        for t in par.sharded.local_tables:
            t.deferred = False
    init = [t.weight.detach().clone() for t in par.sharded.local_tables]
    before = len(launched)
    for batch in par.batches(cfg, 256, 3, 1):
        par.step(batch, opts)
    out[name] = {"launched": len(launched) - before, "init": init,
                 "tables": [t.weight.detach().clone() for t in par.sharded.local_tables],
                 "dense": [p.detach().clone() for p in model.dense_parameters()]}
torch.save(out, f"{sys.argv[1]}/rank{par.ctx.rank}.pt")
shutdown()
