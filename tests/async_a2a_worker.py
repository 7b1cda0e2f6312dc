"""torchrun worker for test_parallel_async.py: two copies of a sharded model, one whose tables
defer their gradients (backward all-to-all in flight while autograd goes on) and whose ids are
exchanged a batch ahead, one with ordinary sparse gradients (blocking all-to-all) and ids
exchanged in forward, trained on the same batches; then two on one-hot ids, whose next batch's
ids ride in the pooled all-to-all or travel alone; writes all four."""

import sys

import torch

import dlrmkit.parallel.comm as comm
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.optim.build import build_optimizers
from dlrmkit.perf.bench_parallel import parallel_setup
from dlrmkit.parallel.dist import shutdown

from dlrmkit.model import embedding

launched = []  # events in order: launches and waits of async all-to-alls (by kind), table backward
_start = comm.all_to_all_started


def started(*a, **k):
    kind = a[5]  # pooled_fwd / pooled_bwd
    launched.append(kind)
    out, wait = _start(*a, **k)

    def recorded_wait():
        launched.append("wait_" + kind)
        wait()

    return out, recorded_wait


comm.all_to_all_started = started
_lookup_backward = embedding.PooledLookup.backward
embedding.PooledLookup.backward = staticmethod(lambda ctx, g: launched.append("lookup_bwd") or _lookup_backward(ctx, g))

cfg = ModelConfig(13, [3000, 500, 2000, 800], 16, [32, 16], [32, 1])
out = {}
for name in ("async", "blocking"):
    model = DLRM(cfg)
    model.reset_parameters(0)
    # the blocking copy also exchanges ids inside forward, the async one a batch ahead
    par = parallel_setup(model, 256, sys.argv[2], None, True, 0, ids_ahead=name == "async")
    opts = build_optimizers(model, "sgd", 0.5)
    if name == "blocking":
        for t in par.sharded.local_tables:
            t.deferred = False
    init = [t.weight.detach().clone() for t in par.sharded.local_tables]
    before = len(launched)
    for batch in par.batches(cfg, 256, 3, 1):
        par.step(batch, opts)
    par.close()  # the ids exchange started ahead lands before the next model's collectives
    out[name] = {
        "launched": launched[before:],
        "init": init,
        "ids_ahead_bytes": par.stats.bytes.get("ids_ahead", 0),
        "tables": [t.weight.detach().clone() for t in par.sharded.local_tables],
        "dense": [p.detach().clone() for p in model.dense_parameters()],
    }
# one-hot ids: the next batch's ride in the pooled all-to-all ("carried") or go alone ("own");
# "no_buckets": overlapped, but the dense gradients summed after backward, as a caller that turns
# the buckets off (an A/B against DDP) does: backward's exchange must then not ride in them
for name in ("carried", "own", "no_buckets"):
    model = DLRM(cfg)
    model.reset_parameters(0)
    par = parallel_setup(model, 256, sys.argv[2], None, True, 0, ids_ahead=name == "carried")
    par.buckets.enabled = name != "no_buckets"
    opts = build_optimizers(model, "sgd", 0.5)
    before = len(launched)
    for batch in par.batches(cfg, 256, 3, 1, one_hot=True):
        par.step(batch, opts)
    par.close()
    out[name] = {
        "launched": launched[before:],
        "ids_ahead_bytes": par.stats.bytes.get("ids_ahead", 0),
        "tables": [t.weight.detach().clone() for t in par.sharded.local_tables],
        "dense": [p.detach().clone() for p in model.dense_parameters()],
    }
torch.save(out, f"{sys.argv[1]}/rank{par.ctx.rank}.pt")
shutdown()
