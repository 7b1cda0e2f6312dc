"""Sums over ranks (comm.sum_started): two gloo ranks exchange their buffers in one all-to-all
and add; other world sizes use torch's all-reduce. Every rank must hold the same sum, bit for
bit, and it must be the sum of every rank's buffer."""

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
        assert torch.equal(got[r]["bf16"], got[0]["bf16"])
        # the wire rounds each rank's values to bf16; the sum is of those rounded values
        exact = sum(x.float() for x in bf16_inputs)
        torch.testing.assert_close(got[r]["bf16"], exact, rtol=1e-2, atol=1e-2)
        if world == 2:  # summed in fp32, not rounded again to the wire's bf16
            assert torch.equal(got[r]["bf16"], bf16_inputs[0].float() + bf16_inputs[1].float())
        a = sum(x.view(20, 15) for x in buffers(300, 30, world))
        b = sum(buffers(7, 40, world))
        torch.testing.assert_close(got[r]["buckets"][0], a, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[r]["buckets"][1], b, rtol=1e-6, atol=1e-6)
        # bytes counted as a ring all-reduce's: 2 (N-1)/N of the 4,000-byte buffer
        assert got[r]["fp32_bytes"] == 2 * (world - 1) * 4000 // world
        if world == 2:  # the tail: not summed, handed to the peer
            routed, received = got[r]["routed"]
            torch.testing.assert_close(routed[:50], sum(buffers(50, 50, world)), rtol=1e-6, atol=1e-6)
            assert torch.equal(received, torch.arange(5.0 - 2 * r) + 200 - 100 * r)
            for name in ("rides", "alone"):  # the riders' exchange: rank r gets [0..1] or [2..4] of each
                grad, back, calls = got[r][name]
                torch.testing.assert_close(grad, sum(buffers(4, 60, world)), rtol=1e-6, atol=1e-6)
                want = torch.cat(
                    [
                        (torch.arange(5.0) + 10 * src)[:2] if r == 0 else (torch.arange(5.0) + 10 * src)[2:]
                        for src in range(2)
                    ]
                )
                assert torch.equal(back.float(), want), (name, back)
                assert calls == ["all_to_all_single"] * (1 if name == "rides" else 2), calls
    # two gloo ranks: one all-to-all per sum and no all-reduce; three: all-reduces only
    expected = {2: {"all_to_all_single"}, 3: {"all_reduce"}}[world]
    assert set(got[0]["calls"]) == expected and len(got[0]["calls"]) == 4 + 4 * (world == 2), got[0]["calls"]
