"""Criteo-shaped synthetic data: presets of Criteo's table sizes, any shape from
--cardinalities, table scaling, and the hashed teacher that keeps huge tables cheap."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from dlrmkit.data import synthetic
from dlrmkit.data.synthetic import HashedTable, Teacher, generate, zipf_continuous
from dlrmkit.data.synthetic_shapes import (
    KAGGLE_TABLE_SIZES,
    SYNTH_PRESETS,
    TERABYTE_TABLE_SIZES,
    config_for_tables,
    resolve_config,
)
from dlrmkit.errors import DlrmkitError


def test_criteo_presets_have_criteo_table_sizes():
    assert SYNTH_PRESETS["kaggle"].table_sizes == KAGGLE_TABLE_SIZES
    assert len(KAGGLE_TABLE_SIZES) == 26 and sum(KAGGLE_TABLE_SIZES) == 33_762_577
    assert max(TERABYTE_TABLE_SIZES) == 40_000_000 and TERABYTE_TABLE_SIZES.count(40_000_000) == 5
    name, cfg = resolve_config("terabyte", None, 0.01, 1000, 100)
    assert name == "terabyte" and max(cfg.table_sizes) == 400_000 and min(cfg.table_sizes) == 1
    assert (cfg.rows, cfg.test_rows, cfg.num_numerical) == (1000, 100, 13)


def test_cardinalities_and_bad_options():
    name, cfg = resolve_config(None, "30000000,10000000,5,2", 1.0, None, None)
    assert name == "custom" and cfg.table_sizes == [30_000_000, 10_000_000, 5, 2]
    for bad in ("3,x", "3,0", ""):
        with pytest.raises(DlrmkitError, match="--cardinalities"):
            resolve_config(None, bad, 1.0, None, None)
    with pytest.raises(DlrmkitError, match="not both"):
        resolve_config("kaggle", "3,4", 1.0, None, None)
    with pytest.raises(DlrmkitError, match="--scale"):
        resolve_config("kaggle", None, 0.0, None, None)


def test_hashed_parameters_are_deterministic_normal_values():
    table = HashedTable(key=12345, latent_dim=4, bias_std=0.5, latent_std=0.2)
    ids = np.arange(200_000, dtype=np.int64) * 197 + 39_000_000
    bias, latent = table.bias(ids), table.latent(ids)
    np.testing.assert_array_equal(bias, table.bias(ids.copy()))  # a function of the id alone
    assert abs(bias.mean()) < 0.01 and abs(bias.std() - 0.5) < 0.01
    assert latent.shape == (200_000, 4) and abs(latent.std() - 0.2) < 0.005
    assert abs(np.corrcoef(latent[:, 0], latent[:, 1])[0, 1]) < 0.01  # components independent
    assert abs(np.corrcoef(bias, latent[:, 0])[0, 1]) < 0.01
    other = HashedTable(key=54321, latent_dim=4, bias_std=0.5, latent_std=0.2).bias(ids)
    assert abs(np.corrcoef(bias, other)[0, 1]) < 0.01  # tables differ


def test_continuous_zipf_matches_the_discrete_head():
    n, alpha = 50_000, 1.1
    rng = np.random.default_rng(0)
    ids = zipf_continuous(rng.random(400_000), n, alpha)
    assert ids.min() >= 0 and ids.max() < n
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    exact_top = w[: n // 100].sum() / w.sum()  # the exact Zipf's top-1% share
    got_top = np.isin(ids, np.arange(n // 100)).mean()
    assert abs(got_top - exact_top) < 0.05, (got_top, exact_top)
    assert np.bincount(ids)[0] > np.bincount(ids)[10] > np.bincount(ids)[1000]


def test_large_tables_generate_without_per_row_state(tmp_path, monkeypatch):
    """Tables above the stored limit are hashed (no per-row arrays), and the dataset they make
    is valid, skewed, and as learnable as the stored teacher's (optimal AUC known)."""
    monkeypatch.setattr(synthetic, "STORED_MAX_ROWS", 1000)
    cfg = config_for_tables([3_000_000, 500, 40], rows=20_000, test_rows=10_000)
    teacher = Teacher(cfg, seed=0)
    assert teacher.bias[0] is None and teacher.latent[0] is None and teacher.cdfs[0] is None
    assert teacher.bias[1] is not None
    spec = generate(str(tmp_path / "d"), cfg, seed=0, progress=False)
    ids = np.fromfile(tmp_path / "d" / "train" / "cat_0.bin", dtype=np.int32)
    assert len(ids) == 20_000 and ids.min() >= 0 and ids.max() < 3_000_000
    assert (ids < 30_000).mean() > 0.5  # the top 1% of ids take most rows
    assert 0.7 < spec.metadata["optimal_auc"] < 0.97
    again = generate(str(tmp_path / "e"), cfg, seed=0, progress=False)
    assert again.metadata["optimal_auc"] == spec.metadata["optimal_auc"]


def test_synth_cli_cardinalities(cli, tmp_path):
    out = tmp_path / "custom"
    result = cli(
        "synth",
        "--cardinalities",
        "4000000,1000,7",
        "--rows",
        "5000",
        "--test-rows",
        "2000",
        "--out",
        out,
        "--no-progress",
    )
    assert result.code == 0, result.err
    assert "5,000 train + 2,000 test rows, 3 tables (4,001,007 rows in all, largest 4,000,000)" in result.out
    spec = yaml.safe_load((out / "feature_spec.yaml").read_text())
    assert spec["metadata"]["preset"] == "custom" and 0.5 < spec["metadata"]["optimal_auc"] < 1.0
    bad = cli("synth", "--cardinalities", "10,-1", "--out", tmp_path / "bad")
    assert bad.code == 2 and "--cardinalities" in bad.err and not (tmp_path / "bad").exists()
