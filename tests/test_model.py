import math

import pytest
import torch
from torch import nn

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.dlrm import DLRM, ModelConfig, flops_per_sample
from dlrmkit.model.embedding import EmbeddingCollection, JaggedIds, bag_of_each, select_tables
from dlrmkit.model.interaction import CatInteraction, DotInteraction

SIZES = [3, 10, 1, 25]


def table_weight(coll: EmbeddingCollection, t: int) -> torch.Tensor:
    """The rows of table t inside its fused weight (a view)."""
    for group, fused in zip(coll.groups, coll.tables):
        if t in group:
            i = group.index(t)
            off = int(fused.row_offsets[i])
            return fused.weight[off : off + coll.table_sizes[t]]
    raise AssertionError(f"table {t} in no group")


def reference_bags(coll: EmbeddingCollection) -> list[nn.EmbeddingBag]:
    """One nn.EmbeddingBag(mode='sum') per table, holding a copy of the fused weights."""
    refs = []
    for t, (rows, dim) in enumerate(zip(coll.table_sizes, coll.dims)):
        bag = nn.EmbeddingBag(rows, dim, mode="sum")
        with torch.no_grad():
            bag.weight.copy_(table_weight(coll, t))
        refs.append(bag)
    return refs


def make_collection(sizes, dims, seed=0):
    coll = EmbeddingCollection(sizes, dims)
    coll.reset_parameters(torch.Generator().manual_seed(seed))
    return coll


def random_jagged(sizes, batch, gen, max_len=5):
    """Multi-hot ids with bag lengths 0..max_len, plus the same bags per table for the reference."""
    values, lengths, per_table = [], [], []
    for rows in sizes:
        bags = []
        for _ in range(batch):
            n = int(torch.randint(0, max_len + 1, (1,), generator=gen))
            bag = torch.randint(0, rows, (n,), generator=gen)
            bags.append(bag)
            values.append(bag)
            lengths.append(n)
        per_table.append(bags)
    offsets = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    return JaggedIds(torch.cat(values).long(), offsets, batch), per_table


def reference_from_bags(refs, per_table):
    outs = []
    for bag_module, bags in zip(refs, per_table):
        flat = torch.cat(bags).long()
        offsets = torch.tensor([0] + [len(b) for b in bags[:-1]], dtype=torch.int64).cumsum(0)
        outs.append(bag_module(flat, offsets))
    return outs  # per table [B, dim]


def fused_grad(coll, t):
    for group, fused in zip(coll.groups, coll.tables):
        if t in group:
            assert fused.weight.grad.is_sparse
            dense = fused.weight.grad.to_dense()
            off = int(fused.row_offsets[group.index(t)])
            return dense[off : off + coll.table_sizes[t]]
    raise AssertionError


# ---- embeddings -------------------------------------------------------------------------------------


def test_fused_layout():
    coll = make_collection([4, 6, 5, 2], [8, 4, 8, 4])
    assert not coll.uniform
    assert coll.groups == [[1, 3], [0, 2]]
    assert coll.tables[0].weight.shape == (8, 4) and coll.tables[1].weight.shape == (9, 8)
    assert coll.tables[1].row_offsets.tolist() == [0, 4]
    assert make_collection([3, 3], [4, 4]).uniform


@pytest.mark.parametrize("seed", [0, 1])
def test_one_hot_matches_separate_embedding_bags(seed):
    gen = torch.Generator().manual_seed(seed)
    coll = make_collection(SIZES, [6] * len(SIZES), seed)
    refs = reference_bags(coll)
    b = 17
    ids = torch.stack([torch.randint(0, n, (b,), generator=gen) for n in SIZES], dim=1)
    ids[0] = torch.tensor([n - 1 for n in SIZES])  # the last row of every table
    ids[1:4, 1] = 2  # duplicates in a batch
    out = coll(ids)
    assert out.shape == (b, len(SIZES), 6)
    expected = torch.stack([ref(ids[:, t : t + 1]) for t, ref in enumerate(refs)], dim=1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # gradients
    upstream = torch.randn(out.shape, generator=gen)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for t, ref in enumerate(refs):
        torch.testing.assert_close(fused_grad(coll, t), ref.weight.grad)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_hot_matches_separate_embedding_bags(seed):
    gen = torch.Generator().manual_seed(seed)
    coll = make_collection(SIZES, [5] * len(SIZES), seed)
    refs = reference_bags(coll)
    b = 13
    ids, per_table = random_jagged(SIZES, b, gen)
    lengths = ids.offsets[1:] - ids.offsets[:-1]
    assert lengths.min() == 0 and lengths.max() >= 3  # empty bags and real multi-hot bags
    assert ids.num_tables == len(SIZES)
    assert ids.table_lengths().tolist() == [sum(len(x) for x in bags) for bags in per_table]
    out = coll(ids)
    assert out.shape == (b, len(SIZES), 5)
    expected = torch.stack(reference_from_bags(refs, per_table), dim=1)
    torch.testing.assert_close(out, expected)
    empty = lengths.view(len(SIZES), b).t() == 0  # [B, T]
    assert torch.all(out[empty] == 0)
    upstream = torch.randn(out.shape, generator=gen)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for t, ref in enumerate(refs):
        torch.testing.assert_close(fused_grad(coll, t), ref.weight.grad)


def test_jagged_from_dense_equals_one_hot():
    coll = make_collection(SIZES, [4] * len(SIZES))
    ids = torch.tensor([[0, 9, 0, 24], [2, 0, 0, 3], [1, 5, 0, 5]])
    jagged = JaggedIds.from_dense(ids)
    assert jagged.num_tables == 4 and jagged.batch_size == 3
    assert jagged.values.tolist() == [0, 2, 1, 9, 0, 5, 0, 0, 0, 24, 3, 5]
    torch.testing.assert_close(coll(jagged), coll(ids))


@pytest.mark.parametrize("multi_hot", [False, True])
def test_mixed_widths_match_separate_embedding_bags(multi_hot):
    gen = torch.Generator().manual_seed(4)
    sizes, dims = [7, 3, 12, 5, 9], [8, 2, 4, 8, 2]
    coll = make_collection(sizes, dims)
    assert len(coll.groups) == 3
    refs = reference_bags(coll)
    b = 11
    if multi_hot:
        ids, per_table = random_jagged(sizes, b, gen)
        parts = reference_from_bags(refs, per_table)
    else:
        ids = torch.stack([torch.randint(0, n, (b,), generator=gen) for n in sizes], dim=1)
        parts = [ref(ids[:, t : t + 1]) for t, ref in enumerate(refs)]
    out = coll(ids)
    expected = torch.cat(parts, dim=1)  # in table order, not width order
    assert out.shape == (b, sum(dims))
    torch.testing.assert_close(out, expected)
    upstream = torch.randn(out.shape, generator=gen)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for t, ref in enumerate(refs):
        torch.testing.assert_close(fused_grad(coll, t), ref.weight.grad)


@pytest.mark.parametrize("num_bags", [0, 1, 2, 40])
def test_bag_of_each_equals_repeat_interleave_with_empty_bags(num_bags):
    gen = torch.Generator().manual_seed(num_bags)
    lengths = torch.randint(0, 4, (num_bags,), generator=gen)
    if num_bags > 2:
        lengths[0] = lengths[-2] = lengths[-1] = 0  # empty bags first and last, and two in a row
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    got = bag_of_each(offsets, int(offsets[-1]))
    assert torch.equal(got, torch.repeat_interleave(torch.arange(num_bags), lengths))


def test_sample_major_order_and_table_offsets():
    gen = torch.Generator().manual_seed(2)
    ids, per_table = random_jagged([4, 5, 6], 3, gen)
    values, offsets = ids.sample_major(torch.tensor([0, 100, 1000]))
    for s in range(3):
        for t, add in enumerate([0, 100, 1000]):
            got = values[offsets[s * 3 + t] : offsets[s * 3 + t + 1]]
            assert got.tolist() == (per_table[t][s] + add).tolist()


def test_select_tables_jagged():
    gen = torch.Generator().manual_seed(0)
    ids, per_table = random_jagged([4, 5, 6], 3, gen)
    sub = select_tables(ids, [2, 0])
    assert sub.batch_size == 3 and sub.num_tables == 2
    for k, t in enumerate([2, 0]):
        for s in range(3):
            got = sub.values[sub.offsets[k * 3 + s] : sub.offsets[k * 3 + s + 1]]
            assert got.tolist() == per_table[t][s].tolist()


def test_reset_parameters_bounds():
    coll = make_collection([4, 400], [3, 3])
    w0, w1 = table_weight(coll, 0), table_weight(coll, 1)
    assert w0.abs().max() <= math.sqrt(1 / 4) and w0.abs().max() > 0.5 * math.sqrt(1 / 4)
    assert w1.abs().max() <= math.sqrt(1 / 400)


def test_id_zero_starts_at_zero_in_every_table_and_shard():
    """Id 0 (unseen, rare and missing values) starts at zero, so a value no training row had adds
    nothing through its row; every other row starts random, and a shard of rows [2, 400) gets the
    single-device init of those rows."""
    from dlrmkit.model.embedding import init_table_block

    coll = make_collection([4, 400], [3, 3])
    for t in (0, 1):
        w = table_weight(coll, t)
        assert torch.count_nonzero(w[0]) == 0
        assert bool((w[1:].abs().sum(dim=1) > 0).all())
    whole, shard = torch.empty(400, 3), torch.empty(398, 3)
    init_table_block(whole, base=7, table=1, table_rows=400, dim=3)
    init_table_block(shard, base=7, table=1, table_rows=400, dim=3, row_start=2)
    assert torch.equal(whole[2:], shard) and torch.count_nonzero(whole[0]) == 0


# ---- interactions -----------------------------------------------------------------------------------


def naive_dot(dense, pooled, self_interaction):
    feats = [dense] + [pooled[:, t] for t in range(pooled.shape[1])]
    out = [dense]
    for i in range(len(feats)):
        for j in range(i + 1 if self_interaction else i):
            out.append((feats[i] * feats[j]).sum(dim=1, keepdim=True))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("tables", [1, 3, 8])
def test_dot_interaction_matches_naive_loop(self_interaction, tables):
    gen = torch.Generator().manual_seed(tables)
    b, d = 5, 4
    dense, pooled = torch.randn(b, d, generator=gen), torch.randn(b, tables, d, generator=gen)
    inter = DotInteraction(tables + 1, self_interaction)
    n = tables + 1
    pairs = n * (n + 1) // 2 if self_interaction else n * (n - 1) // 2
    assert inter.num_pairs == pairs and inter.output_size(d) == d + pairs
    out = inter(dense, pooled)
    assert out.shape == (b, d + pairs)
    torch.testing.assert_close(out, naive_dot(dense, pooled, self_interaction))


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("has_dense", [False, True])
def test_dot_interaction_gradient_matches_naive_loop(self_interaction, has_dense):
    """PairDots' one-bmm backward ((G + G^T) F) against autograd through the naive loop."""
    gen = torch.Generator().manual_seed(7)
    b, tables, d = 3, 4, 5
    dense = torch.randn(b, d, generator=gen, dtype=torch.float64, requires_grad=True)
    pooled = torch.randn(b, tables, d, generator=gen, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(b, 64, generator=gen, dtype=torch.float64)
    inter = DotInteraction(tables + int(has_dense), self_interaction, has_dense)

    def naive(dense, pooled):
        if has_dense:
            return naive_dot(dense, pooled, self_interaction)
        return naive_dot(pooled[:, 0], pooled[:, 1:], self_interaction)[:, d:]

    got = inter(dense if has_dense else None, pooled)
    want = naive(dense, pooled)
    torch.testing.assert_close(got, want)
    inputs = (dense, pooled) if has_dense else (pooled,)
    g_got = torch.autograd.grad((got * weights[:, : got.shape[1]]).sum(), inputs)
    g_want = torch.autograd.grad((want * weights[:, : want.shape[1]]).sum(), inputs)
    for a, w in zip(g_got, g_want):
        torch.testing.assert_close(a, w)
    assert torch.autograd.gradcheck(lambda *x: inter(*x) if has_dense else inter(None, *x), inputs)


def test_cat_interaction():
    dense, pooled = torch.randn(2, 3), torch.randn(2, 4, 3)
    inter = CatInteraction(5)
    out = inter(dense, pooled)
    assert out.shape == (2, inter.output_size(3)) == (2, 15)
    torch.testing.assert_close(out[:, 3:6], pooled[:, 0])


# ---- the DLRM ---------------------------------------------------------------------------------------


def small_config(**kw):
    base = dict(num_numerical=4, table_sizes=[3, 5, 7], embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[16, 4, 1])
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_dlrm_forward_shape_and_backward(interaction):
    model = DLRM(small_config(interaction=interaction))
    model.reset_parameters(0)
    b = 9
    dense = torch.randn(b, 4)
    ids = torch.stack([torch.randint(0, n, (b,)) for n in [3, 5, 7]], dim=1)
    out = model(dense, ids)
    assert out.shape == (b,)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert model.embeddings.tables[0].weight.grad.is_sparse
    assert all(p.grad is not None and not p.grad.is_sparse for p in model.dense_parameters())
    n_emb = sum(p.numel() for p in model.embeddings.parameters())
    assert n_emb == 15 * 8
    assert sum(p.numel() for p in model.dense_parameters()) + n_emb == sum(p.numel() for p in model.parameters())
    # multi-hot input with one id per bag gives the same logits
    torch.testing.assert_close(model(dense, JaggedIds.from_dense(ids)), out)


def test_dlrm_top_mlp_input_size():
    model = DLRM(small_config())
    # 4 features (dense + 3 tables): 6 pairs + 8 dense dims
    assert model.top_mlp[0].in_features == 8 + 6
    assert model.bottom_mlp[0].in_features == 4
    assert isinstance(model.bottom_mlp[-1], nn.ReLU) and isinstance(model.top_mlp[-1], nn.Linear)


def test_reset_parameters_is_deterministic():
    a, b, c = DLRM(small_config()), DLRM(small_config()), DLRM(small_config())
    a.reset_parameters(123)
    b.reset_parameters(123)
    c.reset_parameters(124)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(not torch.equal(sa[k], sc[k]) for k in sa)
    # the global RNG is neither used nor advanced
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    a.reset_parameters(5)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(bottom_mlp=[16, 7]), "embedding dim"),
        (dict(top_mlp=[16, 2]), "1 output"),
        (dict(top_mlp=[]), "1 output"),
        (dict(interaction="attention"), "unknown interaction"),
        (dict(num_numerical=0), "empty bottom MLP"),
    ],
)
def test_bad_model_config(kw, match):
    with pytest.raises(DlrmkitError, match=match):
        DLRM(small_config(**kw))


def test_dlrm_without_numerical_features():
    model = DLRM(small_config(num_numerical=0, bottom_mlp=[]))
    model.reset_parameters(0)
    ids = torch.zeros(4, 3, dtype=torch.int64)
    assert model(torch.zeros(4, 0), ids).shape == (4,)


def test_flops_per_sample_hand_count():
    cfg = ModelConfig(num_numerical=4, table_sizes=[10, 20, 30], embedding_dim=4, bottom_mlp=[8, 4], top_mlp=[6, 1])
    bottom = 2 * 4 * 8 + 2 * 8 * 4  # 128
    interaction = 2 * 4 * 4 * 4  # batched gram matrix of 4 features of dim 4: 128
    top_in = 4 + 6  # dense dims + pairs among 4 features
    top = 2 * top_in * 6 + 2 * 6 * 1  # 132
    assert flops_per_sample(cfg, backward=False) == bottom + interaction + top == 388
    assert flops_per_sample(cfg) == 3 * 388
    cfg_self = ModelConfig(4, [10, 20, 30], 4, [8, 4], [6, 1], self_interaction=True)
    assert flops_per_sample(cfg_self, backward=False) == 128 + 128 + 2 * (4 + 10) * 6 + 12
    cfg_cat = ModelConfig(4, [10, 20, 30], 4, [8, 4], [6, 1], interaction="cat")
    assert flops_per_sample(cfg_cat, backward=False) == 128 + 2 * 16 * 6 + 12
    # the count agrees with the model's actual top MLP input size
    for c in (cfg, cfg_self, cfg_cat):
        assert DLRM(c).top_mlp[0].in_features == {id(cfg): 10, id(cfg_self): 14, id(cfg_cat): 16}[id(c)]


def test_dot_interaction_gradient_under_bf16_autocast():
    """Under CPU bf16 autocast the one-bmm backward matches autograd through plain bmm (same
    bf16 rounding), and gradients come back in the inputs' dtype."""
    gen = torch.Generator().manual_seed(3)
    dense = torch.randn(6, 8, generator=gen, requires_grad=True)
    pooled = torch.randn(6, 5, 8, generator=gen, requires_grad=True)
    inter = DotInteraction(6)
    weights = torch.randn(6, inter.output_size(8), generator=gen)

    def plain(d, p):
        feats = torch.cat([d.unsqueeze(1), p], dim=1)
        pairs = torch.bmm(feats, feats.transpose(1, 2)).flatten(1).index_select(1, inter.flat_index)
        return torch.cat([d, pairs], dim=1)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = inter(dense, pooled), plain(dense, pooled)
    g_got = torch.autograd.grad((got.float() * weights).sum(), (dense, pooled))
    g_want = torch.autograd.grad((want.float() * weights).sum(), (dense, pooled))
    assert all(g.dtype == torch.float32 for g in g_got)
    for a, w in zip(g_got, g_want):
        torch.testing.assert_close(a, w, rtol=2e-2, atol=2e-2)
