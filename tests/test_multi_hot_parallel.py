"""`torchrun -m dlrmkit train` on a multi-hot dataset with the DCN interaction: each loader
strategy (the id exchange, own features, broadcast) and sharding gives the single process's
loss and AUC."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_util import torchrun, train_one_process  # noqa: E402
from test_parallel_train import check_same  # noqa: E402

pytestmark = pytest.mark.multirank  # launches ranks with torchrun

ARGS = ["--max-steps", "6", "--batch-size", "250", "--no-progress", "--no-shuffle", "--eval-batch-size", "700"]
ARGS += ["--interaction", "dcn", "--dcn-layers", "2", "--dcn-rank", "4", "--optimizer", "adagrad"]


@pytest.fixture(scope="module")
def multi_hot(tiny_data, tmp_path_factory) -> Path:
    from dlrmkit.data.multi_hot import materialize

    out = tmp_path_factory.mktemp("mh") / "mh"
    materialize(str(tiny_data), str(out), [3, 2, 1, 5, 4], progress=False)
    return out


@pytest.fixture(scope="module")
def single(multi_hot, tmp_path_factory) -> dict:
    return train_one_process(multi_hot, ARGS, tmp_path_factory.mktemp("single") / "m.json")


@pytest.mark.parametrize(
    "world,sharding,loader",
    [(2, "table_wise", "exchange"), (2, "row_wise", "own-features"), (3, "column_wise", "broadcast")],
)
def test_multi_hot_dcn_under_torchrun_matches_single(world, sharding, loader, multi_hot, single, tmp_path):
    out = tmp_path / "m.json"
    proc = torchrun(
        world, "-m", "dlrmkit", "train", "--data", multi_hot, *ARGS,
        "--sharding", sharding, "--loader", loader, "--metrics-json", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_same(json.loads(out.read_text()), single, world)
