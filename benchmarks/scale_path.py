"""The whole path at a given size, stage by stage: raw Criteo rows (benchmarks/gen_criteo.py) ->
preprocess -> validate -> train N steps with a checkpoint -> evaluate the checkpoint -> resume
for more steps; or, with --synth, a synthetic dataset of any table sizes in place of the first
two stages. Per stage it prints wall time, throughput, peak RSS and, where one exists, the
analytic bytes the stage must hold (tables, plus optimizer state while training).

    python benchmarks/scale_path.py --rows 10000000 --workdir /tmp/scale          # raw path
    python benchmarks/scale_path.py --synth "--preset terabyte --scale 0.2" --rows 200000 \\
        --optimizer adagrad --workdir /tmp/scale_big                                  # 5 GB of tables+state

Every stage is a fresh `python -m dlrmkit` (or script) process; its peak RSS is that process's
own (os.wait4), so stages do not mask each other. Files stay in --workdir (removed first).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30


@dataclass
class Stage:
    name: str
    seconds: float
    peak_rss: int  # bytes
    work: float = 0.0  # rows or samples the stage processed
    unit: str = "rows"
    analytic: int | None = None  # bytes the stage must hold at least

    def line(self) -> str:
        rate = f"{self.work / self.seconds:>12,.0f} {self.unit}/s" if self.work else f"{'':>12} {'':<9}"
        held = (
            f"  analytic {self.analytic / GiB:6.2f} GiB  ({self.peak_rss / self.analytic:.2f}x)"
            if self.analytic
            else ""
        )
        return f"{self.name:<12} {self.seconds:8.1f} s  {rate}  peak RSS {self.peak_rss / GiB:6.2f} GiB{held}"


def run(name: str, argv: list[str], log: str) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of one stage's process; output goes to `log`, printed on failure."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        with open(log, encoding="utf-8") as f:
            print(f.read()[-4000:], file=sys.stderr)
        raise SystemExit(f"stage {name} failed with exit code {code}: {shlex.join(argv)}")
    return seconds, usage.ru_maxrss * 1024


def dlrmkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlrmkit", *map(str, args)]


def table_bytes(data: str, dim: int) -> int:
    import yaml

    with open(os.path.join(data, "feature_spec.yaml"), encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    return sum(int(v["cardinality"]) for v in spec["feature_spec"].values() if "cardinality" in v) * dim * 4


def main() -> None:
    p = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=200_000, help="raw rows (or synthetic training rows) (default 200,000)")
    p.add_argument(
        "--synth",
        metavar="ARGS",
        help="make the dataset with `dlrmkit synth ARGS` instead of raw rows + "
        'preprocess, e.g. "--preset terabyte --scale 0.2"',
    )
    p.add_argument("--workdir", required=True, help="folder for every file of the run (replaced)")
    p.add_argument("--steps", type=int, default=50, help="training steps, and as many again on resume (default 50)")
    p.add_argument("--preset", default="criteo-kaggle", help="train preset (default criteo-kaggle)")
    p.add_argument("--embedding-dim", type=int, default=16, help="embedding width (default 16)")
    p.add_argument("--batch-size", type=int, default=2048, help="global batch (default 2048)")
    p.add_argument(
        "--optimizer", default="adagrad", help="train --optimizer (default adagrad: state as large as the tables)"
    )
    p.add_argument("--workers", type=int, default=2, help="preprocess workers (default 2)")
    p.add_argument("--eval-rows", type=int, default=100_000, help="test rows (default 100,000)")
    a = p.parse_args()

    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    w = lambda *parts: os.path.join(a.workdir, *parts)  # noqa: E731
    data, ckpt, stages = w("data"), w("checkpoints"), []
    if a.synth:
        sec, rss = run(
            "synth",
            dlrmkit(
                "synth",
                *shlex.split(a.synth),
                "--rows",
                a.rows,
                "--test-rows",
                a.eval_rows,
                "--out",
                data,
                "--no-progress",
            ),
            w("synth.log"),
        )
        stages.append(Stage("synth", sec, rss, a.rows + a.eval_rows))
    else:
        raw = w("raw.tsv")
        sec, rss = run(
            "generate",
            [sys.executable, os.path.join(HERE, "gen_criteo.py"), "--rows", str(a.rows), "--out", raw],
            w("generate.log"),
        )
        stages.append(Stage("generate", sec, rss, a.rows))
        sec, rss = run(
            "preprocess",
            dlrmkit(
                "preprocess",
                "criteo",
                "--input",
                raw,
                "--out",
                data,
                "--test-rows",
                a.eval_rows,
                "--frequency-threshold",
                3,
                "--workers",
                a.workers,
                "--no-progress",
            ),
            w("preprocess.log"),
        )
        stages.append(Stage("preprocess", sec, rss, a.rows))
    sec, rss = run("validate", dlrmkit("validate", "--data", data), w("validate.log"))
    stages.append(Stage("validate", sec, rss, a.rows + (a.eval_rows if a.synth else 0)))
    tables = table_bytes(data, a.embedding_dim)
    state = tables if a.optimizer == "adagrad" else 0
    train = [
        "--data",
        data,
        "--preset",
        a.preset,
        "--embedding-dim",
        a.embedding_dim,
        "--batch-size",
        a.batch_size,
        "--optimizer",
        a.optimizer,
        "--checkpoint-dir",
        ckpt,
        "--no-progress",
        "--eval-batch-size",
        16384,
    ]
    sec, rss = run(
        "train",
        dlrmkit("train", *train, "--max-steps", a.steps, "--metrics-json", w("train.json"), "--run-dir", w("run1")),
        w("train.log"),
    )
    stages.append(Stage("train+save", sec, rss, a.steps * a.batch_size, "samples", tables + state))
    sec, rss = run(
        "evaluate",
        dlrmkit("evaluate", "--data", data, "--checkpoint", ckpt, "--metrics-json", w("eval.json")),
        w("evaluate.log"),
    )
    stages.append(Stage("evaluate", sec, rss, a.eval_rows, "rows", tables))
    sec, rss = run(
        "resume",
        dlrmkit(
            "train",
            *train,
            "--max-steps",
            2 * a.steps,
            "--resume",
            "--metrics-json",
            w("resume.json"),
            "--run-dir",
            w("run2"),
        ),
        w("resume.log"),
    )
    stages.append(Stage("resume+save", sec, rss, a.steps * a.batch_size, "samples", tables + state))

    with open(w("train.json"), encoding="utf-8") as f:
        trained = json.load(f)
    with open(w("resume.json"), encoding="utf-8") as f:
        resumed = json.load(f)
    with open(w("eval.json"), encoding="utf-8") as f:
        evaluated = json.load(f)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(ckpt) for n in names)
    print(
        f"tables {tables / GiB:.2f} GiB (dim {a.embedding_dim}), {a.optimizer} state {state / GiB:.2f} GiB; "
        f"checkpoints on disk {size / GiB:.2f} GiB; training steps alone {trained['samples_per_s']:,.0f} samples/s; "
        f"evaluate AUC {evaluated['auc']:.4f}; "
        f"after resume: steps {resumed['steps']}, AUC {resumed['auc']:.4f}"
    )
    print("stage        wall        throughput       peak RSS        analytic bytes held")
    for s in stages:
        print(s.line())


if __name__ == "__main__":
    main()
