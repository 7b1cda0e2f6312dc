"""A checkpoint describes a whole model or is refused: chunk lists that overlap, repeat a chunk or
leave part of a tensor uncovered, byte ranges outside their file, files holding bytes no chunk
names, dtypes or shapes that disagree with the manifest, metadata far larger than its model (both
formats), and counters or optimizer fields of the wrong type or range are each one line, exit 2.
A property test mutates a valid checkpoint (bytes, JSON fields, chunk lists) and requires either a
load bit-identical to the original or one DlrmkitError line."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import run_cli
from dlrmkit.checkpoint import save_load as ckpt
from dlrmkit.errors import DlrmkitError
from test_checkpoint_trust import assert_one_line_error, relist, to_first_format


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory) -> Path:
    """A checkpoint folder (adagrad: optimizer state in it) of 3 steps on the tiny dataset."""
    c = tmp_path_factory.mktemp("whole") / "C"
    r = run_cli(
        "train", "--data", tiny_data, "--no-progress", "--max-steps", 3, "--optimizer", "adagrad", "--checkpoint-dir", c,
        "--search-budget", 0,
    )  # fmt: skip
    assert r.code == 0, r.err
    return c / "step_3"


@pytest.fixture(scope="module")
def original(trained) -> dict[str, torch.Tensor]:
    tensors, _ = ckpt.load_logical_state(str(trained))
    return tensors


@pytest.fixture
def ck(trained, tmp_path) -> Path:
    dst = tmp_path / "step_3"
    shutil.copytree(trained, dst)
    return dst


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def table(meta: dict) -> dict:
    return meta["tensors"]["table.4.weight"]  # 120 rows x 16 (the largest tiny table)


def evaluate(tiny_data, path):
    return run_cli("evaluate", "--data", tiny_data, "--checkpoint", path)


# ---- chunk lists ---------------------------------------------------------------------------------------
def split_rows(meta: dict, a: int, b: int, c0: int, c1: int) -> None:
    """Replace the single chunk of table 4 by two row ranges [a, a+c0) and [b, b+c1) over the same bytes."""
    t = table(meta)
    (chunk,) = t["chunks"]
    rows, dim = t["size"]
    item = chunk["length"] // (rows * dim)
    t["chunks"] = [
        {**chunk, "offsets": [a, 0], "sizes": [c0, dim], "length": c0 * dim * item},
        {
            **chunk,
            "offsets": [b, 0],
            "sizes": [c1, dim],
            "offset": chunk["offset"] + c0 * dim * item,
            "length": c1 * dim * item,
        },
    ]


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: split_rows(m, 0, 50, 60, 60), "overlap"),  # rows 50..59 twice, 110..119 never
        (lambda m: split_rows(m, 0, 60, 60, 59), "a part is missing"),
        (lambda m: table(m)["chunks"].append(table(m)["chunks"][0]), "listed twice"),
        (lambda m: table(m).update(dtype="float64"), "table.4.weight"),
        (lambda m: table(m)["chunks"][0].update(offset=table(m)["chunks"][0]["offset"] + 4), "table.4.weight"),
    ],
    ids=["overlap-and-gap", "gap", "repeated", "dtype-differs", "bytes-shifted"],
)
def test_a_chunk_list_that_does_not_tile_its_tensor_is_refused(tiny_data, ck, change, needle):
    edit_json(ck / "metadata.json", change)
    relist(ck)  # as a forger who can write the folder would
    assert_one_line_error(evaluate(tiny_data, ck), needle)


def test_bytes_no_chunk_names_are_refused(tiny_data, ck):
    with open(ck / "data_0.bin", "ab") as f:
        f.write(b"\0" * 64)
    relist(ck)
    assert_one_line_error(evaluate(tiny_data, ck), "data_0.bin", "but its chunks hold")


def test_a_model_loaded_twice_is_identical(trained, original):
    again, _ = ckpt.load_logical_state(str(trained))
    assert again.keys() == original.keys()
    assert all(torch.equal(again[k], original[k]) for k in original)


# ---- cost bounded before parsing -------------------------------------------------------------------------
def test_metadata_far_larger_than_its_model_is_refused_before_parsing(tiny_data, ck):
    text = (ck / "metadata.json").read_text()
    (ck / "metadata.json").write_text(text[:-1] + " " * (24 << 20) + "}")  # valid JSON, 24 MiB
    relist(ck)
    t0 = time.monotonic()
    r = evaluate(tiny_data, ck)
    assert_one_line_error(r, "metadata.json", "more than a checkpoint metadata may be")
    assert time.monotonic() - t0 < 20  # hashing 24 MiB, no parse


def test_first_format_metadata_listing_a_chunk_many_times_is_refused_quickly(tiny_data, ck):
    to_first_format(str(ck))
    from dlrmkit.checkpoint.legacy import _MetadataUnpickler

    fp = ck / ".metadata"
    meta = _MetadataUnpickler(open(fp, "rb")).load()
    md = meta.state_dict_metadata["table.4.weight"]
    md.chunks = md.chunks * 50_000  # one object, referenced 50,000 times: a small pickle
    fp.write_bytes(pickle.dumps(meta))
    relist(ck)
    t0 = time.monotonic()
    assert_one_line_error(evaluate(tiny_data, ck), ".metadata")
    assert time.monotonic() - t0 < 20


def test_first_format_still_loads_identically(ck, original):
    to_first_format(str(ck))
    tensors, _ = ckpt.load_logical_state(str(ck))
    assert all(torch.equal(tensors[k], original[k]) for k in original)


# ---- counters and optimizer fields ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: m.update(epoch=1 << 62), "field 'epoch'"),
        (lambda m: m.update(epoch=2), "past --epochs 1"),
        (lambda m: m.update(batch_in_epoch=10**6), "field 'batch_in_epoch'"),
        (lambda m: m.update(step=True), "field 'step'"),
        (lambda m: m.update(best_auc=7.5), "field 'best_auc'"),
        (
            lambda m: (
                m["optimizer_scalars"].update({k: None for k in m["optimizer_scalars"]})
                or m["optimizer_scalars"].setdefault("embeddings.step", None)
            ),
            "optimizer_scalars",
        ),
        (lambda m: m.update(run_id="../x"), "field 'run_id'"),
        (lambda m: m.update(recent_losses=[0.5, "x"]), "field 'recent_losses'"),
    ],
    ids=["epoch-2^62", "epoch-past-epochs", "batch-past-epoch", "step-bool", "auc-7.5", "scalar-null", "run-id",
         "recent-losses-text"],  # fmt: skip
)
def test_resume_refuses_counters_out_of_range(tiny_data, trained, tmp_path, change, needle):
    c = tmp_path / "C"
    shutil.copytree(trained.parent, c, ignore=shutil.ignore_patterns("*.lock"))
    edit_json(c / "step_3" / "manifest.json", change)
    r = run_cli(
        "train",
        "--data",
        tiny_data,
        "--no-progress",
        "--optimizer",
        "adagrad",
        "--epochs",
        1,
        "--checkpoint-dir",
        c,
        "--resume",
        "--search-budget",
        0,
    )
    assert_one_line_error(r, needle)
    assert sorted(os.listdir(c)) == ["latest", "log.jsonl", "step_3"]


# ---- property: any mutation loads identically or is one line ------------------------------------------------
def leaves(doc, path=()):
    """(path, value) of every leaf and every list of a JSON document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, (*path, k))
    elif isinstance(doc, list):
        yield path, doc
        for i, v in enumerate(doc):
            yield from leaves(v, (*path, i))
    else:
        yield path, doc


def set_at(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(0, 1 << 64),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(0, 200), max_size=3),
)


def loads_identically_or_one_line(path: Path, original: dict[str, torch.Tensor]) -> None:
    try:
        tensors, _ = ckpt.load_logical_state(str(path))
        model, _ = ckpt.load_single_process_model(str(path))
    except DlrmkitError as exc:
        assert "\n" not in str(exc) and str(exc), str(exc)
        return
    assert tensors.keys() == original.keys()
    for k in original:
        assert tensors[k].dtype == original[k].dtype and torch.equal(tensors[k], original[k]), k
    weights = dict(model.named_parameters())
    assert all(torch.isfinite(w).all() for w in weights.values())


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(data=st.data())
def test_any_json_mutation_loads_identically_or_is_one_line(trained, original, tmp_path_factory, data):
    ck = tmp_path_factory.mktemp("mut") / "step_3"
    shutil.copytree(trained, ck)
    name = data.draw(st.sampled_from(["metadata.json", "manifest.json"]))
    doc = json.loads((ck / name).read_text())
    paths = [p for p, _ in leaves(doc) if p]
    path = data.draw(st.sampled_from(paths))
    op = data.draw(st.sampled_from(["set", "delete", "duplicate", "drop"]))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    target = parent[path[-1]]
    if op == "set":
        set_at(doc, path, data.draw(VALUES))
    elif op == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif op == "duplicate" and isinstance(target, list) and target:
        target.append(target[data.draw(st.integers(0, len(target) - 1))])
    elif op == "drop" and isinstance(target, list) and target:
        target.pop(data.draw(st.integers(0, len(target) - 1)))
    (ck / name).write_text(json.dumps(doc))
    if name == "metadata.json" or data.draw(st.booleans()):
        relist(ck)  # the checksums then say nothing: every check is on the content
    loads_identically_or_one_line(ck, original)


@PROPERTY
@given(data=st.data())
def test_any_byte_mutation_loads_identically_or_is_one_line(trained, original, tmp_path_factory, data):
    ck = tmp_path_factory.mktemp("mut") / "step_3"
    shutil.copytree(trained, ck)
    name = data.draw(st.sampled_from(sorted(os.listdir(ck))))
    raw = bytearray((ck / name).read_bytes())
    how = data.draw(st.sampled_from(["flip", "truncate", "append"]))
    if how == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del raw[data.draw(st.integers(0, len(raw))) :]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=64))
    (ck / name).write_bytes(bytes(raw))
    relisted = name == "metadata.json" and data.draw(st.booleans())
    if relisted:
        relist(ck)
    if name == "manifest.json" or relisted:  # the manifest's own hash is not listed
        loads_identically_or_one_line(ck, original)
        return
    try:  # a listed file changed: a checksum error (a relisted data file is another, valid checkpoint)
        ckpt.load_logical_state(str(ck))
        assert (ck / name).read_bytes() == (trained / name).read_bytes(), f"{name} changed and still loaded"
    except DlrmkitError as exc:
        assert "\n" not in str(exc)


def test_tiling_check_is_exact_on_random_grids():
    """coverage.check_tiling against a brute-force cover count on small grids."""
    import random

    from dlrmkit.checkpoint.coverage import check_tiling

    rng = random.Random(0)
    for _ in range(300):
        rows, cols = rng.randint(1, 6), rng.randint(1, 6)
        boxes = []
        for _ in range(rng.randint(1, 5)):
            r0, c0 = rng.randrange(rows), rng.randrange(cols)
            boxes.append(([r0, c0], [rng.randint(1, rows - r0), rng.randint(1, cols - c0)]))
        count = [[0] * cols for _ in range(rows)]
        for (r0, c0), (nr, nc) in boxes:
            for r in range(r0, r0 + nr):
                for c in range(c0, c0 + nc):
                    count[r][c] += 1
        exact = all(v == 1 for row in count for v in row) and len({tuple(o) for o, _ in boxes}) == len(boxes)
        try:
            check_tiling("t", [rows, cols], boxes)
            ok = True
        except DlrmkitError:
            ok = False
        assert ok == exact, (rows, cols, boxes)


@pytest.mark.parametrize("dtype", [["float32"], {"a": 1}, 7, None])
def test_a_tensor_dtype_of_another_kind_is_one_line(trained, tmp_path, dtype):
    for name in ("manifest.json", "metadata.json"):
        ck = tmp_path / name / "step_3"
        shutil.copytree(trained, ck)
        doc = json.loads((ck / name).read_text())
        first = next(iter(doc["tensors"].values()))
        first["dtype"] = dtype
        (ck / name).write_text(json.dumps(doc))
        with pytest.raises(DlrmkitError, match="dtype") as exc:  # never a TypeError from a set lookup
            ckpt.load_logical_state(str(ck))
        assert "\n" not in str(exc.value)
