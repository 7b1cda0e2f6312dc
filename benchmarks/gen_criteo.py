"""Write a Criteo-format TSV with realistic statistics: per-column vocabularies of Criteo Kaggle's
sizes (33.8M values in all, the largest 10.1M), power-law frequencies with a long tail, missing
fields, negative integers, ~25% clicks.

Each category column draws from its Kaggle-sized vocabulary: 60% of the rows from a power law
(exponent 0.9, the head: the top 1% of values take about half of those rows) and 40% uniformly
(the tail of rare values). So the distinct values per column grow with the rows as in the
real logs (at 45.8M rows they approach Kaggle's counts) and a frequency threshold drops most of
the tail; the script prints the distinct values it wrote, and those written at least 3 times.

    python benchmarks/gen_criteo.py --rows 2000000 --out /tmp/criteo_2m.tsv
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from tqdm import tqdm

from dlrmkit.data.synthetic import zipf_continuous
from dlrmkit.data.synthetic_shapes import KAGGLE_TABLE_SIZES

VOCAB = KAGGLE_TABLE_SIZES  # values per column
HEAD_SHARE, HEAD_EXPONENT = 0.6, 0.9
MISSING_INT = [0.45, 0.0, 0.2, 0.2, 0.05, 0.25, 0.05, 0.0, 0.05, 0.45, 0.05, 0.77, 0.2]
MISSING_CAT = [
    0.0,
    0.0,
    0.03,
    0.03,
    0.0,
    0.12,
    0.0,
    0.0,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.44,
    0.44,
    0.03,
    0.76,
    0.0,
    0.03,
    0.44,
    0.44,
]


HEX = np.array([f"{i:02x}" for i in range(256)], dtype="S2")


def chunk(rng: np.random.Generator, n: int, seen: list[np.ndarray] | None = None) -> pa.Table:
    """`n` rows as an Arrow table (nulls are the empty fields), written by Arrow's CSV writer."""
    cols = [pa.array((rng.random(n) < 0.25).astype(np.int8))]
    for j in range(13):
        v = np.floor(rng.lognormal(1.5, 1.8, n)).astype(np.int64)
        if j == 1:
            v -= rng.integers(0, 3, n) * (rng.random(n) < 0.1)  # I2 has negatives
        cols.append(pa.array(v, mask=rng.random(n) < MISSING_INT[j]))
    for j, size in enumerate(VOCAB):
        ids = np.where(
            rng.random(n) < HEAD_SHARE, zipf_continuous(rng.random(n), size, HEAD_EXPONENT), rng.integers(0, size, n)
        )
        missing = rng.random(n) < MISSING_CAT[j]
        if seen is not None:  # occurrences per value, saturating at 255
            values, counts = np.unique(ids[~missing], return_counts=True)
            seen[j][values] = np.minimum(seen[j][values].astype(np.int64) + counts, 255).astype(np.uint8)
        # a fixed random 32-bit hex per id, as in Criteo's hashed values
        h = ((ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(j * 97)) % np.uint64(2**32)).astype(">u4")
        text = HEX[h.view(np.uint8).reshape(n, 4)].view("S8").ravel()
        cols.append(pa.array(text, mask=missing).cast(pa.string()))
    return pa.table(cols, names=[f"c{i}" for i in range(len(cols))])


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    seen = [np.zeros(size, dtype=np.uint8) for size in VOCAB]  # 34 MB: occurrences of each value (to 255)
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pacsv.CSVWriter(a.out, chunk(rng, 0).schema, write_options=options) as writer:
        for start in tqdm(range(0, a.rows, 100_000), unit="chunk", disable=None):
            writer.write_table(chunk(rng, min(100_000, a.rows - start), seen))
    distinct = [int((s > 0).sum()) for s in seen]
    kept = [int((s >= 3).sum()) for s in seen]
    print(
        f"wrote {a.out}: {a.rows:,} rows; distinct categories {sum(distinct):,} (largest column {max(distinct):,}); "
        f"seen at least 3 times (what preprocess --frequency-threshold 3 keeps) {sum(kept):,} (largest column {max(kept):,})"
    )


if __name__ == "__main__":
    main()
