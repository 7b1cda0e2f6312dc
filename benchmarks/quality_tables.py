"""Markdown tables for docs/RECIPES.md from the JSON lines of quality_grid.py: per dataset, each
variant's test AUC per seed, its mean and its move from the base recipe, the mean validation AUC,
and the test log loss before and after the temperature.

    python benchmarks/quality_tables.py grid.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(paths: list[str]) -> int:
    runs: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for path in paths:
        for line in open(path, encoding="utf-8"):
            if line.strip():
                r = json.loads(line)
                runs[(r["data"].rstrip("/").split("/")[-1], r["variant"])][r["seed"]] = r
    datasets = list(dict.fromkeys(d for d, _ in runs))
    for data in datasets:
        base = runs.get((data, "base"), {})
        base_mean = statistics.mean(r["test_auc"] for r in base.values()) if base else float("nan")
        print(f"\n{data}\n")
        print("| variant | test AUC per seed | mean | vs base | mean val AUC | test log loss (T-scaled) | epoch |")
        print("|---|---|---|---|---|---|---|")
        for (d, variant), by_seed in runs.items():
            if d != data:
                continue
            seeds = [by_seed[s] for s in sorted(by_seed)]
            mean = statistics.mean(r["test_auc"] for r in seeds)
            per_seed = " ".join(f"{r['test_auc']:.4f}" for r in seeds)
            print(
                f"| {variant} | {per_seed} | {mean:.4f} | "
                f"{mean - base_mean:+.4f} | {statistics.mean(r['val_auc'] for r in seeds):.4f} | "
                f"{statistics.mean(r['test_logloss'] for r in seeds):.4f} "
                f"({statistics.mean(r['test_logloss_calibrated'] for r in seeds):.4f}) | "
                f"{statistics.mean(r['selected_epoch'] for r in seeds):.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
