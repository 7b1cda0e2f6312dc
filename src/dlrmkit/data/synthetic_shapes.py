"""Shapes of synthetic datasets: the config dataclass, the named presets (toy ones and
Criteo-shaped ones), and the rules that build a config for any list of table sizes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlrmkit.errors import DlrmkitError


@dataclass
class SynthConfig:
    table_sizes: list[int]
    num_numerical: int
    rows: int
    test_rows: int
    zipf_alpha: float = 1.1
    latent_dim: int = 4
    bias_std: float = 0.6
    latent_std: float = 0.45
    dense_weight_std: float = 0.5
    click_rate: float = 0.25
    chunk_rows: int = 1 << 18
    # the teacher's interaction: "dot" (pairwise dots of the latent vectors) or "cross" (DCNv2's:
    # x0 . (U V x0) over the concatenated vectors, rank `cross_rank`)
    teacher: str = "dot"
    cross_rank: int = 8
    # ids per sample of each table: MLPerf DCNv2's synthetic expansion of the teacher's one-hot ids
    # (dlrmkit.data.multi_hot); the label depends on the first id of each bag, so the optimal AUC holds
    multi_hot: list[int] | None = None


# Criteo Kaggle (Display Advertising Challenge, 45.8M rows): the table sizes the DLRM reference
# trains with (facebookresearch/dlrm's Kaggle --arch-embedding-size): 33.76M rows, largest 10.1M
KAGGLE_TABLE_SIZES = [
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
]
# Criteo Terabyte as MLPerf DLRM v1 preprocesses it: frequency threshold 3, tables capped at 40M rows
TERABYTE_TABLE_SIZES = [
    40_000_000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40_000_000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40_000_000,
    40_000_000,
    40_000_000,
    590152,
    12973,
    108,
    36,
]


def scaled_terms(num_tables: int) -> dict[str, float]:
    """Per-term scales that keep the teacher's logit spread (std ~1.8) for any number of tables:
    the T biases share a variance of ~1.6 and the (T+1)T/2 latent pairs ~1.2, so labels stay
    learnable (optimal AUC ~0.85) instead of saturating as tables are added. 26 tables give
    the `small` preset's bias_std 0.25 and latent_std 0.17."""
    pairs = (num_tables + 1) * num_tables / 2
    latent_dim = 4
    return {"bias_std": float(np.sqrt(1.6 / num_tables)), "latent_std": float((1.2 / (pairs * latent_dim)) ** 0.25)}


def config_for_tables(table_sizes: list[int], rows: int, test_rows: int, num_numerical: int = 13) -> SynthConfig:
    """A Criteo-like dataset (13 numerical features) over the given tables."""
    return SynthConfig(
        list(table_sizes), num_numerical=num_numerical, rows=rows, test_rows=test_rows, **scaled_terms(len(table_sizes))
    )


SYNTH_PRESETS: dict[str, SynthConfig] = {
    "tiny": SynthConfig([3, 8, 20, 50, 120, 300], num_numerical=4, rows=150_000, test_rows=20_000, latent_std=0.3),
    "small": SynthConfig(
        [int(round(x)) for x in np.geomspace(3, 200_000, 26)],
        num_numerical=13,
        rows=500_000,
        test_rows=50_000,
        # 26 tables give 351 latent pairs and 26 biases: smaller per-term scales keep the logit's
        # spread (std ~1.8) like tiny's, so labels stay learnable (optimal AUC ~0.86, not 0.99)
        latent_std=0.17,
        bias_std=0.25,
    ),
    "kaggle": config_for_tables(KAGGLE_TABLE_SIZES, rows=2_000_000, test_rows=200_000),
    "terabyte": config_for_tables(TERABYTE_TABLE_SIZES, rows=2_000_000, test_rows=200_000),
}


def parse_cardinalities(text: str) -> list[int]:
    """'N1,N2,...' -> table sizes; a one-line error naming --cardinalities otherwise."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DlrmkitError(f"--cardinalities must be comma-separated integers, got '{text}'") from None
    if not sizes or min(sizes) < 1:
        raise DlrmkitError(f"--cardinalities needs at least one table, each of at least 1 row, got '{text}'")
    return sizes


def resolve_config(
    preset: str | None, cardinalities: str | None, scale: float, rows: int | None, test_rows: int | None
) -> tuple[str, SynthConfig]:
    """(name, config) from the synth options: a preset or explicit table sizes, tables scaled by
    `scale` (each at least 1 row), rows and test rows overriding the preset's."""
    if cardinalities is not None and preset is not None:
        raise DlrmkitError("give --preset or --cardinalities, not both")
    if not scale > 0:
        raise DlrmkitError(f"--scale must be positive, got {scale}")
    if cardinalities is not None:
        name, cfg = "custom", config_for_tables(parse_cardinalities(cardinalities), 1_000_000, 100_000)
    else:
        name = preset or "tiny"
        if name not in SYNTH_PRESETS:
            raise DlrmkitError(f"unknown --preset '{name}' (choose from: {', '.join(SYNTH_PRESETS)})")
        cfg = SYNTH_PRESETS[name]
    if scale != 1.0:
        cfg = replace(cfg, table_sizes=[max(1, int(round(n * scale))) for n in cfg.table_sizes])
    return name, replace(
        cfg,
        rows=rows if rows is not None else cfg.rows,
        test_rows=test_rows if test_rows is not None else cfg.test_rows,
    )
