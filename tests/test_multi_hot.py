"""Multi-hot datasets: MLPerf DCNv2's synthetic expansion (`dlrmkit multihot`), the FeatureSpec's
`hotness`, and the loaders that turn fixed-size bags into JaggedIds."""

from __future__ import annotations

import filecmp
import json
import os
import tracemalloc

import numpy as np
import pytest
import torch
import yaml

from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.loader import BatchLoader
from dlrmkit.data.multi_hot import materialize
from dlrmkit.data.split_binary import SplitBinaryDataset, open_dataset
from dlrmkit.errors import DatasetError

from helpers import TINY_TABLES, run_cli

SIZES = [3, 2, 1, 5, 4]


def mlperf_lookups(rows: list[int], sizes: list[int], seed: int) -> list[np.ndarray]:
    """MLPerf's multi_hot.py, whole tables at once: one np.random.seed(seed), then per table the
    id itself followed by rows x (k - 1) uniform draws."""
    np.random.seed(seed)
    out = []
    for e, k in zip(rows, sizes):
        extra = np.random.randint(0, e, size=(e, k - 1))
        out.append(np.concatenate([np.arange(e)[:, None], extra], axis=1))
    return out


@pytest.fixture(scope="module")
def multi_hot(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("mh") / "mh"
    materialize(str(tiny_data), str(out), SIZES, seed=0, block_rows=700, progress=False)
    return out


def test_bags_are_mlperf_expansion_with_exact_sizes(tiny_data, multi_hot):
    spec = FeatureSpec.from_yaml(str(multi_hot))
    assert spec.hotness == SIZES and spec.cardinalities == TINY_TABLES
    lookups = mlperf_lookups(TINY_TABLES, SIZES, 0)
    _, src, _ = open_dataset(str(tiny_data))
    _, got, _ = open_dataset(str(multi_hot))
    assert len(got) == len(src)
    one_hot, bags = src.read(0, len(src)), got.read(0, len(got))
    np.testing.assert_array_equal(bags.dense, one_hot.dense)
    np.testing.assert_array_equal(bags.labels, one_hot.labels)
    assert bags.ids.shape == (len(src), sum(SIZES)) and bags.hotness == SIZES
    col = 0
    for t, k in enumerate(SIZES):
        path = os.path.join(multi_hot, "train", f"cat_{t}.bin")
        assert os.path.getsize(path) == len(src) * k * spec.dtype(f"cat_{t}.bin").itemsize
        np.testing.assert_array_equal(bags.ids[:, col : col + k], lookups[t][one_hot.ids[:, t]])
        col += k
    # the extra ids are uniform draws, not copies of the first
    assert (bags.ids[:, 3:5] != bags.ids[:, [3]]).any()


def test_materializing_twice_gives_identical_files(tiny_data, multi_hot, tmp_path):
    again = tmp_path / "again"
    assert (
        run_cli(
            "multihot", "--data", tiny_data, "--out", again, "--multi-hot-sizes", "3,2,1,5,4", "--block-rows", 333
        ).code
        == 0
    )
    cmp = filecmp.dircmp(multi_hot, again)
    names = [f for sub in ("", "train", "test") for f in os.listdir(os.path.join(multi_hot, sub)) if "." in f]
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only
    for sub in ("train", "test"):
        for name in os.listdir(multi_hot / sub):
            assert filecmp.cmp(multi_hot / sub / name, again / sub / name, shallow=False), name
    assert filecmp.cmp(multi_hot / "feature_spec.yaml", again / "feature_spec.yaml", shallow=False)
    assert len(names) > 10
    other = tmp_path / "seed1"
    assert (
        run_cli("multihot", "--data", tiny_data, "--out", other, "--multi-hot-sizes", "3,2,1,5,4", "--seed", 1).code
        == 0
    )
    assert not filecmp.cmp(multi_hot / "train" / "cat_3.bin", other / "train" / "cat_3.bin", shallow=False)


def test_num_embeddings_fold_ids_and_drop_the_optimal_auc(tiny_data, tmp_path):
    out = tmp_path / "capped"
    r = run_cli(
        "multihot",
        "--data",
        tiny_data,
        "--out",
        out,
        "--multi-hot-sizes",
        "1,1,2,2,2",
        "--num-embeddings",
        "3,8,20,50,7",
    )
    assert r.code == 0, r.err
    spec = FeatureSpec.from_yaml(str(out))
    assert spec.cardinalities == [3, 8, 20, 50, 7] and "optimal_auc" not in spec.metadata
    _, src, _ = open_dataset(str(tiny_data))
    ids = SplitBinaryDataset(spec, "train").read(0, 100).ids
    np.testing.assert_array_equal(ids[:, -2], src.read(0, 100).ids[:, 4] % 7)


def materialize_peak(tiny_data, out, block_rows: int) -> int:
    tracemalloc.start()
    try:
        materialize(str(tiny_data), str(out), SIZES, block_rows=block_rows, progress=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_by_the_block(tmp_path):
    """Peak Python/numpy allocations follow --block-rows, not the dataset: 10x the rows at the
    same block size, about the same peak (a fixed few MB of buffers); the peak stays below the
    ids of the whole dataset."""
    from helpers import tiny_config

    from dlrmkit.data.synthetic import generate

    small, large = tmp_path / "small", tmp_path / "large"
    generate(str(small), tiny_config(rows=6000, test_rows=500), seed=0)
    generate(str(large), tiny_config(rows=60000, test_rows=500), seed=0)
    peak_small = materialize_peak(small, tmp_path / "a", 512)
    peak_large = materialize_peak(large, tmp_path / "b", 512)
    whole_ids = 60000 * sum(SIZES) * 8
    assert peak_large < whole_ids * 0.7, (peak_large, whole_ids)
    assert peak_large < 1.1 * peak_small + (64 << 10), (peak_small, peak_large)


def test_loader_yields_jagged_bags(multi_hot):
    spec, train, _ = open_dataset(str(multi_hot))
    batch = next(iter(BatchLoader(train, 64, prefetch=0).epoch(0)))
    ids = batch.ids
    assert ids.batch_size == 64 and ids.num_tables == len(SIZES)
    assert ids.table_lengths().tolist() == [64 * k for k in SIZES]
    assert set(ids.offsets.diff().view(len(SIZES), 64)[3].tolist()) == {5}
    raw = train.read(0, 64)
    np.testing.assert_array_equal(ids.values[64 * 3 : 64 * 3 + 64 * 2].numpy(), raw.ids[:, 3:5].reshape(-1))


def test_train_and_evaluate_on_multi_hot(multi_hot, tmp_path):
    r = run_cli(
        *("train", "--data", multi_hot, "--max-steps", 8, "--no-progress", "--run-dir", tmp_path / "R"),
        *("--interaction", "dcn", "--dcn-rank", 4),
    )
    assert r.code == 0, r.err
    r = run_cli("evaluate", "--checkpoint", tmp_path / "R" / "checkpoints", "--data", multi_hot)
    assert r.code == 0, r.err


def corrupt_spec(path, change) -> None:
    spec_file = path / "feature_spec.yaml"
    doc = yaml.safe_load(spec_file.read_text())
    change(doc)
    spec_file.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("value", [0, -1, "3", True, 1 << 20])
def test_bad_hotness_names_the_field(multi_hot, tmp_path, value):
    import shutil

    copy = tmp_path / "d"
    shutil.copytree(multi_hot, copy)
    corrupt_spec(copy, lambda d: d["feature_spec"]["cat_3.bin"].__setitem__("hotness", value))
    with pytest.raises(DatasetError, match=r"feature_spec\.cat_3\.bin\.hotness"):
        FeatureSpec.from_yaml(str(copy))


def test_file_of_the_wrong_hotness_and_bad_ids_name_the_file(multi_hot, tmp_path):
    import shutil

    copy = tmp_path / "d"
    shutil.copytree(multi_hot, copy)
    corrupt_spec(copy, lambda d: d["feature_spec"]["cat_3.bin"].__setitem__("hotness", 4))
    with pytest.raises(DatasetError, match=r"cat_3\.bin: \d+ rows, but"):
        open_dataset(str(copy))
    shutil.rmtree(copy)
    shutil.copytree(multi_hot, copy)
    path = copy / "train" / "cat_4.bin"
    data = np.fromfile(path, dtype=np.int8)
    data[10 * 4 + 3] = 120  # row 10, 4th id of the bag; table 4 has 120 rows
    data.tofile(path)
    _, train, _ = open_dataset(str(copy))
    with pytest.raises(DatasetError, match=r"cat_4\.bin: feature 'cat_4\.bin' row 10 has id 120"):
        train.read(0, 64)
    with pytest.raises(DatasetError, match="row 10"):
        train.read_tables(0, 64, [4])


def test_one_hot_source_required(multi_hot, tmp_path):
    r = run_cli("multihot", "--data", multi_hot, "--out", tmp_path / "x", "--multi-hot-sizes", "1,1,1,1,1")
    assert r.code == 2 and "already multi-hot" in r.err
    r = run_cli("multihot", "--data", multi_hot, "--out", tmp_path / "x")
    assert r.code == 2 and "26 tables" in r.err


def test_fixed_bags_match_the_table_major_layout():
    from dlrmkit.data.multi_hot import fixed_bags

    ids = torch.arange(2 * 6).view(2, 6)  # tables of 1, 2 and 3 ids
    jag = fixed_bags(ids, [1, 2, 3])
    assert jag.values.tolist() == [0, 6, 1, 2, 7, 8, 3, 4, 5, 9, 10, 11]
    assert jag.offsets.tolist() == [0, 1, 2, 4, 6, 9, 12]


def test_synth_terabyte_multi_hot_keeps_the_optimal_auc(tmp_path):
    """`synth --preset terabyte --multi-hot mlperf` at a small --scale: MLPerf's 26 bag sizes, and
    the one-hot dataset's teacher, labels and optimal AUC (the bag's first id is the teacher's)."""
    from dlrmkit.data.multi_hot import MLPERF_MULTI_HOT_SIZES

    common = ("--preset", "terabyte", "--scale", "1e-4", "--rows", 3000, "--test-rows", 2000, "--no-progress")
    assert run_cli("synth", "--out", tmp_path / "one", *common).code == 0
    r = run_cli("synth", "--out", tmp_path / "multi", *common, "--multi-hot", "mlperf")
    assert r.code == 0, r.err
    one, multi = FeatureSpec.from_yaml(str(tmp_path / "one")), FeatureSpec.from_yaml(str(tmp_path / "multi"))
    assert multi.hotness == MLPERF_MULTI_HOT_SIZES and multi.cardinalities == one.cardinalities
    assert multi.metadata["optimal_auc"] == one.metadata["optimal_auc"]
    a, b = SplitBinaryDataset(one, "test").read(0, 2000), SplitBinaryDataset(multi, "test").read(0, 2000)
    np.testing.assert_array_equal(a.labels, b.labels)
    firsts = np.concatenate([[0], np.cumsum(MLPERF_MULTI_HOT_SIZES)[:-1]])
    np.testing.assert_array_equal(b.ids[:, firsts], a.ids)
    assert not os.listdir(tmp_path / "multi" / "train") == [] and not any(
        "lookup" in f for f in os.listdir(tmp_path / "multi")
    )


def test_numerical_values_keep_the_source_dtype(tmp_path):
    """A transcoded dataset stores float32 numbers (beyond float16's range and precision); the
    expansion copies them as they are, never through float16."""
    rows = ["y,a,c"] + [f"{i % 2},{70_000 + 2 * i + 1},k{i % 5}" for i in range(200)]
    (tmp_path / "in.csv").write_text("\n".join(rows) + "\n")
    r = run_cli(
        "transcode", "--input", tmp_path / "in.csv", "--out", tmp_path / "d", "--label", "y", "--numerical", "a",
        "--categorical", "c", "--test-rows", "50",
    )  # fmt: skip
    assert r.code == 0, r.err
    materialize(str(tmp_path / "d"), str(tmp_path / "m"), [3], progress=False)
    _, src, _ = open_dataset(str(tmp_path / "d"))
    _, out, _ = open_dataset(str(tmp_path / "m"))
    a, b = src.read(0, len(src)).dense, out.read(0, len(out)).dense
    assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b) and a[0, 0] == 70_001.0


def test_a_checkpoint_without_bag_sizes_resumes_on_its_dataset(multi_hot, tmp_path):
    """Checkpoints written before model_config recorded `hotness` resume on the same dataset."""
    run = ("train", "--data", multi_hot, "--no-progress", "--search-budget", 0, "--checkpoint-dir", tmp_path / "C")
    assert run_cli(*run, "--max-steps", 2, "--run-dir", tmp_path / "R1").code == 0
    manifest = tmp_path / "C" / "step_2" / "manifest.json"
    doc = json.loads(manifest.read_text())
    assert doc["model_config"].pop("hotness") == SIZES
    manifest.write_text(json.dumps(doc))
    r = run_cli(*run, "--max-steps", 4, "--resume", "--run-dir", tmp_path / "R2")
    assert r.code == 0, r.err
    assert "resumed from" in r.err


@pytest.fixture(scope="module")
def multi_hot_model(multi_hot, tmp_path_factory):
    """Checkpoints of a model trained on `multi_hot`'s bags."""
    run = tmp_path_factory.mktemp("mh-run") / "R"
    r = run_cli("train", "--data", multi_hot, "--max-steps", 4, "--no-progress", "--search-budget", 0, "--run-dir", run)
    assert r.code == 0, r.err
    return run / "checkpoints"


def refused(r, *phrases: str) -> None:
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1, r.err
    assert all(p in lines[0] for p in phrases), lines[0]


def test_evaluate_refuses_rows_of_other_bag_sizes(tiny_data, tiny_run, multi_hot, multi_hot_model, tmp_path):
    """A model scores rows in the bag sizes it was trained on (model_config.hotness): a dataset of
    other sizes (one-hot, or other bags over the same tables) is one line naming the table and both sizes."""
    r = run_cli("evaluate", "--checkpoint", multi_hot_model, "--data", tiny_data)
    said = f"{multi_hot_model}: table 0 (cat_0.bin) was trained on bags of 3 ids per sample"
    refused(r, said, f"{tiny_data} has bags of 1")
    other = tmp_path / "other"
    materialize(str(tiny_data), str(other), [3, 2, 2, 5, 4], seed=0, progress=False)
    r = run_cli("evaluate", "--checkpoint", multi_hot_model, "--data", other)
    refused(r, "table 2 (cat_2.bin) was trained on bags of 1 id per sample", f"{other} has bags of 2")
    # a one-hot model (its model_config records hotness null: one id per table) and bags
    r = run_cli("evaluate", "--checkpoint", tiny_run / "checkpoints", "--data", multi_hot)
    refused(r, "table 0 (cat_0.bin) was trained on bags of 1 id per sample", f"{multi_hot} has bags of 3")
    assert run_cli("evaluate", "--checkpoint", multi_hot_model, "--data", multi_hot).code == 0


def test_a_checkpoint_without_bag_sizes_is_evaluated_as_it_comes(multi_hot, multi_hot_model, tmp_path):
    """Checkpoints written before model_config recorded `hotness` keep scoring their dataset."""
    import shutil

    ckpt = tmp_path / "C"
    shutil.copytree(multi_hot_model, ckpt)
    manifest = ckpt / (ckpt / "latest").read_text().strip() / "manifest.json"
    doc = json.loads(manifest.read_text())
    assert doc["model_config"].pop("hotness") == SIZES
    manifest.write_text(json.dumps(doc))
    r = run_cli("evaluate", "--checkpoint", ckpt, "--data", multi_hot)
    assert r.code == 0, r.err
