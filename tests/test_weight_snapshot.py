"""WeightSnapshot: the best validation weights kept in memory when small, in an unlinked temporary
file when large, and put back exactly; a folder it cannot write is one clear error; and training
with --restore-best ends on the best weights whichever way they were kept."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from helpers import run_cli
from dlrmkit.errors import DlrmkitError
from dlrmkit.train import snapshot
from dlrmkit.train.snapshot import WeightSnapshot


class Mixed(nn.Module):
    """Parameters and buffers of several dtypes and layouts, one of them non-contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(1000, 16))
        self.bf16 = nn.Parameter(torch.randn(37, 5).to(torch.bfloat16))
        self.register_buffer("ids", torch.arange(11, dtype=torch.int64))
        self.register_buffer("scalar", torch.tensor(3.5))
        self.register_buffer("flag", torch.tensor([True, False, True]))
        self.register_buffer("transposed", torch.randn(6, 4).t())  # non-contiguous


def scramble(m: nn.Module) -> None:
    with torch.no_grad():
        for t in m.state_dict().values():
            t.copy_(torch.zeros_like(t) if t.dtype == torch.bool else (t * 0 + 7).to(t.dtype))


@pytest.mark.parametrize("in_memory_max", [1 << 30, 0], ids=["memory", "file"])
def test_restore_puts_back_every_tensor_exactly(tmp_path, in_memory_max, monkeypatch):
    monkeypatch.setattr(snapshot, "BLOCK_BYTES", 4096)  # several blocks per table
    m = Mixed()
    want = {k: v.clone() for k, v in m.state_dict().items()}
    snap = WeightSnapshot(str(tmp_path), in_memory_max=in_memory_max)
    snap.take(m)
    assert snap.taken
    assert os.listdir(tmp_path) == []  # the file is unlinked from the start: nothing to leave behind
    scramble(m)
    assert not torch.equal(m.table, want["table"])
    snap.restore(m)
    for k, v in m.state_dict().items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k]), k
    assert (snap.file is not None) == (in_memory_max == 0)
    # a second, later copy replaces the first
    with torch.no_grad():
        m.table.add_(1)
    later = m.table.detach().clone()
    snap.take(m)
    scramble(m)
    snap.restore(m)
    assert torch.equal(m.table, later)
    snap.close()
    assert os.listdir(tmp_path) == []


def test_unwritable_folder_is_one_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    snap = WeightSnapshot(str(blocker / "sub"), in_memory_max=0)
    with pytest.raises(DlrmkitError, match="a-file.*best weights.*--restore-best false"):
        snap.take(Mixed())


def train_selecting(data, folder, in_memory_max: int, monkeypatch) -> tuple[dict, list[dict]]:
    monkeypatch.setattr(snapshot, "IN_MEMORY_MAX", in_memory_max)
    out, ck = folder / "metrics.json", folder / "ck"
    r = run_cli(
        "train",
        "--data",
        data,
        "--no-progress",
        "--epochs",
        3,
        "--eval-every",
        4,
        "--lr",
        8.0,
        "--restore-best",
        "true",
        "--patience",
        0,
        "--checkpoint-dir",
        ck,
        "--metrics-json",
        out,
        "--search-budget",
        0,
    )
    assert r.code == 0, r.err
    return json.loads(out.read_text()), [json.loads(x) for x in (ck / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow  # two whole runs with early stopping
def test_restore_best_from_a_file_equals_from_memory(tiny_data, tmp_path, monkeypatch):
    """The same run with the copy in memory and forced to disk: the best evaluation is restored
    (not the last), and the test metrics of the restored weights are the same both ways."""
    (tmp_path / "memory").mkdir()
    (tmp_path / "file").mkdir()
    in_memory, log = train_selecting(tiny_data, tmp_path / "memory", 1 << 40, monkeypatch)
    on_disk, log_disk = train_selecting(tiny_data, tmp_path / "file", 0, monkeypatch)
    evals = [e for e in log if e.get("event") == "eval"]
    best = max(evals, key=lambda e: e["auc"])
    assert best["step"] < in_memory["steps"], "the run must select an earlier step for this test to bite"
    assert [e for e in log_disk if e.get("event") == "restore_best"][0]["step"] == best["step"]
    assert on_disk["selected_step"] == in_memory["selected_step"] == best["step"]
    for key in ("auc", "logloss", "val_auc"):
        assert on_disk[key] == in_memory[key], key
    assert not [n for n in os.listdir(tmp_path / "file" / "ck") if n.startswith("tmp")]


def test_large_weights_go_to_the_folder_small_ones_stay_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "IN_MEMORY_MAX", 1000)
    big, small = WeightSnapshot(str(tmp_path)), WeightSnapshot(str(tmp_path))
    big.take(Mixed())  # 64 KB of table
    small.take(nn.Linear(3, 2))
    assert big.file is not None and big.memory is None
    assert small.file is None and small.memory is not None
