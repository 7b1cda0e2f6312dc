"""More ranks than tables under --sharding table_wise: a rank owning no table still joins every
exchange (its empty lookups' backward included) and keeps an empty table optimizer, so the job
gives the single process's loss and AUC, and its checkpoints resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import run_cli, scratch_cwd  # noqa: E402
from parallel_util import torchrun, torchrun_env  # noqa: E402

pytestmark = pytest.mark.multirank  # launches ranks with torchrun

ARGS = ["--search-budget", "0", "--batch-size", "240", "--no-progress", "--no-shuffle", "--eval-batch-size", "700"]


@pytest.fixture(scope="module")
def two_tables(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two") / "two"
    r = run_cli("synth", "--out", out, "--cardinalities", "50,40", "--rows", "1200", "--test-rows", "300")
    assert r.code == 0, r.err
    return out


@pytest.mark.parametrize("recipe", [["--preset", "tiny"], []], ids=["sgd-tables", "adagrad-tables"])
def test_a_rank_without_tables_trains_as_one_process(two_tables, tmp_path, recipe):
    one, three, ck = tmp_path / "one.json", tmp_path / "three.json", tmp_path / "ck"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrmkit",
            "train",
            "--data",
            str(two_tables),
            *ARGS,
            *recipe,
            "--max-steps",
            "6",
            "--metrics-json",
            str(one),
        ],
        env=torchrun_env(),
        cwd=scratch_cwd(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = ["-m", "dlrmkit", "train", "--data", two_tables, *ARGS, *recipe, "--sharding", "table_wise"]
    proc = torchrun(
        3, *run, "--max-steps", 6, "--checkpoint-dir", ck, "--metrics-json", three, "--collective-timeout", 60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    m, single = json.loads(three.read_text()), json.loads(one.read_text())
    assert m["world_size"] == 3 and m["samples"] == single["samples"]
    assert m["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert m["auc"] == pytest.approx(single["auc"], abs=1e-5)
    assert m["logloss"] == pytest.approx(single["logloss"], rel=1e-5)
    assert m["val_auc"] == pytest.approx(single["val_auc"], abs=1e-5)
    # every rank saved and loads the same optimizers (the empty rank's table optimizer included)
    proc = torchrun(3, *run, "--checkpoint-dir", ck, "--resume", "--max-steps", 8, "--metrics-json", three)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(three.read_text())["steps"] == 8
    assert proc.stderr.count(f"resumed from {ck}/step_6 (step 6, epoch ") == 1, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def short_last_batch(tmp_path_factory) -> dict[str, Path]:
    """One-hot and multi-hot datasets whose last training batch holds fewer rows than 3 ranks."""
    out = {}
    for name, extra in (("one-hot", []), ("multi-hot", ["--multi-hot", "3,2"])):
        out[name] = tmp_path_factory.mktemp("short") / name
        r = run_cli(
            "synth", "--out", out[name], "--cardinalities", "50,40", "--rows", "1001", "--test-rows", "300", *extra
        )
        assert r.code == 0, r.err
    return out


@pytest.mark.parametrize(
    ("data", "how"),
    [
        ("one-hot", ["--sharding", "row_wise"]),  # the exchange of an empty slice's bags
        ("one-hot", ["--plan", "mixed"]),  # a replicated table's lookups of no sample beside a sharded one
        ("multi-hot", ["--sharding", "data_parallel", "--loader", "exchange"]),
        ("multi-hot", ["--sharding", "data_parallel", "--loader", "broadcast"]),  # bags of no table
    ],
    ids=["row-wise", "mixed", "multi-hot-replicated", "multi-hot-replicated-broadcast"],
)
def test_a_rank_without_samples_in_the_last_batch_trains_as_one_process(short_last_batch, tmp_path, data, how):
    one, three = tmp_path / "one.json", tmp_path / "three.json"
    # 901 training rows (100 held out for validation) in batches of 450: the last batch has 1 row
    run = ["-m", "dlrmkit", "train", "--data", str(short_last_batch[data]), "--preset", "tiny", "--batch-size", "450"]
    run += ["--search-budget", "0", "--no-progress", "--no-shuffle", "--epochs", "1", "--no-final-checkpoint"]
    proc = subprocess.run(
        [sys.executable, *run, "--metrics-json", str(one)],
        env=torchrun_env(),
        cwd=scratch_cwd(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if how == ["--plan", "mixed"]:
        how = ["--plan", tmp_path / "plan.json"]
        r = run_cli("plan", *run[3:9], "--world-size", "3", "--sharding", "table_wise", "--json", how[1])
        assert r.code == 0, r.err
        plan = json.loads(how[1].read_text())
        table = plan["tables"][0]
        table["strategy"] = "data_parallel"
        table["shards"] = [{**table["shards"][0], "rank": rank} for rank in range(3)]
        how[1].write_text(json.dumps(plan))
    proc = torchrun(3, *run, *how, "--metrics-json", three, "--collective-timeout", 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m, single = json.loads(three.read_text()), json.loads(one.read_text())
    assert m["steps"] == single["steps"] == 3 and m["samples"] == single["samples"]
    assert m["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert m["val_auc"] == pytest.approx(single["val_auc"], abs=1e-5)
