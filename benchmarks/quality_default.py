"""The default path as a new user runs it, per dataset and seed: `dlrmkit baseline --data D`, then
`dlrmkit train --data D --seed S` with nothing else (--preset auto: the candidate search on the
validation rows, the chosen recipe, the temperature), each in a fresh process. Prints one JSON
line per run: the candidate chosen, validation and test AUC / log loss, test ECE, the baseline's
test figures and the wall seconds. docs/RECIPES.md holds the table made from these lines.

    PYTHONPATH=src nice -n 10 python benchmarks/quality_default.py DATA [DATA ...] --seeds 0,1,2 \
        [--train-args '--folds 1']
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time


def dlrmkit(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dlrmkit", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"dlrmkit {' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc.stdout


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="+")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--train-args", default="", help="more train options, as one string split as a shell would (e.g. \"--folds 1\", \"--blend 'regression=1'\")")
    args = p.parse_args(argv)
    for data in args.data:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "baseline.json")
            dlrmkit("baseline", "--data", data, "--out", out)
            base = json.load(open(out))
            for seed in args.seeds.split(","):
                run = os.path.join(tmp, f"run{seed}")
                t0, cpu0 = time.perf_counter(), cpu_seconds()
                text = dlrmkit("train", "--data", data, "--seed", seed, "--run-dir", run, "--no-progress",
                               *shlex.split(args.train_args))  # fmt: skip
                seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
                m = json.load(open(os.path.join(run, "metrics.json")))
                chosen = next((line.split(" val AUC")[0].strip() for line in text.splitlines() if "<- chosen" in line), "none")
                if m.get("blend"):  # the run is a blend of candidates
                    weights = {b["name"]: b["weight"] for b in m["blend"]}  # a member's runs share its weight
                    runs = collections.Counter(b["name"] for b in m["blend"])  # its seeds
                    chosen = "blend: " + ", ".join(f"{n} x{w} ({runs[n]} run(s))" for n, w in weights.items())
                print(
                    json.dumps(
                        {
                            "data": data,
                            "seed": int(seed),
                            "chosen": chosen,
                            "val_auc": m["val_auc"],
                            "test_auc": m["auc"],
                            "test_logloss": m["logloss"],
                            "test_ece": m.get("ece"),
                            "temperature": m.get("temperature"),
                            "baseline_c": base["c"],
                            "baseline_test_auc": base["test_auc"],
                            "baseline_test_logloss": base["test_logloss"],
                            "seconds": seconds,
                            "cpu_seconds": cpu,  # user + system of the train process (shared machines)
                        }
                    ),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
