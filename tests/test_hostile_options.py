"""Hostile command-line options, output paths and environment variables, one table row each
(the style of test_hostile_inputs.py, whose workspace and snapshot this module reuses): the
command line, a phrase of the one-line error, the environment, and the promise that nothing in
the workspace (which is also the current folder) changed. Every row is refused with exit 2 and
one line on stderr, before any training or preprocessing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

import test_hostile_inputs as hostile
from helpers import run_cli
from dlrmkit import cli_types as ct
from dlrmkit.atomic_io import check_output_dir
from dlrmkit.errors import DlrmkitError, describe_error

trained_run = hostile.trained_run  # the fixtures `ws` needs, shared with test_hostile_inputs
ws = hostile.ws
write_bytes = hostile.write_bytes

T = hostile.T  # train on the tiny dataset, 2 steps, into {ws}/newrun
TC = hostile.TR  # transcode rows.csv
PP = hostile.PP
CK = hostile.CK
B = ("bench", "--steps", "1", "--windows", "1", "--warmup", "0", "--batch-size", "64", "--no-compile")
PLAN = ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2")
TUNE = ("tune", "--data", "{ws}/data", "--trials", "1", "--max-steps", "1")
HW = b'{"name": "x", "peak_flops": 1e12, "peak_flops_amp": 1e12, "mem_bw": 1e9, "intra_bw": 1e9, "inter_bw": 1e9}'


@dataclass
class Option(hostile.Probe):
    env: dict[str, str] = field(default_factory=dict)


def link(name: str, target: str) -> object:
    return lambda ws: os.symlink(target.replace("{ws}", str(ws)), ws / name)


PROBES = [
    # ---- values: one line whatever the text, ASCII numbers, finite bounds
    Option("number-with-newline", (*T, "--lr", "1\n2"), "--lr: expected a number, got '1\\n2'"),
    Option("arabic-indic-digits", ("synth", "--out", "{ws}/x", "--rows", "\u0663"), "--rows"),
    Option("full-width-digits", (*T, "--batch-size", "\uff11\uff16"), "--batch-size"),
    # an underscore only groups thousands: Python's int() reads '1_0' as 10, float() '1e1_0' as 1e10
    Option("underscore-in-digits", (*T, "--max-steps", "1_0"), "--max-steps: expected an integer, got '1_0'"),
    Option("underscore-in-exponent", (*T, "--lr", "1e1_0"), "--lr: expected a number, got '1e1_0'"),
    Option("underscore-in-memory-size", (*PLAN, "--device-memory", "1_0GiB"), "--device-memory"),
    Option("weight-decay-1e30", (*T, "--embedding-weight-decay", "1e30"), "--embedding-weight-decay"),
    Option("checkpoint-seconds-1e30", (*T, "--checkpoint-every-seconds", "1e30"), "--checkpoint-every-seconds"),
    Option("init-scale-2-63", (*T, "--embedding-init-scale", str(2**63)), "--embedding-init-scale"),
    Option("synth-scale-1e30", ("synth", "--out", "{ws}/x", "--scale", "1e30"), "--scale"),
    Option("baseline-c-1e30", ("baseline", "--data", "{ws}/data", "--c", "1e30"), "--c"),
    # a C this small made L-BFGS overflow: NaN weights, whose scores were still printed as an AUC
    Option("baseline-c-1e-200", ("baseline", "--data", "{ws}/data", "--c", "1e-200"), "--c: must be >= 1e-09"),
    Option("baseline-c-grid-item-1e-200", ("baseline", "--data", "{ws}/data", "--c-grid", "1,1e-200"), "--c-grid"),
    Option(
        "baseline-c-with-c-grid",
        ("baseline", "--data", "{ws}/data", "--c", "1", "--c-grid", "0.1,1"),
        "--c-grid applies without --c",
    ),
    Option("tune-budget-1e30", (*TUNE, "--budget", "1e30"), "--budget"),
    Option("backend-unknown", (*T, "--backend", "carrier-pigeon"), "--backend"),
    Option("workers-beyond-cpus", (*PP[:-2], "--out", "{ws}/o", "--workers", str(ct.MAX_WORKERS + 1)), "--workers"),
    Option("threads-beyond-cpus", (*B, "--threads", str(ct.MAX_THREADS + 1)), "--threads"),
    Option("train-threads-0", (*T, "--threads", "0"), "--threads: must be >= 1, got 0"),
    Option("bench-threads-0", (*B, "--threads", "0"), "--threads: must be >= 1, got 0"),
    Option("synth-preset-empty", ("synth", "--out", "{ws}/x", "--preset", ""), "--preset: cannot be empty"),
    Option("tune-preset-unknown", (*TUNE, "--out", "{ws}/t", "--preset", "enormous"), "unknown preset 'enormous'"),
    Option(
        "evaluate-plan-missing",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK, "--plan", "{ws}/p.json"),
        "no such file",
    ),
    # ---- comma lists
    Option("cardinalities-empty-item", ("synth", "--out", "{ws}/x", "--cardinalities", "3,,4"), "item 2 is empty"),
    Option("cardinalities-trailing-comma", ("synth", "--out", "{ws}/x", "--cardinalities", "3,4,"), "item 3"),
    Option(
        "cardinalities-too-many",
        ("synth", "--out", "{ws}/x", "--cardinalities", ",".join(["3"] * 10_001)),
        "at most 10,000",
    ),
    Option("bottom-mlp-empty-item", (*T, "--bottom-mlp", "64,,16"), "--bottom-mlp"),
    Option("transcode-names-empty-item", (*TC[:-4], "--out", "{ws}/o", "--numerical", "a,,b"), "item 2"),
    # ---- repeated and conflicting options
    Option("option-given-twice", (*T, "--lr", "0.1", "--lr", "0.2"), "given more than once"),
    Option("input-list-given-twice", (*PP, "--out", "{ws}/o", "--input", "{ws}/rows.csv"), "given more than once"),
    Option("input-file-twice", (*PP[:4], "{ws}/rows.tsv", "--out", "{ws}/o"), "already given as --input"),
    Option("test-file-is-input", (*PP, "--out", "{ws}/o", "--test-files", "{ws}/rows.tsv"), "already given"),
    Option("columns-with-header", (*TC, "--out", "{ws}/o", "--columns", "y,a,b,c"), "--no-header"),
    Option("trace-without-profile", (*B, "--trace", "{ws}/t.json"), "add --profile"),
    Option("weak-without-simulate", (*PLAN, "--weak"), "--weak applies with --simulate"),
    Option("lamb-lr-without-lamb", (*T, "--lamb-lr", "0.1", "--optimizer", "sgd"), "--lamb-lr applies"),
    Option("spark-master-without-spark", (*PP, "--out", "{ws}/o", "--spark-master", "local[2]"), "--engine spark"),
    # ---- output paths: empty, odd characters, OS limits
    Option("synth-out-empty", ("synth", "--out", "", "--force"), "--out: a path cannot be empty"),
    Option("preprocess-out-empty", (*PP, "--out", ""), "--out: a path cannot be empty"),
    Option("transcode-out-blank", (*TC, "--out", "  "), "--out: a path cannot be empty"),
    Option("metrics-json-empty", (*T, "--metrics-json", ""), "--metrics-json: a path cannot be empty"),
    # `-` is standard output to every file output: a folder output made a folder named '-'
    Option("report-out-dash", ("report", "{ws}/run", "--out", "-"), "--out -: a folder is needed, not standard output"),
    Option(
        "synth-out-dash", ("synth", "--out", "-", "--cardinalities", "3", "--rows", "5"), "--out -: a folder is needed"
    ),
    Option("run-dir-dash", (*T[:6], "--run-dir", "-"), "--run-dir -: a folder is needed"),
    Option("run-dir-newline", (*T[:6], "--run-dir", "{ws}/a\nb"), "control character"),
    Option("plan-json-tab", (*PLAN, "--json", "{ws}/a\tb"), "control character"),
    Option("metrics-json-too-long", (*T, "--metrics-json", "{ws}/" + "/".join(["d" * 200] * 25)), "bytes long"),
    Option("out-name-too-long", ("synth", "--out", "{ws}/" + "x" * 300), "at most 255"),
    Option("data-empty", ("validate", "--data", ""), "--data: a path cannot be empty"),
    # ---- output paths: links, devices, the same file twice, inputs
    Option("tensorboard-dangling-link", (*T, "--tensorboard", "{ws}/ln"), "does not exist", setup=link("ln", "{ws}/x")),
    Option("run-dir-dangling-link", (*T[:6], "--run-dir", "{ws}/ln"), "does not exist", setup=link("ln", "{ws}/gone")),
    Option("log-jsonl-dangling-link", (*T, "--log-jsonl", "{ws}/ln"), "does not exist", setup=link("ln", "{ws}/x/y")),
    Option(
        "log-jsonl-dev-full",
        (*T, "--log-jsonl", "/dev/full"),
        "--log-jsonl /dev/full: cannot write (No space left on device)",
    ),
    Option("metrics-and-log-same-file", (*T, "--metrics-json", "{ws}/m", "--log-jsonl", "{ws}/m"), "is also"),
    Option("metrics-json-is-run-config", (*T, "--metrics-json", "{ws}/newrun/config.yaml"), "--run-dir's config.yaml"),
    Option("bench-json-and-plot-same", (*B, "--json", "{ws}/o", "--plot", "{ws}/o"), "is also --json"),
    Option(
        "metrics-json-is-config",
        (*T, "--config", "{ws}/c.yaml", "--metrics-json", "{ws}/c.yaml"),
        "is the input --config",
        setup=write_bytes("c.yaml", b"lr: 0.5\n"),
    ),
    Option(
        "log-jsonl-is-config",
        (*T, "--config", "{ws}/c.yaml", "--log-jsonl", "{ws}/c.yaml"),
        "is the input --config",
        setup=write_bytes("c.yaml", b"lr: 0.5\n"),
    ),
    Option(
        "plan-json-is-hardware",
        (*PLAN, "--simulate", "--hardware", "{ws}/hw.json", "--json", "{ws}/hw.json"),
        "is the input --hardware",
        setup=write_bytes("hw.json", HW),
    ),
    Option(
        "baseline-out-is-spec",
        ("baseline", "--data", "{ws}/data", "--out", "{ws}/data/feature_spec.yaml"),
        "inside --data",
    ),
    Option(
        "baseline-out-is-labels",
        ("baseline", "--data", "{ws}/data", "--out", "{ws}/data/train/label.bin"),
        "inside --data",
    ),
    Option("tune-out-inside-data", (*TUNE, "--out", "{ws}/data/t"), "inside --data"),
    Option(
        "tune-storage-inside-data", (*TUNE, "--out", "{ws}/t", "--storage", "sqlite:///{ws}/data/s.db"), "inside --data"
    ),
    Option("run-dir-of-another-run", (*T[:6], "--run-dir", "{ws}/run"), "already holds checkpoints of another run"),
    # ---- input files that never end or never open
    Option("config-is-a-pipe", (*T, "--config", "{fifo}"), "not a regular file"),
    Option("hardware-is-dev-zero", (*PLAN, "--simulate", "--hardware", "/dev/zero"), "not a regular file"),
    Option("space-is-a-pipe", (*TUNE, "--out", "{ws}/t", "--space", "{fifo}"), "not a regular file"),
    # ---- torchrun's environment, set to garbage outside torchrun
    Option("rank-not-a-number", T, "RANK='x'", env={"RANK": "x", "WORLD_SIZE": "2"}),
    Option("world-size-not-a-number", T, "WORLD_SIZE='two'", env={"RANK": "0", "WORLD_SIZE": "two"}),
    Option("rank-beyond-world", T, "RANK=5: must be in [0, 1]", env={"RANK": "5", "WORLD_SIZE": "2"}),
    Option("world-size-zero", T, "WORLD_SIZE=0", env={"RANK": "0", "WORLD_SIZE": "0"}),
    Option("local-rank-garbage", T, "LOCAL_RANK", env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "zz"}),
    Option("master-port-garbage", T, "MASTER_PORT", env={"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "http"}),
    Option("bench-rank-garbage", B, "RANK='-'", env={"RANK": "-", "WORLD_SIZE": "2"}),
    # ---- a one-process command started by torchrun on 2 ranks (each rank ran it whole: the second
    # writer's lock error, or predict's rows twice on standard output)
    Option(
        "predict-on-two-ranks",
        ("predict", "--checkpoint", CK, "--input", "{ws}/rows.csv", "--output", "{ws}/p.csv"),
        "predict runs in one process, and torchrun started 2 ranks",
        env={"RANK": "0", "WORLD_SIZE": "2"},
    ),
    Option(
        "export-on-two-ranks",
        ("export", "--checkpoint", CK, "--out", "{ws}/m.pt"),
        "export runs in one process",
        env={"RANK": "1", "WORLD_SIZE": "2"},
    ),
    Option(
        "fault-unknown-signal",
        T,
        "unknown signal 'BOGUS'",
        env={"DLRMKIT_FAULT": "train:step-1@0:BOGUS"},
        may_change=("newrun",),
    ),
]


def test_table_covers_the_classes():
    assert len({p.id for p in PROBES}) == len(PROBES) >= 60
    assert {p.argv[0] for p in PROBES} >= {"train", "synth", "plan", "bench", "tune", "baseline", "preprocess"}


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_hostile_option(ws, monkeypatch, probe: Option):
    fifo = ws.parent / f"{ws.name}.fifo"  # outside the workspace: its snapshot would block reading a pipe
    if not fifo.exists():
        os.mkfifo(fifo)
    if probe.setup:
        probe.setup(ws)
    for name, value in probe.env.items():
        monkeypatch.setenv(name, value)
    before = hostile.snapshot(ws)
    argv = [a.replace("{ws}", str(ws)).replace("{fifo}", str(fifo)) for a in probe.argv]
    result = run_cli(*argv, cwd=ws)  # the workspace is the current folder: '' or '.' must not touch it
    assert result.code == probe.code, (result.code, result.err)
    lines = result.err.strip("\n").splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert lines[0].startswith("dlrmkit ") and ": error: " in lines[0] and probe.phrase in lines[0], lines[0]
    after = hostile.snapshot(ws)
    outputs = probe.may_change + (("newrun",) if "{ws}/newrun" in probe.argv else ())
    before, after = without(before, outputs), without(after, outputs)
    assert before == after, sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))[:6]


def without(snap: dict, names: tuple[str, ...]) -> dict:
    """A snapshot minus the declared outputs the command may have started."""
    out = {k: v for k, v in snap.items() if k.removeprefix("./").split("/")[0] not in names}
    out["./"] = [n for n in snap.get("./", []) if n not in names]
    return out


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: no space)")
def test_a_log_that_cannot_be_written_fails_before_training(tiny_data, tmp_path):
    """--log-jsonl on a device whose every write fails is found at start-up (an empty write
    probes it), not at the first log line: no run folder, no recipe, no training."""
    run = tmp_path / "run"
    r = run_cli(
        "train", "--data", tiny_data, "--no-progress", "--max-steps", "2", "--run-dir", run, "--log-jsonl", "/dev/full"
    )
    assert r.code == 2 and r.err.strip() == (
        "dlrmkit train: error: --log-jsonl /dev/full: cannot write (No space left on device)"
    ), r.err
    assert r.out == "" and not run.exists()
    # a device that takes writes is a log like any other
    r = run_cli(
        "train", "--data", tiny_data, "--no-progress", "--max-steps", "2", "--run-dir", run, "--log-jsonl", "/dev/null"
    )
    assert r.code == 0, r.err


def test_a_full_disk_fails_before_training(tiny_data, tmp_path, monkeypatch):
    """An output file whose file system has no free block (os.statvfs says so here) is refused at
    start-up, naming the option: the run would otherwise fail only when it writes there."""
    real = os.statvfs
    full = tmp_path / "full"
    full.mkdir()

    def statvfs(path):
        st = real(path)
        if os.path.realpath(path) != str(full):
            return st
        return os.statvfs_result((*st[:2], st.f_blocks or 1, 0, 0, *st[5:]))  # f_blocks > 0, nothing free

    monkeypatch.setattr(os, "statvfs", statvfs)
    run = tmp_path / "run"
    for option in ("--metrics-json", "--log-jsonl"):
        argv = ("train", "--data", tiny_data, "--no-progress", "--max-steps", "2", "--run-dir", run)
        r = run_cli(*argv, option, full / "out.json")
        assert r.code == 2 and f"{option} {full / 'out.json'}: cannot write (No space left on device" in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1 and not run.exists()
    assert os.listdir(full) == []


def test_the_root_folder_is_never_an_output_folder():
    with pytest.raises(DlrmkitError, match="the root folder cannot be an output"):
        check_output_dir("/", "--run-dir")
    check_output_dir("/", "--out", allow_root=True)  # the parent of an output may be /


@pytest.mark.parametrize(
    "text",
    ["[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory", "CUDA out of memory. Tried"],
)
def test_a_failed_allocation_is_out_of_memory_not_a_bug(text):
    message, code = describe_error(RuntimeError(text))
    assert code == 2 and message.startswith("out of memory")
