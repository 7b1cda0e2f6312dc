"""Synthetic click data from a hidden teacher model, so a training run can say how close it came
to the best possible AUC.

Categories follow a Zipf (power-law) frequency with id 0 the most frequent, as in preprocessed
Criteo data. The teacher has a DLRM-like structure: a linear term in the numerical features,
a bias per category, and pairwise dot products between a projection of the numerical features
and per-category latent vectors. Labels are drawn from its click probability; the Bayes-optimal
AUC (the AUC of the true probabilities on the test rows) is stored in the dataset metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dlrmkit.data.feature_spec import TEST, TRAIN, FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryWriter
from dlrmkit.errors import DlrmkitError
from dlrmkit.metrics import roc_auc


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


SYNTH_PRESETS: dict[str, SynthConfig] = {
    "tiny": SynthConfig([3, 8, 20, 50, 120, 300], num_numerical=4, rows=150_000, test_rows=20_000, latent_std=0.3),
    "small": SynthConfig(
        [int(round(x)) for x in np.geomspace(3, 200_000, 26)], num_numerical=13, rows=500_000, test_rows=50_000,
        # 26 tables give 351 latent pairs and 26 biases: smaller per-term scales keep the logit's
        # spread (std ~1.8) like tiny's, so labels stay learnable (optimal AUC ~0.86, not 0.99)
        latent_std=0.17, bias_std=0.25,
    ),
}


class Teacher:
    """The hidden model. All parameters come from one seeded generator."""

    def __init__(self, cfg: SynthConfig, seed: int):
        rng = np.random.default_rng([seed, 1])
        self.cfg = cfg
        k = cfg.latent_dim
        self.dense_w = rng.normal(0, cfg.dense_weight_std / np.sqrt(max(cfg.num_numerical, 1)), cfg.num_numerical)
        self.dense_proj = rng.normal(0, 1.0 / np.sqrt(max(cfg.num_numerical, 1)), (cfg.num_numerical, k))
        self.bias = [rng.normal(0, cfg.bias_std, n) for n in cfg.table_sizes]
        self.latent = [rng.normal(0, cfg.latent_std, (n, k)) for n in cfg.table_sizes]
        self.cdfs = []
        for n in cfg.table_sizes:
            w = (np.arange(1, n + 1, dtype=np.float64)) ** -cfg.zipf_alpha
            self.cdfs.append(np.cumsum(w) / w.sum())
        self.offset = 0.0

    def sample_features(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Numerical features (float16, log-scaled like preprocessed counts) and Zipf ids."""
        dense = np.log1p(rng.gamma(0.7, 3.0, (n, self.cfg.num_numerical))).astype(np.float16)
        ids = np.empty((n, len(self.cdfs)), dtype=np.int64)
        for t, cdf in enumerate(self.cdfs):
            ids[:, t] = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
        return dense, ids

    def logits(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        x = dense.astype(np.float64)
        x = x - 1.0  # centre the log-scaled features
        logit = x @ self.dense_w + self.offset
        feats = [np.tanh(x @ self.dense_proj)]
        for t in range(ids.shape[1]):
            logit += self.bias[t][ids[:, t]]
            feats.append(self.latent[t][ids[:, t]])
        f = np.stack(feats, axis=1)  # [n, T+1, k]
        gram = np.einsum("nik,njk->nij", f, f)
        iu = np.triu_indices(f.shape[1], 1)
        return logit + gram[:, iu[0], iu[1]].sum(axis=1)

    def calibrate(self, rng: np.random.Generator) -> None:
        """Shift the logit so the mean click probability is the configured click rate."""
        dense, ids = self.sample_features(rng, 20_000)
        z = self.logits(dense, ids)
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (1 / (1 + np.exp(-(z + mid)))).mean() < self.cfg.click_rate:
                lo = mid
            else:
                hi = mid
        self.offset = (lo + hi) / 2


def generate(out_dir: str, cfg: SynthConfig, seed: int = 0, preset: str = "custom", overwrite: bool = False) -> FeatureSpec:
    if cfg.rows <= 0 or cfg.test_rows <= 0:
        raise DlrmkitError(f"--rows and --test-rows must be positive (got {cfg.rows}, {cfg.test_rows})")
    teacher = Teacher(cfg, seed)
    teacher.calibrate(np.random.default_rng([seed, 2]))
    writer = SplitBinaryWriter(out_dir, cfg.num_numerical, cfg.table_sizes, overwrite=overwrite)
    test_probs, test_labels = [], []
    try:
        for mapping, rows, stream in ((TRAIN, cfg.rows, 3), (TEST, cfg.test_rows, 4)):
            rng = np.random.default_rng([seed, stream])
            for start in range(0, rows, cfg.chunk_rows):
                n = min(cfg.chunk_rows, rows - start)
                dense, ids = teacher.sample_features(rng, n)
                probs = 1 / (1 + np.exp(-teacher.logits(dense, ids)))
                labels = rng.random(n) < probs
                writer.append(mapping, dense, ids, labels)
                if mapping == TEST:
                    test_probs.append(probs)
                    test_labels.append(labels)
        labels = np.concatenate(test_labels)
        metadata = {
            "generator": "dlrmkit synth",
            "preset": preset,
            "seed": seed,
            "optimal_auc": roc_auc(labels, np.concatenate(test_probs)),
            "test_click_rate": float(labels.mean()),
            "synth_config": {k: v for k, v in asdict(cfg).items() if k != "chunk_rows"},
        }
        return writer.finish(metadata)
    except BaseException:
        writer.abort()
        raise
