"""Large replicated tables exchange their lookups' rows (parallel/replica_grads.py): packing
survives any alignment and value type, a table's local gradient is read the same from deferred
bags and from a sparse gradient, and the global gradient built from every rank's rows updates a
table as one process does with the whole batch."""

import torch

from dlrmkit.model.embedding import FusedTable
from dlrmkit.optim.sparse import SparseSGD
from dlrmkit.parallel.replica_grads import pack, packed_size, set_global, take_local, unpack


def test_pack_round_trip_at_any_offset():
    rows = torch.tensor([5, 0, 2**40, 7])
    for dtype in (torch.float32, torch.bfloat16):
        values = torch.randn(4, 3).to(dtype)
        for unit in (torch.float32, torch.bfloat16):
            packed = pack(rows, values, unit)
            assert packed.dtype == unit and packed.numel() == packed_size(4, 3, dtype, unit)
            # received after one element of other data: the tail may start anywhere
            buf = torch.cat([torch.zeros(1, dtype=unit), packed])[1:]
            got_rows, got_values = unpack(buf, 4, 3, dtype)
            assert torch.equal(got_rows, rows) and torch.equal(got_values, values)


def lookups(table: FusedTable, ids: torch.Tensor) -> torch.Tensor:
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
        rows, values = take_local(table.weight)
        assert table.weight.grad is None and not getattr(table.weight, "bag_grads", [])
        got.append((rows, values))
    assert got[0][0].tolist() == [1, 5, 3, 7, 1, 9]  # table-local ids + each table's row offset, lookup order
    torch.testing.assert_close(got[0][1], got[1][1])
    assert torch.equal(got[0][0], got[1][0])


def test_global_gradient_matches_the_whole_batch():
    """Two 'ranks' (halves of a batch) exchanging rows: the SGD update of both halves' rows, in
    rank order, equals one process's update with the whole batch; duplicates across halves too."""
    ids = torch.tensor([[1, 0], [3, 2], [1, 4], [0, 2]])
    for defer in (False, True):
        tables = []
        for _ in range(3):
            t = FusedTable([5, 5], 4)
            with torch.no_grad():
                t.weight.copy_(torch.arange(40.0).view(10, 4) / 40)
            if defer:
                t.defer_grads()
            tables.append(t)
        whole, half0, half1 = tables
        lookups(whole, ids)
        SparseSGD([whole.weight], lr=0.1).step()
        parts = []
        for t, part in ((half0, ids[:2]), (half1, ids[2:])):
            out = t(part)
            offset = 0 if t is half0 else out.numel()
            (out * (torch.arange(1.0, out.numel() + 1) + offset).view_as(out)).sum().backward()
            parts.append(take_local(t.weight))
        set_global(half0.weight, parts)
        SparseSGD([half0.weight], lr=0.1).step()
        torch.testing.assert_close(half0.weight, whole.weight, rtol=0, atol=1e-6)
