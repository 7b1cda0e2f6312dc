"""The asynchronous backward all-to-all (pooled_exchange.PooledAllToAll, deferred) is taken when
every local table defers its gradient, and gives the blocking path's weights; so do ids exchanged
a batch ahead (parallel/ids_ahead.py) against ids exchanged in forward, and one-hot ids
coalesced with the previous step's pooled all-to-all against ids exchanged alone; the forward
all-to-all is started before the model (ShardedEmbedding.start) on both."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_util import ROOT, torchrun  # noqa: E402

pytestmark = pytest.mark.multirank  # launches ranks with torchrun


@pytest.mark.parametrize("sharding,world", [("table_wise", 2), ("row_wise", 2), ("table_wise", 3)])
def test_async_backward_all_to_all_matches_blocking(sharding, world, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "async_a2a_worker.py", tmp_path, sharding)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        # ids went through the ahead group (parallel/ids_ahead.py) on the async copy only
        assert got["async"]["ids_ahead_bytes"] > 0 and got["blocking"]["ids_ahead_bytes"] == 0
        for name in ("async", "blocking"):
            events = got[name]["launched"]
            # every step: forward exchange started before the model, backward's launched early
            assert events.count("pooled_fwd") == 3 and events.count("pooled_bwd") == 3, events
            starts = [i for i, e in enumerate(events) if e == "pooled_fwd"] + [len(events)]
            for a, b in zip(starts[:-1], starts[1:]):
                step = events[a:b]
                # async: the tables' backward runs while the gradients travel, the wait comes after it
                before = step.index("lookup_bwd") < step.index("wait_pooled_bwd")
                assert before == (name == "async"), (name, step)
        for a, b in zip(
            got["async"]["tables"] + got["async"]["dense"], got["blocking"]["tables"] + got["blocking"]["dense"]
        ):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not all(torch.equal(a, b) for a, b in zip(got["async"]["tables"], got["async"]["init"])), (
            "tables trained"
        )
        # one-hot ids travel with the previous step's pooled all-to-all: only the first batch's go
        # alone, with the same bytes counted and the same training
        # (row-wise shards take bucketed ids: a worker thread exchanges them a batch ahead instead)
        coalesced, own = got["coalesced"], got["own"]
        assert coalesced["launched"].count("ids_ahead") == (0 if sharding == "row_wise" else 1)
        assert coalesced["launched"].count("pooled_fwd") == 3
        assert coalesced["ids_ahead_bytes"] > 0 and own["ids_ahead_bytes"] == 0
        for other in (own, got["no_buckets"]):
            for a, b in zip(coalesced["tables"] + coalesced["dense"], other["tables"] + other["dense"]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
