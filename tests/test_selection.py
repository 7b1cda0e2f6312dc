"""Honest evaluation: validation mappings from preprocess/transcode, the test mapping read only
after training, the small-data recipe, the logistic-regression baseline and tune's objective."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
import yaml

from helpers import run_cli
from dlrmkit.data.split_binary import SplitBinaryDataset, open_dataset, open_val

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "criteo", "criteo_kaggle_head6k.tsv")
NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def write_csv(path, rows: int, seed: int = 0) -> None:
    """A click log with a header: label, two numerical and three categorical columns; the label
    depends on the categories, so a model has something to learn."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "n1", "n2", "a", "b", "c"])
        for i in range(rows):
            a, b, c = rng.integers(0, 20), rng.integers(0, 50), rng.integers(0, 5)
            p = 1 / (1 + np.exp(-(0.3 * (a % 5) - 0.6 + 0.5 * (c == 2))))
            w.writerow(
                [
                    int(rng.random() < p),
                    rng.integers(0, 60000),
                    round(float(rng.normal()), 3),
                    f"a{a}",
                    f"b{b}",
                    f"c{c}" if i % 7 else "",
                ]
            )


def transcode(src, out, *extra):
    r = run_cli(
        "transcode",
        "--input",
        str(src),
        "--out",
        str(out),
        "--label",
        "y",
        "--numerical",
        "n1,n2",
        "--categorical",
        "a,b,c",
        *extra,
    )
    assert r.code == 0, r.err
    return r


def test_transcode_val_split_keeps_order_and_vocabulary(tmp_path):
    write_csv(tmp_path / "x.csv", 1000)
    transcode(tmp_path / "x.csv", tmp_path / "all", "--test-rows", "100")
    r = transcode(tmp_path / "x.csv", tmp_path / "v", "--test-rows", "100", "--val-rows", "150")
    assert "750 train + 150 val + 100 test rows" in r.out
    spec, train, test = open_dataset(str(tmp_path / "v"))
    val = open_val(spec)
    assert (len(train), len(val), len(test)) == (750, 150, 100)
    _, all_train, all_test = open_dataset(str(tmp_path / "all"))
    # the same rows in the same order: val is the tail of the old train mapping, test unchanged
    got = np.concatenate([train.read(0, 750).labels, val.read(0, 150).labels, test.read(0, 100).labels])
    want = np.concatenate([all_train.read(0, 900).labels, all_test.read(0, 100).labels])
    assert (got == want).all()
    assert (val.read(0, 150).dense == all_train.read(750, 900).dense).all()
    # only the 750 training rows were counted for the vocabulary
    b_train = {int(i) for i in train.read(0, 750).ids[:, 1]}
    assert max(b_train) == spec.cardinalities[1] - 1  # every id of b occurs in the training rows
    r = transcode(tmp_path / "x.csv", tmp_path / "f", "--test-rows", "100", "--val-fraction", "0.1")
    assert "810 train + 90 val + 100 test rows" in r.out


@pytest.mark.skipif(not os.path.exists(REAL), reason="needs ../shared/data/criteo (real Criteo rows, not in the repo)")
def test_preprocess_criteo_val_split(tmp_path):
    head = tmp_path / "head.tsv"
    with open(REAL) as f:
        head.write_text("".join(f.readlines()[:1200]))
    args = ["preprocess", "criteo", "--input", str(head), "--test-rows", "200", "--no-progress", "--workers", "1"]
    assert run_cli(*args, "--out", str(tmp_path / "a")).code == 0
    r = run_cli(*args, "--out", str(tmp_path / "b"), "--val-rows", "300")
    assert r.code == 0, r.err
    assert "700 train + 300 val + 200 test rows" in r.out
    spec_a, train_a, test_a = open_dataset(str(tmp_path / "a"))
    spec_b, train_b, test_b = open_dataset(str(tmp_path / "b"))
    val_b = open_val(spec_b)
    assert (val_b.read(0, 300).labels == train_a.read(700, 1000).labels).all()
    assert (test_b.read(0, 200).dense == test_a.read(0, 200).dense).all()
    # val rows are not counted for the vocabulary: fewer (or equal) ids than with them
    assert all(b <= a for a, b in zip(spec_a.cardinalities, spec_b.cardinalities))
    assert sum(spec_b.cardinalities) < sum(spec_a.cardinalities)
    assert run_cli("validate", "--data", str(tmp_path / "b")).code == 0


def test_test_mapping_is_read_only_after_training(tmp_path, monkeypatch):
    from dlrmkit.config import TrainConfig
    from dlrmkit.train.trainer import Trainer

    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300")
    reads: list[str] = []
    original = SplitBinaryDataset.read

    def spy(self, start, end, check_ids=True):
        reads.append(self.mapping)
        return original(self, start, end, check_ids)

    monkeypatch.setattr(SplitBinaryDataset, "read", spy)

    def run(data):
        reads.clear()
        cfg = TrainConfig.of(
            data=str(data),
            preset="tiny",
            epochs=4,
            batch_size=64,
            patience=1,
            restore_best=True,
            progress=False,
            shuffle=False,
            numerical_transform="signed-log",
        )
        m = Trainer(cfg).fit()
        return m, list(reads)

    m, seq = run(tmp_path / "d")
    assert "test" in seq and "val" in seq
    first_test = seq.index("test")
    assert all(s == "test" for s in seq[first_test:]), "the test mapping was read before training ended"
    # a test mapping whose labels are all 1 changes nothing but the final test score
    label = tmp_path / "d" / "test" / "label.bin"
    np.ones(300, dtype=np.bool_).tofile(label)
    m1, _ = run(tmp_path / "d")
    for key in ("val_auc", "val_logloss", "steps", "best_auc", "selected_step", "train_loss"):
        assert m1[key] == m[key], key
    assert np.isnan(m1["auc"]) and not np.isnan(m["auc"])


def test_small_data_recipe_is_chosen_printed_and_recorded(tmp_path):
    write_csv(tmp_path / "x.csv", 1200)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "200")
    run_dir = tmp_path / "run"
    r = run_cli(
        "train",
        "--data",
        str(tmp_path / "d"),
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--epochs",
        "3",
        "--embedding-dim",
        "4",
    )
    assert r.code == 0, r.err
    assert "recipe small-data" in r.out and "why:" in r.out
    # n1 holds raw values up to 60,000: their signed log, unless the validation rows prefer them as they are
    assert "sign(x) log(1+|x|)" in r.out and ("numerical-transform signed-log" in r.out or "as they are" in r.out)
    assert "kept from the command line/config: embedding-dim, epochs" in r.out
    cfg = yaml.safe_load(open(run_dir / "config.yaml"))
    if cfg.get("blend"):  # the search chose a blend: each member's folder holds its whole config
        member = sorted((run_dir / "checkpoints").glob("*/config.yaml"))[0]
        cfg = yaml.safe_load(open(member))
        assert cfg["embedding-dim"] == 4 and cfg["bottom-mlp"][-1] == 4 and cfg["epochs"] == 3
    else:
        assert cfg["wide"] is True and cfg["optimizer"] == "adagrad" and cfg["embedding-dim"] == 4
        assert cfg["bottom-mlp"][-1] == 4 and cfg["epochs"] == 3 and cfg["restore-best"] is True
    m = json.load(open(run_dir / "metrics.json"))
    assert {"val_auc", "val_logloss", "auc", "logloss"} <= set(m)
    # the run repeats from its config.yaml with the same choices (nothing left to the recipe)
    r2 = run_cli(
        "train", "--config", str(run_dir / "config.yaml"), "--run-dir", str(tmp_path / "run2"), "--no-progress"
    )
    assert r2.code == 0, r2.err
    assert json.load(open(tmp_path / "run2" / "metrics.json"))["val_auc"] == m["val_auc"]


@pytest.mark.parametrize(
    "given,named",
    [
        (["--patience", "2"], ["--patience 2"]),
        (["--restore-best", "true"], ["--restore-best true"]),
        (["--patience", "1", "--restore-best", "true"], ["--patience 1", "--restore-best true"]),
        (["--target-auc", "0.7"], ["--target-auc 0.7"]),
        (["--lr-decay-on-plateau", "0.1"], ["--lr-decay-on-plateau 0.1"]),
    ],
)
def test_selection_options_without_validation_rows_are_refused(tmp_path, given, named):
    """--val-fraction 0 leaves no validation rows, even beside the dataset's val mapping: an early
    stop or best-weight option given with it would do nothing, so it is one line before any work."""
    write_csv(tmp_path / "x.csv", 600)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100", "--val-rows", "100")
    assert open_val(open_dataset(str(tmp_path / "d"))[0]) is not None  # the dataset has its own val rows
    argv = ["train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--max-steps", "2"]
    r = run_cli(*argv, "--val-fraction", "0", *given)
    assert r.code == 2, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in [*named, "--val-fraction 0"]), r.err
    assert not (tmp_path / "run").exists() and r.out == ""  # refused before the run folder or the recipe
    # the same options with validation rows are taken
    assert run_cli(*argv, *given).code == 0


def test_val_fraction_zero_leaves_the_recipes_selection_unset(tmp_path):
    """The small-data recipe stops early and restores the best weights; with --val-fraction 0 it
    does neither, and says so. The defaults it would have set are no error, and the run's
    config.yaml (no patience, no restore-best) repeats it; the same values from a --config file
    are the user's own, refused with the file named."""
    write_csv(tmp_path / "x.csv", 600)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")
    run = tmp_path / "run"
    common = ["--data", tmp_path / "d", "--no-progress", "--epochs", "2", "--val-fraction", "0"]
    r = run_cli("train", *common, "--run-dir", run)
    assert r.code == 0, r.err
    assert "recipe small-data" in r.out and "--val-fraction 0: no validation rows, so no early stop" in r.out
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert cfg["patience"] is None and cfg["restore-best"] is None and cfg["val-fraction"] == 0
    m = json.load(open(run / "metrics.json"))
    assert m["steps"] == m["selected_step"] > 0  # the last weights, not a restored step
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "run2", "--no-progress")
    assert r2.code == 0, r2.err
    # explicit choices: refused, the file named for a value from it, a flag named as given
    (tmp_path / "c.yaml").write_text("patience: 3\nrestore-best: true\n")
    r3 = run_cli("train", *common, "--config", tmp_path / "c.yaml", "--run-dir", tmp_path / "run3")
    assert r3.code == 2 and f"--patience 3 (from --config {tmp_path / 'c.yaml'})" in r3.err, r3.err
    # patience 0 and restore-best false say "none": nothing is ignored
    r4 = run_cli("train", *common, "--patience", "0", "--restore-best", "false", "--run-dir", tmp_path / "run4")
    assert r4.code == 0, r4.err


def test_baseline_matches_scikit_learn_and_train_prints_lift(tmp_path):
    """C chosen on the validation rows (the last 10% of train, held out as `train` holds them), the
    chosen C's fit on the remaining train rows scored on the test rows: scikit-learn's
    LogisticRegression run the same way gives the same C and the same test AUC."""
    pytest.importorskip("sklearn", reason="the reference logistic regression needs scikit-learn (test extra)")
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score
    from sklearn.preprocessing import OneHotEncoder

    write_csv(tmp_path / "x.csv", 2000, seed=3)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "400", "--log-transform")
    r = run_cli("baseline", "--data", str(tmp_path / "d"))
    assert r.code == 0, r.err
    assert "<- chosen" in r.out and "chosen on the validation rows" in r.out
    result = json.load(open(tmp_path / "d" / "baseline.json"))
    _, train, test = open_dataset(str(tmp_path / "d"))
    held = int(round(len(train) * 0.1))
    a, v, b = train.read(0, len(train) - held), train.read(len(train) - held, len(train)), test.read(0, len(test))
    enc = OneHotEncoder(handle_unknown="ignore").fit(a.ids)
    xd = a.dense.astype(np.float64)
    mu, sd = xd.mean(0), xd.std(0)
    import scipy.sparse as sp

    def x(p):
        return sp.hstack([enc.transform(p.ids), (p.dense.astype(np.float64) - mu) / sd]).tocsr()

    scores = []
    for c in (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0):
        fit = LogisticRegression(C=c, max_iter=5000).fit(x(a), a.labels)
        pv = fit.predict_proba(x(v))[:, 1]
        test_auc = roc_auc_score(b.labels, fit.predict_proba(x(b))[:, 1])
        scores.append((roc_auc_score(v.labels, pv), log_loss(v.labels, pv), c, test_auc))
    top = max(s[0] for s in scores)
    ref = min((s for s in scores if s[0] >= top - 0.001), key=lambda s: s[1])
    assert result["c"] == ref[2], (result["c_tried"], scores)
    assert abs(result["test_auc"] - ref[3]) < 0.002, (result, ref)
    assert 0.5 < result["val_auc"] <= 1.0 and len(result["c_tried"]) <= 6  # coarse to fine, not all 7
    # the chosen C refitted on the train and validation rows together, as scikit-learn would refit it
    both = train.read(0, len(train))
    enc = OneHotEncoder(handle_unknown="ignore").fit(both.ids)
    xd = both.dense.astype(np.float64)
    mu, sd = xd.mean(0), xd.std(0)
    refit = LogisticRegression(C=ref[2], max_iter=5000).fit(x(both), both.labels)
    assert abs(result["refit_test_auc"] - roc_auc_score(b.labels, refit.predict_proba(x(b))[:, 1])) < 0.002
    assert result["refit_rows"] == len(train) and f"refitted on the train and validation rows ({len(train):,})" in r.out
    t = run_cli(
        "train", "--data", str(tmp_path / "d"), "--run-dir", str(tmp_path / "run"), "--no-progress", "--epochs", "2",
        "--folds", "1",
    )  # fmt: skip
    assert t.code == 0, t.err
    # the default recipe refits, so its lift is against the refitted regression
    assert f"refitted on the train and validation rows as this run was: test AUC {result['refit_test_auc']:.4f}" in t.out
    # a baseline made for the dataset as it was (or by a dlrmkit that recorded no fingerprint) is
    # named stale, with no lift against it
    from dlrmkit.commands.train import baseline_lift

    data = str(tmp_path / "d")
    assert f"lift {0.9 - result['test_auc']:+.4f}" in baseline_lift(data, {"auc": 0.9})
    assert f"lift {0.9 - result['refit_test_auc']:+.4f}" in baseline_lift(data, {"auc": 0.9, "refit": True})
    json.dump({k: v for k, v in result.items() if not k.startswith("refit")}, open(tmp_path / "d" / "baseline.json", "w"))
    line = baseline_lift(data, {"auc": 0.9, "refit": True})  # a baseline.json from before refits
    assert "no refit" in line and "no lift printed" in line and "dlrmkit baseline --data" in line, line
    for stale in ({**result, "dataset_fingerprint": "0" * 64}, {k: v for k, v in result.items() if "fingerprint" not in k}):
        json.dump(stale, open(tmp_path / "d" / "baseline.json", "w"))
        line = baseline_lift(data, {"auc": 0.9})
        assert "no lift printed" in line and "dlrmkit baseline --data" in line, line


def test_a_baseline_json_that_is_not_one_prints_no_lift(dataset_copy):
    """baseline.json comes with the dataset: one whose figures are not numbers, that is not a
    regular file or is oversized gives no lift line; the run that reads it never fails or waits."""
    from dlrmkit.commands.train import baseline_lift
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.data.fingerprint import dataset_fingerprint

    data, path = str(dataset_copy), dataset_copy / "baseline.json"
    fingerprint = dataset_fingerprint(FeatureSpec.from_yaml(data))
    good = {"test_auc": 0.7, "refit_test_auc": 0.71, "dataset_fingerprint": fingerprint}
    path.write_text(json.dumps(good))
    assert "lift +0.2000 AUC" in baseline_lift(data, {"auc": 0.9})
    for bad in ({"test_auc": "0.7"}, {"test_auc": True}, {"refit_test_auc": "0.71"}, {"refit_test_auc": [0.71]}):
        path.write_text(json.dumps({**good, **bad}))
        assert baseline_lift(data, {"auc": 0.9, "refit": True}) == "", bad  # was "internal error" for a string
    path.write_text(json.dumps([good]))
    assert baseline_lift(data, {"auc": 0.9}) == ""
    path.write_text(json.dumps(good) + " " * (1 << 20))
    assert baseline_lift(data, {"auc": 0.9}) == ""
    path.unlink()
    os.mkfifo(path)  # opening it used to block the end of the run forever
    assert baseline_lift(data, {"auc": 0.9}) == ""


def test_tune_maximizes_validation_auc(tmp_path):
    pytest.importorskip("optuna", reason="tune needs Optuna (the tune extra)")
    import optuna

    write_csv(tmp_path / "x.csv", 800)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "200", "--val-rows", "150")
    out = tmp_path / "t"
    r = run_cli(
        "tune",
        "--data",
        str(tmp_path / "d"),
        "--trials",
        "3",
        "--out",
        str(out),
        "--max-steps",
        "10",
        "--no-prune",
        "--budget",
        "5",
    )
    assert r.code == 0, r.err
    study = optuna.load_study(study_name="dlrmkit", storage=f"sqlite:///{out / 'study.db'}")
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert complete
    for trial in complete:
        log = [json.loads(x) for x in open(out / f"trial_{trial.number}" / "log.jsonl")]
        val = [e for e in log if e.get("event") == "eval"]
        ends = [e for e in log if e.get("event") == "end"]
        assert trial.value == pytest.approx(ends[-1]["val_auc"]) and val and all(e["mapping"] == "val" for e in val)
    assert r.out.count("test AUC") == 1 and "scored once" in r.out


def test_selection_without_validation_rows_says_it_selects_nothing(tmp_path):
    """Too few train rows to hold any out: the recipe's early stop and best weights have nothing
    to select on, and train says so instead of leaving them silently idle."""
    write_csv(tmp_path / "x.csv", 104)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")  # 4 train rows: 10% rounds to 0
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--epochs", "1")
    assert r.code == 0, r.err
    assert "validation rows: none (too few train rows" in r.out, r.out
    assert "note: --patience, --restore-best select nothing without validation rows" in r.out, r.out
    # with validation rows there is nothing to say
    write_csv(tmp_path / "y.csv", 600)
    transcode(tmp_path / "y.csv", tmp_path / "e", "--test-rows", "100")
    r2 = run_cli("train", "--data", tmp_path / "e", "--run-dir", tmp_path / "run2", "--no-progress", "--max-steps", "2")
    assert r2.code == 0 and "select nothing" not in r2.out, r2.err


def test_lr_decays_at_each_plateau_and_resumes_at_its_scale(tmp_path):
    """--lr-decay-on-plateau F: each evaluation without a better validation AUC multiplies the
    learning rate by F, logged, and every later step trains at that rate; a checkpoint keeps the
    scale, --resume takes it back, and a crafted one is refused naming the field."""
    from dlrmkit.checkpoint import save_load as ckpt

    write_csv(tmp_path / "x.csv", 1200)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "200", "--val-rows", "200")
    run = tmp_path / "run"
    common = ["--data", tmp_path / "d", "--no-progress", "--preset", "tiny", "--batch-size", "64", "--lr", "0.1"]
    common += ["--numerical-transform", "signed-log"]
    common += ["--lr-decay-on-plateau", "0.5", "--patience", "0", "--log-every", "1", "--evals-per-epoch", "4"]
    r = run_cli("train", *common, "--epochs", "6", "--run-dir", run)
    assert r.code == 0, r.err
    events = [json.loads(line) for line in open(run / "log.jsonl")]
    evals = [e for e in events if e["event"] == "eval"]
    best, scale, plateaus = -1.0, 1.0, 0
    for e in events:
        if e["event"] == "eval":
            plateaus += not e["auc"] > best
            best = max(best, e["auc"])
        if e["event"] == "lr_decay":
            scale *= 0.5
            assert e["lr_scale"] == pytest.approx(scale)
        if e["event"] == "train":
            assert e["lr"] == pytest.approx(0.1 * scale)
    assert len(evals) > 4 and plateaus > 0 and scale == pytest.approx(0.5**plateaus)
    # the checkpoint keeps the scale; a crafted scale is refused
    ck = run / "checkpoints"
    path = ckpt.latest_checkpoint(str(ck))
    manifest = ckpt.read_manifest(path)
    assert manifest["lr_scale"] == pytest.approx(scale)
    manifest["lr_scale"] = 5
    json.dump(manifest, open(os.path.join(path, ckpt.MANIFEST), "w"))
    r = run_cli("train", *common, "--epochs", "7", "--checkpoint-dir", ck, "--resume", "--run-dir", tmp_path / "run2")
    assert r.code == 2 and "field 'lr_scale' is 5" in r.err, r.err  # a longer schedule: it would train on


def test_lr_decay_stops_above_zero_so_its_checkpoints_resume(tiny_data, tmp_path):
    """A decay factor that would underflow the scale to 0.0 leaves it at the smallest positive
    float instead: every checkpoint's lr_scale is one --resume accepts."""
    from dlrmkit.checkpoint import save_load as ckpt

    common = ["--data", tiny_data, "--no-progress", "--preset", "tiny", "--eval-every", "1", "--patience", "0",
              "--lr-decay-on-plateau", "1e-200", "--checkpoint-every", "4", "--run-dir", tmp_path / "run"]  # fmt: skip
    r = run_cli("train", *common, "--max-steps", "12")
    assert r.code == 0, r.err
    scales = [e["lr_scale"] for e in map(json.loads, open(tmp_path / "run" / "log.jsonl")) if e["event"] == "lr_decay"]
    assert len(scales) >= 2 and scales[0] == pytest.approx(1e-200) and all(s > 0 for s in scales)
    assert ckpt.read_manifest(ckpt.latest_checkpoint(str(tmp_path / "run" / "checkpoints")))["lr_scale"] > 0
    r = run_cli("train", *common, "--max-steps", "16", "--resume")
    assert r.code == 0 and "resumed from" in r.err + r.out, r.err


def test_numerical_features_only_train_with_buckets_and_a_fixed_preset_is_one_line(tmp_path):
    """A dataset with numerical features only has no table to look up: the recipe reads each
    numerical feature as a category too (buckets), so the default path trains; a preset without
    --numerical-buckets is refused in one line naming the dataset and the fix."""
    write_csv(tmp_path / "x.csv", 900)
    r = run_cli(
        "transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
        "--numerical", "n1,n2", "--test-rows", "150",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert open_dataset(str(tmp_path / "d"))[0].cardinalities == []
    common = ["train", "--data", tmp_path / "d", "--no-progress"]
    r = run_cli(*common, "--run-dir", tmp_path / "run", "--search-budget", "2", "--folds", "1")  # one model's config.yaml
    assert r.code == 0, r.err
    assert "no categorical features: each numerical feature is also a category" in r.out
    assert yaml.safe_load(open(tmp_path / "run" / "config.yaml"))["numerical-buckets"] > 0
    m = json.load(open(tmp_path / "run" / "metrics.json"))
    assert 0.0 <= m["auc"] <= 1.0
    r = run_cli(*common, "--run-dir", tmp_path / "run2", "--preset", "tiny")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert str(tmp_path / "d") in r.err and "--numerical-buckets" in r.err


def test_rows_of_one_label_are_refused_before_any_work(tmp_path):
    write_csv(tmp_path / "x.csv", 600)
    lines = (tmp_path / "x.csv").read_text().splitlines()
    # the 100 rows before the last 100 (the val mapping) all non-clicks
    lines[401:501] = ["0" + line[1:] for line in lines[401:501]]
    (tmp_path / "v.csv").write_text("\n".join(lines) + "\n")
    transcode(tmp_path / "v.csv", tmp_path / "v", "--test-rows", "100", "--val-rows", "100")
    for cmd in (("train", "--run-dir", tmp_path / "run", "--no-progress", "--folds", "1"), ("baseline",)):
        r = run_cli(cmd[0], "--data", tmp_path / "v", *cmd[1:])
        (line,) = r.err.strip().splitlines()
        assert r.code == 2 and "the validation rows (the dataset's val mapping (100 rows)) are all non-clicks" in line
    # cross-validated (the default on these few rows): the last fold is those rows
    r = run_cli("train", "--data", tmp_path / "v", "--run-dir", tmp_path / "run", "--no-progress")
    assert r.code == 2 and "the validation rows (fold 5 of 5 of the train and val mappings' rows" in r.err, r.err
    assert not (tmp_path / "run").exists()
    # held out of the train mapping instead: both labels there, the run goes on
    r = run_cli("baseline", "--data", tmp_path / "v", "--val-fraction", "0.2")
    assert r.code == 0, r.err
    # training rows of one label teach nothing
    (tmp_path / "t.csv").write_text("\n".join([lines[0], *("1" + line[1:] for line in lines[1:501]), *lines[501:]]))
    transcode(tmp_path / "t.csv", tmp_path / "t", "--test-rows", "100")
    r = run_cli("train", "--data", tmp_path / "t", "--preset", "tiny", "--max-steps", "2", "--no-progress")
    assert r.code == 2 and "the 450 training rows are all clicks (label 1)" in r.err, r.err
