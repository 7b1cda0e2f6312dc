"""The planner's choices are pinned: for several table sets, world sizes, strategies, memory
limits and optimizer states, the shards chosen, the per-rank cost figures, the report `dlrmkit
plan` prints (with its notes) and the one-line refusals equal those recorded in
tests/golden/plans.json. A change to the planner or its cost model that moves any of them fails
here; if the change is meant, rewrite the file with `python tests/test_plan_pinned.py --write`
and review its diff."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dlrmkit.commands.plan import MULTI_HOT_TABLES
from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.plan import GiB, PRESET_TABLES, make_plan

GOLDEN = Path(__file__).resolve().parent / "golden" / "plans.json"
SMALL = [3, 8, 20, 300, 500, 2500, 70_000]

# name -> (tables (a preset name or sizes), dim, world size, strategy, make_plan keyword arguments)
CASES: dict[str, tuple] = {
    "small-auto-1": (SMALL, 16, 1, "auto", {"batch_size": 50, "min_rows_sharded": 16}),
    "small-auto-3": (SMALL, 16, 3, "auto", {"batch_size": 50, "min_rows_sharded": 16}),
    "small-auto-4-adagrad": (SMALL, 16, 4, "auto", {"batch_size": 50, "min_rows_sharded": 16, "optimizer_state": 1.0}),
    "small-table-3": (SMALL, 16, 3, "table_wise", {"batch_size": 50}),
    "small-column-3": (SMALL, 16, 3, "column_wise", {"batch_size": 50}),
    "small-column-5-narrow": (SMALL, 8, 5, "column_wise", {"batch_size": 50}),
    "small-row-4": (SMALL, 16, 4, "row_wise", {"batch_size": 50}),
    "small-replicated-2": (SMALL, 16, 2, "data_parallel", {"batch_size": 50}),
    "narrow-auto-4": ([5000, 6000], 4, 4, "auto", {"batch_size": 64}),
    "kaggle-auto-2": ("criteo-kaggle", 16, 2, "auto", {"batch_size": 128}),
    "kaggle-auto-8": ("criteo-kaggle", 16, 8, "auto", {}),
    # a CPU host's share: small per-rank batches replicate every table that fits, larger ones shard
    "kaggle-auto-2-host-6GiB": ("criteo-kaggle", 16, 2, "auto", {"batch_size": 128, "replicate_memory": 6 * GiB}),
    "kaggle-auto-2-host-2GiB": ("criteo-kaggle", 16, 2, "auto", {"batch_size": 128, "replicate_memory": 2 * GiB}),
    "kaggle-auto-2-host-batch-1024": (
        "criteo-kaggle",
        16,
        2,
        "auto",
        {"batch_size": 1024, "replicate_memory": 6 * GiB},
    ),
    "kaggle-row-8-rowwise-adagrad": ("criteo-kaggle", 16, 8, "row_wise", {"optimizer_state": 1 / 16}),
    "kaggle-column-3": ("criteo-kaggle", 16, 3, "column_wise", {"batch_size": 4096}),
    "kaggle-auto-4-700MiB": ("criteo-kaggle", 16, 4, "auto", {"device_memory": 700 << 20, "batch_size": 2048}),
    "kaggle-auto-4-600MiB-refused": ("criteo-kaggle", 16, 4, "auto", {"device_memory": 600 << 20, "batch_size": 2048}),
    "mlperf-auto-8-80GiB": ("criteo-1tb-mlperf", 128, 8, "auto", {"device_memory": 80 * GiB}),
    "mlperf-auto-64-80GiB": ("criteo-1tb-mlperf", 128, 64, "auto", {"device_memory": 80 * GiB}),
    "mlperf-auto-16-16GiB-adagrad": (
        "criteo-1tb-mlperf",
        128,
        16,
        "auto",
        {"device_memory": 16 * GiB, "optimizer_state": 1.0, "bytes_per_value": 2},
    ),
    "113b-auto-8-80GiB": ("criteo-1tb-113b", 128, 8, "auto", {"device_memory": 80 * GiB}),
    "113b-auto-100-24GiB": ("criteo-1tb-113b", 128, 100, "auto", {"device_memory": 24 * GiB}),
    "113b-auto-4-80GiB-refused": ("criteo-1tb-113b", 128, 4, "auto", {"device_memory": 80 * GiB}),
    "replicated-too-large-refused": ([1000, 1500], 64, 2, "auto", {"device_memory": 1 << 20}),
    # MLPerf DLRM-DCNv2's bags: the hot tables cut row-wise, placement balancing lookups and memory
    "mlperf-multihot-auto-8-80GiB-adagrad": (
        "criteo-1tb-mlperf-multihot",
        128,
        8,
        "auto",
        {"device_memory": 80 * GiB, "optimizer_state": 1.0, "bags": MULTI_HOT_TABLES["criteo-1tb-mlperf-multihot"][2]},
    ),
}


def outcome(name: str) -> dict:
    """What the planner gives for case `name`: its plan, figures and report, or its refusal."""
    tables, dim, world, strategy, kw = CASES[name]
    rows = (PRESET_TABLES.get(tables) or MULTI_HOT_TABLES[tables])[0] if isinstance(tables, str) else tables
    try:
        plan = make_plan(rows, dim, world, strategy, **kw)
    except DlrmkitError as exc:
        return {"error": str(exc)}
    return {
        "tables": [
            [tp.strategy, [[s.rank, s.row_start, s.row_end, s.col_start, s.col_end] for s in tp.shards]]
            for tp in plan.tables
        ],
        "ranks": [[st["memory"], st["lookups"], st["sent_bytes"]] for st in plan.rank_stats()],
        "report": plan.report().splitlines(),
    }


def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", list(CASES))
def test_plan_is_pinned(name):
    want = golden()[name]
    got = outcome(name)
    assert got.get("error") == want.get("error")
    assert got.get("report") == want.get("report")
    assert got == want


def test_every_case_is_recorded_and_the_refusals_refuse():
    data = golden()
    assert sorted(data) == sorted(CASES)
    assert [n for n in CASES if "error" in data[n]] == [n for n in CASES if n.endswith("-refused")]
    strategies = {s for n in CASES if "tables" in data[n] for s, _ in data[n]["tables"]}
    assert strategies == {"data_parallel", "table_wise", "column_wise", "row_wise"}


@pytest.mark.parametrize(
    "args,name",
    [
        (["--tables-preset", "criteo-kaggle", "--world-size", "8"], "kaggle-auto-8"),
        (
            ["--tables-preset", "criteo-1tb-mlperf", "--world-size", "64", "--device-memory", "80GiB"],
            "mlperf-auto-64-80GiB",
        ),
        (
            [
                "--tables",
                ",".join(f"{r}x16" for r in SMALL),
                "--world-size",
                "4",
                "--sharding",
                "row_wise",
                "--batch-size",
                "50",
            ],
            "small-row-4",
        ),
    ],
)
def test_plan_command_prints_the_pinned_report(cli, args, name):
    r = cli("plan", *args)
    assert r.code == 0, r.err
    assert r.out.splitlines() == golden()[name]["report"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    text = json.dumps({n: outcome(n) for n in CASES}, indent=1)
    text = re.sub(
        r"\[\s+([-0-9, \n]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text
    )  # a shard a line
    GOLDEN.write_text(text + "\n", encoding="utf-8")
