"""The search's single choice against its blend, per dataset and seed, replayed from the logits
quality_grid.py dumps (`--dump DIR`) for the search's candidates: the choice by
dlrmkit.train.recipe_search.choose (with the per-row log losses, so the clearly-worse rule acts),
the blend by dlrmkit.train.blend.ensemble_selection and its temperature, both scored on the test
rows. Prints a markdown table of mean test AUC / log loss and each seed's figures.

    PYTHONPATH=src python benchmarks/quality_grid.py DATA --seeds 0,1,2 --dump DIR \\
        --variants regression-k2-std,regression-k2-std-b32,base-k2-std,base-k2-std-b256,fm-k2-std,big-fm-b256,deepfm-adam-plateau
    PYTHONPATH=src python benchmarks/quality_blend.py DIR [DATASET ...] [--with VARIANT,...] \
        [--seeds 0,1,2] [--bags N] [--blend-seeds N]

`--with`: more grid variants as candidates beside the search's (what a new candidate would add);
`--bags 0`: ensemble selection unbagged (one run on the validation rows themselves).
`--blend-seeds N`: each member of a blend (weighing SEEDED_SHARE of it or more) the mean of its
runs on seeds S to S+N-1, as `train --blend-seeds N` trains it (those seeds' dumps needed; the
selection sees seed S's logits only).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys

import numpy as np

from quality_choice import VARIANT

from dlrmkit.metrics import roc_auc
from dlrmkit.train.blend import BAGS, SEEDED_SHARE, ensemble_selection, mean_logits
from dlrmkit.train.calibration import kept_scale, log_loss_of_logits, row_log_losses
from dlrmkit.train.options import BLEND_SEEDS
from dlrmkit.train.recipe_search import Candidate, choose


def seed_runs(folder: str, data: str, seed: int, extra: list[str]) -> dict[str, dict]:
    runs = {}
    for name, variant in [*VARIANT.items(), *((v, v) for v in extra)]:
        path = os.path.join(folder, f"{data}-{variant}-{seed}.npz")
        if os.path.exists(path):
            f = np.load(path)
            zv, yv = f["zv"].astype(np.float32), f["yv"]
            a = kept_scale(zv, yv)  # each candidate's temperature, as the search applies it
            runs[name] = {"zv": a * zv, "yv": yv, "zt": a * f["zt"].astype(np.float32), "yt": f["yt"]}
    return runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("datasets", nargs="*")
    parser.add_argument("--with", dest="extra", default="", help="more grid variants as candidates")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--bags", type=int, default=BAGS, help="ensemble selection's bootstrap samples (0: unbagged)")
    parser.add_argument("--blend-seeds", type=int, default=BLEND_SEEDS, help="runs per blend member")
    args = parser.parse_args(argv)
    extra = [v for v in args.extra.split(",") if v]
    folder, wanted, seeds = args.folder, args.datasets, [int(s) for s in args.seeds.split(",")]
    names = sorted({os.path.basename(p).split("-")[0] for p in glob.glob(os.path.join(folder, "*.npz"))})
    print("| dataset | single choice: test AUC / log loss | blend: test AUC / log loss | blend per seed (members) |")
    print("|---|---|---|---|")
    for data in wanted or names:
        single, blended, cells = [], [], []
        for seed in seeds:
            runs = seed_runs(folder, data, seed, extra)
            if len(runs) < 5:
                continue
            yv, yt = next(iter(runs.values()))["yv"], next(iter(runs.values()))["yt"]
            tried = [
                Candidate(n, {}, "", {
                    "val_auc": roc_auc(yv, r["zv"]), "val_logloss": log_loss_of_logits(r["zv"], yv),
                    "val_logloss_t": log_loss_of_logits(r["zv"], yv), "val_row_logloss": row_log_losses(r["zv"], yv),
                    "val_rows": len(yv),
                })
                for n, r in runs.items()
            ]  # fmt: skip
            win = runs[choose(tried).name]
            single.append((roc_auc(yt, win["zt"]), log_loss_of_logits(win["zt"], yt)))
            members = ensemble_selection({n: r["zv"] for n, r in runs.items()}, yv, args.bags)
            if len(members) == 1:  # no blend: the run is the single choice, as in `train`
                members = [type(members[0])(choose(tried).name, 1)]
            if len(members) > 1:  # a blend: each member its runs on seeds S, S+1, ... (as train_blend trains them)
                again = [seed_runs(folder, data, seed + k, extra) for k in range(1, args.blend_seeds)]
                if any(m.name not in r for r in again for m in members):
                    raise SystemExit(f"{data}: --blend-seeds {args.blend_seeds} needs dumps of seeds {seed} to "
                                     f"{seed + args.blend_seeds - 1}")  # fmt: skip
                total = sum(m.weight for m in members)  # a member under SEEDED_SHARE of it: one seed
                runs = {m.name: {key: np.mean([r[m.name][key] for r in [runs, *again]], axis=0) for key in ("zv", "zt")}
                        if m.weight >= SEEDED_SHARE * total else runs[m.name] for m in members}  # fmt: skip
            w = [m.weight for m in members]
            zv = mean_logits([runs[m.name]["zv"] for m in members], w)
            zt = kept_scale(zv.astype(np.float32), yv) * mean_logits([runs[m.name]["zt"] for m in members], w)
            blended.append((roc_auc(yt, zt), log_loss_of_logits(zt, yt)))
            cells.append(f"{blended[-1][0]:.4f} ({', '.join(f'{m.name} x{m.weight}' for m in members)}; "
                         f"single {single[-1][0]:.4f})")
        if single:
            s = [statistics.mean(x) for x in zip(*single)]
            b = [statistics.mean(x) for x in zip(*blended)]
            print(f"| {data} | {s[0]:.4f} / {s[1]:.4f} | {b[0]:.4f} / {b[1]:.4f} | {'; '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
