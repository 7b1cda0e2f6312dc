"""The sharding planner: presets fit (or fail with one line), every rank gets work, plans
round-trip through JSON and reject hand edits that break the tiling."""

from __future__ import annotations

import json

import pytest

from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.plan import GiB, PRESET_TABLES, ShardingPlan, make_plan


def test_113b_preset_shape():
    rows, dim = PRESET_TABLES["criteo-1tb-113b"]
    assert (len(rows), sum(rows), max(rows), dim) == (26, 882_000_000, 292_000_000, 128)


def test_113b_fits_on_8_devices(cli, tmp_path):
    out = tmp_path / "plan.json"
    r = cli(
        "plan", "--tables-preset", "criteo-1tb-113b", "--world-size", "8", "--device-memory", "80GiB", "--json", out
    )
    assert r.code == 0, r.err
    plan = ShardingPlan.load(str(out))
    stats = plan.rank_stats()
    assert all(0 < s["memory"] < 80 * GiB for s in stats)
    assert "rank" in r.out and len(r.out.splitlines()) >= 8 + 3


def test_113b_fails_on_4_devices_with_one_line(cli):
    r = cli("plan", "--tables-preset", "criteo-1tb-113b", "--world-size", "4", "--device-memory", "80GiB")
    assert r.code == 2
    line = r.err.strip()
    assert "\n" not in line and "table" in line and "GiB" in line and "80.0 GiB" in line


def test_mlperf_on_64_ranks_gives_every_rank_work():
    rows, dim = PRESET_TABLES["criteo-1tb-mlperf"]
    plan = make_plan(rows, dim, 64, device_memory=80 * GiB)
    owners = {s.rank for tp in plan.tables if tp.model_parallel for s in tp.shards}
    assert owners == set(range(64))
    assert all(s.cols >= 4 for tp in plan.tables for s in tp.shards)
    assert any(tp.strategy == "column_wise" for tp in plan.tables)


@pytest.mark.parametrize("strategy", ["auto", "table_wise", "column_wise", "row_wise", "data_parallel"])
@pytest.mark.parametrize("world", [1, 3])
def test_forced_strategies_tile_tables(strategy, world, tmp_path):
    plan = make_plan([3, 8, 20, 300, 500], 16, world, strategy, batch_size=50, min_rows_sharded=16)
    plan.validate()
    if strategy != "auto":
        assert {tp.strategy for tp in plan.tables} == {strategy}
    path = tmp_path / "p.json"
    plan.save(str(path))
    assert ShardingPlan.load(str(path)) == plan
    assert "rank" in plan.report()


def test_hand_edited_plan_is_checked(tmp_path):
    plan = make_plan([300, 500], 16, 2, "column_wise")
    d = plan.to_dict()
    d["tables"][0]["shards"][0]["col_end"] = 5  # leaves a gap
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(DlrmkitError, match="table 0"):
        ShardingPlan.load(str(path))


def test_a_plan_for_other_tables_names_the_table_that_differs():
    plan = make_plan([300, 500, 40], 16, 2, "table_wise")
    with pytest.raises(DlrmkitError, match="3 tables, but the model has 2"):
        plan.check_matches([300, 500], 16, 2)
    with pytest.raises(DlrmkitError, match="table 2 is 40 x 16, but the model's is 41 x 16"):
        plan.check_matches([300, 500, 41], 16, 2)
    plan.check_matches([300, 500, 40], 16, 2)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_tables_with_a_per_row_optimizer_state_are_never_cut_into_column_slices(world):
    sizes = [200_000, 60_000, 3_000, 40]
    plan = make_plan(sizes, 16, world, batch_size=4096, optimizer_state=1 / 16, row_state=True)
    assert all(s.cols == tp.dim for tp in plan.tables for s in tp.shards)
    assert {s.rank for tp in plan.tables if tp.model_parallel for s in tp.shards} == set(range(world))
    assert any(tp.strategy == "column_wise" for tp in make_plan(sizes, 16, world, batch_size=4096).tables)
    with pytest.raises(DlrmkitError, match="--sharding column_wise: table 0 is cut into column slices"):
        make_plan(sizes, 16, world, "column_wise", row_state=True)


def test_tables_option(cli):
    r = cli("plan", "--tables", "1000000x64,5000x64,100x64", "--world-size", "2")
    assert r.code == 0 and "data_parallel 1" in r.out
    assert cli("plan", "--tables", "10x5x3", "--world-size", "2").code == 2


def test_a_batch_smaller_than_the_world_is_refused_as_train_refuses_it(cli):
    r = cli("plan", "--tables", "1000x16,50x16", "--world-size", "4", "--batch-size", "3")
    assert r.code == 2 and "--batch-size 3 is smaller than the world size 4" in r.err, r.err
    assert cli("plan", "--tables", "1000x16,50x16", "--world-size", "4", "--batch-size", "4").code == 0
