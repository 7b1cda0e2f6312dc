"""The acceptance criterion of hybrid parallelism: N ranks (torchrun, gloo, CPU) give the same
losses and weights as one process, for every strategy and a mixed auto plan, one-hot and
multi-hot bags, blocking and overlapped gradient all-reduce, N = 1..4 (global batch 50: uneven
for 3 and 4 ranks). Ranks build no full tables: shards are initialized in place (seeded per
table and row chunk), so equal weights also check that init."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parallel_equiv_worker as worker  # noqa: E402
from parallel_util import ROOT, torchrun  # noqa: E402


@pytest.fixture(scope="module")
def reference() -> dict:
    return {name: worker.run(name, 0, 1, distributed=False) for name in worker.PLANS}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_match_single_process(world, reference, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "parallel_equiv_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, ref in reference.items():
        got = torch.load(tmp_path / f"{name}.pt")
        assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5, abs=1e-6), name
        assert ref["losses"][0] != pytest.approx(ref["losses"][-1]), "training must move the loss"
        for t, (a, b) in enumerate(zip(ref["tables"], got["tables"])):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name}: table {t}")
        for a, b in zip(ref["dense"], got["dense"]):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name}: dense parameter")


def test_row_wise_shards_receive_only_their_ids():
    """Bucketing: the ids rank 0 sends to rank 1's row ranges are only those in the ranges,
    relative to the range start, with bag lengths that count them."""
    from dlrmkit.model.embedding import JaggedIds
    from dlrmkit.parallel.plan import make_plan
    from dlrmkit.parallel.sharded_embedding import ShardedEmbedding

    plan = make_plan(worker.TABLES, 16, 2, "row_wise", batch_size=8, min_rows_sharded=1)
    emb = ShardedEmbedding(plan, 0)
    assert emb.bucketed
    lengths = torch.tensor([[2, 0, 3]] * len(worker.TABLES))
    values = torch.cat([torch.tensor([0, n - 1, 1, n // 2, n - 2]) for n in worker.TABLES])
    ids = JaggedIds(values, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.reshape(-1).cumsum(0)]), 3)
    keys = emb.all_keys[1]
    vals, lens = emb.key_bags(ids, keys)
    for (t, a, e), v, l in zip(keys, vals, lens):
        full = torch.tensor([0, worker.TABLES[t] - 1, 1, worker.TABLES[t] // 2, worker.TABLES[t] - 2])
        want = full[(full >= a) & (full < e)] - a
        assert v.tolist() == want.tolist() and int(l.sum()) == len(want) and a > 0
        assert l[1] == 0
