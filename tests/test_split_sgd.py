"""Split-SGD BF16: bit-exact equality with an fp32 master-weight SGD whose forward/backward use
the top 16 bits of each fp32 weight, and weight memory equal to the fp32 model's."""

import copy

import pytest
import torch
import torch.nn.functional as F

from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.model.embedding import JaggedIds
from dlrmkit.optim import split_sgd_kernel
from dlrmkit.optim.build import defer_table_grads
from dlrmkit.optim.split_sgd import SplitSGD, join_fp32, split_fp32, truncate_to_bf16

CFG = ModelConfig(num_numerical=5, table_sizes=[50, 7, 300], embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[32, 16, 1])


def test_split_join_roundtrip_is_bit_exact():
    gen = torch.Generator().manual_seed(0)
    w = torch.cat(
        [
            torch.randn(1000, generator=gen) * 10 ** torch.randint(-30, 30, (1000,), generator=gen),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-40, -1e-40]),
        ]
    )
    hi, lo = split_fp32(w)
    assert hi.dtype == torch.bfloat16 and lo.dtype == torch.int16
    assert torch.equal(join_fp32(hi, lo).view(torch.int32), w.view(torch.int32))
    # the top half is the truncation, not the rounding, of the fp32 value
    assert torch.equal(hi.view(torch.int16).to(torch.int32), torch.bitwise_right_shift(w.view(torch.int32), 16))
    assert not torch.equal(hi, w.to(torch.bfloat16))  # rounding differs somewhere: the test means something


def batches(n, batch_size=64, jagged=False, seed=1):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.tensor(CFG.table_sizes)
    out = []
    for _ in range(n):
        dense = torch.rand(batch_size, CFG.num_numerical, generator=gen)
        labels = torch.randint(0, 2, (batch_size,), generator=gen).float()
        if jagged:
            t = len(CFG.table_sizes)
            lengths = torch.randint(0, 4, (t, batch_size), generator=gen)
            per_table = lengths.sum(1)
            values = (
                torch.rand(int(per_table.sum()), generator=gen) * torch.repeat_interleave(sizes, per_table)
            ).long()
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
            ids = JaggedIds(values, offsets, batch_size)
        else:
            ids = (torch.rand(batch_size, len(CFG.table_sizes), generator=gen) * sizes).long()
        out.append((dense, ids, labels))
    return out


def loss_of(model, dense, ids, labels):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.binary_cross_entropy_with_logits(model(dense, ids), labels)


@pytest.mark.parametrize("jagged", [False, True], ids=["one-hot", "jagged"])
@pytest.mark.parametrize("deferred", [False, "sorted", "lookup-order"], ids=["coo-grad", "bag-grad-sorted", "bag-grad"])
def test_split_sgd_matches_fp32_master_sgd_bit_for_bit(jagged, deferred, monkeypatch):
    """bag-grad: the tables defer their gradients (build_optimizers' fast path) and the kernel
    reads each lookup's row from the pooled gradient, in lookup order (narrow tables) or sorted by
    row (wide ones, embedding.SORT_MIN_DIM, forced here); the bits must not change."""
    from dlrmkit.model import embedding

    monkeypatch.setattr(embedding, "SORT_MIN_DIM", 0 if deferred == "sorted" else 1 << 20)
    torch.manual_seed(0)
    lr, steps = 0.5, 100
    fp32_model = DLRM(CFG)
    fp32_model.reset_parameters(3)
    # reference: fp32 master weights; a bf16 model whose weights are their top 16 bits
    master = {n: p.detach().clone() for n, p in fp32_model.named_parameters()}
    ref = copy.deepcopy(fp32_model).to(torch.bfloat16)
    ref_params = dict(ref.named_parameters())
    # split-SGD on the model itself
    model = copy.deepcopy(fp32_model)
    opt = SplitSGD(model.parameters(), lr=lr)
    if deferred:
        if split_sgd_kernel.fused_kernel() is None:
            pytest.skip("the bag-gradient path needs the fused kernel (C++ compiler + ninja); none built here")
        defer_table_grads(model.embeddings)
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in params.values())

    naive = copy.deepcopy(fp32_model).to(torch.bfloat16)  # plain bf16 SGD, to show the gap is real
    naive_opt = torch.optim.SGD(naive.dense_parameters(), lr=lr)

    for dense, ids, labels in batches(steps, jagged=jagged):
        with torch.no_grad():
            for n, p in ref_params.items():
                p.copy_(truncate_to_bf16(master[n]))
        ref.zero_grad(set_to_none=True)
        loss_of(ref, dense, ids, labels).backward()
        with torch.no_grad():
            for n, p in ref_params.items():
                g = p.grad
                if g.is_sparse:  # fp32 sparse SGD (dlrmkit's SparseSGD): lookups added in order
                    master[n].index_add_(0, g._indices()[0], g._values().float(), alpha=-lr)
                else:
                    master[n].add_(g.float(), alpha=-lr)

        opt.zero_grad(set_to_none=True)
        loss_of(model, dense, ids, labels).backward()
        table = params["embeddings.tables.0.weight"]
        if deferred:
            assert table.grad is None and len(table.bag_grads) == 1
        else:
            assert table.grad.is_sparse
        opt.step()
        assert not getattr(table, "bag_grads", None)

        naive_opt.zero_grad(set_to_none=True)
        loss_of(naive, dense, ids, labels).backward()
        naive_opt.step()

    for n, p in params.items():
        joined = opt.master_weight(p)
        assert torch.equal(joined.view(torch.int32), master[n].view(torch.int32)), n
        assert torch.equal(p.data, truncate_to_bf16(master[n])), n
        assert not torch.equal(master[n], dict(fp32_model.named_parameters())[n].detach()), f"{n} never trained"
    # the low halves carry information that plain bf16 SGD loses
    naive_w = dict(naive.named_parameters())["top_mlp.0.weight"].detach().float()
    assert not torch.equal(naive_w, master["top_mlp.0.weight"])


def test_weight_memory_equals_fp32_model():
    big = ModelConfig(13, [10_000, 2_000], 16, [64, 16], [64, 1])
    fp32_model = DLRM(big)
    fp32_model.reset_parameters(0)
    fp32_bytes = sum(p.numel() * p.element_size() for p in fp32_model.parameters())
    model = copy.deepcopy(fp32_model)
    opt = SplitSGD(model.parameters(), lr=0.1)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    )
    assert param_bytes == fp32_bytes // 2
    assert param_bytes + state_bytes == fp32_bytes
    # and the fp32 values are all still there
    for p32, p in zip(fp32_model.parameters(), model.parameters()):
        assert torch.equal(opt.master_weight(p), p32.detach())


def test_sparse_update_leaves_untouched_rows_and_sums_duplicates():
    w0 = torch.randn(20, 4)
    p = torch.nn.Parameter(w0.clone())
    opt = SplitSGD([p], lr=0.25)
    ids = torch.tensor([3, 3, 3, 7, 0, 7])
    upstream = torch.randn(6, 4)
    (F.embedding(ids, p, sparse=True).float() * upstream).sum().backward()
    opt.step()
    expect = w0.clone()
    expect.index_add_(0, ids, upstream.to(torch.bfloat16).float(), alpha=-0.25)
    untouched = [r for r in range(20) if r not in (0, 3, 7)]
    assert torch.equal(opt.master_weight(p)[untouched], w0[untouched])
    assert torch.equal(opt.master_weight(p).view(torch.int32), expect.view(torch.int32))


def test_state_dict_roundtrip_keeps_low_halves():
    p = torch.nn.Parameter(torch.randn(5, 3))
    opt = SplitSGD([p], lr=0.1)
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = SplitSGD([q], lr=0.1)  # q is already bf16: zero low halves
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[q]["low"].dtype == torch.int16
    assert torch.equal(opt2.master_weight(q), opt.master_weight(p))
