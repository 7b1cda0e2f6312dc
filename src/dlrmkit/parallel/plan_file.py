"""Reading a sharding plan file (`train --plan`, `evaluate --plan`), which may have been edited by
hand or come from elsewhere: every field of its type and range before anything is built from it
(an integer is never a float, a bool or text; counts and sizes within the command line's limits;
shard fields exactly the five of a Shard), so a bad plan is one line naming the field. Plans
name strategies only from dlrmkit.parallel.sharding.STRATEGIES (checked by ShardingPlan.validate):
a file never chooses what is imported. It knows nothing of ShardingPlan: dlrmkit.parallel.plan
builds the plan from the fields read here."""

from __future__ import annotations

from typing import Any

from dlrmkit.errors import DlrmkitError
from dlrmkit.parallel.plan_cost import TablePlan
from dlrmkit.parallel.sharding import Shard

MAX_SHARDS = 2_000_000  # about 0.5 GiB of plan and a few seconds of planning per million (the planner's bound too)
MAX_PLAN_BYTES = 256 << 20  # a plan file of MAX_SHARDS shards (about 100 bytes each)
MAX_WORLD_SIZE, MAX_ROWS, MAX_DIM = 1 << 16, 1 << 48, 1 << 16  # as the command line's limits
MAX_BAG = 1 << 16  # ids per sample of one table (MLPerf's largest bag is 100)
SHARD_FIELDS = ("rank", "row_start", "row_end", "col_start", "col_end")


def _int(v: Any, lo: int, hi: int, source: str, field: str) -> int:
    """`v` if it is an integer (not a float, a bool or text) in [lo, hi], else one line naming the field."""
    if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
        return v
    raise DlrmkitError(f"{source}: {field} must be an integer in [{lo:,}, {hi:,}], got {str(v)[:40]!r}")


def plan_fields(d: Any, source: str) -> dict[str, Any]:
    """A plan file's JSON `d` as ShardingPlan's fields, each checked (the layout is not yet validated)."""
    if not isinstance(d, dict) or not isinstance(d.get("tables"), list):
        raise DlrmkitError(f"{source}: not a sharding plan (a mapping with 'world_size' and a list 'tables')")
    world = _int(d.get("world_size"), 1, MAX_WORLD_SIZE, source, "world_size")
    if (
        sum(len(t["shards"]) for t in d["tables"] if isinstance(t, dict) and isinstance(t.get("shards"), list))
        > MAX_SHARDS
    ):
        raise DlrmkitError(f"{source}: more than {MAX_SHARDS:,} shards; refused")
    tables = []
    for i, t in enumerate(d["tables"]):
        where = f"table {i}"
        if not isinstance(t, dict) or not isinstance(t.get("shards"), list) or not isinstance(t.get("strategy"), str):
            raise DlrmkitError(f"{source}: {where}: not a mapping with 'rows', 'dim', 'strategy' and a list 'shards'")
        shards = []
        for k, s in enumerate(t["shards"]):
            if not isinstance(s, dict) or set(s) != set(SHARD_FIELDS):
                raise DlrmkitError(f"{source}: {where}: shard {k} must hold exactly {', '.join(SHARD_FIELDS)}")
            shards.append(Shard(**{f: _int(s[f], 0, MAX_ROWS, source, f"{where} shard {k} {f}") for f in SHARD_FIELDS}))
        rows, dim = (
            _int(t.get("rows"), 1, MAX_ROWS, source, f"{where} rows"),
            _int(t.get("dim"), 1, MAX_DIM, source, f"{where} dim"),
        )
        bag = _int(t.get("bag", 1), 1, MAX_BAG, source, f"{where} bag")  # ids per sample: the costs' lookups
        tables.append(TablePlan(rows, dim, t["strategy"], shards, bag))
    memory = d.get("device_memory")
    notes = d.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise DlrmkitError(f"{source}: 'notes' must be a list of text lines")
    state = d.get("optimizer_state", 0)
    if isinstance(state, bool) or not isinstance(state, (int, float)) or not 0 <= state <= 16:
        raise DlrmkitError(f"{source}: 'optimizer_state' must be a number in [0, 16]")
    return {
        "world_size": world,
        "tables": tables,
        "batch_size": _int(d.get("batch_size", 65536), 1, MAX_ROWS, source, "batch_size"),
        "device_memory": None if memory is None else _int(memory, 1, MAX_ROWS << 8, source, "device_memory"),
        "bytes_per_value": _int(d.get("bytes_per_value", 4), 1, 8, source, "bytes_per_value"),
        "optimizer_state": float(state),
        "notes": notes,
    }
