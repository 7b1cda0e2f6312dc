"""Write a Criteo-format TSV with realistic statistics: power-law (Zipf) categories with
per-column vocabularies of very different sizes, missing fields, negative integers, ~25% clicks.

    python benchmarks/gen_criteo.py --rows 2000000 --out /tmp/criteo_2m.tsv
"""

from __future__ import annotations

import argparse

import numpy as np

# distinct values per column, roughly Criteo Kaggle's spread (capped for a 2M-row file)
VOCAB = [1460, 580, 1_000_000, 800_000, 305, 24, 12517, 633, 3, 93145, 5683, 1_000_000, 3194, 27, 14992,
         1_000_000, 10, 5652, 2173, 4, 1_000_000, 18, 15, 286181, 105, 142572]
MISSING_INT = [0.45, 0.0, 0.2, 0.2, 0.05, 0.25, 0.05, 0.0, 0.05, 0.45, 0.05, 0.77, 0.2]
MISSING_CAT = [0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
               0.44, 0.44, 0.03, 0.76, 0.0, 0.03, 0.44, 0.44]


def chunk(rng: np.random.Generator, n: int) -> bytes:
    cols = [np.where(rng.random(n) < 0.25, "1", "0")]
    for j in range(13):
        v = np.floor(rng.lognormal(1.5, 1.8, n)).astype(np.int64)
        if j == 1:
            v -= rng.integers(0, 3, n) * (rng.random(n) < 0.1)  # I2 has negatives
        s = v.astype(str)
        cols.append(np.where(rng.random(n) < MISSING_INT[j], "", s))
    for j, size in enumerate(VOCAB):
        ids = (rng.zipf(1.2, n) - 1) % size
        # a fixed random 32-bit hex per id, as in Criteo's hashed values
        h = ((ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(j * 97)) % np.uint64(2**32)).astype(np.uint32)
        s = np.char.mod("%08x", h)
        cols.append(np.where(rng.random(n) < MISSING_CAT[j], "", s))
    table = np.stack(cols, axis=1)
    return ("\n".join("\t".join(r) for r in table.tolist()) + "\n").encode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    with open(a.out, "wb") as f:
        for start in range(0, a.rows, 100_000):
            f.write(chunk(rng, min(100_000, a.rows - start)))
    print(f"wrote {a.out}: {a.rows:,} rows")


if __name__ == "__main__":
    main()
