"""Cross-validation (`train --folds 5`) against held-out rows, replayed from the logits
quality_grid.py dumps for the search's candidates: per dataset and seed, test AUC of
(1) the blend chosen on the held-out rows, two seeds per member (the default before --folds, less
its refit), (2) the blend chosen on the folds' validation logits, the held-out models kept, and
(3) chosen so and each member the mean of its fold models (what --folds trains), beside the
regression alone and its fold models' mean. Prints one line per dataset and seed, then the means.

    V=regression-k1-std,regression-k2-std-b32,base-k2-std,base-k2-std-b256,fm-k2-std,big-fm-b256,deepfm-adam-plateau
    PYTHONPATH=src python benchmarks/quality_grid.py DATA --seeds 0,1,2 --variants $V --dump DIR/held
    for F in 1 2 3 4 5; do PYTHONPATH=src python benchmarks/quality_grid.py DATA --seeds 0,1 --variants $V \\
        --folds 5 --fold $F --dump DIR/f$F; done
    PYTHONPATH=src python benchmarks/quality_folds.py DIR NAME[,NAME ...] --seeds 0,1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

import quality_choice
from dlrmkit.metrics import roc_auc
from dlrmkit.train.blend import SEEDED_SHARE, ensemble_selection, mean_logits
from dlrmkit.train.calibration import kept_scale

# the search's candidates as quality_grid.py names them; its `regression` keeps every id (--min-id-count 1)
VARIANT = {**quality_choice.VARIANT, "regression": "regression-k1-std"}
FOLDS = 5


def runs_of(folder: str, data: str, seed: int) -> dict[str, dict]:
    """Each candidate's validation and test logits, after its own temperature (as the search
    applies it)."""
    runs = {}
    for name, variant in VARIANT.items():
        path = os.path.join(folder, f"{data}-{variant}-{seed}.npz")
        if os.path.exists(path):
            f = np.load(path)
            zv, yv = f["zv"].astype(np.float32), f["yv"]
            a = kept_scale(zv, yv)
            runs[name] = {"zv": a * zv, "yv": yv, "zt": a * f["zt"].astype(np.float32), "yt": f["yt"]}
    return runs


def blend_test(members, sources: list[dict]) -> np.ndarray:
    """The blend's test logits, each member the mean of its runs in `sources` (the first only for
    a member under SEEDED_SHARE of the blend, as train_blend runs it)."""
    total = sum(m.weight for m in members)
    zs = []
    for m in members:
        use = [s for s in (sources if m.weight >= SEEDED_SHARE * total else sources[:1]) if m.name in s]
        zs.append(np.mean([s[m.name]["zt"] for s in use], axis=0))
    return mean_logits(zs, [m.weight for m in members])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="holding held/ and f1/ .. f5/, quality_grid.py --dump folders")
    p.add_argument("datasets", help="dataset names, comma-separated (the dump files' first part)")
    p.add_argument("--seeds", default="0,1")
    args = p.parse_args(argv)
    rows = []
    for data in args.datasets.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            held = runs_of(os.path.join(args.folder, "held"), data, seed)
            again = runs_of(os.path.join(args.folder, "held"), data, seed + 1)
            folds = [runs_of(os.path.join(args.folder, f"f{f}"), data, seed) for f in range(1, FOLDS + 1)]
            names = [n for n in held if all(n in f for f in folds)]
            if len(names) < 5:
                print(f"{data} seed {seed}: dumps missing", file=sys.stderr)
                continue
            yt = held[names[0]]["yt"]
            chosen_held = ensemble_selection({n: held[n]["zv"] for n in names}, held[names[0]]["yv"])
            oof = {n: np.concatenate([f[n]["zv"] for f in folds]) for n in names}
            chosen_folds = ensemble_selection(oof, np.concatenate([f[names[0]]["yv"] for f in folds]))
            bag = {n: {"zt": np.mean([f[n]["zt"] for f in folds], axis=0)} for n in names}
            row = [
                roc_auc(yt, blend_test(chosen_held, [held, again])),
                roc_auc(yt, blend_test(chosen_folds, [held, again])),
                roc_auc(yt, blend_test(chosen_folds, [bag])),
                roc_auc(yt, held["regression"]["zt"]),
                roc_auc(yt, bag["regression"]["zt"]),
            ]
            rows.append(row)
            print(f"{data} seed {seed}: " + "  ".join(f"{x:.4f}" for x in row))
    if rows:
        print("mean: " + "  ".join(f"{statistics.mean(c):.4f}" for c in zip(*rows)))
        print("(held-out choice; fold choice, held-out models; fold choice, fold models; regression; its fold models)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
