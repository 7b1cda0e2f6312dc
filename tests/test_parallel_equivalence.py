"""The acceptance criterion of hybrid parallelism: N ranks (torchrun, gloo, CPU) give the same
losses and weights as one process, for every strategy and a mixed auto plan, one-hot and
multi-hot bags, the dot and the DCNv2 cross interaction, blocking and overlapped gradient all-reduce, N = 1..4 (global batch 50: uneven
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

pytestmark = pytest.mark.multirank  # launches ranks with torchrun


@pytest.fixture(scope="module")
def reference() -> dict:
    return {name: worker.run(name, 0, 1, distributed=False) for name in worker.PLANS}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_match_single_process(world, reference, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "parallel_equiv_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_matches(reference, tmp_path)


def check_matches(reference: dict, tmp_path: Path) -> None:
    for name, ref in reference.items():
        got = torch.load(tmp_path / f"{name}.pt")
        # fp16 plans: each rank's MLPs run in fp16 on its slice of the batch, a few fp16 roundings
        # (3e-5 measured at most) from one process's
        rel, atol = (1e-3, 1e-4) if "fp16" in name else (1e-5, 1e-6)
        assert got["losses"] == pytest.approx(ref["losses"], rel=rel, abs=atol), name
        assert ref["losses"][0] != pytest.approx(ref["losses"][-1]), "training must move the loss"
        # gradients are summed across ranks in another order than one process sums its batch: a few
        # float32 roundings apart after the steps (MLPs: 2.1e-6 measured at most; tables: 1.1e-6, an
        # Adagrad row whose gradients nearly cancel, each step divided by the root of their summed
        # squares), where a wrong row or shard is off by a step of the learning rate (0.05)
        for t, (a, b) in enumerate(zip(ref["tables"], got["tables"])):
            torch.testing.assert_close(b, a, rtol=rel, atol=max(atol, 5e-6), msg=f"{name}: table {t}")
        for a, b in zip(ref["dense"], got["dense"]):
            torch.testing.assert_close(b, a, rtol=rel, atol=max(atol, 5e-6), msg=f"{name}: dense parameter")
        assert got.get("scale") == ref.get("scale"), name


def test_cpu_group_carries_the_ids_and_the_default_group_the_model(reference, tmp_path):
    """The GPU path's split, run on CPU: with a separate group for CPU tensors (NCCL runs get a
    gloo one), ids, bag lengths and batch sizes (int64) travel only there, the step's float
    traffic (pooled embeddings, gradients, loss) only on the default group, gathering tables for a
    checkpoint on the CPU group; results still match one process."""
    proc = torchrun(2, ROOT / "tests" / "parallel_equiv_worker.py", tmp_path, "cpu-group")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_matches(reference, tmp_path)
    for name in reference:
        got = torch.load(tmp_path / f"{name}.pt")
        steps, gather = got["step_calls"], got["gather_calls"]
        ints = {(f, g) for f, g, dtype in steps if dtype == "torch.int64"}
        floats = {(f, g) for f, g, dtype in steps if dtype != "torch.int64"}
        # replicated tables only: no id exchange, no pooled all-to-all
        sharded = name != "data_parallel" and not name.startswith("replicated")
        assert all(g == "cpu" for _, g in ints) and (bool(ints) or not sharded), (name, ints)
        assert (("all_to_all_single", "default") in floats) == sharded, (name, floats)
        assert all(g == "default" for _, g in floats), (name, floats)
        assert all(g == "cpu" for _, g, _ in gather) and (bool(gather) or not sharded), (name, gather)


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
