"""--time-limit on a 46,170-row log of 80 columns: `dlrmkit train --data D --seed 0` with the
default limit against `--time-limit 0`, on a quiet machine and with CPU-bound processes beside
it, each a fresh process; prints wall seconds, test AUC / log loss and what the limit left out.

    PYTHONPATH=src python benchmarks/bench_time_limit.py [--burners 0,2] [--limits default,0] [--out DIR]

The log: 50 categorical columns (5 to 3,000 values, Zipf-drawn) and 30 numerical ones, the label
a logistic function of every fourth categorical column and three numerical ones (seed 1); 51,300
rows, transcoded with defaults and --test-fraction 0.1 (46,170 train, 5,130 test)."""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROWS, CATEGORICAL, NUMERICAL = 51_300, 50, 30


def write_log(path: str) -> None:
    rng = np.random.default_rng(1)
    cards = rng.integers(5, 3000, CATEGORICAL)
    cats = np.stack([rng.zipf(1.3, ROWS) % k for k in cards], 1)
    nums = rng.normal(size=(ROWS, NUMERICAL))
    effects = [rng.normal(size=k) * 0.5 for k in cards]
    z = sum(effects[j][cats[:, j]] for j in range(0, CATEGORICAL, 4)) + nums[:, 0] - nums[:, 1] * nums[:, 2] - 1
    y = rng.random(ROWS) < 1 / (1 + np.exp(-z))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y"] + [f"c{j}" for j in range(CATEGORICAL)] + [f"x{j}" for j in range(NUMERICAL)])
        for i in range(ROWS):
            w.writerow([int(y[i])] + list(cats[i]) + ["%.3f" % v for v in nums[i]])


def dlrmkit(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dlrmkit", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"dlrmkit {' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burners", default="0,2", help="CPU-bound processes beside the runs, per round")
    parser.add_argument("--limits", default="default,0", help="--time-limit values, per round ('default': none given)")
    parser.add_argument(
        "--out", default=None, help="folder for the log, its dataset and the runs (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="time-limit-")
    data = os.path.join(out, "data")
    os.makedirs(out, exist_ok=True)
    if not os.path.isdir(data):
        write_log(os.path.join(out, "log.csv"))
        dlrmkit("transcode", "--input", os.path.join(out, "log.csv"), "--out", data, "--label", "y",
                "--categorical", ",".join(f"c{j}" for j in range(CATEGORICAL)),
                "--numerical", ",".join(f"x{j}" for j in range(NUMERICAL)), "--test-fraction", "0.1")  # fmt: skip
    print("| processes beside it | --time-limit | wall s | test AUC / log loss | left out |")
    print("|---|---|---|---|---|")
    for burners in (int(b) for b in args.burners.split(",")):
        beside = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
        try:
            for limit in args.limits.split(","):
                run = os.path.join(out, f"run-{burners}-{limit}")
                extra = [] if limit == "default" else ["--time-limit", limit]
                t0 = time.perf_counter()
                text = dlrmkit("train", "--data", data, "--run-dir", run, "--no-progress", "--seed", "0", *extra)
                wall = time.perf_counter() - t0
                test = re.search(r"test logloss ([0-9.]+)\s+test AUC ([0-9.]+)", text)
                left = [m.split(":")[0] for m in re.findall(r"^search \d+/\d+: ([^:]+): not tried", text, re.M)]
                left += re.findall(r"^search \d+/\d+: ended by --time-limit after its epoch \d+: (.+)$", text, re.M)
                left += ["second seeds"] * ("--blend-seeds 1)" in text) + ["refits"] * ("(--refit false)" in text)
                print(f"| {burners} | {limit} | {wall:.0f} | {test.group(2)} / {test.group(1)} | "
                      f"{', '.join(left) or 'nothing'} |", flush=True)  # fmt: skip
        finally:
            for p in beside:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
