"""Sharding strategies own what makes them different: each module's STRATEGY cuts tables,
checks layouts, selects a shard's ids and names its output columns; embedding modules expose
their tables as logical pieces (what checkpoints save). Single process, no process group."""

from __future__ import annotations

import inspect

import pytest
import torch

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import EmbeddingCollection
from dlrmkit.parallel import sharded_embedding
from dlrmkit.parallel.plan import ShardingPlan, make_plan
from dlrmkit.parallel.sharded_embedding import ShardedEmbedding
from dlrmkit.parallel.sharding import STRATEGIES, Shard, Strategy, strategy
from dlrmkit.checkpoint import state as ckpt_state

TABLES = [3, 8, 20, 300, 500]


def test_every_name_loads_its_strategy_and_no_other_name_loads():
    for name in STRATEGIES:
        st = strategy(name)
        assert isinstance(st, Strategy) and st.name == name
    assert [n for n in STRATEGIES if not strategy(n).model_parallel] == ["data_parallel"]
    with pytest.raises(KeyError):
        strategy("os")  # a plan file's name is looked up, never imported


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_strategy_shards_pass_its_own_check(name, world):
    st = strategy(name)
    for rows in TABLES:
        n = world if not st.model_parallel else st.split_count(rows, 16, world)
        shards = st.shards(rows, 16, list(range(n)))
        assert st.check(rows, 16, shards, world) is None
        if st.model_parallel:
            assert sum(s.rows * s.cols for s in shards) == rows * 16


@pytest.mark.parametrize(
    "name,edit,message",
    [
        (
            "table_wise",
            lambda t: t["shards"].append({**t["shards"][0], "row_start": 100}) or t["shards"][0].update(row_end=100),
            "one shard holding all of it",
        ),
        (
            "column_wise",
            lambda t: t["shards"].append({**t["shards"][0], "row_start": 100}) or t["shards"][0].update(row_end=100),
            "each hold all its rows",
        ),
        ("data_parallel", lambda t: t["shards"].pop(), "one full shard on every rank"),
    ],
)
def test_a_layout_its_strategy_cannot_serve_is_refused(name, edit, message, tmp_path):
    """A hand-edited plan whose table is tiled but not in its strategy's layout: one line."""
    d = make_plan([300, 500], 16, 2, name, min_rows_sharded=1).to_dict()
    edit(d["tables"][1])
    with pytest.raises(DlrmkitError, match=f"plan: table 1: .*{message}"):
        ShardingPlan.from_dict(d)


def test_row_wise_grids_are_a_row_wise_layout():
    """Row ranges cut into column slices (a grid) are row-wise: bucketed ids, shared by slices."""
    d = make_plan([300], 16, 4, "row_wise").to_dict()
    d["tables"][0]["shards"] = [
        dict(rank=r, row_start=a, row_end=b, col_start=c, col_end=c + 8)
        for r, (a, b, c) in enumerate([(0, 100, 0), (0, 100, 8), (100, 300, 0), (100, 300, 8)])
    ]
    plan = ShardingPlan.from_dict(d)
    emb = ShardedEmbedding(plan, 0)
    assert emb.bucketed and emb.all_keys[1] == [(0, 0, 100)] and emb.all_keys[2] == [(0, 100, 300)]


def loop_select(values, lengths, a, e):
    """Reference: bag by bag, the ids in [a, e) relative to a, and their count."""
    out, counts, pos = [], [], 0
    for n in lengths.tolist():
        bag = [v - a for v in values[pos : pos + n].tolist() if a <= v < e]
        out += bag
        counts.append(len(bag))
        pos += n
    return out, counts


@pytest.mark.parametrize("one_hot", [True, False])
def test_row_wise_selects_the_ids_in_its_range(one_hot):
    g = torch.Generator().manual_seed(0)
    lengths = torch.ones(40, dtype=torch.int64) if one_hot else torch.randint(0, 5, (40,), generator=g)
    values = torch.randint(0, 300, (int(lengths.sum()),), generator=g)
    st = strategy("row_wise")
    for a, e in [(0, 100), (100, 250), (250, 300)]:
        v, l = st.select_ids(values, lengths, one_hot, a, e, 300)
        want_v, want_l = loop_select(values, lengths, a, e)
        assert v.tolist() == want_v and l.tolist() == want_l and len(want_v) > 0
    v, l = st.select_ids(values, lengths, one_hot, 0, 300, 300)
    assert v is values and l is lengths  # a whole table: ids travel unchanged, no bucketing
    assert not st.buckets(0, 300, 300) and st.buckets(0, 100, 300)


def test_column_slices_sit_side_by_side_and_row_ranges_sum():
    col = strategy("column_wise")
    cols = [list(col.columns(2, s, 16)) for s in col.shards(50, 16, [0, 1, 2])]
    assert sorted(c for cs in cols for c in cs) == list(range(32, 48))
    row = strategy("row_wise")
    assert {tuple(row.columns(2, s, 16)) for s in row.shards(50, 16, [0, 1, 2])} == {tuple(range(32, 48))}


def test_collection_pieces_are_views_of_its_weights():
    coll = EmbeddingCollection([5, 7, 3], [4, 8, 4])
    pieces = coll.logical_shards()
    assert [(p.table, p.rows, p.cols, p.rank) for p in pieces] == [(0, 5, 4, None), (2, 3, 4, None), (1, 7, 8, None)]
    with torch.no_grad():
        pieces[1].data.fill_(2.5)
    assert coll.tables[0].weight[5:8].eq(2.5).all() and not coll.tables[0].weight[:5].eq(2.5).any()


@pytest.mark.parametrize("name", ["auto", "column_wise", "row_wise", "table_wise", "data_parallel"])
def test_sharded_pieces_tile_every_table_and_hold_this_ranks_weights(name):
    """Over both ranks' modules: every model-parallel table's pieces tile it once, each rank's
    own pieces carry its weights (the single-device values after load_from); replicated tables
    are one whole piece on every rank."""
    plan = make_plan(TABLES, 16, 2, name, min_rows_sharded=16)
    coll = EmbeddingCollection(TABLES, [16] * len(TABLES))
    coll.reset_parameters(torch.Generator().manual_seed(3))
    full = {p.table: p.data for p in coll.logical_shards()}
    held = {t: 0 for t in range(len(TABLES))}
    for rank in (0, 1):
        emb = ShardedEmbedding(plan, rank)
        emb.load_from(coll)
        pieces = emb.logical_shards()
        assert sorted({p.table for p in pieces}) == list(range(len(TABLES)))
        for p in pieces:
            if p.rank is None:
                assert not plan.tables[p.table].model_parallel
                torch.testing.assert_close(p.data, full[p.table])
                continue
            assert (p.weight is not None) == (p.rank == rank)
            if p.weight is not None:
                held[p.table] += p.rows * p.cols
                torch.testing.assert_close(p.data, full[p.table][p.row_start : p.row_end, p.col_start : p.col_end])
    for t, tp in enumerate(plan.tables):
        assert held[t] == (tp.rows * tp.dim if tp.model_parallel else 0)


def test_the_orchestrator_and_checkpoints_name_no_strategy_internals():
    """ShardedEmbedding asks each table's strategy; checkpoints read only logical pieces."""
    source = inspect.getsource(sharded_embedding)
    assert not [n for n in STRATEGIES if n in source]
    state = inspect.getsource(ckpt_state)
    assert not [f for f in ("local_tables", "group_keys", "dp_table", "row_offsets", ".shards[") if f in state]
    assert Shard(0, 0, 2, 0, 4).cols == 4
