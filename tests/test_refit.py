"""--refit: once selection has chosen on the validation rows, the recipe is trained again on the
training and validation rows together, repeating what the run chose (its selected step scaled to
the rows, its learning-rate decays, its regression's C, its temperature), and that model is the
run's: the test rows read once, by it; its checkpoint what evaluate scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from helpers import run_cli
from dlrmkit.config import TrainConfig
from dlrmkit.data.split_binary import open_dataset
from dlrmkit.train.refit import Refit, plan, refit
from dlrmkit.train.trainer import Trainer
from test_quality import assert_test_rows_read_last, spy_reads
from test_selection import transcode, write_csv


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """1,300 rows: 1,000 train, 200 val (a val mapping), 100 test; and the same rows with no val
    mapping (train holds out its last 10%)."""
    root = tmp_path_factory.mktemp("refit")
    write_csv(root / "x.csv", 1300)
    transcode(root / "x.csv", root / "val", "--test-rows", "100", "--val-rows", "200")
    transcode(root / "x.csv", root / "held", "--test-rows", "100")
    return root


def rows(dataset):
    b = dataset.read(0, len(dataset), check_ids=False)
    return b.dense.astype(np.float64), b.ids.astype(np.int64), b.labels


@pytest.mark.parametrize("name", ["val", "held"])
def test_joined_rows_are_both_datasets_rows_read_as_the_first_reads_its_own(data, name):
    spec, train, _ = open_dataset(str(data / name))
    from dlrmkit.data.split_binary import open_val

    val = open_val(spec) if name == "val" else None
    if val is None:  # held out: two windows of one mapping, joined back
        n = len(train)
        train, val = train.window(0, n - 130), train.window(n - 130, n, "val")
    joined = train.joined(val)
    assert len(joined) == len(train) + len(val) and joined.mapping == "train"
    for got, a, b in zip(rows(joined), rows(train), rows(val)):
        assert (got == np.concatenate([a, b])).all()
    # a read across the seam, and the first dataset's folds on every row (the second's are not applied)
    k = len(train)
    assert (joined.read(k - 5, k + 5).ids == np.concatenate([train.read(k - 5, k).ids, val.read(0, 5).ids])).all()
    folded = train.fold_ids([2] * len(spec.cardinalities)).joined(val.fold_unknown([np.ones(c, bool) for c in spec.cardinalities]))
    ids = folded.read(0, len(folded)).ids
    assert ids.max() <= 1 and (ids[len(train) :] == np.minimum(rows(val)[1], 2) * (rows(val)[1] < 2)).all()


def config(data, **kw):
    values = dict(data=str(data), preset="tiny", epochs=6, batch_size=64, lr=0.5, progress=False,
                  final_checkpoint=False, restore_best=True, patience=6, numerical_transform="signed-log",
                  standardize_numerical=True)  # fmt: skip
    return TrainConfig.of(**{**values, **kw})


def test_a_refit_repeats_its_runs_selected_steps_decays_and_temperature(data):
    cfg = config(data / "val", lr_decay_on_plateau=0.5, calibration="temperature")
    run = Trainer(cfg)
    test = run.test_set
    run.test_set = test.window(0, 0, "test")
    m = run.fit(save=False)
    assert run.lr_scales and m["selected_step"] > 0  # these rows and seed: plateaus before the end
    how = plan(run, m)
    per_epoch = len(run.loader)  # 16 batches of 64 of the 1,000 training rows; 19 of the 1,200 joined
    assert how.epochs == m["selected_step"] / per_epoch and how.scale == pytest.approx(1 / run.temperature)
    assert how.lr_scales == tuple((s / per_epoch, x) for s, x in run.lr_scales if s <= m["selected_step"])
    seen = []
    again, test2, out = refit(run, m, read_test=False)
    assert len(again.train_set) == 1200 and again.val_set is None and again.step == round(how.epochs * 19)
    assert len(test2) == 100 and len(again.test_set) == 0  # the caller reads the test rows
    assert out["refit"] and out["val_auc"] == m["val_auc"] and out["selected_step"] == m["selected_step"]
    # the decays at the same point of training: the scale a step ran with, step by step
    probe = Trainer(config(data / "val", calibration="temperature"), refit=Refit(9 / 19, ((3 / 19, 0.5), (7 / 19, 0.25)), None, 1.0, {}))
    original = probe.train_step

    def step(batch):
        seen.append(probe.schedule.scale)
        return original(batch)

    probe.train_step = step
    probe.fit(save=False)
    assert seen == [1.0] * 3 + [0.5] * 4 + [0.25] * 2 and probe.step == 9
    # the temperature its run fitted, folded into the refit's model
    assert again.temperature == pytest.approx(run.temperature)


def test_a_refit_of_the_regression_keeps_the_c_its_run_chose(data):
    cfg = config(data / "held", deep=False, wide=True, wide_init="regression", patience=1, epochs=2,
                 min_id_count=1, preset="auto", embedding_dim=8, bottom_mlp=[], top_mlp=[8, 1])  # fmt: skip
    run = Trainer(cfg)
    run.test_set = run.test_set.window(0, 0, "test")
    m = run.fit(save=False)
    again, _, out = refit(run, m, read_test=False)
    assert run.wide_init["c"] != 1.0  # not the C a fit without validation rows takes
    assert again.wide_init["c"] == run.wide_init["c"] and len(again.train_set) == 1200  # 1,080 + 120 held out


def test_train_refit_reads_the_test_rows_once_and_saves_the_refit(data, tmp_path, monkeypatch):
    reads = spy_reads(monkeypatch)
    run = tmp_path / "run"
    r = run_cli("train", "--data", data / "val", "--preset", "tiny", "--epochs", "3", "--batch-size", "64",
                "--numerical-transform", "signed-log", "--refit", "true", "--run-dir", run, "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert_test_rows_read_last(reads)
    assert [x for x in reads if x.startswith("test") and not x.endswith(":0")] == ["test:100"]  # once
    monkeypatch.undo()
    m = json.load(open(run / "metrics.json"))
    said = f"refit on the training and validation rows: {m['selected_step'] / 16:.2f} epochs, as selection chose"
    assert said in r.out, r.out
    assert m["refit"] and m["refit_steps"] == m["steps"] == round(m["selected_step"] / 16 * 19)  # the epochs
    assert yaml.safe_load(open(run / "config.yaml"))["refit"] is True
    # the checkpoint is the refit's, and scores the test rows as the run did
    r = run_cli("evaluate", "--data", data / "val", "--checkpoint", run / "checkpoints", "--metrics-json", tmp_path / "e.json")
    assert r.code == 0, r.err
    assert json.load(open(tmp_path / "e.json"))["auc"] == pytest.approx(m["auc"], abs=1e-9)
    r = run_cli("report", run)
    text = (run / "report.md").read_text()
    assert r.code == 0 and f"validation AUC {m['val_auc']:.4f}" in text, text
    assert f"refitted on the training and validation rows for {m['selected_step'] / 16:.2f} epochs" in text, text
    log = [json.loads(line)["event"] for line in open(run / "log.jsonl")]
    assert log.index("refit") < len(log) - 2 and log[-2:] == ["test", "end"] and "eval" in log[: log.index("refit")]
    assert log.count("test") == 1  # the run selection refits read no test rows, and logs no test record


def test_refit_without_validation_rows_is_refused_or_said(data, tmp_path):
    r = run_cli("train", "--data", data / "val", "--preset", "tiny", "--max-steps", "5", "--refit", "true",
                "--val-fraction", "0", "--run-dir", tmp_path / "run", "--no-progress")  # fmt: skip
    assert r.code == 2 and "--refit true acts on validation rows" in r.err and len(r.err.strip().splitlines()) == 1


def test_a_refits_checkpoint_ends_its_run_and_a_run_saving_along_the_way_keeps_its_selection(data, tmp_path):
    common = ("--data", data / "val", "--preset", "tiny", "--epochs", "2", "--batch-size", "64",
              "--numerical-transform", "signed-log", "--refit", "true", "--no-progress")  # fmt: skip
    run = tmp_path / "run"
    r = run_cli("train", *common, "--run-dir", run)
    assert r.code == 0, r.err
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and not p.name.endswith(".lock")}
    r = run_cli("train", *common, "--run-dir", run, "--resume")  # the same command: the run ended
    assert r.code == 0 and "the run ended" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = run_cli("train", *[c if c != "2" else "3" for c in common], "--run-dir", run, "--resume")  # a longer one
    assert r.code == 2 and "the checkpoint of a refit" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert {p: p.read_bytes() for p in before} == before and sorted(run.rglob("*")) == sorted(
        p for p in run.rglob("*") if p in before or p.is_dir() or p.name.endswith(".lock")
    )
    # checkpoints along the way are for --resume, which continues the selected model: no refit, said so
    r = run_cli("train", *common, "--run-dir", tmp_path / "along", "--checkpoint-every", "10")
    assert r.code == 0 and "refit: skipped (checkpoints along the way" in r.err, r.err
    m = json.load(open(tmp_path / "along" / "metrics.json"))
    assert "refit" not in m and m["steps"] == 2 * 16


def test_the_search_refits_unless_told_not_to(tmp_path):
    write_csv(tmp_path / "x.csv", 900)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "a", "--no-progress", "--epochs", "2",
                "--search-budget", "2", "--folds", "1")  # fmt: skip
    assert r.code == 0 and "refit: each model kept is trained again" in r.out, r.out + r.err
    assert yaml.safe_load(open(tmp_path / "a" / "config.yaml"))["refit"] is True
    assert json.load(open(tmp_path / "a" / "metrics.json"))["refit"] is True
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "b", "--no-progress", "--epochs", "2",
                "--search-budget", "2", "--refit", "false", "--folds", "1")  # fmt: skip
    assert r.code == 0 and "refit:" not in r.out and "refit on the" not in r.out, r.out
    assert not json.load(open(tmp_path / "b" / "metrics.json")).get("refit")
    # unsearched (--search-budget 0): the base recipe as it is, no refit
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "c", "--no-progress", "--epochs", "2",
                "--search-budget", "0", "--folds", "1")  # fmt: skip
    assert r.code == 0 and not json.load(open(tmp_path / "c" / "metrics.json")).get("refit"), r.out


def test_a_searched_single_choice_is_taken_over_and_refitted_not_trained_again(tmp_path, monkeypatch):
    write_csv(tmp_path / "x.csv", 900)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")
    made = []  # each Trainer built: whether it is a refit
    build = Trainer.__init__

    def spy(self, cfg, keep_log=False, refit=None):
        made.append(refit is not None)
        build(self, cfg, keep_log, refit)

    monkeypatch.setattr(Trainer, "__init__", spy)
    # the transform given: no numbers check, whose regression fit is a trainer of its own
    common = ("--data", tmp_path / "d", "--no-progress", "--epochs", "2", "--search-budget", "1", "--min-id-count", "1",
              "--folds", "1", "--numerical-transform", "signed-log")  # fmt: skip
    r = run_cli("train", *common, "--run-dir", tmp_path / "a")  # one candidate: one model, no blend
    assert r.code == 0 and "blend" not in r.out, r.out + r.err
    assert made == [False, True]  # the search's run, taken over, then its refit
    log = [json.loads(line)["event"] for line in open(tmp_path / "a" / "log.jsonl")]
    assert "eval" in log[: log.index("refit")] and log[-2:] == ["test", "end"] and log.count("test") == 1
    made.clear()
    r = run_cli("train", *common, "--run-dir", tmp_path / "b", "--refit", "false")
    assert r.code == 0 and made == [False, False]  # no refit: the run trains its choice again, and is it
    a, b = (json.load(open(tmp_path / f / "metrics.json")) for f in "ab")
    assert a["val_auc"] == b["val_auc"] and a["refit"] and not b.get("refit")
