"""The fused split-SGD sparse kernel (dlrmkit.optim.split_sgd_kernel) gives the same bits as the
pure-torch path and as fp32 index_add_, with duplicate ids, sorted or not, bf16 or fp32 grads."""

import pytest
import torch

from dlrmkit.optim import split_sgd_kernel
from dlrmkit.optim.split_sgd import SplitSGD, join_fp32, split_fp32


@pytest.fixture(scope="module")
def kernel():
    op = split_sgd_kernel.fused_kernel()
    if op is None:
        pytest.skip("split-SGD fused kernel could not be built here (no C++ compiler/ninja); fallback path in use")
    return op


def sparse_grad(rows, values, shape):
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, check_invariants=False)


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dim", [3, 16, 128])
def test_fused_equals_pure_torch_and_fp32_index_add(kernel, monkeypatch, sort, dtype, dim):
    gen = torch.Generator().manual_seed(dim)
    n_rows, n = 300, 5000  # ~17 lookups per row: many duplicates
    w = torch.randn(n_rows, dim, generator=gen) * 2
    rows = torch.randint(0, n_rows, (n,), generator=gen)
    rows = rows.sort()[0] if sort else rows
    values = torch.randn(n, dim, generator=gen).to(dtype)
    grad = sparse_grad(rows, values, (n_rows, dim))
    lr = 0.173

    hi_f, lo_f = split_fp32(w)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # sorted: split at row boundaries; unsorted (5000 >= 4096): rows owned by thread
    try:
        SplitSGD._sparse_step(hi_f, lo_f, grad, lr)
    finally:
        torch.set_num_threads(threads)

    monkeypatch.setenv("DLRMKIT_SPLIT_SGD_KERNEL", "0")
    hi_t, lo_t = split_fp32(w)
    SplitSGD._sparse_step(hi_t, lo_t, grad, lr)

    expect = w.clone().index_add_(0, rows, values.float(), alpha=-lr)
    assert torch.equal(join_fp32(hi_t, lo_t).view(torch.int32), expect.view(torch.int32))
    assert torch.equal(join_fp32(hi_f, lo_f).view(torch.int32), expect.view(torch.int32))
    assert torch.equal(hi_f.view(torch.int16), hi_t.view(torch.int16)) and torch.equal(lo_f, lo_t)
    assert not torch.equal(join_fp32(hi_f, lo_f), w)  # the update did something


def test_fused_path_is_taken_and_rejects_bad_rows(kernel):
    hi, lo = split_fp32(torch.randn(10, 4))
    rows = torch.tensor([1, 1, 9])
    assert split_sgd_kernel.fused_sparse_step(hi, lo, rows, torch.ones(3, 4), 0.5)
    with pytest.raises(RuntimeError, match="out of range"):
        split_sgd_kernel.fused_sparse_step(hi, lo, torch.tensor([0, 10, 2]), torch.ones(3, 4), 0.5)


@pytest.mark.parametrize("sort", [True, False], ids=["sorted", "lookup-order"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_by_bag_equals_per_lookup_rows_and_checks_bags(kernel, dtype, sort):
    """The deferred-gradient path: lookup i reads row bags[i] of the pooled gradient; the bits
    equal those of the materialized per-lookup gradient, on 2 threads (unsorted rows: each thread
    owns blocks of rows and keeps their lookups in order), for split halves and fp32 tables."""
    from dlrmkit.model.embedding import BagGrad

    gen = torch.Generator().manual_seed(7)
    w = torch.randn(500, 16, generator=gen)
    rows = torch.randint(0, 500, (9000,), generator=gen)
    rows = rows.sort(stable=True)[0] if sort else rows
    bag_grad = BagGrad(rows, torch.randint(0, 64, (9000,), generator=gen), torch.randn(64, 16, generator=gen).to(dtype))
    hi_b, lo_b = split_fp32(w)
    hi_r, lo_r = split_fp32(w)
    w_b = w.clone()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert split_sgd_kernel.fused_bag_step(hi_b, lo_b, bag_grad, 0.3)
        assert split_sgd_kernel.fused_sgd_bag_step(w_b, bag_grad, 0.3)
    finally:
        torch.set_num_threads(threads)
    SplitSGD._sparse_step(hi_r, lo_r, bag_grad.to_sparse(w.shape), 0.3)
    assert torch.equal(hi_b.view(torch.int16), hi_r.view(torch.int16)) and torch.equal(lo_b, lo_r)
    assert not torch.equal(join_fp32(hi_b, lo_b), w)
    expect = w.clone().index_add_(0, rows, bag_grad.grad.float().index_select(0, bag_grad.bags), alpha=-0.3)
    assert torch.equal(w_b.view(torch.int32), expect.view(torch.int32))
    bad = BagGrad(rows[:2], torch.tensor([0, 64]), bag_grad.grad)
    with pytest.raises(RuntimeError, match="bag 64 out of range"):
        split_sgd_kernel.fused_bag_step(hi_b, lo_b, bad, 0.3)


def test_disabled_kernel_falls_back(monkeypatch):
    monkeypatch.setenv("DLRMKIT_SPLIT_SGD_KERNEL", "0")
    hi, lo = split_fp32(torch.randn(10, 4))
    assert not split_sgd_kernel.fused_sparse_step(hi, lo, torch.tensor([1]), torch.ones(1, 4), 0.5)


def test_build_failure_falls_back_to_pure_torch(monkeypatch, caplog):
    def broken():
        raise OSError("no compiler")

    monkeypatch.setattr(split_sgd_kernel, "_cache", {})
    monkeypatch.setattr(split_sgd_kernel, "_build", broken)
    w = torch.randn(10, 4)
    hi, lo = split_fp32(w)
    rows, values = torch.tensor([2, 2, 5]), torch.randn(3, 4)
    SplitSGD._sparse_step(hi, lo, sparse_grad(rows, values, (10, 4)), 0.5)
    SplitSGD._sparse_step(hi, lo, sparse_grad(rows, values, (10, 4)), 0.5)
    assert sum("unavailable" in r.getMessage() for r in caplog.records) == 1  # logged once
    expect = w.clone().index_add_(0, rows, values, alpha=-0.5).index_add_(0, rows, values, alpha=-0.5)
    assert torch.equal(join_fp32(hi, lo).view(torch.int32), expect.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dense_step_equals_pure_torch_join_add_split(kernel, monkeypatch, dtype):
    """The one-pass dense step (MLP weights) gives the bits of join, add_, split, on 2 threads."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(300, 257, generator=gen)  # 77,100 elements: several thread chunks and a vector tail
    grad = torch.randn(300, 257, generator=gen).to(dtype)
    p = torch.nn.Parameter(w.clone())
    opt = SplitSGD([p], lr=0.21)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert split_sgd_kernel.fused_dense_step(p, opt.state[p]["low"], grad, 0.21)
    finally:
        torch.set_num_threads(threads)
    expect = w.clone().add_(grad.float(), alpha=-0.21)
    assert torch.equal(opt.master_weight(p).view(torch.int32), expect.view(torch.int32))
    monkeypatch.setenv("DLRMKIT_SPLIT_SGD_KERNEL", "0")
    assert not split_sgd_kernel.fused_dense_step(p, opt.state[p]["low"], grad, 0.21)


def test_kernel_runs_the_widest_clone_the_cpu_has(kernel):
    """Clones named after CPU models ("arch=skylake-avx512") dispatch on the model, so an AMD CPU
    with AVX-512 silently ran the portable clone, 9x slower; the clones are per ISA level now."""
    level, expected = split_sgd_kernel.kernel_isa_level(), split_sgd_kernel.cpu_isa_level()
    if level == -1:
        pytest.skip("the kernel was built without ISA clones (a compiler other than GCC >= 12 on x86-64)")
    if expected is None:
        pytest.skip("no /proc/cpuinfo flags to compare the kernel's clone with (not Linux on x86-64)")
    assert level == expected


def test_cpu_isa_level_reads_the_flags(tmp_path):
    v2 = "cx16 lahf_lm popcnt pni ssse3 sse4_1 sse4_2"
    base = f"processor\t: 0\nflags\t\t: fpu sse2 {v2} avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
    v4 = " avx512f avx512bw avx512cd avx512dq avx512vl"
    for extra, level in (("", 3), (v4, 4), (" avx512f", 3)):
        (tmp_path / "cpuinfo").write_text(base + extra + "\n")
        assert split_sgd_kernel.cpu_isa_level(str(tmp_path / "cpuinfo")) == level
    (tmp_path / "cpuinfo").write_text(base.replace(" lahf_lm", "") + v4 + "\n")  # no v2: GCC runs the default
    assert split_sgd_kernel.cpu_isa_level(str(tmp_path / "cpuinfo")) == 0
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse2\n")
    assert split_sgd_kernel.cpu_isa_level(str(tmp_path / "cpuinfo")) == 0
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # aarch64: no x86 flags
    assert split_sgd_kernel.cpu_isa_level(str(tmp_path / "cpuinfo")) is None
    assert split_sgd_kernel.cpu_isa_level(str(tmp_path / "missing")) is None


def test_a_narrower_clone_than_the_cpu_has_is_logged(kernel, monkeypatch, caplog):
    """Logged when the kernel is built (fused_kernel runs the check), and only when the CPU has more."""
    monkeypatch.setattr(split_sgd_kernel, "_cache", {})
    monkeypatch.setattr(split_sgd_kernel, "cpu_isa_level", lambda: 5)  # a CPU wider than any clone
    assert split_sgd_kernel.fused_kernel() is not None
    assert any("without the vector code this CPU has (x86-64-v5)" in r.getMessage() for r in caplog.records)
    level = split_sgd_kernel.kernel_isa_level()
    for cpu in (level, None, 0):  # as wide as the clone; nothing to compare with; no vector ISA at all
        caplog.clear()
        monkeypatch.setattr(split_sgd_kernel, "cpu_isa_level", lambda cpu=cpu: cpu)
        split_sgd_kernel._warn_if_slow_clone()
        assert not caplog.records, cpu


def test_a_failing_clone_check_keeps_the_kernel(kernel, monkeypatch):
    def broken():
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad cpuinfo")

    monkeypatch.setattr(split_sgd_kernel, "_cache", {})
    monkeypatch.setattr(split_sgd_kernel, "cpu_isa_level", broken)
    assert split_sgd_kernel.fused_kernel() is not None
