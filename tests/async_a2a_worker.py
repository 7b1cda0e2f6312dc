"""torchrun worker for test_parallel_async.py: two copies of a sharded model, one whose tables
defer their gradients (backward all-to-all in flight while autograd goes on) and whose ids are
exchanged a batch ahead, one with ordinary sparse gradients (blocking all-to-all) and ids
exchanged in forward, trained on the same batches; then three on one-hot ids, whose next batch's
ids travel coalesced with the pooled all-to-all, or alone, or with the dense gradients' buckets
started after backward only; writes all five."""

import sys
import threading

import torch

from dlrmkit.model import embedding
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.optim.build import build_optimizers
from dlrmkit.parallel import transport
from dlrmkit.parallel.dist import shutdown
from dlrmkit.perf.bench_parallel import parallel_setup

launched = []  # events in order: starts and waits of the training thread's collectives (by kind), table backward
_start = transport.TorchCollectives.start


class Recorded:
    def __init__(self, request, kind: str):
        self.request, self.kind = request, kind

    def wait(self):
        launched.append("wait_" + self.kind)
        return self.request.wait()


def started(self, ops):
    request = _start(self, ops)
    if not ops or threading.current_thread() is not threading.main_thread():
        return request
    launched.append(ops[0].kind)  # pooled_fwd (with the next ids coalesced), pooled_bwd, ids_ahead, ...
    return Recorded(request, ops[0].kind)


transport.TorchCollectives.start = started
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
    par.close()  # the ids exchange started ahead completes before the next model's collectives
    out[name] = {
        "launched": launched[before:],
        "init": init,
        "ids_ahead_bytes": par.stats.bytes.get("ids_ahead", 0),
        "tables": [t.weight.detach().clone() for t in par.sharded.local_tables],
        "dense": [p.detach().clone() for p in model.dense_parameters()],
    }
# one-hot ids: the next batch's travel coalesced with the pooled all-to-all ("coalesced") or go
# alone ("own"); "no_buckets": overlapped, but no bucket's sum starts during backward
for name in ("coalesced", "own", "no_buckets"):
    model = DLRM(cfg)
    model.reset_parameters(0)
    par = parallel_setup(model, 256, sys.argv[2], None, True, 0, ids_ahead=name == "coalesced")
    par.buckets.overlap = name != "no_buckets"
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
