"""Multi-hot categorical features: fixed-size bags of ids per sample, and MLPerf DLRM-DCNv2's
synthetic expansion of a one-hot dataset into them.

MLPerf's recipe (mlcommons/training recommendation_v2/torchrec_dlrm, `multi_hot.py` and
`materialize_synthetic_multihot_dataset.py`, uniform distribution): one legacy numpy stream
seeded once (`np.random.seed(0)`) draws, table after table, a lookup table of rows x (k - 1)
uniform ids in [0, rows); the bag of id i (taken modulo the table's rows) is [i, lookup[i]].
`Expansion` reproduces exactly those draws, block by block, into lookup files on disk (never a
whole table in memory), and `materialize` rewrites a one-hot dataset as a multi-hot one reading
and writing `block_rows` rows at a time.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import torch
from tqdm import tqdm

from dlrmkit.data.feature_spec import TEST, TRAIN, VAL, FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryDataset, SplitBinaryWriter
from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import JaggedIds

# MLPerf Training DLRM-DCNv2's bag sizes of the 26 Criteo features (materialize_synthetic_multihot_dataset.py
# --multi_hot_sizes in mlcommons/training recommendation_v2/torchrec_dlrm/README.MD)
MLPERF_MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
BLOCK_ROWS = 1 << 15  # rows read, expanded and written at a time (and lookup rows drawn at a time)


def fixed_bags(ids: np.ndarray | torch.Tensor, hotness: list[int]) -> JaggedIds:
    """Table-major JaggedIds of fixed-size bags: `ids` [B, sum(hotness)] holds each table's
    `hotness[t]` columns side by side (SplitBinaryDataset.read's layout)."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64)) if isinstance(ids, np.ndarray) else ids.long()
    b = ids.shape[0]
    bounds = np.concatenate([[0], np.cumsum(hotness)]).tolist()
    parts = [ids[:, bounds[t] : bounds[t + 1]].reshape(-1) for t in range(len(hotness))]
    values = torch.cat(parts) if parts else ids.new_zeros(0)  # no tables (every table replicated)
    lengths = torch.tensor(hotness, dtype=torch.int64).repeat_interleave(b)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return JaggedIds(values, offsets, b)


def parse_sizes(text: str, count: int, what: str) -> list[int]:
    """'3,2,1,...' -> one positive integer per table (`count` of them), or a one-line error."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise DlrmkitError(f"{what} must be comma-separated integers, got '{text[:80]}'") from None
    if len(sizes) != count or min(sizes) < 1:
        raise DlrmkitError(f"{what} needs {count} positive integers (one per table), got {len(sizes)}: '{text[:80]}'")
    return sizes


class Expansion:
    """The bags of MLPerf's synthetic multi-hot expansion for tables of `rows` rows and bag sizes
    `hotness`: id i of table t -> [i, lookup_t[i, 0], ..., lookup_t[i, k-2]]. The lookup tables
    are drawn in `folder` (files this object creates and `close` removes), block by block."""

    def __init__(self, rows: list[int], hotness: list[int], seed: int, folder: str, block_rows: int = BLOCK_ROWS):
        if len(rows) != len(hotness):
            raise DlrmkitError(f"{len(hotness)} bag sizes for {len(rows)} tables")
        self.rows, self.hotness, self.folder = list(rows), list(hotness), folder
        os.makedirs(folder, exist_ok=False)
        self.lookups: list[np.ndarray | None] = []
        rng = np.random.RandomState(seed)  # the legacy stream of np.random.seed(seed), as MLPerf draws it
        for t, (e, k) in enumerate(zip(self.rows, self.hotness)):
            if k == 1:
                self.lookups.append(None)
                continue
            path = os.path.join(folder, f"lookup_{t}.bin")
            table = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(e, k - 1))
            for lo in range(0, e, block_rows):
                n = min(block_rows, e - lo)
                table[lo : lo + n] = rng.randint(0, e, size=(n, k - 1))
            table.flush()
            del table
            self.lookups.append(np.load(path, mmap_mode="r"))

    def bags(self, t: int, ids: np.ndarray) -> np.ndarray:
        """[n, hotness[t]] bags of table t's one-hot ids (taken modulo its rows, as MLPerf does)."""
        ids = np.asarray(ids, dtype=np.int64) % self.rows[t]
        lookup = self.lookups[t]
        if lookup is None:
            return ids[:, None]
        return np.concatenate([ids[:, None], lookup[ids].astype(np.int64)], axis=1)

    def expand(self, ids: np.ndarray) -> np.ndarray:
        """One-hot ids [n, T] -> [n, sum(hotness)], each table's bag columns side by side."""
        return np.concatenate([self.bags(t, ids[:, t]) for t in range(len(self.rows))], axis=1)

    def close(self) -> None:
        self.lookups = []
        shutil.rmtree(self.folder, ignore_errors=True)


def materialize(
    source: str,
    out_dir: str,
    hotness: list[int],
    seed: int = 0,
    num_embeddings: list[int] | None = None,
    overwrite: bool = False,
    block_rows: int = BLOCK_ROWS,
    progress: bool | None = None,
) -> FeatureSpec:
    """Write the multi-hot dataset of one-hot dataset `source` at `out_dir`: the same rows,
    numerical features and labels; each categorical feature's ids expanded into bags of
    hotness[t] (tables of num_embeddings[t] rows, default the source's cardinalities)."""
    spec = FeatureSpec.from_yaml(source)
    if any(h != 1 for h in spec.hotness):
        raise DlrmkitError(f"{source}: already multi-hot (hotness {spec.hotness}); expand a one-hot dataset")
    rows = list(num_embeddings) if num_embeddings is not None else spec.cardinalities
    if len(hotness) != len(rows):
        raise DlrmkitError(f"--multi-hot-sizes gives {len(hotness)} bag sizes, the dataset has {len(rows)} tables")
    mappings = [m for m in (TRAIN, VAL, TEST) if m in spec.source_spec]
    sets = {m: SplitBinaryDataset(spec, m) for m in mappings}
    from dlrmkit.data.output_dir import output_lock

    with output_lock(out_dir):
        writer = SplitBinaryWriter(
            out_dir, len(spec.numerical_names), rows, overwrite=overwrite, val=VAL in sets, hotness=hotness,
            numerical_dtype=str(spec.numerical_dtype),  # as the source stores them
        )  # fmt: skip
        bar = tqdm(
            total=sum(len(d) for d in sets.values()),
            unit="row",
            unit_scale=True,
            desc="multihot",
            dynamic_ncols=True,
            disable=None if progress is None else not progress,
            leave=False,
        )
        expansion = None
        try:
            expansion = Expansion(rows, hotness, seed, os.path.join(writer.tmp_dir, "lookup.tmp"), block_rows)
            for mapping, data in sets.items():
                for lo in range(0, len(data), block_rows):
                    raw = data.read(lo, min(lo + block_rows, len(data)))
                    writer.append(mapping, raw.dense, expansion.expand(raw.ids), raw.labels)
                    bar.update(len(raw.labels))
            expansion.close()
            bar.close()
            meta = {k: v for k, v in spec.metadata.items() if k != "rows"}
            if any(r < c for r, c in zip(rows, spec.cardinalities)):  # folded ids: the source's optimum no longer holds
                meta.pop("optimal_auc", None)
            meta["multi_hot"] = {"source": os.path.abspath(source), "sizes": list(hotness), "seed": seed}
            meta["multi_hot"]["distribution"] = "uniform (MLPerf DLRM-DCNv2 synthetic multi-hot)"
            return writer.finish(meta)
        except BaseException:
            bar.close()
            if expansion is not None:
                expansion.close()
            writer.abort()
            raise
