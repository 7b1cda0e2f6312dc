"""Peak memory and time of the commands on hostile inputs: 200 rows followed by 16 MiB of empty
lines (plain and a gzip of a few KiB) through preprocess, transcode and predict, and a checkpoint
whose metadata.json is padded far past its model's size, and `report` on a run log padded with
--log-mib MiB of small records, and transcode and predict on long categorical values (a Parquet file
of 12 KiB holding 4 values of 256 KiB over 4,096 rows, a gzip of 0.7 MiB holding 9,600 distinct values
of 64 KiB: the generators of tests/test_streams.py). Each command runs in a fresh process
under RLIMIT_AS 16 GB (so an unbounded read is measured, not killed); prints one line per case:
exit code, peak RSS (MiB), seconds. Figures: docs/BENCHMARKS.md.

    PYTHONPATH=src python benchmarks/bench_hostile_inputs.py [--src DIR] [--empty-mib 16] [--log-mib 128] [--only TEXT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def run(src: str, argv: list[str], cwd: str) -> tuple[int, str]:
    """(exit code, last output line) of `python -m dlrmkit ARGV` (the setup steps)."""
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "dlrmkit", *argv], cwd=cwd, env=env, capture_output=True, text=True)
    return p.returncode, ((p.stdout + p.stderr).strip().splitlines() or [""])[-1][:160]


def measured(src: str, argv: list[str], cwd: str) -> tuple[int, int, float, str]:
    """As `run`, with the peak RSS of that child alone (a wrapper process per command)."""
    code = (
        "import os,resource,subprocess,sys,json;"
        "resource.setrlimit(resource.RLIMIT_AS,(16<<30,16<<30));"
        "p=subprocess.run([sys.executable,'-m','dlrmkit',*sys.argv[1:]],capture_output=True,text=True);"
        "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(json.dumps([p.returncode,u.ru_maxrss//1024,(p.stdout+p.stderr).strip().splitlines()[-1:]]))"
    )
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    rc, rss, last = json.loads(p.stdout)
    return rc, rss, time.monotonic() - t0, (last or [""])[0][:120]


def criteo_rows(n: int) -> bytes:
    rng = random.Random(0)
    lines = [
        "\t".join(
            [
                str(rng.randint(0, 1)),
                *(str(rng.randint(0, 99)) for _ in range(13)),
                *(format(rng.randint(0, 40), "08x") for _ in range(26)),
            ]
        )
        for _ in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def csv_rows(n: int) -> bytes:
    rng = random.Random(0)
    lines = ["label,x,c1,c2"] + [
        f"{rng.randint(0, 1)},{rng.random():.3f},a{rng.randint(0, 5)},b{rng.randint(0, 9)}" for _ in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "src"))
    ap.add_argument("--empty-mib", type=int, default=16)
    ap.add_argument("--log-mib", type=int, default=128, help="MiB of records appended to a run's log for `report`")
    ap.add_argument("--only", default="", help="run the cases whose name holds this text (e.g. 'long')")
    a = ap.parse_args()
    src = os.path.abspath(a.src)
    empty = b"\n" * (a.empty_mib << 20)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "rows.tsv"), "wb") as f:
            f.write(criteo_rows(200) + empty)
        with gzip.open(os.path.join(d, "rows.tsv.gz"), "wb", 9) as f:
            f.write(criteo_rows(200) + empty)
        with open(os.path.join(d, "clean.tsv"), "wb") as f:
            f.write(criteo_rows(400))
        with gzip.open(os.path.join(d, "rows.csv.gz"), "wb", 9) as f:
            f.write(csv_rows(200) + empty)
        with open(os.path.join(d, "clean.csv"), "wb") as f:
            f.write(csv_rows(400))
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from test_streams import long_values_csv_gz, long_values_parquet

        long_values_parquet(os.path.join(d, "long.parquet"))
        long_values_csv_gz(os.path.join(d, "long.csv.gz"))
        setup = [
            ["preprocess", "criteo", "--input", "clean.tsv", "--out", "ds_c", "--workers", "1", "--test-rows", "40"],
            ["train", "--data", "ds_c", "--max-steps", "2", "--batch-size", "32", "--checkpoint-dir", "ck_c", "--search-budget", "0"],
            [
                "transcode",
                "--input",
                "clean.csv",
                "--out",
                "ds_t",
                "--label",
                "label",
                "--numerical",
                "x",
                "--categorical",
                "c1,c2",
                "--test-rows",
                "40",
            ],
            ["train", "--data", "ds_t", "--max-steps", "2", "--batch-size", "32", "--checkpoint-dir", "ck_t", "--search-budget", "0"],
            ["train", "--data", "ds_t", "--max-steps", "2", "--batch-size", "32", "--run-dir", "run_t", "--search-budget", "0"],
        ]
        for argv in setup:
            rc, last = run(src, [*argv, "--no-progress"] if argv[0] != "transcode" else argv, d)
            assert rc == 0, (argv, last)
        cases = {
            "preprocess criteo, 200 rows + empty lines": [
                "preprocess",
                "criteo",
                "--input",
                "rows.tsv",
                "--out",
                "o1",
                "--workers",
                "1",
                "--test-rows",
                "20",
                "--no-progress",
            ],
            "predict criteo .gz, 200 rows + empty lines": [
                "predict",
                "--checkpoint",
                "ck_c",
                "--input",
                "rows.tsv.gz",
                "--output",
                "p1.csv",
            ],
            "transcode .gz, 200 rows + empty lines": [
                "transcode",
                "--input",
                "rows.csv.gz",
                "--out",
                "o2",
                "--label",
                "label",
                "--numerical",
                "x",
                "--categorical",
                "c1,c2",
                "--test-rows",
                "20",
            ],
            "predict csv .gz, 200 rows + empty lines": [
                "predict",
                "--checkpoint",
                "ck_t",
                "--input",
                "rows.csv.gz",
                "--output",
                "p2.csv",
            ],
        }
        long_argv = ["--label", "label", "--numerical", "x", "--categorical", "c1,c2", "--test-rows", "100"]
        cases.update(
            {
                "transcode .parquet, 4 values of 256 KiB (long)": ["transcode", "--input", "long.parquet", "--out", "o3", *long_argv],
                "transcode .csv.gz, 9,600 values of 64 KiB (long)": ["transcode", "--input", "long.csv.gz", "--out", "o4", *long_argv],
                "predict .parquet, 4 values of 256 KiB (long)": ["predict", "--checkpoint", "ck_t", "--input", "long.parquet", "--output", "p3.csv"],
                "predict .csv.gz, 9,600 values of 64 KiB (long)": ["predict", "--checkpoint", "ck_t", "--input", "long.csv.gz", "--output", "p4.csv"],
            }
        )  # fmt: skip
        cases = {k: v for k, v in cases.items() if a.only in k}
        print(f"source {src}; {a.empty_mib} MiB of empty lines")
        for name, argv in cases.items():
            rc, rss, secs, last = measured(src, argv, d)
            print(f"{name:48s} exit {rc}  peak RSS {rss:6,d} MiB  {secs:6.1f} s  | {last}")
        if a.only:
            return
        step = os.path.join(d, "ck_t", open(os.path.join(d, "ck_t", "latest")).read().strip())
        meta = os.path.join(step, "metadata.json")
        text = open(meta).read()
        with open(meta, "w") as f:
            f.write(text[:-1] + " " * (243 << 20) + "}")  # valid JSON, 243 MiB, for a tiny model
        m = json.load(open(os.path.join(step, "manifest.json")))
        m["files"]["metadata.json"] = {"bytes": os.path.getsize(meta), "sha256": _sha(meta)}
        json.dump(m, open(os.path.join(step, "manifest.json"), "w"))
        rc, rss, secs, last = measured(src, ["evaluate", "--data", "ds_t", "--checkpoint", "ck_t"], d)
        print(
            f"{'evaluate, 243 MiB metadata.json (tiny model)':48s} exit {rc}  peak RSS {rss:6,d} MiB  {secs:6.1f} s  "
            f"| {last}"
        )
        log = os.path.join(d, "run_t", "log.jsonl")
        with open(log) as f:
            head = f.read()
        floods = {  # a long run's training-loss records, and tiny records of no event
            "report, log + training-loss records": '{"event":"train","step":7,"loss":0.5,"samples_seen":9}\n',
            "report, log + empty JSON objects": "{}\n",
        }
        for name, line in floods.items():
            with open(log, "w") as f:
                f.write(head + line * ((a.log_mib << 20) // len(line)))
            rc, rss, secs, last = measured(src, ["report", "run_t", "--out", "rep"], d)
            print(f"{name + f' ({a.log_mib} MiB)':48s} exit {rc}  peak RSS {rss:6,d} MiB  {secs:6.1f} s  | {last}")


def _sha(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return h.hexdigest()


if __name__ == "__main__":
    main()
