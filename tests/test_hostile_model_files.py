"""Hostile model-side files, one table row each (as tests/test_hostile_inputs.py, whose checker
runs every row: exit code, exactly one line on stderr with the phrase, no traceback, every file
of the workspace unchanged but the declared output): checkpoint manifests, metadata and data
files, the `latest` pointer, first-format pickled metadata, `train --config` YAML, sharding plan
JSON, `tune` search spaces, and output folders that hold someone else's files. Each kind of file
is tried with what would run code, hang (a FIFO), never end (/dev/zero), exhaust the stack
(deep nesting), expand (YAML aliases), allocate a size taken from the file, or carry a wrong type
in a field that a command reads."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

import test_hostile_inputs as hostile
from helpers import run_cli
from test_checkpoint_trust import relist, to_first_format, transcoded  # noqa: F401 (fixture)
from test_hostile_inputs import Probe, both, snapshot, write_bytes


@pytest.fixture
def mws(tmp_path, transcoded) -> Path:  # noqa: F811 (the fixture imported above)
    """ds/ (a transcoded dataset), C/ (its checkpoints), rows.csv (raw rows `predict` reads),
    a user's folder notes/ and a file afile."""
    ds, c, csv = transcoded
    shutil.copytree(ds, tmp_path / "ds")
    shutil.copytree(c, tmp_path / "C")
    shutil.copy(csv, tmp_path / "rows.csv")
    for fp in (tmp_path / "C").glob("step_*/manifest.json"):  # the copy records its own dataset
        m = json.loads(fp.read_text())
        m["train_config"]["data"] = str(tmp_path / "ds")
        fp.write_text(json.dumps(m))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("the user's own file\n")
    (tmp_path / "afile").write_text("not a folder\n")
    return tmp_path


# ---- setups -----------------------------------------------------------------------------------------
def step(ws: Path) -> Path:
    return Path(os.path.join(ws, "C", (ws / "C" / "latest").read_text().strip()))


def manifest(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Edit the manifest of the checkpoint `latest` names (its own hash is not listed)."""

    def setup(ws: Path) -> None:
        fp = step(ws) / "manifest.json"
        m = json.loads(fp.read_text())
        fn(m)
        fp.write_text(json.dumps(m))

    return setup


def metadata(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Edit metadata.json and re-list the files' hashes, as a forger who can write the folder would."""

    def setup(ws: Path) -> None:
        fp = step(ws) / "metadata.json"
        m = json.loads(fp.read_text())
        fn(m)
        fp.write_text(json.dumps(m))
        relist(str(step(ws)))

    return setup


def in_step(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    """Replace file `name` of the latest checkpoint by what `make(path)` creates there."""

    def setup(ws: Path) -> None:
        path = step(ws) / name
        path.unlink()
        make(path)

    return setup


def link_to(target: str) -> Callable[[Path], None]:
    return lambda path: os.symlink(target, path)


def link_step_outside(ws: Path) -> None:
    """The step folder `latest` names moved to notes/ (a whole, verifying checkpoint) and linked back."""
    folder = step(ws)
    shutil.move(folder, ws / "notes" / folder.name)
    os.symlink(ws / "notes" / folder.name, folder)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def replace(rel: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        path = ws / rel
        if path.exists() or path.is_symlink():
            path.unlink()
        make(path)

    return setup


def deep(n: int = 100_000) -> bytes:
    return b"[" * n + b"]" * n


def alias_bomb(key: str) -> bytes:
    """Nine levels of nine aliases: a few hundred bytes that expand to 9^9 values."""
    lines = ["l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return ("\n".join(lines).replace("l8:", f"{key}:") + "\n").encode()


def model_param(m: dict) -> str:
    return next(k[len("model.") :] for k in m["tensors"] if k.startswith("model.") and k.endswith("weight"))


def tensor_values(key: str, value: float, first_format: bool = False) -> Callable[[Path], None]:
    """Set every value of tensor `key` of the latest checkpoint to `value` (its bytes rewritten in
    place, the files relisted, as a forger who can write the folder would); `first_format`: then
    rewrite the checkpoint in the first format."""

    def setup(ws: Path) -> None:
        import numpy as np

        info = json.loads((step(ws) / "metadata.json").read_text())["tensors"][key]
        with open(step(ws) / info["chunks"][0]["file"], "r+b") as f:
            for chunk in info["chunks"]:
                f.seek(chunk["offset"])
                f.write(np.full(chunk["length"] // np.dtype(info["dtype"]).itemsize, value, info["dtype"]).tobytes())
        relist(str(step(ws)))
        if first_format:  # rewritten through a load that would refuse the values
            from unittest import mock

            with mock.patch("dlrmkit.checkpoint.save_load._not_finite", return_value=None):
                to_first_format(str(step(ws)))

    return setup


def overflowing_stats(m: dict) -> None:
    """Numerical statistics finite as numbers but not as the model's float32: every row scores NaN."""
    n = m["model_config"]["num_numerical"]
    m["model_config"].update(numerical_mean=[1e308] * n, numerical_std=[1.0] * n)


def first_format_metadata(payload: bytes) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        to_first_format(str(step(ws)))
        (step(ws) / ".metadata").write_bytes(payload)
        relist(str(step(ws)))

    return setup


# ---- the commands -----------------------------------------------------------------------------------
EV = ("evaluate", "--data", "{ws}/ds", "--checkpoint", "{ws}/C")
EX = ("export", "--checkpoint", "{ws}/C", "--out", "{ws}/m.pt")
PR = ("predict", "--checkpoint", "{ws}/C", "--input", "{ws}/rows.csv", "--output", "{ws}/p.csv")
SMALL = ("--batch-size", "100", "--eval-batch-size", "100", "--search-budget", "0", "--run-dir", "{ws}/newrun")
RS = (
    "train",
    "--data",
    "{ws}/ds",
    "--no-progress",
    "--checkpoint-dir",
    "{ws}/C",
    "--resume",
    "--max-steps",
    "6",
    *SMALL,
)
T = ("train", "--data", "{ws}/ds", "--no-progress", "--max-steps", "2", *SMALL)
TC = (*T, "--config", "{ws}/c.yaml")
TP = (*T, "--plan", "{ws}/p.json")
TU = ("tune", "--data", "{ws}/ds", "--trials", "1", "--max-steps", "1", "--space", "{ws}/s.yaml", "--out", "{ws}/t")
PLAN = {
    "world_size": 2,
    "tables": [
        {
            "rows": 6,
            "dim": 9,
            "strategy": "table_wise",
            "shards": [dict(rank=0, row_start=0, row_end=6, col_start=0, col_end=9)],
        }
    ],
}


def plan(**changes: Any) -> Callable[[Path], None]:
    return write_bytes("p.json", json.dumps({**PLAN, **changes}).encode())


def shard(**changes: Any) -> Callable[[Path], None]:
    table = {**PLAN["tables"][0], "shards": [{**PLAN["tables"][0]["shards"][0], **changes}]}
    return plan(tables=[table])


PROBES = [
    # ---- checkpoint manifest: how it is read
    Probe(
        "manifest-nested-deep", EV, "nested too deeply", setup=in_step("manifest.json", lambda p: p.write_bytes(deep()))
    ),
    Probe(
        "manifest-nested-deep-export",
        EX,
        "nested too deeply",
        setup=in_step("manifest.json", lambda p: p.write_bytes(deep())),
    ),
    Probe("manifest-fifo", EV, "not a regular file", setup=in_step("manifest.json", fifo)),
    Probe("manifest-dev-zero", EV, "symbolic link", setup=in_step("manifest.json", link_to("/dev/zero"))),
    Probe("manifest-fifo-predict", PR, "not a regular file", setup=in_step("manifest.json", fifo)),
    # ---- checkpoint manifest: fields of the wrong type or size
    Probe("manifest-step-text", RS, "field 'step'", setup=manifest(lambda m: m.update(step="3"))),
    Probe("manifest-step-missing", RS, "no step to resume from", setup=manifest(lambda m: m.pop("step"))),
    Probe("manifest-epoch-negative", RS, "field 'epoch'", setup=manifest(lambda m: m.update(epoch=-5))),
    Probe("manifest-best-auc-text", RS, "field 'best_auc'", setup=manifest(lambda m: m.update(best_auc="x"))),
    Probe(
        "manifest-optimizer-scalars-list",
        RS,
        "optimizer_scalars",
        setup=manifest(lambda m: m.update(optimizer_scalars=[1])),
    ),
    Probe(
        "manifest-optimizer-scalar-text",
        RS,
        "optimizer_scalars.embeddings.step",
        setup=manifest(lambda m: m["optimizer_scalars"].update({"embeddings.step": "abc"})),
    ),
    Probe("manifest-dataset-not-mapping", RS, "field 'dataset'", setup=manifest(lambda m: m.update(dataset=[1]))),
    Probe(
        "manifest-tensor-entry-not-mapping",
        EV,
        "tensors.table.0.weight",
        setup=manifest(lambda m: m["tensors"].update({"table.0.weight": 5})),
    ),
    Probe(
        "manifest-dense-state-of-4tb",
        RS,
        "not a floating-point tensor of its parameter's shape",
        setup=manifest(
            lambda m: m["tensors"].update(
                {f"dense_opt.{model_param(m)}.extra": {"shape": [10**6, 10**6, 100], "dtype": "float32"}}
            )
        ),
    ),
    Probe(
        "manifest-train-config-not-mapping",
        PR,
        "field 'train_config'",
        setup=manifest(lambda m: m.update(train_config=[1])),
    ),
    Probe(
        "manifest-recorded-data-not-a-path",
        PR,
        "train_config.data",
        setup=manifest(lambda m: m["train_config"].update(data={"a": 1})),
    ),
    # ---- the model a manifest describes: typed, consistent with its tensors, within memory
    Probe(
        "model-config-float-dim",
        EX,
        "embedding_dim must be an integer",
        setup=manifest(lambda m: m["model_config"].update(embedding_dim=8.0, bottom_mlp=[32, 8.0])),
    ),
    Probe(
        "model-config-wide-text",
        EX,
        "wide must be true or false",
        setup=manifest(lambda m: m["model_config"].update(wide="no")),
    ),
    Probe(
        "model-config-table-bool",
        EX,
        "table_sizes must be",
        setup=manifest(lambda m: m["model_config"].update(table_sizes=[True, 10])),
    ),
    Probe(
        "model-config-8gb-table-not-in-tensors",
        EX,
        "model_config has table 0 of 200000000 rows",
        setup=manifest(lambda m: m["model_config"].update(table_sizes=[200_000_000, 10])),
    ),
    Probe(
        "model-config-beyond-memory",
        EX,
        "of memory",
        setup=manifest(
            lambda m: (
                m["model_config"].update(table_sizes=[10**12, 10]),
                m["tensors"]["table.0.weight"].update(shape=[10**12, 9]),
            )
        ),
    ),
    Probe(
        "model-config-2m-tables",
        EX,
        "table_sizes must be",
        setup=manifest(lambda m: m["model_config"].update(table_sizes=[5] * 2_000_000)),
    ),
    Probe("model-config-stats-overflow", EV, "the model scores test rows as NaN", setup=manifest(overflowing_stats)),
    Probe(
        "model-config-stats-overflow-predict",
        PR,
        "the model scores input row 1 as NaN",
        setup=manifest(overflowing_stats),
    ),
    # ---- the files a manifest lists
    Probe(
        "data-file-symlink-outside",
        EV,
        "symbolic link",
        setup=both(
            lambda ws: shutil.copy(step(ws) / "data_0.bin", ws / "outside.bin"),
            in_step("data_0.bin", lambda p: os.symlink(p.parent.parent.parent / "outside.bin", p)),
        ),
    ),
    Probe("data-file-fifo", EV, "not a regular file", setup=in_step("data_0.bin", fifo)),
    Probe("metadata-symlink", EV, "symbolic link", setup=in_step("metadata.json", link_to("/etc/hostname"))),
    Probe(
        "metadata-nested-deep",
        EV,
        "nested too deeply",
        setup=both(in_step("metadata.json", lambda p: p.write_bytes(deep())), lambda ws: relist(str(step(ws)))),
    ),
    Probe(
        "metadata-size-beyond-int64",
        EV,
        "integers in [0, 2^62)",
        setup=metadata(lambda m: m["tensors"]["table.0.weight"].update(size=[10**20, 9])),
    ),
    Probe(
        "metadata-chunk-missing",
        EV,
        "its chunks hold 0 values",
        setup=metadata(lambda m: m["tensors"]["table.0.weight"].update(chunks=[])),
    ),
    Probe(
        "metadata-chunk-repeated",
        EV,
        "is listed twice",
        setup=metadata(
            lambda m: m["tensors"]["table.0.weight"]["chunks"].extend(m["tensors"]["table.0.weight"]["chunks"])
        ),
    ),
    Probe(
        "first-format-metadata-claims-1tb",
        EV,
        "refused checkpoint metadata",
        setup=first_format_metadata(b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b"."),
    ),
    # ---- the values the data files hold
    Probe(
        "data-table-nan",
        EV,
        "tensor 'table.0.weight' holds a value that is not finite",
        setup=tensor_values("table.0.weight", float("nan")),
    ),
    Probe(
        "data-table-inf-predict",
        PR,
        "tensor 'table.0.weight' holds a value that is not finite",
        setup=tensor_values("table.0.weight", float("inf")),
    ),
    Probe(
        "data-table-nan-resume",
        RS,
        "tensor 'table.0.weight' holds a value that is not finite",
        setup=tensor_values("table.0.weight", float("nan")),
    ),
    Probe(
        "data-table-nan-first-format",
        EX,
        "tensor 'table.0.weight' holds a value that is not finite",
        setup=tensor_values("table.0.weight", float("nan"), first_format=True),
    ),
    Probe(
        "data-rng-state-garbage-resume",
        RS,
        "tensor 'rng.0' is not a random generator's state",
        setup=tensor_values("rng.0", 7),
    ),
    # ---- the latest pointer
    Probe("latest-binary", EV, "not UTF-8", setup=write_bytes("C/latest", b"\xff\xfe\x00")),
    Probe("latest-binary-resume", RS, "not UTF-8", setup=write_bytes("C/latest", b"\xff\xfe\x00")),
    Probe("latest-dangling-resume", RS, "'latest' pointer", setup=replace("C/latest", link_to("/nowhere/step_3"))),
    Probe("latest-loop-resume", RS, "'latest' pointer", setup=replace("C/latest", lambda p: os.symlink(p, p))),
    Probe("latest-fifo", EV, "not a regular file", setup=replace("C/latest", fifo)),
    Probe("latest-dev-zero", EV, "not a regular file", setup=replace("C/latest", link_to("/dev/zero"))),
    Probe("latest-unicode-digits", EV, "not a step_N folder", setup=write_bytes("C/latest", "step_٣".encode())),
    # a step folder that is a link: read from wherever it points (a checkpoint outside the directory)
    Probe("latest-names-a-linked-step", EV, "a symbolic link", setup=lambda ws: link_step_outside(ws)),
    Probe("latest-names-a-linked-step-resume", RS, "a symbolic link", setup=lambda ws: link_step_outside(ws)),
    Probe(
        "linked-step-resume-without-latest",
        RS,
        "is a symbolic link, not a step_N folder",
        setup=lambda ws: (link_step_outside(ws), (ws / "C" / "latest").unlink()),
    ),
    Probe(
        "latest-binary-fresh-run",
        (*T, "--checkpoint-dir", "{ws}/C"),
        "unreadable 'latest'",
        setup=write_bytes("C/latest", b"\xff\xfe\x00"),
    ),
    # ---- train --config
    Probe("config-nested-deep", TC, "nested too deeply", setup=write_bytes("c.yaml", b"lr: " + deep(50_000) + b"\n")),
    Probe("config-alias-bomb", TC, "expands to more than", setup=write_bytes("c.yaml", alias_bomb("top-mlp"))),
    Probe("config-5000-digit-int", TC, "c.yaml", setup=write_bytes("c.yaml", b"batch-size: " + b"9" * 5000 + b"\n")),
    Probe("config-fifo", TC, "not a regular file", setup=replace("c.yaml", fifo)),
    Probe("config-dev-zero", TC, "not a regular file", setup=replace("c.yaml", link_to("/dev/zero"))),
    Probe("config-too-large", TC, "more than a config file may be", setup=write_bytes("c.yaml", b"#" * (2 << 20))),
    Probe("config-key-twice", TC, "key 'lr' given twice", setup=write_bytes("c.yaml", b"lr: 0.1\nlr: 5\n")),
    Probe(
        "config-dash-and-underscore",
        TC,
        "unknown option 'batch_size' (keys are the flags: did you mean 'batch-size'?)",
        setup=write_bytes("c.yaml", b"batch-size: 100\nbatch_size: 7\n"),
    ),
    Probe("config-private-key", TC, "unknown option '_argv'", setup=write_bytes("c.yaml", b"_argv: [x]\n")),
    # where a run writes comes from the command line only: a config file cannot aim a write at a user's file
    Probe(
        "config-sets-metrics-json",
        TC,
        "'metrics-json' says where the run writes",
        setup=write_bytes("c.yaml", b"metrics-json: victim.json\n"),
    ),
    Probe("config-sets-run-dir", TC, "'run-dir' says where", setup=write_bytes("c.yaml", b"run-dir: elsewhere\n")),
    Probe(
        "config-python-tag",
        TC,
        "not valid YAML",
        setup=write_bytes("c.yaml", b"lr: !!python/object/apply:os.system ['touch MARKER']\n"),
    ),
    # ---- sharding plan files (checked before any work, in one process too)
    Probe("plan-nested-deep", TP, "nested too deeply", setup=write_bytes("p.json", deep())),
    Probe(
        "plan-nan", TP, "NaN is not a JSON number", setup=write_bytes("p.json", b'{"world_size": NaN, "tables": []}')
    ),
    Probe(
        "plan-infinity", TP, "Infinity is not a JSON number", setup=write_bytes("p.json", b'{"world_size": Infinity}')
    ),
    Probe("plan-binary", TP, "not UTF-8", setup=write_bytes("p.json", b"\xff\xfe{")),
    Probe("plan-fifo", TP, "not a regular file", setup=replace("p.json", fifo)),
    Probe("plan-world-size-float", TP, "world_size must be an integer", setup=plan(world_size=2.7)),
    Probe("plan-world-size-0", TP, "world_size must be an integer", setup=plan(world_size=0)),
    Probe("plan-world-size-huge", TP, "world_size must be an integer", setup=plan(world_size=10**30)),
    Probe("plan-rank-text", TP, "shard 0 rank must be an integer", setup=shard(rank="0")),
    Probe("plan-shard-extra-field", TP, "must hold exactly", setup=shard(module="os")),
    Probe(
        "plan-strategy-import",
        TP,
        "unknown strategy",
        setup=plan(tables=[{**PLAN["tables"][0], "strategy": "os.system"}]),
    ),
    Probe("plan-shard-outside-table", TP, "outside the table", setup=shard(row_end=60)),
    Probe(
        "plan-shards-overlap",
        TP,
        "exactly once",
        setup=plan(
            tables=[
                {
                    "rows": 6,
                    "dim": 9,
                    "strategy": "row_wise",
                    "shards": [
                        dict(rank=0, row_start=0, row_end=4, col_start=0, col_end=9),
                        dict(rank=1, row_start=2, row_end=6, col_start=0, col_end=9),
                    ],
                }
            ]
        ),
    ),
    Probe(
        "evaluate-plan-nested-deep",
        (*EV, "--plan", "{ws}/p.json"),
        "nested too deeply",
        setup=write_bytes("p.json", deep()),
    ),
    # ---- tune search spaces
    Probe("tune-space-binary", TU, "not UTF-8", setup=write_bytes("s.yaml", b"\xff\xfe")),
    Probe("tune-space-nested-deep", TU, "nested too deeply", setup=write_bytes("s.yaml", b"lr: " + deep(50_000))),
    Probe("tune-space-alias-bomb", TU, "expands to more than", setup=write_bytes("s.yaml", alias_bomb("lr"))),
    Probe("tune-space-dev-zero", TU, "not a regular file", setup=replace("s.yaml", link_to("/dev/zero"))),
    Probe(
        "tune-space-low-above-high",
        TU,
        "above high",
        setup=write_bytes("s.yaml", b"lr: {type: float, low: 0.5, high: 0.1}\n"),
    ),
    Probe(
        "tune-space-log-text",
        TU,
        "log must be",
        setup=write_bytes("s.yaml", b"lr: {type: float, low: 0.1, high: 1, log: maybe}\n"),
    ),
    Probe(
        "tune-space-unknown-field",
        TU,
        "unknown field 'step'",
        setup=write_bytes("s.yaml", b"batch-size: {type: int, low: 100, high: 200, step: 0}\n"),
    ),
    Probe(
        "tune-space-nested-choice",
        TU,
        "choices must be single values",
        setup=write_bytes("s.yaml", b"lr: {type: categorical, choices: [[0.1, [0.2]]]}\n"),
    ),
    # ---- outputs: a folder holding someone else's files
    Probe(
        "tune-out-user-folder",
        (*TU[:-1], "{ws}/notes"),
        "is not a tune folder",
        setup=write_bytes("s.yaml", b"lr: 0.1\n"),
    ),
    # a trial writes its config.yaml and log.jsonl in --out/trial_N: never through a link planted there
    Probe(
        "tune-trial-folder-link",
        TU,
        "t/trial_0 is not a folder (a symbolic link or a file)",
        setup=both(
            write_bytes("s.yaml", b"lr: 0.1\n"),
            lambda ws: ((ws / "t").mkdir(), os.symlink(ws / "notes", ws / "t" / "trial_0")),
        ),
    ),
    Probe(
        "tune-trial-log-link",
        TU,
        "t/trial_0/log.jsonl is a symbolic link",
        setup=both(
            write_bytes("s.yaml", b"lr: 0.1\n"),
            lambda ws: (
                (ws / "t" / "trial_0").mkdir(parents=True),
                os.symlink(ws / "afile", ws / "t/trial_0/log.jsonl"),
            ),
        ),
    ),
    Probe(
        "run-dir-user-folder",
        (*T[:-1], "{ws}/notes"),
        "is not a run folder",
        setup=write_bytes("notes/config.yaml", b"mine: 1\n"),
    ),
]


def test_every_row_is_named_once():
    assert len({p.id for p in PROBES}) == len(PROBES) >= 60


@pytest.fixture
def fifo_safe(monkeypatch):
    """The workspace snapshot reads every file, and reading a FIFO blocks: FIFOs are set aside
    (renamed, never opened) while the rest is hashed, and recorded by name."""
    original = hostile.snapshot

    def snap(root: Path) -> dict[str, Any]:
        fifos = [
            Path(d) / n for d, _, names in os.walk(root) for n in names if stat.S_ISFIFO(os.lstat(Path(d) / n).st_mode)
        ]
        aside = Path(tempfile.mkdtemp(dir=Path(root).parent))
        for i, f in enumerate(fifos):
            os.rename(f, aside / str(i))
        try:
            out = original(root)
        finally:
            for i, f in enumerate(fifos):
                os.rename(aside / str(i), f)
            aside.rmdir()
        return {**out, **{f"fifo:{os.path.relpath(f, root)}": "fifo" for f in fifos}}

    monkeypatch.setattr(hostile, "snapshot", snap)


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_hostile_model_file(mws, fifo_safe, probe: Probe):
    hostile.test_hostile_input(mws, probe)
    assert not (mws / "MARKER").exists()


def test_a_save_removes_only_its_own_temporary_folders(mws):
    """A checkpoint folder holding the user's `.tmp-step_x` (not a name a save uses) keeps it;
    a `.tmp-step_7` that a killed save left is removed."""
    (mws / "notes" / ".tmp-step_x").mkdir()
    (mws / "notes" / ".tmp-step_x" / "mine.txt").write_text("mine\n")
    (mws / "notes" / ".tmp-step_7").mkdir()
    before = snapshot(mws / "notes")
    r = run_cli(*[a.replace("{ws}", str(mws)) for a in (*T, "--checkpoint-dir", "{ws}/notes")])
    assert r.code == 0, r.err
    after = snapshot(mws / "notes")
    assert after[".tmp-step_x/mine.txt"] == before[".tmp-step_x/mine.txt"]
    assert after["./keep.txt"] == before["./keep.txt"]
    assert not (mws / "notes" / ".tmp-step_7").exists() and (mws / "notes" / "latest").exists()


def test_an_output_that_is_a_link_replaces_the_link_not_its_target(mws):
    """export --out and predict --output naming a symbolic link to the user's file: the link is
    replaced by the new file (written beside it and renamed), the file it pointed to is unchanged."""
    keep = mws / "notes" / "keep.txt"
    before = keep.read_bytes()
    for name, argv in (("m.pt", EX), ("p.csv", PR)):
        os.symlink(keep, mws / name)
        r = run_cli(*[a.replace("{ws}", str(mws)) for a in argv])
        assert r.code == 0, r.err
        assert not (mws / name).is_symlink() and (mws / name).stat().st_size > 0
    assert keep.read_bytes() == before
