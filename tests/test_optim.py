import pytest
import torch
import torch.nn.functional as F

from dlrmkit.optim.schedule import LRSchedule
from dlrmkit.optim.sparse import SparseAdagrad, SparseSGD

ROWS, DIM = 30, 4
# several steps; duplicate ids inside a batch; rows 20.. are never touched
ID_BATCHES = [
    [1, 1, 1, 5, 7],
    [0, 5, 5, 19, 2, 2, 2, 2],
    [7],
    [3, 4, 3, 4, 19, 0],
]
UNTOUCHED = [r for r in range(ROWS) if r not in {i for b in ID_BATCHES for i in b}]


def sparse_grad_step(weight, ids, upstream):
    """Backward of an embedding lookup with sparse=True; returns the sparse gradient."""
    weight.grad = None
    out = F.embedding(torch.tensor(ids), weight, sparse=True)
    (out * upstream).sum().backward()
    assert weight.grad.is_sparse
    return weight.grad


def run_both(make_sparse_opt, make_dense_opt, lrs=None):
    gen = torch.Generator().manual_seed(0)
    init = torch.randn(ROWS, DIM, generator=gen)
    w_sparse = torch.nn.Parameter(init.clone())
    w_dense = torch.nn.Parameter(init.clone())
    opt_s, opt_d = make_sparse_opt([w_sparse]), make_dense_opt([w_dense])
    for step, ids in enumerate(ID_BATCHES):
        if lrs is not None:
            for opt in (opt_s, opt_d):
                for g in opt.param_groups:
                    g["lr"] = lrs[step]
        upstream = torch.randn(len(ids), DIM, generator=gen)
        grad = sparse_grad_step(w_sparse, ids, upstream)
        w_dense.grad = grad.to_dense()  # duplicates summed
        opt_s.step()
        opt_d.step()
        torch.testing.assert_close(w_sparse.data, w_dense.data, rtol=2e-6, atol=1e-6)
    return init, w_sparse.detach(), w_dense.detach()


def test_sparse_sgd_equals_dense_sgd():
    init, ws, wd = run_both(lambda p: SparseSGD(p, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3))
    touched = sorted({i for b in ID_BATCHES for i in b})
    assert not torch.allclose(ws[touched], init[touched])
    assert torch.equal(ws[UNTOUCHED], init[UNTOUCHED])  # bit-identical
    torch.testing.assert_close(ws, wd, rtol=2e-6, atol=1e-6)


def test_sparse_sgd_follows_group_lr_changes():
    lrs = [0.1, 1.0, 0.0, 0.5]
    init, ws, wd = run_both(lambda p: SparseSGD(p, lr=9.0), lambda p: torch.optim.SGD(p, lr=9.0), lrs=lrs)
    assert torch.equal(ws[UNTOUCHED], init[UNTOUCHED])


def test_sparse_sgd_hand_value_with_duplicates():
    w = torch.nn.Parameter(torch.zeros(4, 2))
    grad = sparse_grad_step(w, [2, 2, 2], torch.ones(3, 2))
    assert grad._nnz() == 3  # uncoalesced: one row per lookup
    SparseSGD([w], lr=0.5).step()
    assert w.data.tolist() == [[0, 0], [0, 0], [-1.5, -1.5], [0, 0]]


@pytest.mark.parametrize("init_acc", [0.0, 0.1])
def test_sparse_adagrad_equals_dense_adagrad(init_acc):
    init, ws, wd = run_both(
        lambda p: SparseAdagrad(p, lr=0.2, eps=1e-10, initial_accumulator_value=init_acc),
        lambda p: torch.optim.Adagrad(p, lr=0.2, eps=1e-10, initial_accumulator_value=init_acc),
    )
    assert torch.equal(ws[UNTOUCHED], init[UNTOUCHED])
    touched = sorted({i for b in ID_BATCHES for i in b})
    assert not torch.allclose(ws[touched], init[touched])


def test_sparse_adagrad_accumulator_matches_torch():
    gen = torch.Generator().manual_seed(1)
    init = torch.randn(ROWS, DIM, generator=gen)
    ws, wd = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    os_, od = SparseAdagrad([ws], lr=0.1), torch.optim.Adagrad([wd], lr=0.1, eps=1e-10)
    for ids in ID_BATCHES:
        g = sparse_grad_step(ws, ids, torch.randn(len(ids), DIM, generator=gen))
        wd.grad = g.to_dense()
        os_.step()
        od.step()
    torch.testing.assert_close(os_.state[ws]["sum"], od.state[wd]["sum"], rtol=1e-6, atol=1e-7)
    assert torch.all(os_.state[ws]["sum"][UNTOUCHED] == 0)
    # the state survives a state_dict round trip (checkpoints depend on it)
    clone = torch.nn.Parameter(ws.detach().clone())
    opt2 = SparseAdagrad([clone], lr=0.1)
    opt2.load_state_dict(os_.state_dict())
    assert torch.equal(opt2.state[clone]["sum"], os_.state[ws]["sum"])


def test_sparse_adagrad_hand_value_duplicates_summed_first():
    w = torch.nn.Parameter(torch.zeros(3, 1))
    sparse_grad_step(w, [1, 1], torch.tensor([[1.0], [2.0]]))
    SparseAdagrad([w], lr=1.0, eps=0.0).step()
    # g = 3 (summed), acc = 9, w = -1 * 3 / 3 = -1 (not two updates of 1/1 and 2/sqrt(5))
    assert w.data.flatten().tolist() == [0.0, -1.0, 0.0]


@pytest.mark.parametrize("opt_cls", [SparseSGD, SparseAdagrad])
def test_sparse_optimizers_reject_dense_gradients(opt_cls):
    w = torch.nn.Parameter(torch.zeros(3, 2))
    w.grad = torch.ones(3, 2)
    with pytest.raises(ValueError, match="sparse=True"):
        opt_cls([w], lr=0.1).step()


@pytest.mark.parametrize("opt_cls", [SparseSGD, SparseAdagrad])
def test_sparse_optimizers_skip_params_without_grad(opt_cls):
    w = torch.nn.Parameter(torch.ones(3, 2))
    opt_cls([w], lr=0.1).step()
    assert torch.equal(w.data, torch.ones(3, 2))


# ---- LR schedule ------------------------------------------------------------------------------------


def test_constant_schedule():
    s = LRSchedule(0.7)
    assert [s.lr_at(i) for i in (0, 1, 100, 10**6)] == [0.7] * 4


def test_warmup_is_linear_and_reaches_base_lr():
    s = LRSchedule(2.0, warmup_steps=4)
    assert [s.lr_at(i) for i in range(6)] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0, 2.0])
    s = LRSchedule(1.0, warmup_steps=100)
    lrs = [s.lr_at(i) for i in range(100)]
    diffs = [b - a for a, b in zip(lrs, lrs[1:])]
    assert max(diffs) == pytest.approx(min(diffs)) == pytest.approx(0.01)
    assert lrs[-1] == 1.0 and s.lr_at(100) == 1.0 and lrs[0] > 0


def test_power2_decay_to_zero():
    s = LRSchedule(1.0, warmup_steps=2, decay_start=10, decay_steps=5)
    expected = {
        0: 0.5,
        1: 1.0,
        2: 1.0,
        9: 1.0,
        10: 1.0,
        11: 0.64,
        12: 0.36,
        13: 0.16,
        14: 0.04,
        15: 0.0,
        16: 0.0,
        1000: 0.0,
    }
    for step, lr in expected.items():
        assert s.lr_at(step) == pytest.approx(lr, abs=1e-12), step


def test_decay_to_end_lr():
    s = LRSchedule(3.0, decay_start=4, decay_steps=2, end_lr=1.0)
    assert [s.lr_at(i) for i in (3, 4, 5, 6, 7)] == pytest.approx([3.0, 3.0, 1.5, 1.0, 1.0])


def test_mlperf_recipe_values():
    s = LRSchedule(24.0, warmup_steps=2750, decay_start=49315, decay_steps=27772)
    assert s.lr_at(0) == pytest.approx(24.0 / 2750)
    assert s.lr_at(1374) == pytest.approx(12.0)
    assert s.lr_at(2749) == 24.0
    assert s.lr_at(30000) == 24.0
    assert s.lr_at(49315 + 27772 // 2) == pytest.approx(24.0 * (1 - (27772 // 2) / 27772) ** 2)
    assert s.lr_at(49315 + 27772) == 0.0


def test_decay_needs_both_start_and_steps():
    assert LRSchedule(1.0, decay_start=5, decay_steps=0).lr_at(50) == 1.0
    assert LRSchedule(1.0, decay_start=0, decay_steps=5).lr_at(50) == 1.0


def test_apply_sets_every_group():
    w1, w2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, 2))
    dense = torch.optim.SGD([w1], lr=5.0)
    sparse = SparseSGD([w2], lr=5.0)
    s = LRSchedule(1.0, warmup_steps=4)
    assert s.apply([dense, sparse], 1) == 0.5
    assert dense.param_groups[0]["lr"] == 0.5 and sparse.param_groups[0]["lr"] == 0.5


def test_sparse_sgd_with_deferred_table_gradients_matches_per_lookup_updates():
    """build_optimizers' fast path: the table defers its gradient by bag and SparseSGD applies it
    with the fused kernel; the result equals fp32 index_add_ of each lookup's gradient row, bit for
    bit, and the ordinary sparse-gradient path to float tolerance; zero_grad drops pending grads."""
    from dlrmkit.model.embedding import FusedTable, JaggedIds
    from dlrmkit.optim import split_sgd_kernel

    if split_sgd_kernel.fused_kernel() is None:
        pytest.skip("the fused kernel could not be built here (no C++ compiler/ninja)")
    gen = torch.Generator().manual_seed(3)
    tables = [FusedTable([40, 25], 8) for _ in range(2)]
    init = torch.randn(65, 8, generator=gen)
    for t in tables:
        t.weight.data.copy_(init)
    tables[1].defer_grads()
    start = tables[0].weight.detach().clone()
    lengths = torch.randint(0, 4, (2 * 16,), generator=gen)
    ids = JaggedIds(
        torch.randint(0, 25, (int(lengths.sum()),), generator=gen),
        torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        16,
    )
    upstream = torch.randn(16, 2, 8, generator=gen)
    opts = [SparseSGD([t.weight], lr=0.3) for t in tables]
    for t, o in zip(tables, opts):
        o.zero_grad()
        (t(ids) * upstream).sum().backward()
    assert tables[0].weight.grad.is_sparse and tables[1].weight.grad is None and len(tables[1].weight.bag_grads) == 1
    g = tables[1].weight.bag_grads[0]
    expect = start.clone().index_add_(0, g.rows, g.grad.index_select(0, g.bags), alpha=-0.3)
    for o in opts:
        o.step()
    assert torch.equal(tables[1].weight.detach().view(torch.int32), expect.view(torch.int32))
    torch.testing.assert_close(tables[1].weight.detach(), tables[0].weight.detach(), rtol=1e-6, atol=1e-6)
    assert not torch.equal(tables[1].weight.detach(), start)
    (tables[1](ids) * upstream).sum().backward()
    opts[1].zero_grad()
    assert tables[1].weight.bag_grads == []


@pytest.mark.parametrize("decoupled", [True, False], ids=["adamw", "adam-l2"])
def test_dense_adam_on_the_cpu_is_torchs_fused_kernel_and_stays_so_after_a_load(decoupled):
    from dlrmkit.optim.build import ScaledAdam

    def make(fused_ok: bool):
        gen = torch.Generator().manual_seed(0)
        params = [
            torch.randn(40, 7, generator=gen, requires_grad=True),
            torch.randn(7, generator=gen, requires_grad=True),
        ]
        opt = ScaledAdam(params, lr=0.05, lr_scale=0.2, weight_decay=0.1, decoupled=decoupled)
        if not fused_ok:
            for group in opt.param_groups:
                group["fused"] = None
        return params, opt

    (a, fused), (b, plain) = make(True), make(False)
    assert all(g["fused"] for g in fused.param_groups) and not any(g["fused"] for g in plain.param_groups)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=gen) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        plain.step()
    for p, q, start in zip(a, b, make(True)[0]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert (p - start).abs().mean() > 1e-3  # they stepped
    fused.load_state_dict(plain.state_dict())  # a state saved unfused (a GPU's, say)
    assert all(g["fused"] for g in fused.param_groups)
