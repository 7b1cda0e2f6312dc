"""Plots and a Markdown summary of a run folder (written by `dlrmkit train`): how the run ended
(finished, failed and why, interrupted, or unfinished), train loss, the validation AUC and log loss
of each evaluation against samples seen, throughput over time, and the one final test score;
optionally TensorBoard scalars. Each score is labelled by the mapping it was
computed on, so validation scores are never shown as test scores."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any
from dataclasses import dataclass

from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import atomic_path, check_output_dir, make_dirs, write_text
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option
from dlrmkit.train.run_log import read_log, since_restart, tensorboard

MAX_MAPPINGS = 16  # two plots each: a hostile log cannot make the report write thousands of files


@dataclass
class ReportOptions:
    run: str = option(
        help="run folder written by `dlrmkit train` (holds run.json; its log.jsonl is there or in --checkpoint-dir)",
        parse=ct.path,
        metavar="RUN",
        positional=True,
    )
    out: str | None = option(None, "where to write the plots and report.md (default: RUN)", parse=ct.path)
    tensorboard: str | None = option(
        None, "also log the scalars as TensorBoard events into DIR", parse=ct.path, metavar="DIR"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, ReportOptions)


def finite(value: Any) -> bool:
    """A number a plot or a table can show: an integer past the range of a float (a log from
    elsewhere may hold one) is not, as infinity is not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _num(value: Any, fmt: str = ".4f") -> str:
    return format(value, fmt) if finite(value) else "n/a"


def _text(value: Any, most: int = 200) -> str:
    """A value from the log or run.json as one line of report.md: control characters (a line break
    would start a heading of its own) and backticks shown as '?', at most `most` characters."""
    text = "".join("?" if ord(c) < 32 or ord(c) == 127 or c == "`" else c for c in str(value))
    return text if len(text) <= most else text[: most - 3] + "..."


def series(records: list[dict[str, Any]], event: str, key: str, x: str = "samples_seen") -> tuple[list, list]:
    xs, ys = [], []
    for r in records:
        if r.get("event") == event and key in r and x in r and finite(r[key]) and finite(r[x]):
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


def mapping_name(mapping: str) -> str:
    """How a report names the rows an evaluation read: the log's `mapping` field."""
    return {"val": "validation", "test": "test"}.get(mapping, f"{mapping!r} mapping")


def eval_mappings(records: list[dict[str, Any]]) -> list[str]:
    """The mappings the log's evaluations read, in order of first appearance; an eval record
    without a `mapping` field (logs written before selection moved to validation rows) is
    'unrecorded', never assumed to be validation or test."""
    seen: dict[str, None] = {}
    for r in records:
        if r.get("event") == "eval":
            seen.setdefault(str(r.get("mapping", "unrecorded")), None)
    return list(seen)


def _on(records: list[dict[str, Any]], mapping: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == "eval" and str(r.get("mapping", "unrecorded")) == mapping]


def plots(records: list[dict[str, Any]], out: str) -> list[str]:
    """Write the PNGs that have data; return their paths."""
    t0 = min((r["time"] for r in records if "time" in r), default=0.0)
    for r in records:
        if "time" in r:
            r["elapsed_s"] = r["time"] - t0
    wanted = [("train_loss.png", records, "train", "loss", "samples_seen", "train loss (mean of last 100 steps)")]
    for m in eval_mappings(records):
        name, rows = mapping_name(m), _on(records, m)
        wanted += [
            (f"{m}_auc.png", rows, "eval", "auc", "samples_seen", f"{name} AUC"),
            (f"{m}_logloss.png", rows, "eval", "logloss", "samples_seen", f"{name} log loss"),
        ]
    wanted.append(("throughput.png", records, "train", "samples_per_s", "elapsed_s", "samples/s"))
    written = reliability_plot(records, out)
    for name, rows, event, key, x, ylabel in wanted:
        xs, ys = series(rows, event, key, x)
        if xs:
            path = os.path.join(out, name)
            xlabel = "seconds since start" if x == "elapsed_s" else "samples seen"
            _plot(path, xs, ys, xlabel, ylabel, ylabel)
            written.append(path)
    return written


def reliability_bins(records: list[dict[str, Any]]) -> list[tuple[float, float, int]]:
    """The test record's reliability table ([mean predicted, observed rate, rows] per bin, from
    dlrmkit.train.calibration), each entry checked: a log is read as untrusted input."""
    test = next((r for r in reversed(records) if r.get("event") == "test"), None)
    table = test.get("reliability") if isinstance(test, dict) else None
    if not isinstance(table, list) or len(table) > 1000:
        return []
    bins = []
    for entry in table:
        if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, (int, float)) for v in entry)):
            return []
        p, rate, n = entry
        if not (all(finite(v) for v in entry) and 0 <= p <= 1 and 0 <= rate <= 1 and n >= 0):
            return []
        bins.append((float(p), float(rate), int(n)))
    return bins


def reliability_plot(records: list[dict[str, Any]], out: str) -> list[str]:
    """test_reliability.png: observed click rate against mean predicted probability per bin of the
    test rows, beside the diagonal of perfect calibration; nothing when the log has no table."""
    bins = reliability_bins(records)
    if not bins:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect calibration")
    ax.plot([b[0] for b in bins], [b[1] for b in bins], marker="o", label="test rows")
    ax.set_xlabel("mean predicted click probability (bin)")
    ax.set_ylabel("observed click rate")
    ax.set_title("reliability (test)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "test_reliability.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return [path]


def _eval_table(rows: list[dict[str, Any]], name: str, blend: bool = False) -> list[str]:
    """A mapping's evaluations, one row each; a blend's one evaluation is the blend's (it has no
    step of its own: its samples seen are its members' together)."""
    lines = ["", f"| step | samples seen | {name} AUC | {name} log loss |", "|---:|---:|---:|---:|"]
    return lines + [
        f"| {'(the blend)' if blend else _text(r.get('step', ''), 40)} | {_text(r.get('samples_seen', ''), 40)} | "
        f"{_num(r.get('auc'))} | "
        f"{_num(r.get('logloss'))} |"
        for r in rows
    ]


def seed_of(member: dict[str, Any]) -> str:
    """', fold F' or ', seed S' where a blend's member run records it (a member trained on each
    fold of --folds, or with several seeds; with --folds and --refit, the fold its refit followed)."""
    if member.get("fold") is not None and member.get("refit"):
        seed = "" if member.get("seed") is None else f", seed {_text(member['seed'])}"
        return f"{seed}, refitted on all rows as fold {_text(member['fold'])} chose"
    if member.get("fold") is not None:
        return f", fold {_text(member['fold'])}"
    return "" if member.get("seed") is None else f", seed {_text(member['seed'])}"


def status(records: list[dict[str, Any]]) -> str:
    """How the run ended, by its log's last end, `failed` or `interrupted` record: one that records
    follow (a --resume went on after it) or none at all is a run still going, or killed."""
    last = next((r for r in reversed(records) if r.get("event") in ("end", "failed", "interrupted")), None)
    if last is None or (last.get("event") != "end" and last is not records[-1]):
        return "unfinished (no end record)"
    if last["event"] == "end":
        return "finished"
    if last["event"] == "interrupted":
        at = f" at step {_text(last['step'], 40)}" if finite(last.get("step")) else ""
        return f"interrupted{at} (Ctrl-C)"
    return f"failed: {_text(last.get('why', 'no reason recorded'), 500)}"


def summary(
    run: str, info: dict[str, Any], records: list[dict[str, Any]], pngs: list[str], earlier: int = 0, thinned: int = 1
) -> str:
    """report.md; `thinned`: every how many training-loss records the log's reader kept (run_log.read_log)."""
    end = next((r for r in reversed(records) if r.get("event") == "end"), None)
    test = next((r for r in reversed(records) if r.get("event") == "test"), None)
    cfg = info.get("config", {})
    lines = [f"# Run {os.path.basename(os.path.abspath(run))}", ""]
    blend = next((r for r in records if r.get("event") == "blend"), None)
    members = blend.get("members") if blend else None
    if isinstance(members, list):  # each member run is a run of its own, in the checkpoint folder
        runs = [m for m in members if isinstance(m, dict)]
        groups: dict[str, list[dict[str, Any]]] = {}  # a member's runs (its seeds or folds), in order
        for m in runs:
            groups.setdefault(_text(m.get("name"), 80), []).append(m)
        lines.append(f"- data: `{_text(cfg.get('data'))}`; a blend of {len(groups)} member(s), {len(runs)} run(s), "
                     "each a run folder of its own in the checkpoint folder:")  # fmt: skip
        for name, rs in groups.items():
            weight, first, last = (
                _text(v, 80) for v in (rs[0].get("weight"), rs[0].get("folder"), rs[-1].get("folder"))
            )
            if len(rs) == 1:
                lines.append(f"  - {name}{seed_of(rs[0])} x{weight} (`{first}/`)")
            else:
                which = ", ".join(seed_of(m).removeprefix(", ") for m in rs)
                lines.append(f"  - {name} x{weight}, {len(rs)} runs: {which} (`{first}/` to `{last}/`)")
        if len(runs) < len(members):
            lines.append(f"  - {len(members) - len(runs)} more member record(s) malformed in the log, not listed")
    else:
        lines.append(
            f"- data: `{_text(cfg.get('data'))}`, preset `{_text(cfg.get('preset'), 40)}`, batch "
            f"{_text(cfg.get('batch-size'), 40)}, lr {_text(cfg.get('lr'), 40)}, optimizer {_text(cfg.get('optimizer'), 40)}"
        )
    lines.append(f"- started {_text(info.get('started'), 60)}; status: {status(records)}")
    if earlier:
        lines.append(f"- restarted from step 0 by a --resume that found no checkpoint: the {earlier:,} log records "
                     "before it (an attempt that saved none) are left out")  # fmt: skip
    if thinned > 1:
        lines.append(f"- the log holds more training-loss records than a plot needs: one in every {thinned:,} is plotted")
    if end:
        lines.append(
            f"- steps {_text(end.get('steps'), 40)}, samples/s {_num(end.get('samples_per_s'), ',.0f')}, "
            f"train loss {_num(end.get('train_loss'))}"
        )
        best = f"; best validation AUC {_num(end.get('best_auc'))}" if "best_auc" in end else ""  # a blend has none
        # a blend has no step of its own: its steps are its members' together
        step = _text(end.get("selected_step", end.get("steps")), 40)
        which = "the blend" if end.get("blend") else f"the selected model, step {step}"
        lines.append(
            f"- validation AUC {_num(end.get('val_auc'))}, log loss {_num(end.get('val_logloss'))} ({which}){best}"
        )
        refit = next((r for r in records if r.get("event") == "refit"), None)
        if refit or end.get("refit") is True:  # the selected model trained again on the training and validation rows
            how = (
                f" for {_num(refit.get('epochs'), '.2f')} epochs, as selection chose ({_text(end.get('steps'), 40)} steps)"
                if refit
                else ", each member run for the epochs its selection chose"
            )
            lines.append(
                f"- refitted on the training and validation rows{how}: the model and its test figures are the "
                "refit's, the validation figures those of the model selection chose"
            )
    final = test or end
    if final and ("auc" in final or "logloss" in final):
        # none in a log written before runs under torchrun had one: left out, not 'n/a'
        ece = f", expected calibration error {_num(final['ece'])}" if final.get("ece") is not None else ""
        lines.append(
            f"- test AUC {_num(final.get('auc'))}, log loss {_num(final.get('logloss'))}{ece} "
            "(the test mapping, scored once, after training)"
        )
        calibration = next((r for r in records if r.get("event") == "calibration"), None)
        if calibration:
            lines.append(
                f"- temperature {_num(calibration.get('temperature'))}, fitted on the validation rows "
                f"(validation log loss {_num(calibration.get('val_logloss_before'))} -> "
                f"{_num(calibration.get('val_logloss_after'))})"
            )
        if end and "optimal_auc" in end:
            gap = end["optimal_auc"] - final["auc"] if "auc" in final else None
            lines.append(f"- optimal AUC of the data {_num(end['optimal_auc'])} (test gap {_num(gap)})")
    else:
        lines.append("- test score: none in the log (the run did not reach its final evaluation)")
    if test and test.get("reliability") not in (None, []) and not reliability_bins(records):
        lines.append("- reliability table: malformed in the log (each bin needs a probability and a rate in [0, 1] "
                     "and a finite row count), not plotted")  # fmt: skip
    for m in eval_mappings(records):
        lines += ["", f"Evaluations during training, on the {mapping_name(m)} rows:"]
        lines += _eval_table(_on(records, m), mapping_name(m), blend is not None or bool(end and end.get("blend")))
    if pngs:
        lines += [""] + [f"![{os.path.basename(p)[:-4]}]({os.path.basename(p)})" for p in pngs]
    lines.append("")
    world = end.get("world_size") if end else None
    if isinstance(world, int) and not isinstance(world, bool) and world > 1:  # its config.yaml may hold a --plan
        lines.append(f"Repeat it ({world} ranks): `torchrun --nproc_per_node={world} -m dlrmkit train --config "
                     f"{os.path.join(run, 'config.yaml')}`")  # fmt: skip
    else:
        lines.append(f"Repeat it: `dlrmkit train --config {os.path.join(run, 'config.yaml')}`")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import output_lock
    from dlrmkit.train.run_dir import read_run

    out = args.out or args.run
    check_output_dir(out, "--out")
    check_output_dir(args.tensorboard, "--tensorboard")
    with output_lock(out, "--out"):  # one writer per folder (a run being trained holds its own)
        info = read_run(args.run)
        log = read_log(info["log_jsonl"])
        records, earlier = since_restart(log)
        if len(eval_mappings(records)) > MAX_MAPPINGS:
            raise DlrmkitError(f"{info['log_jsonl']}: evaluations on more than {MAX_MAPPINGS} mappings")
        make_dirs(out, "--out")
        pngs = plots(records, out)
        write_text(os.path.join(out, "report.md"), summary(args.run, info, records, pngs, earlier, log.train_every))
        if args.tensorboard:
            tensorboard(records, args.tensorboard)
    print(f"wrote {len(pngs)} plots and {os.path.join(out, 'report.md')}")
    return 0
