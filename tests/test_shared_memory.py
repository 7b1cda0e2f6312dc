"""Ranks on one host sum and gather through shared memory (parallel/shared_memory.py): every rank
holds the sum of every rank's values, bit for bit the same, request after request (both halves
of the slots); gloo carries one element per rank per request, or what does not fit in a slot;
no file is ever named in /dev/shm, not even when a rank is killed during setup; ranks on
different hosts fall back to gloo."""

import os

import pytest
import torch

from parallel_util import ROOT, torchrun

pytestmark = pytest.mark.multirank  # launches ranks with torchrun

SHM = "/dev/shm"


def values(n: int, seed: int, r: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + 100 * r))


def dlrmkit_files() -> set[str]:
    return {f for f in os.listdir(SHM) if "dlrmkit" in f} if os.path.isdir(SHM) else set()


@pytest.mark.parametrize("world", [2, 3])
def test_sums_and_gathers_through_shared_memory(world, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "shared_memory_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for r in range(world):
        assert got[r]["shared"] and got[r]["open_files"] == [], got[r]["open_files"]  # mapped, no file kept open
        for step, ((a, b, loss, gathered), sizes) in enumerate(got[r]["steps"]):
            torch.testing.assert_close(a, sum(values(300, step, q) for q in range(world)), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(b, sum(values(100, 10 + step, q) for q in range(world)), rtol=1e-6, atol=1e-6)
            assert torch.equal(a, got[0]["steps"][step][0][0]), "every rank holds the same bits"
            assert loss.dtype == torch.float64 and float(loss) == sum(q + 1 for q in range(world))
            assert torch.equal(gathered, torch.cat([values(5, 20 + step, q) for q in range(world)]))
            assert sizes == [world], sizes  # one element per rank through gloo: the slots are written
        large, sizes = got[r]["large"]
        torch.testing.assert_close(large, sum(values(2000, 30, q) for q in range(world)), rtol=1e-6, atol=1e-6)
        assert sizes == [2000], sizes  # too large for a slot: gloo's all-reduce
        for i, total in enumerate(got[r]["unwaited"]):
            torch.testing.assert_close(total, sum(values(50, 42 if i == 0 else 39 + i, q) for q in range(world)))
        assert not got[r]["two_hosts"]


@pytest.mark.parametrize("point", ["shared-memory:created@1", "shared-memory:mapped@0"])
def test_a_rank_killed_during_setup_leaves_nothing_in_dev_shm(point, tmp_path, monkeypatch):
    before = dlrmkit_files()
    monkeypatch.setenv("DLRMKIT_FAULT", point)  # faults.py: that rank SIGKILLs itself there
    proc = torchrun(2, ROOT / "tests" / "shared_memory_worker.py", tmp_path, timeout=120)
    assert proc.returncode != 0 and "SIGKILL" in proc.stderr, proc.stderr[-2000:]  # the fault fired
    assert not (tmp_path / "rank0.pt").exists()
    assert dlrmkit_files() - before == set()
