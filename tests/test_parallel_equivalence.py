"""The acceptance criterion of hybrid parallelism: N ranks (torchrun, gloo, CPU) give the same
losses and weights as one process, for every strategy and a mixed auto plan, N = 1..4
(global batch 50: uneven for 3 and 4 ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parallel_equiv_worker as worker  # noqa: E402
from parallel_util import ROOT, torchrun  # noqa: E402


@pytest.fixture(scope="module")
def reference() -> dict:
    return {name: worker.run(name, 0, 1, distributed=False) for name in worker.PLANS}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_match_single_process(world, reference, tmp_path):
    proc = torchrun(world, ROOT / "tests" / "parallel_equiv_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, ref in reference.items():
        got = torch.load(tmp_path / f"{name}.pt")
        assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5, abs=1e-6), name
        assert ref["losses"][0] != pytest.approx(ref["losses"][-1]), "training must move the loss"
        for t, (a, b) in enumerate(zip(ref["tables"], got["tables"])):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name}: table {t}")
        for a, b in zip(ref["dense"], got["dense"]):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name}: dense parameter")
