"""Synthetic click data from a hidden teacher model, so a training run can say how close it came
to the best possible AUC.

Categories follow a Zipf (power-law) frequency with id 0 the most frequent, as in preprocessed
Criteo data. The teacher has a DLRM-like structure: a linear term in the numerical features,
a bias per category, and pairwise dot products between a projection of the numerical features
and per-category latent vectors. Labels are drawn from its click probability; the Bayes-optimal
AUC (the AUC of the true probabilities on the test rows) is stored in the dataset metadata.

Tables up to `STORED_MAX_ROWS` keep their teacher parameters in arrays and draw ids from the
exact Zipf distribution. Larger tables (Criteo's 10M-40M-row ones) would need gigabytes for
that, so their parameters are a counter-based hash of (seed, table, id) turned into normal
values, and their ids come from the continuous Zipf's inverse CDF: memory stays independent of
table sizes as well as of rows (generation runs in chunks of `chunk_rows`).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np
from tqdm import tqdm

from dlrmkit.data.feature_spec import TEST, TRAIN, FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryWriter
from dlrmkit.data.synthetic_shapes import SYNTH_PRESETS, SynthConfig
from dlrmkit.errors import DlrmkitError
from dlrmkit.metrics import roc_auc

__all__ = ["SYNTH_PRESETS", "SynthConfig", "Teacher", "generate", "STORED_MAX_ROWS"]

STORED_MAX_ROWS = 1 << 21  # above this, a table's teacher parameters are hashed, not stored
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 whose outputs look independent."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _unit(h: np.ndarray) -> np.ndarray:
    """uint64 hashes -> uniform floats in (0, 1)."""
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))


class HashedTable:
    """Teacher parameters of one large table, computed per id: normal(0, std) bias and latent
    values from a hash of (key, id, component) via Box-Muller. Costs no memory per row."""

    def __init__(self, key: int, latent_dim: int, bias_std: float, latent_std: float):
        self.key, self.k, self.bias_std, self.latent_std = np.uint64(key), latent_dim, bias_std, latent_std

    def _normal(self, ids: np.ndarray, component: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            base = _mix(ids.astype(np.uint64) * _GOLDEN + self.key + np.uint64(2 * component + 1))
            u1, u2 = _unit(base), _unit(_mix(base + _GOLDEN))
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def bias(self, ids: np.ndarray) -> np.ndarray:
        return self.bias_std * self._normal(ids, 0)

    def latent(self, ids: np.ndarray) -> np.ndarray:
        return self.latent_std * np.stack([self._normal(ids, 1 + c) for c in range(self.k)], axis=1)


def zipf_continuous(u: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """Ids in [0, n) from uniforms `u` by the inverse CDF of the continuous power law
    x^-alpha on [1, n+1): close to the discrete Zipf, with no per-row table."""
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * np.log(n + 1.0))
    else:
        a = 1.0 - alpha
        x = (1.0 + u * ((n + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, n - 1).clip(0)


class Teacher:
    """The hidden model. All parameters come from one seeded generator (hashed tables from
    keys it draws)."""

    def __init__(self, cfg: SynthConfig, seed: int):
        rng = np.random.default_rng([seed, 1])
        self.cfg = cfg
        k = cfg.latent_dim
        self.dense_w = rng.normal(0, cfg.dense_weight_std / np.sqrt(max(cfg.num_numerical, 1)), cfg.num_numerical)
        self.dense_proj = rng.normal(0, 1.0 / np.sqrt(max(cfg.num_numerical, 1)), (cfg.num_numerical, k))
        stored = [n <= STORED_MAX_ROWS for n in cfg.table_sizes]
        self.bias = [rng.normal(0, cfg.bias_std, n) if s else None for n, s in zip(cfg.table_sizes, stored)]
        self.latent = [rng.normal(0, cfg.latent_std, (n, k)) if s else None for n, s in zip(cfg.table_sizes, stored)]
        keys = np.random.default_rng([seed, 5]).integers(0, 2**63, len(cfg.table_sizes))
        self.hashed = [
            None if s else HashedTable(int(key), k, cfg.bias_std, cfg.latent_std) for s, key in zip(stored, keys)
        ]
        self.cdfs = []
        for n, s in zip(cfg.table_sizes, stored):
            if s:
                w = (np.arange(1, n + 1, dtype=np.float64)) ** -cfg.zipf_alpha
                self.cdfs.append(np.cumsum(w) / w.sum())
            else:
                self.cdfs.append(None)
        self.offset = 0.0
        # the cross teacher's U [n, r] and V [r, n] over x0 = [dense projection, T latent vectors]
        n = (len(cfg.table_sizes) + 1) * k
        cross_rng = np.random.default_rng([seed, 6])
        self.cross_u = cross_rng.normal(0, 1, (n, cfg.cross_rank)) if cfg.teacher == "cross" else None
        self.cross_v = cross_rng.normal(0, 1, (cfg.cross_rank, n)) if cfg.teacher == "cross" else None
        self.cross_scale = 1.0

    def sample_features(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Numerical features (float16, log-scaled like preprocessed counts) and Zipf ids."""
        dense = np.log1p(rng.gamma(0.7, 3.0, (n, self.cfg.num_numerical))).astype(np.float16)
        ids = np.empty((n, len(self.cdfs)), dtype=np.int64)
        for t, (cdf, size) in enumerate(zip(self.cdfs, self.cfg.table_sizes)):
            if cdf is not None:
                ids[:, t] = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
            else:
                ids[:, t] = zipf_continuous(rng.random(n), size, self.cfg.zipf_alpha)
        return dense, ids

    def logits(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Linear and bias terms plus the sum of all pairwise dots of the T+1 latent vectors,
        as (|sum f|^2 - sum |f|^2) / 2: memory [n, k], not [n, T+1, T+1]."""
        x = dense.astype(np.float64) - 1.0  # centre the log-scaled features
        logit = x @ self.dense_w + self.offset
        f = np.tanh(x @ self.dense_proj)
        total, squares = f.copy(), (f * f).sum(axis=1)
        feats = [f]
        for t in range(ids.shape[1]):
            hashed = self.hashed[t]
            if hashed is None:
                logit += self.bias[t][ids[:, t]]
                f = self.latent[t][ids[:, t]]
            else:
                logit += hashed.bias(ids[:, t])
                f = hashed.latent(ids[:, t])
            total += f
            squares += (f * f).sum(axis=1)
            if self.cross_u is not None:
                feats.append(f)
        if self.cross_u is not None:
            return logit + self.cross_scale * self.cross_term(np.concatenate(feats, axis=1))
        return logit + 0.5 * ((total * total).sum(axis=1) - squares)

    def cross_term(self, x0: np.ndarray) -> np.ndarray:
        """sum_i x0_i (U V x0)_i: one DCNv2 cross layer's output, summed."""
        return (x0 * ((x0 @ self.cross_v.T) @ self.cross_u.T)).sum(axis=1)

    def calibrate(self, rng: np.random.Generator) -> None:
        """Shift the logit so the mean click probability is the configured click rate."""
        dense, ids = self.sample_features(rng, 20_000)
        if self.cross_u is not None:  # the cross term's spread: the pairwise dots' (std ~1.1)
            self.cross_scale = 1.0
            plain = self.logits(dense, ids)
            self.cross_scale = 0.0
            self.cross_scale = 1.1 / max(float(np.std(plain - self.logits(dense, ids))), 1e-12)
        z = self.logits(dense, ids)
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (1 / (1 + np.exp(-(z + mid)))).mean() < self.cfg.click_rate:
                lo = mid
            else:
                hi = mid
        self.offset = (lo + hi) / 2


# the teacher and bag fields at their defaults are left out of a dataset's metadata (as before they existed)
_UNSET = {"teacher": "dot", "cross_rank": 8, "multi_hot": None}


def generate(
    out_dir: str,
    cfg: SynthConfig,
    seed: int = 0,
    preset: str = "custom",
    overwrite: bool = False,
    progress: bool | None = None,
) -> FeatureSpec:
    """Writes the dataset chunk by chunk (memory: the teacher's stored tables, one chunk, and
    the test rows' probabilities for the optimal AUC). `progress`: None shows a bar on a terminal."""
    if cfg.rows <= 0 or cfg.test_rows <= 0:
        raise DlrmkitError(f"--rows and --test-rows must be positive (got {cfg.rows}, {cfg.test_rows})")
    if not cfg.table_sizes or min(cfg.table_sizes) < 1:
        raise DlrmkitError(f"every table needs at least 1 row (got {cfg.table_sizes})")
    from dlrmkit.data.output_dir import output_lock

    with output_lock(out_dir):  # one writer per --out
        return _generate(out_dir, cfg, seed, preset, overwrite, progress)


def _generate(
    out_dir: str, cfg: SynthConfig, seed: int, preset: str, overwrite: bool, progress: bool | None
) -> FeatureSpec:
    teacher = Teacher(cfg, seed)
    teacher.calibrate(np.random.default_rng([seed, 2]))
    writer = SplitBinaryWriter(out_dir, cfg.num_numerical, cfg.table_sizes, overwrite=overwrite, hotness=cfg.multi_hot)
    expansion = None
    test_probs, test_labels = [], []
    bar = tqdm(
        total=cfg.rows + cfg.test_rows,
        unit="row",
        unit_scale=True,
        desc="synth",
        dynamic_ncols=True,
        disable=None if progress is None else not progress,
        leave=False,
    )
    try:
        if cfg.multi_hot is not None:  # lookup files in the writer's folder, removed before it is published
            from dlrmkit.data.multi_hot import Expansion

            expansion = Expansion(cfg.table_sizes, cfg.multi_hot, seed, os.path.join(writer.tmp_dir, "lookup.tmp"))
        for mapping, rows, stream in ((TRAIN, cfg.rows, 3), (TEST, cfg.test_rows, 4)):
            rng = np.random.default_rng([seed, stream])
            for start in range(0, rows, cfg.chunk_rows):
                n = min(cfg.chunk_rows, rows - start)
                dense, ids = teacher.sample_features(rng, n)
                probs = 1 / (1 + np.exp(-teacher.logits(dense, ids)))
                labels = rng.random(n) < probs
                writer.append(mapping, dense, ids if expansion is None else expansion.expand(ids), labels)
                if mapping == TEST:
                    test_probs.append(probs)
                    test_labels.append(labels)
                bar.update(n)
        bar.close()
        if expansion is not None:
            expansion.close()
        labels = np.concatenate(test_labels)
        metadata = {
            "generator": "dlrmkit synth",
            "preset": preset,
            "seed": seed,
            "optimal_auc": roc_auc(labels, np.concatenate(test_probs)),
            "test_click_rate": float(labels.mean()),
            "synth_config": {
                k: v
                for k, v in asdict(cfg).items()
                if k != "chunk_rows"
                and (k, v) not in _UNSET.items()
                and not (k == "cross_rank" and cfg.teacher == "dot")
            },
        }
        return writer.finish(metadata)
    except BaseException:
        bar.close()
        if expansion is not None:
            expansion.close()
        writer.abort()
        raise
