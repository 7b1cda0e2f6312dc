"""Plots and a Markdown summary of a run folder (written by `dlrmkit train`): train loss, test
AUC and log loss against samples seen, throughput over time; optionally TensorBoard scalars."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import atomic_path, check_output_dir, make_dirs, write_text
from dlrmkit.train.run_log import read_log, tensorboard


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run", metavar="RUN", type=ct.path, help="run folder written by `dlrmkit train` (holds run.json, log.jsonl)"
    )
    p.add_argument("--out", type=ct.path, help="where to write the plots and report.md (default: RUN)")
    p.add_argument(
        "--tensorboard", metavar="DIR", type=ct.path, help="also log the scalars as TensorBoard events into DIR"
    )


def _num(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"


def series(records: list[dict[str, Any]], event: str, key: str, x: str = "samples_seen") -> tuple[list, list]:
    xs, ys = [], []
    for r in records:
        if r.get("event") == event and key in r and x in r and math.isfinite(r[key]) and math.isfinite(r[x]):
            xs.append(r[x])
            ys.append(r[key])
    return xs, ys


def _plot(path: str, xs: list, ys: list, xlabel: str, ylabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(xs, ys, marker="o" if len(xs) < 30 else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plots(records: list[dict[str, Any]], out: str) -> list[str]:
    """Write the PNGs that have data; return their paths."""
    t0 = min((r["time"] for r in records if "time" in r), default=0.0)
    for r in records:
        if "time" in r:
            r["elapsed_s"] = r["time"] - t0
    wanted = [
        ("train_loss.png", "train", "loss", "samples_seen", "samples seen", "train loss (mean of last 100 steps)"),
        ("test_auc.png", "eval", "auc", "samples_seen", "samples seen", "test AUC"),
        ("test_logloss.png", "eval", "logloss", "samples_seen", "samples seen", "test log loss"),
        ("throughput.png", "train", "samples_per_s", "elapsed_s", "seconds since start", "samples/s"),
    ]
    written = []
    for name, event, key, x, xlabel, ylabel in wanted:
        xs, ys = series(records, event, key, x)
        if xs:
            path = os.path.join(out, name)
            _plot(path, xs, ys, xlabel, ylabel, ylabel)
            written.append(path)
    return written


def summary(run: str, info: dict[str, Any], records: list[dict[str, Any]], pngs: list[str]) -> str:
    end = next((r for r in reversed(records) if r.get("event") == "end"), None)
    evals = [r for r in records if r.get("event") == "eval"]
    cfg = info.get("config", {})
    lines = [f"# Run {os.path.basename(os.path.abspath(run))}", ""]
    lines.append(
        f"- data: `{cfg.get('data')}`, preset `{cfg.get('preset')}`, batch {cfg.get('batch-size')}, "
        f"lr {cfg.get('lr')}, optimizer {cfg.get('optimizer')}"
    )
    lines.append(f"- started {info.get('started')}; status: {'finished' if end else 'unfinished (no end record)'}")
    if end:
        lines.append(
            f"- steps {end.get('steps')}, samples/s {_num(end.get('samples_per_s'), ',.0f')}, "
            f"train loss {_num(end.get('train_loss'))}"
        )
        lines.append(
            f"- final test AUC {_num(end.get('auc'))}, log loss {_num(end.get('logloss'))}, "
            f"best AUC {_num(end.get('best_auc'))}"
        )
        if "optimal_auc" in end:
            gap = end["optimal_auc"] - end["auc"] if "auc" in end else None
            lines.append(f"- optimal AUC of the data {_num(end['optimal_auc'])} (gap {_num(gap)})")
    if evals:
        lines += ["", "| step | samples seen | test AUC | test log loss |", "|---:|---:|---:|---:|"]
        lines += [
            f"| {r.get('step', '')} | {r.get('samples_seen', '')} | {_num(r.get('auc'))} | {_num(r.get('logloss'))} |"
            for r in evals
        ]
    if pngs:
        lines += [""] + [f"![{os.path.basename(p)[:-4]}]({os.path.basename(p)})" for p in pngs]
    lines.append("")
    lines.append(f"Repeat it: `dlrmkit train --config {os.path.join(run, 'config.yaml')}`")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from dlrmkit.train.run_dir import read_run

    out = args.out or args.run
    check_output_dir(out, "--out")
    check_output_dir(args.tensorboard, "--tensorboard")
    info = read_run(args.run)
    records = read_log(info["log_jsonl"])
    make_dirs(out, "--out")
    pngs = plots(records, out)
    write_text(os.path.join(out, "report.md"), summary(args.run, info, records, pngs))
    if args.tensorboard:
        tensorboard(records, args.tensorboard)
    print(f"wrote {len(pngs)} plots and {os.path.join(out, 'report.md')}")
    return 0
