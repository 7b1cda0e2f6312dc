"""Ranks on one host sum dense gradients through shared memory (parallel/shared_slots.py): every
rank holds the sum of every rank's gradients, bit for bit the same, step after step (both halves
of the slots); gloo carries only the loss, riders or a one-element token; no file is left in
/dev/shm; ranks on different hosts, without a usable directory, or that cannot see each other's
files, all fall back to gloo."""

import pytest
import torch

from parallel_util import ROOT, torchrun

pytestmark = pytest.mark.multirank  # launches ranks with torchrun


def values(n: int, seed: int, r: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed + 100 * r))


@pytest.mark.parametrize("world", [2, 3])
def test_gradients_summed_through_shared_memory(world, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "shared_sum_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for r in range(world):
        assert got[r]["shared"] and got[r]["left"] == [], got[r]["left"]
        for step, (a, b, loss, rest, sizes) in enumerate(got[r]["steps"]):
            want_a = sum(values(300, step, q) for q in range(world))
            want_b = sum(values(100, 10 + step, q) for q in range(world))
            torch.testing.assert_close(a, want_a, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(b, want_b, rtol=1e-6, atol=1e-6)
            assert torch.equal(a, got[0]["steps"][step][0]), "every rank holds the same bits"
            assert float(loss) == sum(q + 1 for q in range(world)) and rest == []
            assert sizes == [1, 1], sizes  # per bucket: a token, or the loss; no gradient through gloo
        assert not got[r]["bad_dir"] and not got[r]["two_hosts"]
        assert got[r]["own_dirs"] == (False, []), got[r]["own_dirs"]  # no peer's file: gloo, and nothing left
    if world == 2:
        for r in range(2):
            for name, carried in (("rider", [1, 1]), ("rider_full", [1, 1 + 3 - r])):
                a, back, sizes = got[r][name]
                torch.testing.assert_close(a, values(300, 7, 0) + values(300, 7, 1), rtol=1e-6, atol=1e-6)
                want = torch.cat(
                    [(torch.arange(5.0) + 10 * q)[:2] if r == 0 else (torch.arange(5.0) + 10 * q)[2:] for q in range(2)]
                )
                assert torch.equal(back, want), name
                # in the area: gloo carries tokens only; area full: the last bucket's also the peer's block
                assert sizes == carried, (name, sizes)
