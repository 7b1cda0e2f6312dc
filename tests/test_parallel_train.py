"""`torchrun -m dlrmkit train` end to end: the loader strategies and shardings give the single
process's loss and AUC; the two-"node" launch (two torchrun invocations, c10d rendezvous)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import scratch_cwd  # noqa: E402
from parallel_util import free_port, torchrun, torchrun_env, train_one_process  # noqa: E402

pytestmark = pytest.mark.multirank  # launches ranks with torchrun

ARGS = ["--search-budget", "0", "--max-steps", "6", "--batch-size", "250", "--no-progress", "--no-shuffle", "--eval-batch-size", "700"]


@pytest.fixture(scope="module")
def single(tiny_data, tmp_path_factory) -> dict:
    return train_one_process(tiny_data, ARGS, tmp_path_factory.mktemp("single") / "m.json")


def check_same(m: dict, single: dict, world: int) -> None:
    assert m["world_size"] == world
    assert m["samples"] == single["samples"] == 6 * 250
    assert m["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    # float tolerance: with 3 ranks the bucketed (overlapped) all-reduce sums gradients in another
    # order than one process does, which moves the AUC by a few 1e-6
    assert m["auc"] == pytest.approx(single["auc"], abs=1e-5)
    assert m["logloss"] == pytest.approx(single["logloss"], rel=1e-5)
    # selection reads the same validation rows (the held-out tail of train) on every rank
    assert m["val_auc"] == pytest.approx(single["val_auc"], abs=1e-5)
    assert m["selected_step"] == single["selected_step"]


@pytest.mark.parametrize("world,sharding,loader", [(2, "row_wise", "own-features"), (3, "auto", "broadcast")])
def test_train_under_torchrun_matches_single(world, sharding, loader, tiny_data, single, tmp_path):
    out = tmp_path / "m.json"
    proc = torchrun(
        world,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        tiny_data,
        *ARGS,
        "--sharding",
        sharding,
        "--loader",
        loader,
        "--metrics-json",
        out,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("test AUC") == 1, "only rank 0 prints"
    # 250 samples over 2 or 3 CPU ranks: rank 0 says that one process would be faster
    assert proc.stderr.count(f"note: {250 // world} samples per rank: on CPU") == 1, proc.stderr[-3000:]
    check_same(json.loads(out.read_text()), single, world)


def test_bf16_wire_under_torchrun_tracks_single(tiny_data, single, tmp_path):
    """--comm-dtype bf16 (parallel/transport.py Bf16Wire): pooled embeddings and gradients cross
    as bfloat16, the loss sum as float64; training follows one process within bf16's rounding,
    and the logged loss is the global mean, not rounded."""
    out = tmp_path / "m.json"
    args = ["--sharding", "table_wise", "--comm-dtype", "bf16", "--metrics-json", out]
    proc = torchrun(2, "-m", "dlrmkit", "train", "--data", tiny_data, *ARGS, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["auc"] == pytest.approx(single["auc"], abs=2e-2)
    assert m["logloss"] == pytest.approx(single["logloss"], rel=2e-2)
    assert m["logloss"] != single["logloss"], "the wire rounds: not bit for bit"


def test_calibration_and_unreached_parameters_under_torchrun_match_single(tiny_data, tmp_path):
    """--calibration temperature under torchrun: every rank fits the temperature on all ranks'
    validation logits and folds it into its own weights (the wide column only in the column slice
    that holds it); the test rows' ECE is reported as in one process. With --deep false the MLPs
    get no gradient: AdamW's weight decay leaves them, and no optimizer state is made for them,
    on every rank as in one process."""
    import torch

    from dlrmkit.checkpoint.save_load import load_logical_state

    args = [*ARGS, "--calibration", "temperature", "--deep", "false", "--fm", "true", "--wide", "true"]
    args += ["--optimizer", "adamw", "--dense-weight-decay", "0.1"]
    single = train_one_process(tiny_data, [*args, "--checkpoint-dir", str(tmp_path / "c1")], tmp_path / "m1.json")
    out = tmp_path / "m2.json"
    proc = torchrun(
        2, "-m", "dlrmkit", "train", "--data", tiny_data, *args, "--sharding", "column_wise",
        "--checkpoint-dir", tmp_path / "c2", "--metrics-json", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert single["temperature"] != 1.0
    for key in ("temperature", "val_logloss", "logloss", "ece"):
        assert m[key] == pytest.approx(single[key], rel=1e-5), key
    one, two = load_logical_state(str(tmp_path / "c1")), load_logical_state(str(tmp_path / "c2"))
    names = {k for k in one[0] if not k.startswith("rng.")}
    assert names == {k for k in two[0] if not k.startswith("rng.")}
    for k in names:
        torch.testing.assert_close(two[0][k], one[0][k], rtol=1e-5, atol=1e-6, msg=k)


def test_dropout_under_torchrun_trains_and_says_its_masks_are_each_ranks(tiny_data, tmp_path):
    """As under DistributedDataParallel, each rank draws dropout masks for its own rows: the run
    trains, and rank 0 says once that it matches one process in distribution, not step for step."""
    out = tmp_path / "m.json"
    proc = torchrun(2, "-m", "dlrmkit", "train", "--data", tiny_data, *ARGS, "--dropout", "0.2",
                    "--metrics-json", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("note: --dropout 0.2 under torchrun: each rank draws its own dropout masks") == 1
    m = json.loads(out.read_text())
    assert m["world_size"] == 2 and m["steps"] == 6 and 0 < m["train_loss"] < 10


def test_two_nodes_c10d(tiny_data, single, tmp_path):
    port = free_port()
    out = tmp_path / "m.json"
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(node),
            "--nproc_per_node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "dlrmkit-test",
            "-m",
            "dlrmkit",
            "train",
            "--data",
            str(tiny_data),
            *ARGS,
            "--sharding",
            "table_wise",
            "--metrics-json",
            str(out),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=torchrun_env(), cwd=scratch_cwd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    results = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    check_same(json.loads(out.read_text()), single, 2)


def test_split_sgd_bf16_under_torchrun_tracks_single(tiny_data, tmp_path):
    """Split-SGD keeps bf16 tables: the sharded forward assembles bf16 lookups (a float32 buffer
    once broke it) and the tables' deferred gradients are applied on every rank. bf16 sums run in
    another order across ranks, so the metrics agree to bf16 precision, not bit for bit."""
    split = ["--optimizer", "split-sgd", "--precision", "bf16", "--lr", "0.5"]
    m1, m2 = tmp_path / "m1.json", tmp_path / "m2.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dlrmkit", "train", "--data", str(tiny_data), *ARGS, *split, "--metrics-json", str(m1)],
        env=torchrun_env(),
        cwd=scratch_cwd(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = torchrun(
        2, "-m", "dlrmkit", "train", "--data", tiny_data, *ARGS, *split, "--sharding", "row_wise", "--metrics-json", m2
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = json.loads(m1.read_text()), json.loads(m2.read_text())
    assert two["world_size"] == 2 and two["samples"] == one["samples"]
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=0.02)
    assert two["auc"] == pytest.approx(one["auc"], abs=0.01)
