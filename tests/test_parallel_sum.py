"""Collectives through the Transport seam (parallel/transport.py) on torch's own collectives:
every rank holds the same sum, bit for bit, and it is the sum of every rank's buffer; a bf16 wire
rounds each rank's values; coalesced sums travel as one all-reduce per dtype, beside an
all-gather; coalesced all-to-alls travel as one and deliver what each would alone."""

import pytest
import torch

from parallel_util import ROOT, torchrun

pytestmark = pytest.mark.multirank  # launches ranks with torchrun


def buffers(n: int, seed: int, world: int) -> list[torch.Tensor]:
    return [torch.randn(n, generator=torch.Generator().manual_seed(seed + r)) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_sum_over_ranks_is_the_same_on_every_rank(world, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "sum_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    fp32 = sum(buffers(1000, 10, world)[1:], buffers(1000, 10, world)[0])
    bf16_inputs = [x.to(torch.bfloat16) for x in buffers(1000, 20, world)]
    for r in range(world):
        torch.testing.assert_close(got[r]["fp32"], fp32, rtol=1e-6, atol=1e-6)
        assert torch.equal(got[r]["fp32"], got[0]["fp32"]), "ranks must hold the same bits"
        # bytes counted as a ring all-reduce's: 2 (N-1)/N of the 4,000-byte buffer
        assert got[r]["fp32_bytes"] == 2 * (world - 1) * 4000 // world
        assert got[r]["bf16"].dtype == torch.float32 and torch.equal(got[r]["bf16"], got[0]["bf16"])
        # the wire rounds each rank's values to bf16: near the exact sum, not equal to it
        exact = sum(x.float() for x in bf16_inputs)
        torch.testing.assert_close(got[r]["bf16"], exact, rtol=2e-2, atol=2e-2)
        assert not torch.equal(got[r]["bf16"], fp32)
        a, b, loss, packed = got[r]["coalesced"]
        torch.testing.assert_close(a, sum(x.view(20, 15) for x in buffers(300, 30, world)), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(b, sum(buffers(7, 40, world)), rtol=1e-6, atol=1e-6)
        assert loss.dtype == torch.float64 and float(loss) == sum(q + 0.5 for q in range(world))
        assert torch.equal(packed, torch.cat([torch.arange(5, dtype=torch.uint8) + 10 * q for q in range(world)]))
        # one all-reduce for the two float32 tensors, one for the float64 one, one all-gather
        assert sorted(got[r]["coalesced_calls"]) == ["all_gather_into_tensor", "all_reduce", "all_reduce"]
        assert got[r]["a2a_calls"] == ["all_to_all_single"]  # two all-to-alls, one collective
        for coalesced, alone in zip(got[r]["a2a"], got[r]["a2a_alone"]):
            assert coalesced.dtype == alone.dtype and torch.equal(coalesced, alone)
        pooled_from = torch.cat(
            [
                torch.arange(2 * r + 1, dtype=torch.float32) + sum(2 * d + 1 for d in range(r)) + 100 * s
                for s in range(world)
            ]
        )
        assert torch.equal(got[r]["a2a"][0], pooled_from)
        ids_from = torch.cat(
            [torch.arange(s + 1 + r) + sum(s + 1 + d for d in range(r)) + 1000 * s for s in range(world)]
        )
        assert torch.equal(got[r]["a2a"][1], ids_from)
