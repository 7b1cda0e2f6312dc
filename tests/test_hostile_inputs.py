"""Hostile and bad input, one table row each: the command line, the exit code, a phrase of the
one-line error, and the promise that nothing on disk changed (every file and folder of the
probe's workspace is hashed before and after). Every command is covered; stderr must be exactly
one line and never a traceback. Runs in-process (tests/helpers.py run_cli) on tiny data."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml

from helpers import run_cli

SPEC = "feature_spec.yaml"


# ---- the workspace every probe runs in -------------------------------------------------------
@pytest.fixture(scope="module")
def trained_run(tiny_run) -> Path:
    """The shared finished run (conftest.py `tiny_run`): `ws` copies it."""
    return tiny_run


def criteo_rows(n: int = 40) -> bytes:
    rng = np.random.default_rng(0)
    return b"".join(
        (
            "\t".join(
                [str(i % 2)]
                + [str(rng.integers(0, 9)) for _ in range(13)]
                + [f"{rng.integers(0, 50):08x}" for _ in range(26)]
            )
            + "\n"
        ).encode()
        for i in range(n)
    )


@pytest.fixture
def ws(tmp_path, tiny_data, trained_run) -> Path:
    """data/ (a dataset), run/ (a finished run with checkpoints), rows.csv, rows.tsv, a file
    `afile`, a user's folder `notes/` and an empty `empty.csv`."""
    shutil.copytree(tiny_data, tmp_path / "data")
    shutil.copytree(trained_run, tmp_path / "run")
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    info["log_jsonl"] = str(tmp_path / "run" / "log.jsonl")  # the copy's own log
    (tmp_path / "run" / "run.json").write_text(json.dumps(info))
    (tmp_path / "rows.csv").write_text("y,a,b,c\n" + "".join(f"{i % 2},{i},{i % 3},k{i % 4}\n" for i in range(40)))
    (tmp_path / "rows.tsv").write_bytes(criteo_rows())
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("the user's own file\n")
    (tmp_path / "empty.csv").write_bytes(b"")
    return tmp_path


def snapshot(root: Path) -> dict[str, Any]:
    """Every file (size, mtime, SHA-256) and folder under root."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = sorted(dirs + files)
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[os.path.join(rel, name)] = ("link", os.readlink(p))
                continue
            st = os.stat(p)
            out[os.path.join(rel, name)] = (
                st.st_size,
                st.st_mtime_ns,
                hashlib.sha256(Path(p).read_bytes()).hexdigest(),
            )
    return out


# ---- setups that plant hostile files -------------------------------------------------------------
def edit_spec(fn: Callable[[dict], None], where: str = "data") -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        path = ws / where / SPEC
        doc = yaml.safe_load(path.read_text())
        fn(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    return setup


def set_feature(name: str, **kw) -> Callable[[dict], None]:
    return lambda doc: doc["feature_spec"][name].update(kw)


def set_file(mapping: str, feature: str, value: Any) -> Callable[[dict], None]:
    def fn(doc: dict) -> None:
        for chunk in doc["source_spec"][mapping]:
            if chunk["features"][0] == feature:
                chunk["files"] = value

    return fn


def write_bytes(rel: str, data: bytes) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).write_bytes(data)


def poke(rel: str, dtype: Any, index: Any, value: Any, width: int = 1) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        a = np.fromfile(ws / rel, dtype=dtype)
        a = a.reshape(-1, width) if width > 1 else a
        if dtype == np.bool_:
            a = a.view(np.uint8)
        a[index] = value
        a.tofile(ws / rel)

    return setup


def widen(rel: str) -> Callable[[Path], None]:
    """Rewrite an int8 file as int64 (the same ids)."""
    return lambda ws: np.fromfile(ws / rel, np.int8).astype(np.int64).tofile(ws / rel)


def symlink(rel: str, target: str) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        (ws / rel).unlink()
        os.symlink(target, ws / rel)

    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        for s in setups:
            s(ws)

    return setup


@dataclass
class Probe:
    id: str
    argv: tuple
    phrase: str
    code: int = 2
    setup: Callable[[Path], Any] | None = None
    may_change: tuple[str, ...] = field(default_factory=tuple)


T = ("train", "--data", "{ws}/data", "--no-progress", "--max-steps", "2", "--run-dir", "{ws}/newrun", "--no-shuffle")
TR = ("transcode", "--input", "{ws}/rows.csv", "--label", "y", "--numerical", "a,b", "--categorical", "c")
PP = ("preprocess", "criteo", "--input", "{ws}/rows.tsv", "--no-progress", "--workers", "1")
CK = "{ws}/run/checkpoints"

PROBES = [
    # ---- synth: --force, output folders, options
    Probe(
        "multihot-out-is-data",
        ("multihot", "--data", "{ws}/data", "--out", "{ws}/data", "--force", "--multi-hot-sizes", "2,1,1,1,1"),
        "is inside --data",
    ),
    Probe(
        "multihot-out-is-file",
        ("multihot", "--data", "{ws}/data", "--out", "{ws}/afile", "--multi-hot-sizes", "2,1,1,1,1"),
        "is a file",
    ),
    Probe(
        "multihot-sizes-count",
        ("multihot", "--data", "{ws}/data", "--out", "{ws}/mh", "--multi-hot-sizes", "2,1"),
        "5 positive",
    ),
    Probe("multihot-mlperf-sizes-on-5-tables", ("multihot", "--data", "{ws}/data", "--out", "{ws}/mh"), "26 tables"),
    Probe("synth-force-user-folder", ("synth", "--out", "{ws}/notes", "--force"), "replaces only a dataset"),
    Probe("synth-force-cwd", ("synth", "--out", ".", "--force"), "current folder"),
    Probe("synth-force-parent-of-cwd", ("synth", "--out", "{ws}", "--force"), "current folder"),
    Probe("synth-out-is-file", ("synth", "--out", "{ws}/afile"), "is a file"),
    Probe("synth-out-under-file", ("synth", "--out", "{ws}/afile/sub"), "is a file"),
    Probe("synth-existing-no-force", ("synth", "--out", "{ws}/data"), "already exists"),
    Probe(
        "synth-force-dataset-with-foreign-file",
        ("synth", "--out", "{ws}/data", "--force"),
        "holds 'mine.txt'",
        setup=write_bytes("data/mine.txt", b"keep me"),
    ),
    Probe(
        "synth-force-symlink",
        ("synth", "--out", "{ws}/link", "--force"),
        "symbolic link",
        setup=lambda ws: os.symlink(ws / "data", ws / "link"),
    ),
    Probe(
        "synth-foreign-tmp",
        ("synth", "--out", "{ws}/new", "--rows", "10", "--test-rows", "10"),
        "not made by dlrmkit",
        setup=lambda ws: (ws / "new.tmp").mkdir(),
    ),
    Probe(
        "synth-locked",
        ("synth", "--out", "{ws}/new", "--rows", "10", "--test-rows", "10"),
        "another dlrmkit process",
        setup=lambda ws: hold_lock(ws / "new.lock"),
    ),
    Probe("synth-rows-zero", ("synth", "--out", "{ws}/x", "--rows", "0"), "--rows"),
    Probe("synth-rows-text", ("synth", "--out", "{ws}/x", "--rows", "many"), "--rows"),
    Probe("synth-rows-float", ("synth", "--out", "{ws}/x", "--rows", "1e3"), "--rows"),
    Probe("synth-rows-beyond-disk", ("synth", "--out", "{ws}/x", "--rows", "1000000000000"), "free"),
    Probe("synth-test-rows-huge", ("synth", "--out", "{ws}/x", "--test-rows", "10000000000000"), "--test-rows"),
    Probe("synth-seed-negative", ("synth", "--out", "{ws}/x", "--seed", "-1"), "--seed"),
    Probe("synth-unknown-preset", ("synth", "--out", "{ws}/x", "--preset", "enormous"), "unknown --preset"),
    # ---- train: options
    Probe("train-epochs-0", (*T[:4], "--epochs", "0"), "--epochs"),
    Probe("train-max-steps-0", (*T[:4], "--max-steps", "0"), "--max-steps"),
    Probe("train-max-steps-negative", (*T[:4], "--max-steps", "-3"), "--max-steps"),
    Probe("train-lr-zero", (*T, "--lr", "0"), "--lr"),
    Probe("train-lr-negative", (*T, "--lr", "-0.1"), "--lr"),
    Probe("train-lr-nan", (*T, "--lr", "nan"), "--lr"),
    Probe("train-lr-overflow", (*T, "--lr", "1e400"), "--lr"),
    Probe("train-lamb-lr-inf", (*T, "--lamb-lr", "inf"), "--lamb-lr"),
    Probe("train-batch-zero", (*T, "--batch-size", "0"), "--batch-size"),
    Probe("train-batch-huge", (*T, "--batch-size", "99999999999"), "--batch-size"),
    Probe("train-batch-text", (*T, "--batch-size", "big"), "--batch-size"),
    Probe("train-eval-batch-zero", (*T, "--eval-batch-size", "0"), "--eval-batch-size"),
    Probe("train-eval-every-negative", (*T, "--eval-every", "-1"), "--eval-every"),
    Probe("train-target-auc-2", (*T, "--target-auc", "2"), "--target-auc"),
    Probe("train-target-auc-0", (*T, "--target-auc", "0"), "--target-auc"),
    Probe("train-keep-0", (*T, "--keep", "0"), "--keep"),
    Probe("train-seed-negative", (*T, "--seed", "-5"), "--seed"),
    Probe("train-threads-negative", (*T, "--threads", "-1"), "--threads"),
    Probe("train-embedding-dim-0", (*T, "--embedding-dim", "0"), "--embedding-dim"),
    Probe("train-bottom-mlp-zero", (*T, "--bottom-mlp", "0,16"), "--bottom-mlp"),
    Probe("train-top-mlp-text", (*T, "--top-mlp", "a,b"), "--top-mlp"),
    Probe("train-collective-timeout-0", (*T, "--collective-timeout", "0"), "--collective-timeout"),
    Probe("train-checkpoint-seconds-negative", (*T, "--checkpoint-every-seconds", "-1"), "--checkpoint-every-seconds"),
    Probe("train-log-every-0", (*T, "--log-every", "0"), "--log-every"),
    Probe("train-warmup-negative", (*T, "--warmup-steps", "-1"), "--warmup-steps"),
    Probe("train-skip-nonfinite-negative", (*T, "--skip-nonfinite", "-2"), "--skip-nonfinite"),
    Probe("train-unknown-preset", (*T, "--preset", "enormous"), "enormous"),
    # ---- train: output paths, checked before training
    Probe("train-metrics-json-is-folder", (*T, "--metrics-json", "{ws}/notes"), "is a folder"),
    Probe("train-metrics-json-under-file", (*T, "--metrics-json", "{ws}/afile/m.json"), "is a file"),
    Probe("train-checkpoint-dir-is-file", (*T, "--checkpoint-dir", "{ws}/afile"), "is a file"),
    Probe("train-run-dir-is-file", (*T[:6], "--run-dir", "{ws}/afile"), "is a file"),
    Probe("train-log-jsonl-is-folder", (*T, "--log-jsonl", "{ws}/notes"), "is a folder"),
    Probe("train-tensorboard-is-file", (*T, "--tensorboard", "{ws}/afile"), "is a file"),
    Probe("train-metrics-json-inside-data", (*T, "--metrics-json", "{ws}/data/feature_spec.yaml"), "is inside --data"),
    Probe("train-run-dir-inside-data", (*T[:6], "--run-dir", "{ws}/data/run"), "is inside --data"),
    Probe(
        "train-data-missing",
        ("train", "--data", "{ws}/nowhere", "--no-progress", "--run-dir", "{ws}/newrun"),
        "nowhere",
    ),
    Probe(
        "train-data-is-file", ("train", "--data", "{ws}/afile", "--no-progress", "--run-dir", "{ws}/newrun"), "afile"
    ),
    Probe("train-plan-missing", (*T, "--plan", "{ws}/plan.json"), "no such file"),
    Probe("train-config-missing", (*T, "--config", "{ws}/c.yaml"), "cannot read config"),
    Probe(
        "train-config-not-yaml",
        (*T, "--config", "{ws}/c.yaml"),
        "not valid YAML",
        setup=write_bytes("c.yaml", b"a: [unclosed\n"),
    ),
    Probe(
        "train-config-unknown-key",
        (*T, "--config", "{ws}/c.yaml"),
        "unknown option",
        setup=write_bytes("c.yaml", b"rm-rf: true\n"),
    ),
    Probe(
        "train-config-bad-value",
        (*T, "--config", "{ws}/c.yaml"),
        "batch-size",
        setup=write_bytes("c.yaml", b"batch-size: -5\n"),
    ),
    Probe(
        "train-config-binary", (*T, "--config", "{ws}/c.yaml"), "c.yaml", setup=write_bytes("c.yaml", b"\xff\xfe\x00")
    ),
    # ---- train / evaluate / validate: bad data in the files
    Probe(
        "train-label-byte-7",
        T,
        "has label 7",
        setup=poke("data/train/label.bin", np.bool_, 30, 7),
        may_change=("newrun",),
    ),
    Probe(
        "train-label-byte-255-test",
        T,
        "test/label.bin",
        setup=poke("data/test/label.bin", np.bool_, 17, 255),
        may_change=("newrun",),
    ),
    Probe(
        "train-numerical-nan",
        T,
        "must be finite",
        setup=poke("data/train/numerical.bin", np.float16, (5, 2), np.nan, 4),
        may_change=("newrun",),
    ),
    Probe(
        "train-numerical-inf-test",
        T,
        "row 900",
        setup=poke("data/test/numerical.bin", np.float16, (900, 0), np.inf, 4),
        may_change=("newrun",),
    ),
    Probe(
        "train-id-out-of-range",
        T,
        "outside [0, 20)",
        setup=poke("data/train/cat_2.bin", np.int8, 2, 20),
        may_change=("newrun",),
    ),
    Probe("train-truncated-file", T, "train/cat_2.bin", setup=lambda ws: truncate(ws / "data/train/cat_2.bin", 3000)),
    Probe("train-spec-dtype-object", T, "not allowed", setup=edit_spec(set_feature("num_0", dtype="object"))),
    Probe("train-spec-label-float", T, "not allowed", setup=edit_spec(set_feature("label", dtype="float32"))),
    Probe("train-spec-cat-float", T, "not allowed", setup=edit_spec(set_feature("cat_1.bin", dtype="float16"))),
    Probe("train-spec-dtype-bigendian", T, "not allowed", setup=edit_spec(set_feature("cat_1.bin", dtype=">i2"))),
    Probe("train-spec-dtype-string", T, "not allowed", setup=edit_spec(set_feature("num_1", dtype="<U8"))),
    Probe("train-spec-dtype-list", T, "not allowed", setup=edit_spec(set_feature("num_1", dtype=[1, 2]))),
    Probe(
        "train-spec-path-dotdot",
        T,
        "outside the dataset folder",
        setup=edit_spec(set_file("train", "label", ["../../../etc/hostname"])),
    ),
    Probe(
        "train-spec-path-absolute", T, "absolute path", setup=edit_spec(set_file("train", "label", ["/etc/hostname"]))
    ),
    Probe(
        "train-spec-symlink-escape",
        T,
        "outside the dataset folder",
        setup=symlink("data/train/label.bin", "/etc/hostname"),
    ),
    Probe(
        "train-spec-files-not-list", T, "non-empty list", setup=edit_spec(set_file("train", "label", "train/label.bin"))
    ),
    Probe("train-spec-cardinality-zero", T, "cardinality", setup=edit_spec(set_feature("cat_0.bin", cardinality=0))),
    Probe("train-spec-cardinality-bool", T, "cardinality", setup=edit_spec(set_feature("cat_0.bin", cardinality=True))),
    Probe("train-spec-cardinality-text", T, "cardinality", setup=edit_spec(set_feature("cat_0.bin", cardinality="10"))),
    Probe(
        "train-spec-cardinality-huge",
        T + ("--preset", "tiny"),
        "memory",
        setup=both(  # its files rewritten as int64 too: the claimed size is refused, not the files' sizes
            edit_spec(set_feature("cat_0.bin", cardinality=2**62, dtype="int64")), widen("data/train/cat_0.bin"),
            widen("data/test/cat_0.bin"),
        ),
    ),
    Probe("train-spec-not-yaml", T, "not valid YAML", setup=write_bytes("data/" + SPEC, b"feature_spec: [\n")),
    Probe("train-spec-a-list", T, "expected a mapping", setup=write_bytes("data/" + SPEC, b"- 1\n- 2\n")),
    Probe("train-spec-section-missing", T, "missing section", setup=edit_spec(lambda d: d.pop("channel_spec"))),
    Probe(
        "train-spec-section-wrong-type", T, "must be a mapping", setup=edit_spec(lambda d: d.update(source_spec=[1]))
    ),
    Probe(
        "train-spec-chunk-not-mapping",
        T,
        "list of chunks",
        setup=edit_spec(lambda d: d["source_spec"].update(train=["x"])),
    ),
    Probe("train-spec-binary", T, "not UTF-8", setup=write_bytes("data/" + SPEC, b"\xff\xfe\xfa")),
    Probe(
        "validate-dtype-object",
        ("validate", "--data", "{ws}/data"),
        "not allowed",
        setup=edit_spec(set_feature("label", dtype="object")),
    ),
    Probe(
        "validate-path-escape",
        ("validate", "--data", "{ws}/data"),
        "outside the dataset folder",
        setup=edit_spec(set_file("test", "cat_0.bin", ["../afile"])),
    ),
    Probe(
        "validate-label-7",
        ("validate", "--data", "{ws}/data"),
        "label 7",
        setup=poke("data/test/label.bin", np.bool_, 3, 7),
    ),
    Probe(
        "validate-nan",
        ("validate", "--data", "{ws}/data"),
        "must be finite",
        setup=poke("data/train/numerical.bin", np.float16, (9, 1), np.nan, 4),
    ),
    Probe("validate-not-a-folder", ("validate", "--data", "{ws}/afile"), "afile"),
    Probe("validate-missing", ("validate", "--data", "{ws}/nowhere"), "nowhere"),
    Probe(
        "evaluate-label-7",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK),
        "has label 7",
        setup=poke("data/test/label.bin", np.bool_, 100, 7),
    ),
    Probe(
        "evaluate-numerical-nan",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK),
        "must be finite",
        setup=poke("data/test/numerical.bin", np.float16, (7, 3), np.nan, 4),
    ),
    Probe(
        "evaluate-batch-zero",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK, "--batch-size", "0"),
        "--batch-size",
    ),
    Probe(
        "evaluate-metrics-json-folder",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK, "--metrics-json", "{ws}/notes"),
        "is a folder",
    ),
    Probe(
        "evaluate-checkpoint-missing", ("evaluate", "--data", "{ws}/data", "--checkpoint", "{ws}/nowhere"), "nowhere"
    ),
    Probe("evaluate-data-missing", ("evaluate", "--data", "{ws}/nowhere", "--checkpoint", CK), "nowhere"),
    # ---- bench
    Probe("bench-steps-0", ("bench", "--steps", "0"), "--steps"),
    Probe("bench-windows-0", ("bench", "--windows", "0"), "--windows"),
    Probe("bench-batch-0", ("bench", "--batch-size", "0"), "--batch-size"),
    Probe("bench-lr-negative", ("bench", "--lr", "-1"), "--lr"),
    Probe("bench-warmup-negative", ("bench", "--warmup", "-1"), "--warmup"),
    Probe("bench-json-folder", ("bench", "--json", "{ws}/notes", "--steps", "1"), "is a folder"),
    Probe("bench-trace-under-file", ("bench", "--profile", "--trace", "{ws}/afile/t.json"), "is a file"),
    # ---- plan
    # ---- baseline: options and output paths
    Probe("baseline-no-data", ("baseline", "--data", "{ws}/nothing"), "no such dataset folder"),
    Probe("baseline-c-zero", ("baseline", "--data", "{ws}/data", "--c", "0"), "--c"),
    Probe("baseline-max-iter-0", ("baseline", "--data", "{ws}/data", "--max-iter", "0"), "--max-iter"),
    Probe("baseline-val-fraction-1", ("baseline", "--data", "{ws}/data", "--val-fraction", "1"), "--val-fraction"),
    Probe("baseline-out-folder", ("baseline", "--data", "{ws}/data", "--out", "{ws}/notes"), "is a folder"),
    Probe("plan-world-size-0", ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "0"), "--world-size"),
    Probe(
        "plan-world-size-huge",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "100000000000000000000"),
        "--world-size",
    ),
    Probe(
        "plan-world-size-text", ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "eight"), "--world-size"
    ),
    Probe(
        "plan-too-many-shards",
        ("plan", "--tables", ",".join(["100000x16"] * 40), "--world-size", "65536", "--sharding", "data_parallel"),
        "shards",
    ),
    Probe("plan-tables-zero-rows", ("plan", "--tables", "0x16", "--world-size", "2"), "rows must be"),
    Probe("plan-tables-garbage", ("plan", "--tables", "10x16,abc", "--world-size", "2"), "ROWSxDIM"),
    Probe("plan-tables-mixed-dims", ("plan", "--tables", "10x16,10x8", "--world-size", "2"), "one dim"),
    Probe(
        "plan-device-memory-inf",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2", "--device-memory", "1e999GiB"),
        "--device-memory",
    ),
    Probe(
        "plan-device-memory-negative",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2", "--device-memory", "-5GiB"),
        "--device-memory",
    ),
    Probe(
        "plan-batch-0",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2", "--batch-size", "0"),
        "--batch-size",
    ),
    Probe("plan-dim-0", ("plan", "--data", "{ws}/data", "--world-size", "2", "--dim", "0"), "--dim"),
    Probe(
        "plan-sharding-unknown",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2", "--sharding", "diagonal"),
        "--sharding",
    ),
    Probe(
        "plan-json-folder",
        ("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2", "--json", "{ws}/notes"),
        "is a folder",
    ),
    Probe(
        "plan-hostile-spec",
        ("plan", "--data", "{ws}/data", "--world-size", "2"),
        "not allowed",
        setup=edit_spec(set_feature("num_0", dtype="object")),
    ),
    Probe(
        "plan-does-not-fit",
        ("plan", "--tables-preset", "criteo-1tb-mlperf", "--world-size", "1", "--device-memory", "1GiB"),
        "does not fit",
    ),
    Probe(
        "plan-hardware-zero",
        ("plan", "--tables-preset", "criteo-kaggle", "--simulate", "--world-size", "8", "--hardware", "{ws}/hw.json"),
        "must be a positive number",
        setup=write_bytes(
            "hw.json", b'{"name": "x", "peak_flops": 0, "peak_flops_amp": 1, "mem_bw": 1, "intra_bw": 1, "inter_bw": 1}'
        ),
    ),
    Probe(
        "plan-hardware-text",
        ("plan", "--tables-preset", "criteo-kaggle", "--simulate", "--world-size", "8", "--hardware", "{ws}/hw.json"),
        "must be a positive number",
        setup=write_bytes(
            "hw.json",
            b'{"name": "x", "peak_flops": "fast", "peak_flops_amp": 1, "mem_bw": 1, "intra_bw": 1, "inter_bw": 1}',
        ),
    ),
    Probe(
        "plan-hardware-not-json",
        ("plan", "--tables-preset", "criteo-kaggle", "--simulate", "--hardware", "{ws}/afile"),
        "not a hardware profile",
    ),
    # ---- report
    Probe("report-missing", ("report", "{ws}/nowhere"), "not a run folder"),
    Probe("report-out-is-file", ("report", "{ws}/run", "--out", "{ws}/afile"), "is a file"),
    Probe(
        "report-run-json-garbage", ("report", "{ws}/run"), "run.json", setup=write_bytes("run/run.json", b"{not json")
    ),
    Probe("report-run-json-list", ("report", "{ws}/run"), "run.json", setup=write_bytes("run/run.json", b"[1, 2]")),
    Probe(
        "report-log-bad-number",
        ("report", "{ws}/run"),
        "not a number",
        setup=lambda ws: append_log(ws, b'{"event": "train", "loss": "x"}\n'),
    ),
    Probe(
        "report-log-not-object", ("report", "{ws}/run"), "not a JSON object", setup=lambda ws: append_log(ws, b"[1]\n")
    ),
    Probe("report-log-garbage", ("report", "{ws}/run"), "not a JSON line", setup=lambda ws: append_log(ws, b"{oops\n")),
    # ---- tune
    Probe("tune-trials-0", ("tune", "--data", "{ws}/data", "--trials", "0"), "--trials"),
    Probe("tune-parallel-0", ("tune", "--data", "{ws}/data", "--trials", "1", "--parallel", "0"), "--parallel"),
    Probe("tune-max-steps-0", ("tune", "--data", "{ws}/data", "--trials", "1", "--max-steps", "0"), "--max-steps"),
    Probe("tune-out-is-file", ("tune", "--data", "{ws}/data", "--trials", "1", "--out", "{ws}/afile"), "is a file"),
    Probe("tune-data-missing", ("tune", "--data", "{ws}/nowhere", "--trials", "1", "--out", "{ws}/t"), "nowhere"),
    Probe(
        "tune-space-not-yaml",
        ("tune", "--data", "{ws}/data", "--trials", "1", "--space", "{ws}/s.yaml", "--out", "{ws}/t"),
        "s.yaml: not valid YAML",
        setup=write_bytes("s.yaml", b"lr: [1, 2\n"),
    ),
    Probe(
        "tune-space-a-list",
        ("tune", "--data", "{ws}/data", "--trials", "1", "--space", "{ws}/s.yaml", "--out", "{ws}/t"),
        "a search space is a mapping",
        setup=write_bytes("s.yaml", b"- 1\n"),
    ),
    # ---- export
    Probe("export-out-is-folder", ("export", "--checkpoint", CK, "--out", "{ws}/notes"), "is a folder"),
    Probe("export-out-under-file", ("export", "--checkpoint", CK, "--out", "{ws}/afile/m.pt"), "is a file"),
    Probe(
        "export-out-inside-checkpoint",
        ("export", "--checkpoint", CK, "--out", "{ws}/run/checkpoints/latest"),
        "is inside --checkpoint",
    ),
    Probe(
        "evaluate-metrics-json-inside-data",
        ("evaluate", "--data", "{ws}/data", "--checkpoint", CK, "--metrics-json", "{ws}/data/train/label.bin"),
        "is inside --data",
    ),
    Probe(
        "plan-json-inside-data",
        ("plan", "--data", "{ws}/data", "--world-size", "2", "--json", "{ws}/data/feature_spec.yaml"),
        "is inside --data",
    ),
    Probe("export-checkpoint-missing", ("export", "--checkpoint", "{ws}/nowhere", "--out", "{ws}/m.pt"), "nowhere"),
    Probe(
        "export-format-unknown", ("export", "--checkpoint", CK, "--out", "{ws}/m.pt", "--format", "pickle"), "--format"
    ),
    # ---- predict
    Probe(
        "predict-batch-0",
        ("predict", "--checkpoint", CK, "--input", "{ws}/rows.csv", "--batch-size", "0"),
        "--batch-size",
    ),
    Probe(
        "predict-output-folder",
        ("predict", "--checkpoint", CK, "--input", "{ws}/rows.csv", "--output", "{ws}/notes"),
        "is a folder",
    ),
    Probe("predict-input-missing", ("predict", "--checkpoint", CK, "--input", "{ws}/nowhere.csv"), "no such file"),
    Probe(
        "predict-output-is-input",
        ("predict", "--checkpoint", CK, "--input", "{ws}/rows.csv", "--output", "{ws}/rows.csv"),
        "is the --input file",
    ),
    Probe(
        "predict-delimiter-long",
        ("predict", "--checkpoint", CK, "--input", "{ws}/rows.csv", "--delimiter", "ab"),
        "--delimiter",
    ),
    # ---- preprocess
    Probe("preprocess-workers-0", (*PP[:-1], "0", "--out", "{ws}/o"), "--workers"),
    Probe("preprocess-test-fraction-1", (*PP, "--out", "{ws}/o", "--test-fraction", "1"), "--test-fraction"),
    Probe("preprocess-test-fraction-0", (*PP, "--out", "{ws}/o", "--test-fraction", "0"), "--test-fraction"),
    Probe("preprocess-frequency-0", (*PP, "--out", "{ws}/o", "--frequency-threshold", "0"), "--frequency-threshold"),
    Probe("preprocess-max-table-1", (*PP, "--out", "{ws}/o", "--max-table-size", "1"), "--max-table-size"),
    Probe(
        "preprocess-input-missing",
        ("preprocess", "criteo", "--input", "{ws}/no.tsv", "--out", "{ws}/o"),
        "no such input",
    ),
    Probe(
        "preprocess-input-empty",
        ("preprocess", "criteo", "--input", "{ws}/empty.csv", "--out", "{ws}/o"),
        "empty input",
    ),
    Probe("preprocess-force-user-folder", (*PP, "--out", "{ws}/notes", "--force"), "replaces only a dataset"),
    Probe("preprocess-force-cwd", (*PP, "--out", ".", "--force"), "current folder"),
    Probe("preprocess-out-under-file", (*PP, "--out", "{ws}/afile/o"), "is a file"),
    Probe("preprocess-existing-other-dataset", (*PP, "--out", "{ws}/data"), "different dataset"),
    Probe(
        "preprocess-locked",
        (*PP, "--out", "{ws}/o"),
        "another dlrmkit process",
        setup=lambda ws: hold_lock(ws / "o.lock"),
    ),
    # ---- transcode
    Probe("transcode-test-fraction-1.5", (*TR, "--out", "{ws}/o", "--test-fraction", "1.5"), "--test-fraction"),
    Probe("transcode-delimiter-long", (*TR, "--out", "{ws}/o", "--delimiter", "::"), "--delimiter"),
    Probe("transcode-delimiter-quote", (*TR, "--out", "{ws}/o", "--delimiter", '"'), "--delimiter"),
    Probe(
        "transcode-missing-column",
        ("transcode", "--input", "{ws}/rows.csv", "--out", "{ws}/o", "--label", "y", "--numerical", "zz"),
        "no column",
    ),
    Probe(
        "transcode-column-twice",
        (
            "transcode",
            "--input",
            "{ws}/rows.csv",
            "--out",
            "{ws}/o",
            "--label",
            "y",
            "--numerical",
            "a",
            "--categorical",
            "a",
        ),
        "more than once",
    ),
    Probe("transcode-force-user-folder", (*TR, "--out", "{ws}/notes", "--force"), "replaces only a dataset"),
    Probe("transcode-force-cwd", (*TR, "--out", ".", "--force"), "current folder"),
    Probe(
        "transcode-empty-input",
        ("transcode", "--input", "{ws}/empty.csv", "--out", "{ws}/o", "--label", "y", "--numerical", "a"),
        "empty input",
    ),
    Probe("transcode-no-header-no-columns", (*TR, "--out", "{ws}/o", "--no-header"), "--columns"),
    Probe(
        "transcode-input-missing",
        ("transcode", "--input", "{ws}/no.csv", "--out", "{ws}/o", "--label", "y", "--numerical", "a"),
        "no such input",
    ),
    Probe(
        "transcode-binary-header",
        (*TR, "--out", "{ws}/o"),
        "not UTF-8",
        setup=write_bytes("rows.csv", b"\xff\xfe,a\n1,2\n"),
    ),
    Probe(
        "transcode-no-valid-rows",
        (*TR, "--out", "{ws}/o"),
        "no valid rows",
        setup=write_bytes("rows.csv", b"y,a,b,c\n7,1,2,x\n"),
    ),
    Probe("transcode-columns-twice", (*TR, "--out", "{ws}/o", "--no-header", "--columns", "y,a,a,c"), "appears twice"),
    Probe("transcode-out-is-file", (*TR, "--out", "{ws}/afile"), "is a file"),
    # ---- the command line itself
    Probe("unknown-option", ("train", "--data", "{ws}/data", "--bogus"), "unrecognized arguments"),
    Probe("unknown-command", ("destroy",), "invalid choice"),
]


@dataclass
class HeldLock:
    """A lock another process (here: the test) holds on an output."""

    fd: int


def hold_lock(path: Path) -> Any:
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return HeldLock(fd)


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def append_log(ws: Path, line: bytes) -> None:
    with open(ws / "run" / "log.jsonl", "ab") as f:
        f.write(line)


def test_table_is_large_and_covers_every_command():
    assert len(PROBES) >= 80 and len({p.id for p in PROBES}) == len(PROBES)
    from dlrmkit.cli import COMMANDS

    covered = {p.argv[0] for p in PROBES}
    assert set(COMMANDS) <= covered, set(COMMANDS) - covered


@pytest.mark.parametrize("probe", PROBES, ids=[p.id for p in PROBES])
def test_hostile_input(ws, probe: Probe):
    kept = probe.setup(ws) if probe.setup else None
    before = snapshot(ws)
    argv = [a.replace("{ws}", str(ws)) for a in probe.argv]
    try:
        result = run_cli(*argv, cwd=ws)
    finally:
        if isinstance(kept, HeldLock):
            os.close(kept.fd)
    assert result.code == probe.code, (result.code, result.err)
    assert "Traceback" not in result.err + result.out
    lines = result.err.strip("\n").splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("dlrmkit") and ": error: " in lines[0], lines[0]
    assert probe.phrase in lines[0], (probe.phrase, lines[0])
    after = snapshot(ws)
    for allowed in probe.may_change + (
        ("newrun",) if "{ws}/newrun" in probe.argv else ()
    ):  # a declared output the command may have started
        for snap in (before, after):
            for key in [k for k in snap if k == allowed + "/" or k.startswith(allowed + "/")]:
                del snap[key]
        for snap in (before, after):
            snap["./"] = [n for n in snap.get("./", []) if n != allowed]
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, changed[:6]
