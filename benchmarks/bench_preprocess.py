"""Preprocessing throughput (rows/s) and peak RSS of `dlrmkit preprocess criteo`.

    python benchmarks/bench_preprocess.py --input /tmp/criteo_2m.tsv --workers 1 2 [--spark]

Each run is a fresh `python -m dlrmkit` process; peak RSS is the maximum over it and its
worker processes (RUSAGE_CHILDREN: the largest single process, not the sum).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def run(inp: str, rows: int, extra: list[str], label: str) -> None:
    out = tempfile.mkdtemp(prefix="bench_pp_") + "/ds"
    cmd = [
        sys.executable,
        "-m",
        "dlrmkit",
        "preprocess",
        "criteo",
        "--input",
        inp,
        "--out",
        out,
        "--test-rows",
        str(rows // 10),
        "--no-progress",
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # each run in its own child, so RUSAGE_CHILDREN's maximum is this run's (runs go largest last)
    proc = subprocess.run(["/usr/bin/env", *cmd], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode:
        print(proc.stderr)
        raise SystemExit(proc.returncode)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rss = after.ru_maxrss / 2**20
    # rows per CPU-second (Python processes only; not the JVM's threads) is what a busy machine cannot hide
    print(
        f"{label:<22} {rows / dt:>12,.0f} rows/s  {dt:7.1f} s  CPU {cpu:6.1f} s ({rows / cpu:,.0f} rows per CPU-s)"
        f"  peak RSS (max so far) {rss:.2f} GiB"
    )
    shutil.rmtree(out.rsplit("/", 1)[0], ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--spark", action="store_true", help="also run --engine spark (local[*])")
    a = p.parse_args()
    with open(a.input, "rb") as f:
        rows = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
    for w in a.workers:
        run(a.input, rows, ["--workers", str(w)], f"local, {w} worker(s)")
    if a.spark:
        run(a.input, rows, ["--engine", "spark"], "spark local[*]")


if __name__ == "__main__":
    main()
