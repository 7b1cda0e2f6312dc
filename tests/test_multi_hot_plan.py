"""Planning and simulating MLPerf DLRM-DCNv2's multi-hot model: lookups and id bytes count every
id of every bag, the cross network's FLOPs and weights count in the simulated step."""

from __future__ import annotations

import re

import pytest

from dlrmkit.parallel.plan import make_plan

from helpers import run_cli

BAGS = [3, 1, 7, 2]


def stats_with_bags(bags, world=2, strategy="table_wise"):
    plan = make_plan([1000, 2000, 3000, 4000], 16, world, strategy, None, 64)
    for tp, k in zip(plan.tables, bags):
        tp.bag = k
    return plan.rank_stats()


def test_lookups_and_id_bytes_count_every_id_of_each_bag():
    one, multi = stats_with_bags([1] * 4), stats_with_bags(BAGS)
    assert sum(st["lookups"] for st in one) == 64 * 4
    assert sum(st["lookups"] for st in multi) == 64 * sum(BAGS)
    per_rank_ids = [sum(BAGS[t] + 1 for t, _ in st["shards"]) for st in multi]  # ids and a bag length each
    one_ids = [len(st["shards"]) for st in one]
    for r in range(2):  # the extra bytes are the other rank's samples' extra ids, 8 bytes each
        other = 1 - r
        extra = 32 * (per_rank_ids[other] - one_ids[other]) * 8
        assert multi[r]["sent_bytes"] - one[r]["sent_bytes"] == extra
        assert multi[r]["memory"] > one[r]["memory"]  # the shard's id buffer holds the bags
    replicated = stats_with_bags(BAGS, strategy="data_parallel")
    assert sum(st["lookups"] for st in replicated) == 64 * sum(BAGS)  # each rank its local samples


def test_a_saved_plan_keeps_its_bag_sizes(tmp_path):
    """A plan file read back costs the same lookups: each table's bag is saved and read, checked."""
    import json

    from dlrmkit.errors import DlrmkitError
    from dlrmkit.parallel.plan import ShardingPlan

    plan = make_plan([1000, 2000, 3000, 4000], 16, 2, "table_wise", None, 64)
    for tp, k in zip(plan.tables, BAGS):
        tp.bag = k
    path = str(tmp_path / "plan.json")
    plan.save(path)
    again = ShardingPlan.load(path)
    assert [tp.bag for tp in again.tables] == BAGS
    assert again.rank_stats() == plan.rank_stats()
    doc = json.loads(open(path).read())
    doc["tables"][2]["bag"] = 0
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(DlrmkitError, match="table 2 bag must be an integer"):
        ShardingPlan.load(path)


@pytest.mark.parametrize("world", [8, 64])
def test_plan_of_the_mlperf_multi_hot_preset(world):
    r = run_cli(
        "plan", "--tables-preset", "criteo-1tb-mlperf-multihot", "--world-size", world, "--device-memory", "80e9"
    )
    assert r.code == 0, r.err
    assert "multi-hot: 214 ids per sample" in r.out and f"26 tables on {world} ranks" in r.out
    lookups = [int(m.replace(",", "")) for m in re.findall(r"^\s+\d+\s+[\d.]+ \w+\s+([\d,]+)", r.out, re.M)]
    assert len(lookups) == world
    # the 100-id table is cut row-wise, and the plan says so: no rank takes its 6.5M lookups alone
    assert "note: table 20 (100 ids per sample, 6,553,600 lookups per step) row-wise over" in r.out
    assert max(lookups) < 65536 * 100 // 2


def test_bags_spread_a_hot_table_and_the_lookup_ratio_falls():
    """The planner told the bag sizes cuts the hot multi-hot table row-wise and places shards by
    lookups as well as memory: the max/min lookups per rank fall (against the memory-only plan of
    the same tables, bags set afterwards, as plans were made before), every rank's memory stays
    within the device, and the plan still tiles every table."""
    from dlrmkit.commands.plan import MULTI_HOT_TABLES
    from dlrmkit.parallel.plan import GiB

    rows, dim, bags, _ = MULTI_HOT_TABLES["criteo-1tb-mlperf-multihot"]
    memory_only = make_plan(rows, dim, 8, "auto", 80 * GiB, 65536, optimizer_state=1.0)
    for tp, k in zip(memory_only.tables, bags):
        tp.bag = k
    balanced = make_plan(rows, dim, 8, "auto", 80 * GiB, 65536, optimizer_state=1.0, bags=bags)

    def ratio(plan, field):
        values = [st[field] for st in plan.rank_stats()]
        return max(values) / min(values)

    hot = balanced.tables[bags.index(100)]
    assert hot.strategy == "row_wise" and len({s.rank for s in hot.shards}) >= 4
    assert memory_only.tables[bags.index(100)].strategy != "row_wise"
    assert ratio(memory_only, "lookups") > 8 and ratio(balanced, "lookups") < 2.5
    assert ratio(balanced, "lookup_bytes") < ratio(memory_only, "lookup_bytes") / 2
    assert max(st["memory"] for st in balanced.rank_stats()) <= 80 * GiB
    assert sum(st["lookups"] for st in balanced.rank_stats()) <= sum(st["lookups"] for st in memory_only.rank_stats())
    assert any("row-wise over" in note for note in balanced.notes)
    balanced.validate()


def test_simulated_step_of_the_multi_hot_dcn_model_is_longer():
    def step_ms(preset: str) -> float:
        r = run_cli("plan", "--tables-preset", preset, "--simulate", "--world-size", 8, "--hardware", "h100")
        assert r.code == 0, r.err
        return float(r.out.splitlines()[-1].split()[2])

    r = run_cli("plan", "--tables-preset", "criteo-1tb-mlperf-multihot", "--simulate", "--world-size", 8)
    assert "multi-hot, 214 ids per sample; DCNv2 interaction, 3 layers of rank 512" in r.out
    assert step_ms("criteo-1tb-mlperf-multihot") > 2 * step_ms("criteo-1tb-mlperf")


def test_dense_costs_of_the_cross_network():
    from dlrmkit.perf.simulate import dense_costs

    flops_dot, _, params_dot = dense_costs(128, 26)
    flops_dcn, _, params_dcn = dense_costs(128, 26, cross=(3, 512))
    n = 27 * 128
    assert params_dcn - params_dot > 3 * 2 * n * 512  # the cross layers' U and V
    assert flops_dcn > flops_dot
