"""`--min-id-count`: ids seen fewer than K times in the training rows read as id 0, the tables
keep the others, and train, evaluate and predict fold ids the same way; `--numerical-buckets`
reads each numerical feature as a category too, from boundaries kept in the model's config;
`--standardize-numerical` keeps the training rows' mean and deviation there."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from helpers import run_cli
from dlrmkit.data.id_counts import frequent_rows
from dlrmkit.data.split_binary import open_dataset
from dlrmkit.errors import DatasetError


def write_log(path, rows: int, seed: int = 0) -> None:
    """label from a category `a`; `u` a user seen once in most rows (rare ids); `x` a raw count."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "x", "a", "u"])
        for i in range(rows):
            a = int(rng.integers(0, 8))
            y = int(rng.random() < 1 / (1 + np.exp(-(a - 3.5) / 2)))
            u = f"u{i}" if rng.random() < 0.7 else f"v{int(rng.integers(0, 30))}"
            w.writerow([y, int(rng.integers(0, 5000)), f"a{a}", u])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rare")
    write_log(root / "log.csv", 1200)
    r = run_cli(
        "transcode", "--input", root / "log.csv", "--out", root / "d", "--label", "y", "--numerical", "x",
        "--categorical", "a,u", "--test-rows", "200", "--val-rows", "200",
    )  # fmt: skip
    assert r.code == 0, r.err
    return root


def test_frequent_rows_keep_the_ids_seen_often_enough_and_fold_the_rest(data):
    spec, train, _ = open_dataset(str(data / "d"))
    raw = train.read(0, len(train)).ids.astype(np.int64)
    rows = frequent_rows(train, 2)
    for t in range(2):
        counts = np.bincount(raw[:, t], minlength=spec.cardinalities[t])
        assert rows[t] == 1 + int((counts[1:] >= 2).sum())
    assert rows[0] == spec.cardinalities[0] and rows[1] < spec.cardinalities[1] // 2  # users: mostly rare
    folded = train.fold_ids(rows).read(0, len(train)).ids
    kept = raw < np.asarray(rows)
    assert (folded[kept] == raw[kept]).all() and (folded[~kept] == 0).all() and (~kept).any()
    assert (train.fold_ids(rows).read_tables(0, 50, [1])[:, 0] == folded[:50, 1]).all()


def test_bucket_tables_read_alike_whole_and_by_table(data):
    _, train, _ = open_dataset(str(data / "d"))
    view = train.fold_ids(frequent_rows(train, 2)).with_buckets([[100.0, 1000.0, 3000.0]])
    batch = view.read(0, 300)
    x = batch.dense[:, 0].astype(np.float32)
    expect = (x >= 100).astype(int) + (x >= 1000) + (x >= 3000)
    assert (batch.ids[:, 2] == expect).all() and set(expect) == {0, 1, 2, 3}
    assert (view.read_tables(0, 300, [2, 1])[:, 0] == expect).all()
    assert (view.read_tables(0, 300, [2, 1])[:, 1] == batch.ids[:, 1]).all()
    assert list(view.cardinalities) == [*train.cardinalities, 4]


def test_ids_not_numbered_by_count_are_refused(data, tmp_path):
    import shutil

    shutil.copytree(data / "d", tmp_path / "d")
    path = tmp_path / "d" / "train" / "cat_1.bin"
    spec, train, _ = open_dataset(str(tmp_path / "d"))
    ids = np.fromfile(path, dtype=spec.dtype(spec.categorical_names[1]))
    ids[ids == 1] = spec.cardinalities[1] - 1  # the most frequent user now has the last id
    ids.tofile(path)
    with pytest.raises(DatasetError, match="'cat_1.bin' is not numbered by descending training count"):
        frequent_rows(open_dataset(str(tmp_path / "d"))[1], 2)


def test_train_evaluate_and_predict_fold_rare_ids_alike(data, tmp_path):
    run = tmp_path / "run"
    r = run_cli(
        "train", "--data", data / "d", "--run-dir", run, "--checkpoint-dir", tmp_path / "c", "--no-progress",
        "--min-id-count", "2", "--standardize-numerical", "true", "--numerical-buckets", "8",
        "--search-budget", "0", "--epochs", "2",
    )  # fmt: skip
    assert r.code == 0, r.err
    spec, train, _ = open_dataset(str(data / "d"))
    manifest = json.load(open(next((tmp_path / "c").glob("step_*")) / "manifest.json"))
    mc = manifest["model_config"]
    buckets = mc["numerical_buckets"]
    values = train.read(0, len(train)).dense[:, 0].astype(np.float32)  # the train mapping (val rows apart)
    assert buckets == [np.unique(np.quantile(values, np.linspace(0, 1, 9)[1:-1])).astype(np.float32).tolist()]
    assert mc["table_sizes"] == frequent_rows(train, 2) + [len(buckets[0]) + 1] and mc["min_id_count"] == 2
    stats = train.read(0, len(train)).dense.astype(np.float64)
    stats = np.log1p(stats)  # raw counts: the recipe's signed-log transform
    assert mc["numerical_mean"] == pytest.approx(stats.mean(0), rel=1e-4)
    assert mc["numerical_std"] == pytest.approx(stats.std(0), rel=1e-3)
    assert yaml.safe_load(open(run / "config.yaml"))["min-id-count"] == 2
    metrics = json.load(open(run / "metrics.json"))
    r = run_cli("evaluate", "--data", data / "d", "--checkpoint", tmp_path / "c", "--metrics-json", tmp_path / "e.json")
    assert r.code == 0, r.err
    assert json.load(open(tmp_path / "e.json"))["auc"] == pytest.approx(metrics["auc"], abs=1e-6)
    r = run_cli(
        "predict", "--checkpoint", tmp_path / "c", "--input", data / "log.csv", "--data", data / "d",
        "--output", tmp_path / "p.csv",
    )  # fmt: skip
    assert r.code == 0, r.err
    probs = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)[:, -1]
    assert len(probs) == 1200 and np.isfinite(probs).all()


def test_an_exported_model_reads_the_datasets_rows_as_evaluate_does(data, tmp_path):
    """TorchScript and ONNX exports take the rows as stored: rare ids folded to 0 and bucket ids
    appended inside the graph (they once wanted the bucket columns, and read a rare id's row of
    the next table)."""
    import torch

    from dlrmkit.commands.export import load_model
    from dlrmkit.data.numerical_buckets import model_view

    r = run_cli(
        "train", "--data", data / "d", "--run-dir", tmp_path / "run", "--checkpoint-dir", tmp_path / "c",
        "--no-progress", "--min-id-count", "2", "--numerical-buckets", "8", "--search-budget", "0", "--max-steps", "20",
    )  # fmt: skip
    assert r.code == 0, r.err
    model, cfg = load_model(str(tmp_path / "c"))
    _, train, _ = open_dataset(str(data / "d"))  # the training rows: their rare users stay in the vocabulary
    raw, view = train.read(0, 400), model_view(train, cfg).read(0, 400)
    assert (raw.ids[:, 1] >= cfg.table_sizes[1]).any()  # rare users the model has no row for
    with torch.no_grad():
        want = model(torch.from_numpy(view.dense.astype(np.float32)), torch.from_numpy(view.ids.astype(np.int64)))
    dense, ids = torch.from_numpy(raw.dense.astype(np.float32)), torch.from_numpy(raw.ids.astype(np.int64))
    assert (
        run_cli("export", "--checkpoint", tmp_path / "c", "--out", tmp_path / "m.ts", "--format", "torchscript").code
        == 0
    )
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.ts"))(dense, ids), want)
    ort = pytest.importorskip("onnxruntime", reason="running the ONNX model needs onnxruntime")
    r = run_cli("export", "--checkpoint", tmp_path / "c", "--out", tmp_path / "m.onnx", "--format", "onnx")
    assert r.code == 0, r.err
    onnx_model = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (got,) = onnx_model.run(["logits"], {"dense": dense.numpy(), "ids": ids.numpy()})
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_min_id_count_below_one_is_refused_in_one_line(data, tmp_path):
    r = run_cli("train", "--data", data / "d", "--run-dir", tmp_path / "r", "--min-id-count", "0")
    assert r.code == 2 and "--min-id-count" in r.err


def test_buckets_give_frequent_values_their_own_bucket():
    from dlrmkit.data.numerical_buckets import VALUE_ROWS, with_frequent_values
    from dlrmkit.data.split_binary import bucket_columns

    # 92% zeros (every inner quantile of 8 is 0), a telling value held by enough rows, its
    # neighbours held by too few to learn from, and a spread of values seen once
    values = np.concatenate([
        np.zeros(920), np.full(VALUE_ROWS, 7688.0), np.full(VALUE_ROWS - 1, 7000.0), [7700.0, 8000.0],
        np.linspace(1, 99_999, 77),
    ]).astype(np.float32)  # fmt: skip
    quantiles = np.quantile(values, np.linspace(0, 1, 9)[1:-1])
    assert set(quantiles.tolist()) == {0.0}
    b = with_frequent_values(quantiles, values, most=8)
    buckets = bucket_columns([np.asarray(b, np.float32)], np.array([[0], [7000], [7688], [7700], [8000]], np.float32))
    zero, below, telling, above, far = buckets[:, 0]
    assert len({zero, below, telling}) == 3 and telling not in (above, far)  # 7688 alone in its bucket
    assert above == far or above < telling  # 7700 and 8000 are not split off: too few rows each
    assert b == sorted(set(b)) and np.isfinite(b).all()
    # at most `most` values, the most frequent first
    many = np.repeat(np.arange(50, dtype=np.float32), np.arange(50) + VALUE_ROWS)
    b = with_frequent_values(np.array([]), many, most=4)
    assert b == [46.0, 47.0, 48.0, 49.0]  # 46, 47, 48 and 49 each alone; 45 and below share one


@pytest.fixture(scope="module")
def data_without_val(tmp_path_factory):
    root = tmp_path_factory.mktemp("rare_no_val")
    write_log(root / "log.csv", 1200, seed=1)
    with open(root / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    for i in range(950, 1000):  # in the rows `train` holds out (900-999): users seen twice there, never before
        rows[1 + i][3] = f"w{i // 2}"
    with open(root / "log.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    r = run_cli(
        "transcode", "--input", root / "log.csv", "--out", root / "d", "--label", "y", "--numerical", "x",
        "--categorical", "a,u", "--test-rows", "200",
    )  # fmt: skip
    assert r.code == 0, r.err
    return root / "d"


def trainer_of(data, **kw):
    from dlrmkit.config import TrainConfig
    from dlrmkit.train.trainer import Trainer

    cfg = TrainConfig.of(data=str(data), preset="tiny", min_id_count=2, progress=False, final_checkpoint=False, **kw)
    return Trainer(cfg)


def test_rows_held_out_for_validation_fold_the_ids_their_training_rows_saw_too_rarely(data_without_val):
    """The validation rows held out from the train mapping read as test rows do: an id the training
    rows saw fewer than --min-id-count times is 0 there, though the whole mapping (which counts
    the held-out rows too) keeps it; the training rows keep the whole mapping's fold."""
    spec, whole, _ = open_dataset(str(data_without_val))
    raw = whole.read(0, len(whole)).ids.astype(np.int64)
    trainer = trainer_of(data_without_val)
    n = len(trainer.train_set)
    assert trainer.val_set is not None and n + len(trainer.val_set) == len(whole)
    rows = np.asarray(frequent_rows(whole, 2))
    train_ids, val_ids = raw[:n], raw[n:]
    assert (trainer.train_set.read(0, n).ids == np.where(train_ids < rows, train_ids, 0)).all()
    seen = [np.bincount(train_ids[:, t], minlength=spec.cardinalities[t]) for t in range(2)]
    expect = np.stack([np.where((val_ids[:, t] < rows[t]) & (seen[t][val_ids[:, t]] >= 2), val_ids[:, t], 0)
                       for t in range(2)], axis=1)  # fmt: skip
    got = trainer.val_set.read(0, len(trainer.val_set)).ids
    assert (got == expect).all()
    kept_by_the_mapping = (val_ids < rows) & (val_ids > 0)
    assert (kept_by_the_mapping & (got == 0)).any()  # users the held-out rows alone make frequent
    assert (got[:, 0] == val_ids[:, 0]).all()  # the eight categories of `a`: seen often enough


def test_a_val_mapping_is_read_with_the_mapping_fold_only(data):
    spec, whole, _ = open_dataset(str(data / "d"))
    from dlrmkit.data.split_binary import open_val

    val = open_val(spec)
    rows = np.asarray(frequent_rows(whole, 2))
    raw = val.read(0, len(val)).ids.astype(np.int64)
    trainer = trainer_of(data / "d")
    assert (trainer.val_set.read(0, len(val)).ids == np.where(raw < rows, raw, 0)).all()


def test_bucket_boundaries_stay_increasing_where_float32_rounds_two_into_one():
    """Large values (an hour stamp such as 14102212) have float64 quantiles between float32
    neighbours: rounded, they meet a frequent value's boundary, and must be kept once."""
    from dlrmkit.data.numerical_buckets import VALUE_ROWS, with_frequent_values

    values = np.repeat(np.arange(14102100, 14102300, dtype=np.float32), VALUE_ROWS)
    quantiles = np.array([14102212.4, 14102250.6])  # float64, as np.quantile gives them
    b = with_frequent_values(quantiles, values, most=200)
    assert all(u < v for u, v in zip(b, b[1:])) and 14102212.0 in b
