"""Large replicated tables exchange their lookups (parallel/replica_grads.py): packing survives any
alignment and value type, with bags (multi-hot: one gradient row per bag) and without (one-hot:
one per lookup); a table's local gradient is read the same from deferred bags and from a sparse
gradient, and the global gradient built from every rank's parts updates a table as one process
does with the whole batch."""

import pytest
import torch

from dlrmkit.model.embedding import FusedTable, JaggedIds
from dlrmkit.optim.sparse import SparseAdagrad, SparseSGD
from dlrmkit.parallel.replica_grads import LocalGrad, pack, packed_size, set_global, take_local, unpack


@pytest.mark.parametrize("bags", [[0, 1, 2, 3], [2, 0, 2, 1]], ids=["one-per-lookup", "by-bag"])
def test_pack_round_trip_at_any_offset(bags):
    rows, bags = torch.tensor([5, 0, 2**40, 7]), torch.tensor(bags)
    for dtype in (torch.float32, torch.bfloat16):
        m = 4 if bags.tolist() == [0, 1, 2, 3] else 3
        grad = torch.randn(m, 3).to(dtype)
        for unit in (torch.float32, torch.bfloat16):
            packed = pack(LocalGrad(rows, bags, grad), unit)
            assert packed.dtype == unit and packed.numel() == packed_size(4, m, 3, dtype, unit)
            # received after one element of other data: the tail may start anywhere
            buf = torch.cat([torch.zeros(1, dtype=unit), packed])[1:]
            got = unpack(buf, 4, m, 3, dtype)
            assert torch.equal(got.rows, rows) and torch.equal(got.bags, bags) and torch.equal(got.grad, grad)
    assert packed_size(4, 3, 3, torch.float32, torch.uint8) == 3 * 3 * 4 + 4 * 16  # rows and bags
    assert packed_size(4, 4, 3, torch.float32, torch.uint8) == 4 * 3 * 4 + 4 * 8  # rows only


def lookups(table: FusedTable, ids) -> torch.Tensor:
    out = table(ids)
    (out * torch.arange(1.0, out.numel() + 1).view_as(out)).sum().backward()
    return out


def test_local_rows_from_deferred_and_sparse_gradients_agree():
    ids = torch.tensor([[1, 0], [3, 2], [1, 4]])  # 3 samples, 2 tables of 5 rows
    got = []
    for defer in (False, True):
        table = FusedTable([5, 5], 4)
        torch.nn.init.normal_(table.weight)
        if defer:
            table.defer_grads()
        lookups(table, ids)
        local = take_local(table.weight)
        assert table.weight.grad is None and not getattr(table.weight, "bag_grads", [])
        got.append((local.rows, local.grad.index_select(0, local.bags)))
    assert got[0][0].tolist() == [1, 5, 3, 7, 1, 9]  # table-local ids + each table's row offset, lookup order
    torch.testing.assert_close(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])


def multi_hot(values: list[list[int]]) -> JaggedIds:
    """Bags table-major: values[t * B + b] is the bag of table t, sample b (2 tables)."""
    lengths = torch.tensor([len(v) for v in values])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return JaggedIds(torch.tensor([i for v in values for i in v], dtype=torch.int64), offsets, len(values) // 2)


@pytest.mark.parametrize("hot", [False, True], ids=["one-hot", "multi-hot"])
def test_global_gradient_matches_the_whole_batch(hot):
    """Two 'ranks' (halves of a batch) exchanging their parts: the update of both halves' lookups,
    in rank order, equals one process's update with the whole batch; duplicates across halves too.
    Multi-hot: one gradient row per bag travels, with each lookup's bag."""
    if hot:
        bags = [[1, 1, 3], [0], [], [4, 2], [2, 0], [4], [3, 3], []]  # table 0: samples 0-3, then table 1
        whole_ids = multi_hot(bags)
        halves = [multi_hot(bags[0:2] + bags[4:6]), multi_hot(bags[2:4] + bags[6:8])]
    else:
        whole_ids = torch.tensor([[1, 0], [3, 2], [1, 4], [0, 2]])
        halves = [whole_ids[:2], whole_ids[2:]]
    for defer in (False, True):
        for opt in (SparseSGD, SparseAdagrad):
            tables = []
            for _ in range(3):
                t = FusedTable([5, 5], 4)
                with torch.no_grad():
                    t.weight.copy_(torch.arange(40.0).view(10, 4) / 40)
                if defer:
                    t.defer_grads()
                tables.append(t)
            whole, half0, half1 = tables
            out = whole(whole_ids)
            weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
            (out * weights).sum().backward()
            opt([whole.weight], lr=0.1).step()
            parts = []
            for t, part, lo in ((half0, halves[0], 0), (half1, halves[1], 2)):
                (t(part) * weights[lo : lo + 2]).sum().backward()
                parts.append(take_local(t.weight))
            set_global(half0.weight, parts)
            opt([half0.weight], lr=0.1).step()
            torch.testing.assert_close(half0.weight, whole.weight, rtol=0, atol=1e-6)
            assert not torch.equal(whole.weight, torch.arange(40.0).view(10, 4) / 40)
