"""`--engine spark` (local mode) on the real Criteo rows writes the same bytes as the
single-machine engine, file by file (spec, vocabulary and split binary files)."""

from __future__ import annotations

import filecmp
import gzip
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


@pytest.mark.skipif(not HEAD6K.exists(), reason="needs ../shared/data/criteo")
def test_bad_input_found_on_an_executor_is_one_line(tmp_path):
    gz = tmp_path / "day.gz"
    gz.write_bytes(gzip.compress(HEAD6K.read_bytes()[:200_000])[:-300])
    r = run_cli("preprocess", "criteo", "--input", gz, "--out", tmp_path / "o", "--engine", "spark", "--no-progress")
    assert r.code == 2, r.err
    assert f"{gz}: truncated or corrupt gzip file" in r.err and "internal error" not in r.err, r.err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()
