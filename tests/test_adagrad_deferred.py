"""Adagrad (element-wise, with and without lazy L2, and row-wise) of tables that defer their gradient by
bag (FusedTable.defer_grads): the fused kernel sums each row's lookups straight from the pooled
gradient and steps the row; weights and accumulators equal the ordinary sparse-gradient path's (one
gradient row per lookup, coalesced) to float tolerance, on multi-hot bags with repeated ids and empty
bags, narrow tables (lookup order) and 128-wide ones (sorted by row). The model pools by sum only (no
mean pooling, no per-id weights), so sum pooling is what is checked."""

import pytest
import torch

from dlrmkit.model.embedding import SORT_MIN_DIM, FusedTable, JaggedIds
from dlrmkit.optim import split_sgd_kernel
from dlrmkit.optim.rowwise_adagrad import RowWiseAdagrad
from dlrmkit.optim.sparse import SparseAdagrad


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if split_sgd_kernel.fused_kernel() is None:
        pytest.skip("the fused kernel could not be built here (no C++ compiler/ninja); tables keep sparse gradients")


def multi_hot(gen: torch.Generator, tables: int, batch: int, rows: int, hot: int) -> JaggedIds:
    """Bags of 0..hot ids (empty bags included) over few rows: many repeated ids."""
    lengths = torch.randint(0, hot + 1, (tables * batch,), generator=gen)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    return JaggedIds(values, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), batch)


OPTIMIZERS = {
    "adagrad": lambda p: SparseAdagrad(p, lr=0.05, eps=1e-10, initial_accumulator_value=0.1),
    "adagrad-l2": lambda p: SparseAdagrad(p, lr=0.05, eps=1e-10, weight_decay=0.01),
    "rowwise-adagrad": lambda p: RowWiseAdagrad(p, lr=0.05, eps=1e-10),
}


def run_pair(name: str, dim: int, steps: int = 3):
    """(ordinary table, deferring table, their optimizers) after `steps` steps on the same batches."""
    gen = torch.Generator().manual_seed(dim)
    sizes = [30, 17, 50]
    tables = [FusedTable(sizes, dim) for _ in range(2)]
    init = torch.randn(sum(sizes), dim, generator=gen)
    for t in tables:
        t.weight.data.copy_(init)
    tables[1].defer_grads()
    opts = [OPTIMIZERS[name]([t.weight]) for t in tables]
    for _ in range(steps):
        ids = multi_hot(gen, len(sizes), 24, 17, 6)
        upstream = torch.randn(24, len(sizes), dim, generator=gen)
        for t, o in zip(tables, opts):
            o.zero_grad()
            (t(ids) * upstream).sum().backward()
        assert tables[0].weight.grad.is_sparse
        assert tables[1].weight.grad is None and len(tables[1].weight.bag_grads) == 1
        for o in opts:
            o.step()
        assert tables[1].weight.bag_grads == []
    return tables, opts


@pytest.mark.parametrize("dim", [8, SORT_MIN_DIM], ids=["narrow-lookup-order", "wide-sorted"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_deferred_adagrad_equals_the_sparse_gradient_path(name, dim):
    tables, opts = run_pair(name, dim)
    ref, fused = tables[0].weight.detach(), tables[1].weight.detach()
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-6)
    ref_acc, fused_acc = opts[0].state[tables[0].weight]["sum"], opts[1].state[tables[1].weight]["sum"]
    torch.testing.assert_close(fused_acc, ref_acc, rtol=1e-5, atol=1e-6)
    assert (fused_acc != fused_acc.flatten()[0]).any()  # the accumulator moved (touched rows only)
    untouched = ref_acc.reshape(len(ref_acc), -1).eq(ref_acc.flatten()[-1]).all(1)
    assert untouched.any() and (~untouched).any()  # some rows untouched, some touched


def test_deferred_adagrad_without_the_kernel_takes_the_sparse_path(monkeypatch):
    """A deferred gradient the kernel cannot take (here: disabled) is applied as the sparse COO
    gradient it stands for, with the same result."""
    monkeypatch.setitem(split_sgd_kernel._cache, "adagrad", False)
    tables, opts = run_pair("adagrad-l2", 16)
    torch.testing.assert_close(tables[1].weight.detach(), tables[0].weight.detach(), rtol=1e-6, atol=1e-7)


def test_two_lookups_of_one_table_in_a_step_take_one_adagrad_step():
    """Adagrad sums a row's gradient over the whole step before its step: two deferred gradients of
    one weight are merged, not applied one after the other."""
    gen = torch.Generator().manual_seed(5)
    tables = [FusedTable([40], 4) for _ in range(2)]
    init = torch.randn(40, 4, generator=gen)
    for t in tables:
        t.weight.data.copy_(init)
    tables[1].defer_grads()
    opts = [SparseAdagrad([t.weight], lr=0.1) for t in tables]
    a, b = multi_hot(gen, 1, 8, 6, 3), multi_hot(gen, 1, 8, 6, 3)
    for t in tables:
        (t(a).sum() + 2 * t(b).sum()).backward()
    assert len(tables[1].weight.bag_grads) == 2
    for o in opts:
        o.step()
    torch.testing.assert_close(tables[1].weight.detach(), tables[0].weight.detach(), rtol=1e-5, atol=1e-6)


def test_build_optimizers_defers_adagrad_tables_of_a_dcn_model():
    from dlrmkit.model.dlrm import DLRM, ModelConfig
    from dlrmkit.optim.build import build_optimizers

    model = DLRM(ModelConfig(3, [20, 30, 7], 8, [8], [4, 1], "dcn", dcn_layers=2, dcn_rank=4))
    model.reset_parameters(0)
    for emb in ("adagrad", "rowwise-adagrad"):
        build_optimizers(model, "adagrad", 0.1, embedding_optimizer=emb)
        assert all(t.deferred for t in model.embeddings.tables)


def test_kernel_rejects_unsorted_rows_and_bad_bags():
    w, acc = torch.zeros(10, 4), torch.zeros(10, 4)
    op = torch.ops.dlrmkit_split_sgd.adagrad_rows
    with pytest.raises(RuntimeError, match="sorted"):
        op(w, acc, torch.tensor([3, 1]), torch.ones(2, 4), None, 0.1, 1e-10, 0.0)
    with pytest.raises(RuntimeError, match="out of range"):
        op(w, acc, torch.tensor([1, 3]), torch.ones(2, 4), torch.tensor([0, 2]), 0.1, 1e-10, 0.0)


@pytest.mark.parametrize("rowwise", [False, True], ids=["element-wise", "row-wise"])
def test_kernel_split_over_threads_at_row_boundaries(rowwise):
    """Enough lookups for several threads' ranges (2048 each): a row whose lookups straddle a range
    boundary is stepped once, by one thread."""
    gen = torch.Generator().manual_seed(7)
    w, pooled = torch.randn(200, 16, generator=gen), torch.randn(900, 16, generator=gen)
    acc = torch.rand(200, generator=gen) if rowwise else torch.rand(200, 16, generator=gen)
    rows, bags = torch.randint(0, 200, (9000,), generator=gen).sort()[0], torch.randint(0, 900, (9000,), generator=gen)
    uniq, inverse = torch.unique(rows, return_inverse=True)
    g = torch.zeros(len(uniq), 16).index_add_(0, inverse, pooled.index_select(0, bags))
    ref_w, ref_acc = w.clone(), acc.clone()
    ref_acc.index_add_(0, uniq, g.square().mean(1) if rowwise else g * g)
    scale = ref_acc.index_select(0, uniq).sqrt().add(1e-10)
    ref_w.index_add_(0, uniq, g / (scale.unsqueeze(1) if rowwise else scale), alpha=-0.2)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        torch.ops.dlrmkit_split_sgd.adagrad_rows(w, acc, rows, pooled, bags, 0.2, 1e-10, 0.0)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acc, ref_acc, rtol=1e-5, atol=1e-5)
