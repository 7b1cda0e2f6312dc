"""`--engine spark` (local mode) on the real Criteo rows writes the same bytes as the
single-machine engine, file by file (spec, vocabulary and split binary files)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from helpers import run_cli

pytestmark = pytest.mark.slow  # starts Spark

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo"
HEAD6K = CRITEO / "criteo_kaggle_head6k.tsv"

pytest.importorskip("pyspark", reason="needs pyspark (pip install 'dlrmkit[spark]')")


@pytest.mark.skipif(not HEAD6K.exists(), reason="needs ../shared/data/criteo")
def test_spark_matches_single_machine_byte_for_byte(tmp_path):
    common = [
        "preprocess",
        "criteo",
        "--input",
        HEAD6K,
        "--test-rows",
        "1000",
        "--frequency-threshold",
        "2",
        "--no-progress",
    ]
    local = run_cli(*common, "--out", tmp_path / "local", "--workers", "2")
    assert local.code == 0, local.err
    spark = run_cli(*common, "--out", tmp_path / "spark", "--engine", "spark", "--spark-master", "local[2]")
    assert spark.code == 0, spark.err
    a, b = tmp_path / "local", tmp_path / "spark"
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert len(files) == 1 + 2 * 28 + 27  # spec, 2 x (label, numerical, 26 cats), vocabulary
    differing = [f for f in files if not filecmp.cmp(a / f, b / f, shallow=False)]
    assert differing == []
