"""A blend of the search's candidates: ensemble selection on the validation rows, each member a
run of its own, the test rows read once after all are trained, and `evaluate`, `predict` and
`--config` treating the blend as one model; a blend.yaml from elsewhere is checked field by field."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from helpers import run_cli
from dlrmkit.metrics import roc_auc
from dlrmkit.train.blend import Member, ensemble_selection, mean_logits, parse_spec
from dlrmkit.train.calibration import kept_scale, log_loss_of_logits
from test_quality import assert_test_rows_read_last, spy_reads
from test_selection import transcode, write_csv


def test_ensemble_selection_keeps_the_members_that_lower_the_validation_log_loss():
    rng = np.random.default_rng(0)
    signal = rng.normal(size=20_000)
    y = (rng.random(20_000) < 1 / (1 + np.exp(-signal))).astype(np.float32)
    # two models with independent errors and one that knows nothing, each after its temperature
    # (as the search passes them)
    raw = [signal + rng.normal(size=y.size), signal + rng.normal(size=y.size), rng.normal(size=y.size)]
    a, b, noise = (kept_scale(z, y) * z for z in raw)
    members = ensemble_selection({"a": a, "noise": noise, "b": b}, y)
    assert {m.name for m in members} == {"a", "b"} and all(m.weight >= 1 for m in members)
    blended = mean_logits([{"a": a, "b": b}[m.name] for m in members], [m.weight for m in members])
    assert log_loss_of_logits(blended, y) < min(log_loss_of_logits(a, y), log_loss_of_logits(b, y))
    # a model no mean improves on is a blend of one; a diverged one (NaN logits) is never in it
    assert ensemble_selection({"a": signal, "noise": noise}, y) == [Member("a", 1)]
    diverged = np.full(y.size, np.nan)
    assert {m.name for m in ensemble_selection({"nan": diverged, "a": a, "b": b}, y)} == {"a", "b"}


@pytest.mark.parametrize(
    "text,said",
    [("regression", "is not NAME=WEIGHT"), ("regression=0; dlrm+wide=1", "outside 1..1000"),
     ("; ".join(f"m{i}=1" for i in range(17)), "needs 1 to 16 different members"),
     ("regression=1; regression=2", "different members")],
)  # fmt: skip
def test_blend_text_is_checked(text, said):
    with pytest.raises(Exception, match=said):
        parse_spec(text)
    r = run_cli("train", "--data", "nowhere", "--blend", text)
    assert r.code == 2 and "--blend" in r.err and said in r.err and len(r.err.strip().splitlines()) <= 2, r.err


def test_blend_trains_its_members_reads_the_test_rows_once_and_scores_as_one_model(tmp_path, monkeypatch):
    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300")
    reads = spy_reads(monkeypatch)
    run = tmp_path / "run"
    spec = "regression, buckets=2; dlrm+wide=1"
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", run, "--no-progress", "--epochs", "2", "--blend", spec)
    assert r.code == 0, r.err
    assert "blend member run 1/4: regression, buckets, seed 0 (weight 2)" in r.out and "recipe small-data" in r.out, r.out
    assert_test_rows_read_last(reads)
    monkeypatch.undo()
    ck = run / "checkpoints"
    doc = yaml.safe_load(open(ck / "blend.yaml"))
    # each member trained with two seeds (--blend-seeds' default), sharing the member's weight
    runs = [("regression, buckets", 0, 2), ("regression, buckets", 1, 2), ("dlrm+wide", 0, 1), ("dlrm+wide", 1, 1)]
    assert [(m["name"], m["seed"], m["weight"]) for m in doc["members"]] == runs
    for m in doc["members"]:  # each member run is a run of its own: checkpoints, config, log
        assert (ck / m["folder"] / "latest").exists() and (ck / m["folder"] / "config.yaml").exists()
        assert yaml.safe_load(open(ck / m["folder"] / "config.yaml"))["seed"] == m["seed"]
    assert yaml.safe_load(open(ck / "regression-buckets-seed0" / "config.yaml"))["deep"] is False
    m = json.load(open(run / "metrics.json"))
    assert [(b["name"], b["seed"], b["weight"]) for b in m["blend"]] == runs and 0 < m["temperature"]
    assert m["blend"][2]["val_auc"] != m["blend"][3]["val_auc"]  # the seeds train different models
    # the blend's test figures are the weighted mean of its members' logits, as evaluate scores it
    r = run_cli("evaluate", "--data", tmp_path / "d", "--checkpoint", ck, "--metrics-json", tmp_path / "e.json")
    assert r.code == 0, r.err
    e = json.load(open(tmp_path / "e.json"))
    assert e["auc"] == pytest.approx(m["auc"], abs=1e-9) and e["logloss"] == pytest.approx(m["logloss"], abs=1e-7)
    # ... and as predict scores the raw rows (the test mapping is the CSV's last 300 rows)
    with open(tmp_path / "x.csv") as f:
        lines = f.readlines()
    (tmp_path / "tail.csv").write_text(lines[0] + "".join(lines[-300:]))
    r = run_cli("predict", "--checkpoint", ck, "--input", tmp_path / "tail.csv", "--output", tmp_path / "p.csv")
    assert r.code == 0, r.err
    p = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    assert roc_auc(p[:, 1], p[:, 2]) == pytest.approx(m["auc"], abs=1e-6)
    # one model per graph: export names the members instead
    r = run_cli("export", "--checkpoint", ck, "--out", tmp_path / "m.pt")
    assert r.code == 2 and "a blend of 4 models" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    # config.yaml repeats the blend, without the search
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert cfg["blend"] == spec and cfg["search-budget"] == 0
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "run2", "--no-progress")
    assert r2.code == 0 and "search: 7" not in r2.out, r2.out + r2.err
    assert json.load(open(tmp_path / "run2" / "metrics.json"))["auc"] == m["auc"]
    r = run_cli("report", run)
    text = (run / "report.md").read_text()
    assert r.code == 0 and "a blend of 2 member(s), 4 run(s)" in text, text
    assert "best validation AUC" not in text  # a blend has no best evaluation: not "n/a"
    assert "(the blend)" in text and "(the selected model" not in text  # no step: its members' steps together
    # one line a member: its weight, its runs and their folders
    assert "  - dlrm+wide x1, 2 runs: seed 0, seed 1 (`dlrm-wide-seed0/` to `dlrm-wide-seed1/`)" in text, text
    # one seed: each member one run, in a folder named after it
    r3 = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "run3", "--no-progress",
                 "--blend-seeds", "1")  # fmt: skip
    assert r3.code == 0 and "blend member run 2/2: dlrm+wide, seed 0 (weight 1)" in r3.out, r3.out + r3.err
    doc = yaml.safe_load(open(tmp_path / "run3" / "checkpoints" / "blend.yaml"))
    assert [m["folder"] for m in doc["members"]] == ["regression-buckets", "dlrm-wide"]
    # a blend is written at its run's end: --resume says the run ended, and leaves its folder as it is
    before = sorted(p.name for p in ck.iterdir())
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", run, "--resume", "--no-progress")
    assert r.code == 0 and r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert "the run ended" in r.err and "holds its blend" in r.err, r.err
    assert sorted(p.name for p in ck.iterdir()) == before


def test_blend_is_refused_where_it_cannot_run(tmp_path):
    write_csv(tmp_path / "x.csv", 600)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")
    for extra, said in (
        (["--blend", "regression=1; nonesuch=1"], "no candidate named 'nonesuch'"),
        (["--blend", "regression=1; dlrm+wide=1", "--preset", "tiny"], "--preset tiny"),
        (["--blend", "regression=1; dlrm+wide=1", "--val-fraction", "0"], "no validation rows"),
    ):
        r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "r", "--no-progress", *extra)
        assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, (extra, r.err)
        assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_a_bad_test_file_stops_a_blend_before_anything_is_saved(dataset_copy, tmp_path):
    """As one model does: the members train, the test read fails with one line, and no member's
    checkpoint and no blend.yaml are left to look like a finished blend."""
    label = np.memmap(dataset_copy / "test" / "label.bin", dtype=np.uint8, mode="r+")
    label[17] = 255
    label.flush()
    run = tmp_path / "r"
    r = run_cli("train", "--data", dataset_copy, "--run-dir", run, "--no-progress", "--max-steps", "2",
                "--blend", "regression=1; dlrm+wide=1")  # fmt: skip
    assert r.code == 2 and "row 17 has label 255" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (run / "checkpoints" / "blend.yaml").exists()
    assert not list((run / "checkpoints").glob("*/step_*"))
    # the run's log says it failed, and why: report says so, not "unfinished"
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert records and records[-1]["event"] == "failed" and "row 17 has label 255" in records[-1]["why"], records
    assert run_cli("report", run).code == 0
    text = (run / "report.md").read_text()
    assert "status: failed: " in text and "row 17 has label 255" in text, text


@pytest.fixture(scope="module")
def blend_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("blend")
    write_csv(tmp / "x.csv", 600)
    transcode(tmp / "x.csv", tmp / "d", "--test-rows", "100")
    r = run_cli("train", "--data", tmp / "d", "--run-dir", tmp / "run", "--no-progress", "--epochs", "1",
                "--blend", "regression=1; dlrm+wide=1", "--blend-seeds", "1")  # fmt: skip
    assert r.code == 0, r.err
    return tmp


@pytest.mark.parametrize(
    "doc,said",
    [
        ("- 1\n", "not a blend description"),
        ({"members": [], "scale": 1.0}, "'members' must be a list"),
        ({"members": [{"folder": "regression", "weight": 1}] * 161, "scale": 1.0}, "a list of 1 to 160 members"),
        ({"members": [{"folder": "../run", "weight": 1}], "scale": 1.0}, "one plain folder name"),
        ({"members": [{"folder": "/etc", "weight": 1}], "scale": 1.0}, "one plain folder name"),
        ({"members": [{"folder": "regression", "weight": 0}], "scale": 1.0}, "'weight' must be a whole number"),
        ({"members": [{"folder": "regression", "weight": True}], "scale": 1.0}, "'weight' must be a whole number"),
        ({"members": [{"folder": "regression", "weight": 1}], "scale": ".nan"}, "'scale' must be a number"),
        ({"members": [{"folder": "regression", "weight": 1}], "scale": 1e9}, "'scale' must be a number"),
        ({"members": [{"folder": "missing", "weight": 1}], "scale": 1.0}, "is not a folder inside"),
        ({"members": [{"folder": "link", "weight": 1}], "scale": 1.0}, "is not a folder inside"),
        ({"members": [{"folder": "regression", "weight": 1}] * 2, "scale": 1.0}, "listed twice"),
    ],
)
def test_a_crafted_blend_file_is_one_line(blend_run, tmp_path, doc, said):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(blend_run / "run" / "checkpoints", ck)
    os.symlink(ck / "regression", ck / "link")
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc).replace("'.nan'", ".nan")
    (ck / "blend.yaml").write_text(text)
    for argv in (["evaluate", "--data", blend_run / "d"], ["export", "--out", tmp_path / "m.pt"]):
        r = run_cli(*argv, "--checkpoint", ck)
        assert r.code == 2 and said in r.err and "blend.yaml" in r.err, (argv, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err


def test_a_fresh_run_does_not_write_into_a_blends_folder(blend_run, tmp_path):
    """A blend's folder holds its members' checkpoints beside blend.yaml: a run without --resume
    given it as --checkpoint-dir is refused before any work, the folder left as it is (a run wrote
    its own step folder and `latest` beside the blend, and a blend replaced its blend.yaml)."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(blend_run / "run" / "checkpoints", ck)
    before = sorted((p.relative_to(ck), p.read_bytes() if p.is_file() else None) for p in ck.rglob("*"))
    for extra in (["--preset", "tiny"], ["--blend", "regression=1; dlrm+wide=1", "--blend-seeds", "1", "--seed", "3"]):
        r = run_cli("train", "--data", blend_run / "d", "--checkpoint-dir", ck, "--run-dir", tmp_path / "r",
                    "--no-progress", "--max-steps", "2", *extra)  # fmt: skip
        assert r.code == 2 and "another run's blend (blend.yaml)" in r.err, (extra, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err
        assert not (tmp_path / "r").exists()
    assert sorted((p.relative_to(ck), p.read_bytes() if p.is_file() else None) for p in ck.rglob("*")) == before


def test_a_member_scoring_nan_is_refused(blend_run, tmp_path):
    """A member whose manifest's numerical statistics overflow the model's float32 scores every row
    NaN: `evaluate` of the blend is one line, not a NaN log loss and a numpy warning with exit 0."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(blend_run / "run" / "checkpoints", ck)
    for fp in ck.glob("regression/step_*/manifest.json"):
        m = json.loads(fp.read_text())
        n = m["model_config"]["num_numerical"]
        m["model_config"].update(numerical_mean=[1e308] * n, numerical_std=[1.0] * n)
        fp.write_text(json.dumps(m))
    r = run_cli("evaluate", "--data", blend_run / "d", "--checkpoint", ck)
    assert r.code == 2 and "the model scores test rows as NaN" in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err


def test_predict_checks_every_members_dataset(blend_run, tmp_path):
    """predict reads the vocabulary at the path the first member records; each member's recorded
    vocabulary fingerprint is compared with it: a member trained with another is one line naming
    it, the blend as trained scores."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(blend_run / "run" / "checkpoints", ck)
    lines = (blend_run / "x.csv").read_text().splitlines(keepends=True)
    (tmp_path / "tail.csv").write_text(lines[0] + "".join(lines[-100:]))
    r = run_cli("predict", "--checkpoint", ck, "--input", tmp_path / "tail.csv")
    assert r.code == 0 and "scored 100" in r.err, r.err
    for fp in ck.glob("dlrm-wide/step_*/manifest.json"):  # the second member
        m = json.loads(fp.read_text())
        m["dataset"]["vocabulary"] = "0" * 64
        fp.write_text(json.dumps(m))
    r = run_cli("predict", "--checkpoint", ck, "--input", tmp_path / "tail.csv")
    assert r.code == 2 and r.out == "", r.err
    (line,) = r.err.strip().splitlines()
    assert f"{ck / 'dlrm-wide'}: the model was trained on {blend_run / 'd'}, but {blend_run / 'd'}" in line, line
    assert "holds another vocabulary" in line, line


def log_events(path) -> list[tuple]:
    """A log's records without their times: (event, step, AUC), a NaN AUC as None."""
    return [(r["event"], r.get("step"), r.get("auc") if r.get("auc") == r.get("auc") else None)
            for r in map(json.loads, open(path))]  # fmt: skip


def test_a_searched_blend_takes_over_the_search_runs_and_its_config_repeats_it(tmp_path):
    """Each member's first seed is the search's own run of that candidate (the same training, not
    done again): its folder holds a checkpoint and the training's whole log, as a fresh member run's
    does, and the run's config.yaml, which trains every member run afresh, gives the same figures."""
    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300")
    run, again = tmp_path / "run", tmp_path / "again"
    common = ("--no-progress", "--epochs", "2", "--folds", "1")  # held-out rows, not folds: tests/test_folds.py
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", run, "--search-budget", "3", *common)
    assert r.code == 0 and "blend:" in r.out, r.out + r.err  # these rows and seed end in a blend
    doc = yaml.safe_load(open(run / "checkpoints" / "blend.yaml"))
    weights = {m["name"]: m["weight"] for m in doc["members"]}
    assert r.out.count("(the search's run of it, not trained again)") == len(weights) >= 2, r.out
    # two seeds for a member weighing a tenth of the blend or more, one for the others
    runs = [sum(m["name"] == n for m in doc["members"]) for n in weights]
    assert runs == [2 if w >= 0.1 * sum(weights.values()) else 1 for w in weights.values()], (runs, weights)
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", again, *common)
    assert r2.code == 0 and "not trained again" not in r2.out, r2.out + r2.err
    a, b = (json.load(open(f / "metrics.json")) for f in (run, again))
    assert a["auc"] == b["auc"] and a["logloss"] == b["logloss"] and a["val_logloss"] == b["val_logloss"]
    for m in doc["members"]:
        taken, fresh = (log_events(f / "checkpoints" / m["folder"] / "log.jsonl") for f in (run, again))
        assert taken == fresh, m["folder"]
        # the member's run to its end, then its refit on the training and validation rows to the refit's
        events = [e for e, _, _ in taken]
        run1, refit = events[: events.index("refit")], events[events.index("refit") :]
        assert run1[-2:] == ["calibration", "end"] and "eval" in run1 and run1.count("end") == 1
        assert "test" not in run1  # a member reads no test rows: the blend reads them, once
        assert refit == ["refit", "end"]  # no evaluation, and no test rows: the blend reads them


def test_a_run_takes_over_a_trained_model_only_where_it_would_train_the_same(tiny_data, tmp_path):
    from dlrmkit.config import TrainConfig
    from dlrmkit.train.trainer import Trainer

    def cfg(**kw):
        return TrainConfig.of(data=str(tiny_data), preset="tiny", max_steps=6, eval_every=3, progress=False, **kw)

    trainer = Trainer(cfg(), keep_log=True)
    m = trainer.fit(save=False)
    assert trainer.take_over(cfg(lr=0.5, checkpoint_dir=str(tmp_path / "a")), m) is None  # another training
    assert not (tmp_path / "a").exists()
    taken = trainer.take_over(cfg(checkpoint_dir=str(tmp_path / "b"), calibration="temperature"), m)
    assert taken is not None and taken["val_auc"] == m["val_auc"] and taken["temperature"] > 0
    events = [e for e, _, _ in log_events(tmp_path / "b" / "log.jsonl")]
    assert events.count("eval") == 2 and events[-3:] == ["calibration", "test", "end"] and events.count("end") == 1
    trainer.save_final()
    assert (tmp_path / "b" / "latest").exists()
