"""What `train --data D` (--preset auto) chooses, per dataset and seed, from quality_grid.py's runs
of its candidates: each candidate's grid variant is its recipe over the small-data base, trained
with the same seed, so its validation figures are the search's; the choice is
dlrmkit.train.recipe_search.choose itself. Prints a markdown table: the chosen candidate and its
test AUC per seed, the mean, and the mean test log loss after the temperature fitted on the
validation rows.

    PYTHONPATH=src python benchmarks/quality_choice.py grid.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import json
import statistics
import sys

from dlrmkit.train.recipe_search import Candidate, choose

# candidate (dlrmkit.train.recipe_search.candidates, in its order) -> its quality_grid.py variant
VARIANT = {
    "regression": "regression-k2-std",
    "regression, buckets": "regression-k2-std-b32",
    "dlrm+wide": "base-k2-std",
    "dlrm+wide, buckets": "base-k2-std-b256",
    "dlrm+wide+fm": "fm-k2-std",
    "deepfm, adam, lr decay": "deepfm-adam-plateau",
    "dlrm+wide+fm, wide top MLP": "big-fm-b256",
}


def main(paths: list[str]) -> int:
    runs: dict[tuple[str, str, int], dict] = {}
    for path in paths:
        for line in open(path, encoding="utf-8"):
            if line.strip():
                r = json.loads(line)
                runs[(r["data"].rstrip("/").split("/")[-1], r["variant"], r["seed"])] = r
    print("| dataset | chosen candidate, test AUC (per seed) | mean test AUC | mean test log loss (T-scaled) |")
    print("|---|---|---|---|")
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.train.selection import validation_split

    for data in dict.fromkeys(d for d, _, _ in runs):
        path = next(r["data"] for (d, _, _), r in runs.items() if d == data)
        spec, train, _ = open_dataset(path)
        val_rows = len(validation_split(spec, train, None)[1])
        picks = []
        for seed in sorted({s for d, _, s in runs if d == data}):
            tried = [
                Candidate(name, {}, "", {**runs[(data, v, seed)], "val_rows": val_rows})
                for name, v in VARIANT.items()
                if (data, v, seed) in runs
            ]
            if len(tried) < 5:  # every candidate (buckets only with numerical features) or none
                continue
            win = choose(tried)
            picks.append((win.name, win.result))
        if picks:
            cells = ", ".join(f"{n} {r['test_auc']:.4f}" for n, r in picks)
            auc = statistics.mean(r["test_auc"] for _, r in picks)
            ll = statistics.mean(r["test_logloss_calibrated"] for _, r in picks)
            print(f"| {data} | {cells} | {auc:.4f} | {ll:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
