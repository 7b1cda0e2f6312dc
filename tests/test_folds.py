"""--folds K: cross-validation. Each of K contiguous folds of the train mapping is the validation
rows of a model trained on the others; --preset auto trains every candidate once per fold,
chooses and blends on all folds' validation logits, and the run is the kept candidates' fold
models averaged, the test rows read once, after every model is trained."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from helpers import run_cli
from dlrmkit.config import TrainConfig
from dlrmkit.data.id_counts import id_counts
from dlrmkit.data.split_binary import open_dataset, open_val
from dlrmkit.train import recipe, regression
from dlrmkit.train.selection import validation_split
from dlrmkit.train.trainer import Trainer
from test_quality import assert_test_rows_read_last, spy_reads
from test_selection import transcode, write_csv


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """1,300 rows: 1,200 train (no val mapping) and 100 test; and the same rows with a val mapping."""
    root = tmp_path_factory.mktemp("folds")
    write_csv(root / "x.csv", 1300)
    transcode(root / "x.csv", root / "held", "--test-rows", "100")
    transcode(root / "x.csv", root / "val", "--test-rows", "100", "--val-rows", "200")
    return root


def rows(dataset):
    b = dataset.read(0, len(dataset), check_ids=False)
    return b.dense.astype(np.float64), b.ids.astype(np.int64), b.labels


def assert_repeated_and_scored(run, dataset, tmp_path, common, reported):
    """A cross-validated run's figures: its validation ones are all 1,200 rows' (each fold scored
    by its own fold models); config.yaml repeats the run without the search (the same models, the
    same figures); `evaluate` scores the checkpoint folder as the run did; `report` says `reported`."""
    m = json.load(open(run / "metrics.json"))
    log = [json.loads(line) for line in open(run / "log.jsonl")]
    assert [e for e in log if e["event"] == "eval"][-1]["auc"] == m["val_auc"]
    again = tmp_path / "again"
    r = run_cli("train", "--config", run / "config.yaml", "--run-dir", again, *common)
    assert r.code == 0 and "not trained again" not in r.out and "search:" not in r.out, r.out + r.err
    b = json.load(open(again / "metrics.json"))
    assert (m["auc"], m["logloss"], m["val_auc"]) == (b["auc"], b["logloss"], b["val_auc"])
    out = tmp_path / "e.json"
    r = run_cli("evaluate", "--data", dataset, "--checkpoint", run / "checkpoints", "--metrics-json", out)
    assert r.code == 0, r.err
    assert json.load(open(out))["auc"] == pytest.approx(m["auc"], abs=1e-9)
    r = run_cli("report", run)
    assert r.code == 0 and reported in (run / "report.md").read_text()


@pytest.mark.parametrize("k", [2, 3, 5])
def test_each_fold_validates_its_rows_and_the_others_train(data, k):
    spec, train, _ = open_dataset(str(data / "held"))
    whole = rows(train)
    seen = []
    for i in range(1, k + 1):
        rest, val, source = validation_split(spec, train, None, (i, k))
        lo, hi = len(train) * (i - 1) // k, len(train) * i // k
        assert len(val) == hi - lo and len(rest) == len(train) - len(val) and val.mapping == "val"
        assert f"fold {i} of {k}" in source
        for got, want in zip(rows(val), whole):
            assert (got == want[lo:hi]).all()
        for got, want in zip(rows(rest), whole):
            assert (got == np.concatenate([want[:lo], want[hi:]])).all()
        seen.append((lo, hi))
    assert [lo for lo, _ in seen] == [0] + [hi for _, hi in seen[:-1]] and seen[-1][1] == len(train)
    spec, train, _ = open_dataset(str(data / "val"))  # a val mapping: its rows are cut too (fold_rows)
    assert "of the train and val mappings' rows" in validation_split(spec, train, None, (1, k))[2]


def config(data, **kw):
    values = dict(data=str(data), preset="tiny", epochs=2, batch_size=64, progress=False, final_checkpoint=False,
                  numerical_transform="signed-log")  # fmt: skip
    return TrainConfig.of(**{**values, **kw})


def test_a_fold_run_reads_its_fold_as_held_out_rows(data):
    """Its validation rows are the fold, read as test rows are: an id the other folds saw fewer
    than --min-id-count times reads as 0, though the whole mapping's count keeps its row."""
    spec, train, _ = open_dataset(str(data / "held"))
    lo, hi = len(train) // 3, 2 * len(train) // 3
    t = Trainer(config(data / "held", folds=3, fold=2, min_id_count=3))
    assert len(t.val_set) == hi - lo and len(t.train_set) == len(train) - (hi - lo)
    assert "fold 2 of 3" in t.val_source
    ids = rows(train)[1]
    outside = [np.bincount(np.concatenate([ids[:lo, j], ids[hi:, j]]), minlength=c)
               for j, c in enumerate(spec.cardinalities)]  # fmt: skip
    whole = id_counts(train)
    got = rows(t.val_set)[1]
    for j in range(ids.shape[1]):
        want = ids[lo:hi, j].copy()
        want[(outside[j][want] < 3) | (whole[j][want] < 3)] = 0
        assert (got[:, j] == want).all(), j
    assert (got == 0).any() and (got != 0).any()  # these rows: some ids folded, some kept


def test_with_a_val_mapping_the_folds_cut_both_mappings_rows(data):
    """The val mapping's rows follow the train mapping's, and the folds cut them all: the last
    fold is the val mapping's rows (200 of 1,200 in six folds), read as held-out rows."""
    spec, train, _ = open_dataset(str(data / "val"))
    from dlrmkit.data.split_binary import open_val

    val = open_val(spec)
    assert (len(train), len(val)) == (1000, 200)
    t = Trainer(config(data / "val", folds=6, fold=6, min_id_count=1))
    assert len(t.train_set) == 1000 and len(t.val_set) == 200
    for got, want in zip(rows(t.val_set), rows(val)):
        assert (got == want).all()
    t = Trainer(config(data / "val", folds=6, fold=1, min_id_count=1))
    assert len(t.train_set) == 1000 and len(t.val_set) == 200
    for got, want in zip(rows(t.train_set), rows(train.window(200, 1000).joined(val))):
        assert (got == want).all()


def test_equal_sized_folds_fit_their_own_regression(data):
    """Folds of one size are different rows: each fold's regression is its own fit (a process
    keeps each fit for its candidates), the same as a fresh fit of that fold."""
    kw = dict(preset="auto", deep=False, wide=True, wide_init="regression", patience=1, embedding_dim=8,
              bottom_mlp=[], top_mlp=[8, 1], min_id_count=1, folds=4)  # fmt: skip
    regression._CHOSEN.clear()
    first = [Trainer(config(data / "held", fold=i, **kw)).wide_init for i in (1, 2)]
    assert first[0]["val_auc"] != first[1]["val_auc"]
    regression._CHOSEN.clear()
    assert Trainer(config(data / "held", fold=2, **kw)).wide_init == first[1]


def test_the_default_cross_validates_a_small_log_without_a_val_mapping(data, tmp_path, monkeypatch):
    reads = spy_reads(monkeypatch)
    run = tmp_path / "run"
    common = ("--no-progress", "--epochs", "2")
    r = run_cli("train", "--data", data / "held", "--run-dir", run, "--search-budget", "3", *common)
    assert r.code == 0 and "cross-validation (--folds 5): 1,200 rows, so" in r.out, r.out + r.err
    assert_test_rows_read_last(reads)  # after every model is trained, each model scoring them once
    monkeypatch.undo()
    doc = yaml.safe_load(open(run / "checkpoints" / "blend.yaml"))
    names = {m["name"] for m in doc["members"]}
    assert [x for x in reads if x.startswith("test") and not x.endswith(":0")] == ["test:100"] * 5 * len(names)
    assert sorted((m["name"], m["fold"]) for m in doc["members"]) == sorted((n, f) for n in names for f in range(1, 6))
    # every fold model is the search's own run of that candidate on that fold, not trained again
    assert r.out.count("(the search's run of it, not trained again)") == 5 * len(names), r.out
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert cfg["folds"] == 5 and cfg["search-budget"] == 0 and "refit" not in cfg and cfg["blend"]
    m = json.load(open(run / "metrics.json"))
    assert m["folds"] == 5 and not m["refit"] and len(m["blend"]) == 5 * len(names)
    assert_repeated_and_scored(run, data / "held", tmp_path, common, reported="5 runs: fold 1, fold 2, fold 3, fold 4, fold 5 (`")


def test_past_fold_rows_the_choice_is_cross_validated_and_each_member_refitted(data, tmp_path, monkeypatch):
    """Between FOLD_ROWS and FOLD_REFIT_ROWS, where the validation rows hold few of their rarer
    label: the choice, the blend's weights and its temperature on the folds' validation logits,
    then each kept candidate trained once more on all rows, as its median fold chose; the run is
    the refitted models, the test rows read once by each."""
    monkeypatch.setattr(recipe, "FOLD_ROWS", 1199)
    reads = spy_reads(monkeypatch)
    run = tmp_path / "run"
    common = ("--no-progress", "--epochs", "2")
    r = run_cli("train", "--data", data / "val", "--run-dir", run, "--search-budget", "3", *common)
    assert r.code == 0 and "cross-validation (--folds 5): 1,200 rows in the train and val mappings" in r.out, r.out
    assert "trained again on all 1,200 rows, repeating what its median fold" in r.out, r.out
    assert_test_rows_read_last(reads)
    monkeypatch.undo()
    doc = yaml.safe_load(open(run / "checkpoints" / "blend.yaml"))
    names = [m["name"] for m in doc["members"]]
    assert [x for x in reads if x.startswith("test") and not x.endswith(":0")] == ["test:100"] * len(names)
    labels = rows(open_val(open_dataset(str(data / "val"))[0]))[2]
    rarer = min(int(labels.sum()), len(labels) - int(labels.sum()))
    assert f"the validation rows hold {rarer:,} of their rarer label, under 500" in r.out, r.out
    assert all(m["refit"] and 1 <= m["fold"] <= 5 for m in doc["members"])
    # each member refitted once, from one fold's run; twice (seeds 0 and 1) where it weighs a tenth or more
    total = sum({m["name"]: m["weight"] for m in doc["members"]}.values())
    for name in set(names):
        runs = [m for m in doc["members"] if m["name"] == name]
        assert len({m["fold"] for m in runs}) == 1
        assert [m["seed"] for m in runs] == ([0, 1] if runs[0]["weight"] >= 0.1 * total else [0]), doc
    assert r.out.count("(the search's run of it, not trained again)") == 5 * len(set(names)), r.out
    for m in doc["members"]:  # one model on all 1,200 rows, saved in a folder of the member's own
        end = [json.loads(line) for line in open(run / "checkpoints" / m["folder"] / "log.jsonl")][-1]
        assert end["event"] == "end" and end["refit"], end
        assert not end["steps"] or abs(end["samples"] / end["epochs"] - 1200) < 64, end  # epochs of all rows
        member = yaml.safe_load(open(run / "checkpoints" / m["folder"] / "config.yaml"))
        assert (member["folds"], member["fold"], member["refit"]) == (5, m["fold"], True)
    assert r.out.count(": refit on all rows, seed ") == len(names), r.out
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert (cfg["folds"], cfg["refit"], cfg["search-budget"]) == (5, True, 0) and cfg["blend"]
    m = json.load(open(run / "metrics.json"))
    assert m["folds"] == 5 and m["refit"] and len(m["blend"]) == len(names) > len(set(names))
    # samples/s: every sample the fold runs and the refits trained, over the time they took
    ends = [r for f in (run / "checkpoints").glob("*/log.jsonl") for r in map(json.loads, open(f)) if r["event"] == "end"]
    fits = [(e["samples"], e["samples"] / e["samples_per_s"]) for e in ends if e["samples_per_s"]]
    assert m["samples"] == sum(e["samples"] for e in ends), (m["samples"], ends)
    assert m["samples_per_s"] == pytest.approx(sum(n for n, _ in fits) / sum(t for _, t in fits), rel=1e-6)
    assert_repeated_and_scored(run, data / "val", tmp_path, common, reported="refitted on all rows as fold")


def test_the_default_holds_out_rows_past_fold_refit_rows_with_enough_validation_labels_or_folds_1(data, tmp_path, monkeypatch):
    common = ("--no-progress", "--epochs", "2", "--search-budget", "2")
    r = run_cli("train", "--data", data / "val", "--run-dir", tmp_path / "a", *common)
    assert r.code == 0 and "cross-validation (--folds 5): 1,200 rows in the train and val mappings" in r.out, r.out
    r = run_cli("train", "--data", data / "held", "--run-dir", tmp_path / "b", *common, "--folds", "1")
    assert r.code == 0 and "cross-validation" not in r.out and "refit:" in r.out, r.out + r.err
    monkeypatch.setattr(recipe, "FOLD_ROWS", 1000)
    monkeypatch.setattr(recipe, "FEW_VAL_LABELS", 1)  # under FOLD_REFIT_ROWS, but enough validation clicks
    for name in ("held", "val"):
        r = run_cli("train", "--data", data / name, "--run-dir", tmp_path / f"d{name}", *common)
        assert r.code == 0 and "cross-validation" not in r.out and "refit:" in r.out, r.out + r.err
    monkeypatch.setattr(recipe, "FEW_VAL_LABELS", 500)
    monkeypatch.setattr(recipe, "FOLD_REFIT_ROWS", 1199)
    for name in ("held", "val"):
        r = run_cli("train", "--data", data / name, "--run-dir", tmp_path / f"c{name}", *common)
        assert r.code == 0 and "cross-validation" not in r.out and "refit:" in r.out, r.out + r.err


@pytest.mark.parametrize(
    "args,said",
    [(("--preset", "tiny", "--folds", "5"), "give --fold I too"),
     (("--preset", "tiny", "--fold", "2"), "--fold 2 needs --folds K with K >= 2"),
     (("--preset", "tiny", "--folds", "3", "--fold", "4"), "--fold 4 needs --folds K with K >= 4"),
     (("--preset", "tiny", "--folds", "3", "--fold", "1", "--val-fraction", "0.2"), "--fold and --val-fraction"),
     (("--folds", "3", "--val-fraction", "0.2"), "--folds and --val-fraction"),
     (("--folds", "3", "--search-budget", "0"), "the search is off"),
     (("--folds", "11",), "--folds")],
)  # fmt: skip
def test_folds_given_with_what_they_cannot_go_with_is_one_line(data, tmp_path, args, said):
    r = run_cli(
        "train", "--data", data / "held", "--run-dir", tmp_path / "run", "--no-progress", "--max-steps", "2", *args
    )
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) <= 2, r.err


def test_one_fold_trains_with_a_fixed_preset(data, tmp_path):
    r = run_cli("train", "--data", data / "held", "--run-dir", tmp_path / "run", "--no-progress", "--preset", "tiny",
                "--epochs", "1", "--folds", "4", "--fold", "3", "--numerical-transform", "signed-log")  # fmt: skip
    assert r.code == 0 and "validation rows: fold 3 of 4 of the train rows, 300 rows" in r.out, r.out + r.err


def test_one_fold_under_the_search_validates_on_that_fold_alone(data, tmp_path):
    """--folds K --fold F with --preset auto: the search's candidates are the models fold F
    validates, one each, and the run is chosen among them as on any validation rows."""
    run = tmp_path / "run"
    r = run_cli("train", "--data", data / "held", "--run-dir", run, "--no-progress", "--epochs", "2",
                "--search-budget", "2", "--folds", "4", "--fold", "3", "--refit", "false")  # fmt: skip
    assert r.code == 0 and "cross-validation" not in r.out, r.out + r.err
    m = json.load(open(run / "metrics.json"))
    assert "folds" not in m and all("fold" not in b for b in m.get("blend", []))
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert cfg["folds"] == 4 and cfg["fold"] == 3
