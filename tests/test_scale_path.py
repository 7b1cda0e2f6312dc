"""benchmarks/scale_path.py runs the whole path (raw rows or synth -> validate -> train ->
evaluate -> resume) and prints every stage's figures; here at a small size."""

from __future__ import annotations

import subprocess
import sys

import pytest

from parallel_util import ROOT, torchrun_env

pytestmark = pytest.mark.multirank  # launches ranks with torchrun

STAGES_RAW = ("generate", "preprocess", "validate", "train+save", "evaluate", "resume+save")


@pytest.mark.parametrize("source", ["raw", "synth"])
def test_scale_path_small(tmp_path, source):
    extra = ["--synth", "--cardinalities 30000,500,20"] if source == "synth" else []
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale_path.py"),
            "--rows",
            "4000",
            "--eval-rows",
            "1000",
            "--steps",
            "3",
            "--batch-size",
            "256",
            "--workdir",
            str(tmp_path / "w"),
            *extra,
        ],
        env=torchrun_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    stages = ("synth",) + STAGES_RAW[2:] if source == "synth" else STAGES_RAW
    for stage in stages:
        line = next((l for l in lines if l.startswith(stage + " ")), None)
        assert line is not None and " s " in line and "peak RSS" in line, (stage, proc.stdout)
    for stage in ("train+save", "evaluate", "resume+save"):
        assert "analytic" in next(l for l in lines if l.startswith(stage))
    summary = next(l for l in lines if l.startswith("tables "))
    assert "after resume: steps 6" in summary
    if source == "synth":  # 30,520 rows x 16 x 4 bytes, and as much Adagrad state
        assert "tables 0.00 GiB (dim 16), adagrad state 0.00 GiB" in summary
