"""--time-limit: a searched run leaves out its optional training where it would pass the limit
(the search's later candidates, then a blend's second seeds, then its refits, or a single
choice's refit), ends a candidate's training at an epoch end by its deadline, says so, keeps the
options given, and config.yaml repeats what ran."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import yaml

from helpers import run_cli
from dlrmkit.train import time_limit
from dlrmkit.train.time_limit import BlendTime, Clock, blend_time, refit_seconds, trim
from test_selection import transcode, write_csv


def spent(seconds: float, limit: float) -> Clock:
    """A clock that has run `seconds` of `limit`."""
    return Clock(limit, time.perf_counter() - seconds)


@pytest.mark.parametrize(
    "seconds, cost, given, dropped",
    [
        (50, BlendTime(seeds=20, refits=20), {}, (False, False)),  # 90 of 100: all of it
        (50, BlendTime(seeds=30, refits=30), {}, (True, False)),  # 110: the seeds go, the refits fit
        (50, BlendTime(seeds=30, refits=60), {}, (True, True)),  # the refits alone pass it too
        (50, BlendTime(seeds=30, refits=60), {"seeds_given": True, "refit_given": True}, (False, False)),
        (50, BlendTime(seeds=0, refits=60), {}, (False, True)),  # no second seed to leave out
        (500, BlendTime(seeds=0, refits=0), {}, (False, False)),  # nothing optional left
    ],
)
def test_a_blend_leaves_out_its_second_seeds_then_its_refits(seconds, cost, given, dropped):
    flags = {"seeds_given": False, "refit_given": False, **given}
    seeds, refits, lines = trim(spent(seconds, 100.0), cost, **flags)
    assert (seeds, refits) == dropped
    assert len(lines) == seeds + refits
    assert all("--time-limit (1.66667 min)" in line for line in lines), lines
    assert trim(spent(seconds, 0.0), cost, **flags) == (False, False, [])  # 0: no limit


def test_the_search_starts_candidates_only_in_its_share_of_the_limit():
    share = time_limit.SEARCH_SHARE * 100
    assert spent(share - 5, 100.0).search_open() and not spent(share + 5, 100.0).search_open()
    assert spent(1e6, 0.0).search_open()


def candidate(name: str, seconds: float, selected: int, steps: int, train: int = 900, val: int = 100, runs: int = 1):
    trainer = SimpleNamespace(train_set=range(train), val_set=range(val))
    metrics = {"selected_step": selected, "steps": steps}
    return SimpleNamespace(name=name, result={"seconds": seconds}, trained=[(trainer, None, metrics)] * runs)


def test_a_refit_is_timed_by_the_steps_and_rows_it_repeats():
    # a run of 10 s that chose step 40 of 100: 40% of its steps on 1000/900 of its rows, and its setup
    assert refit_seconds(candidate("a", 10, 40, 100)) == pytest.approx(10 * (time_limit.REFIT_SETUP + 0.4 * 1000 / 900))
    assert refit_seconds(candidate("r", 10, 0, 0)) == pytest.approx(10 * time_limit.REFIT_SETUP)  # a regression
    folds = candidate("f", 50, 40, 100, runs=5)  # a candidate's 5 fold runs: 10 s each
    assert refit_seconds(folds) == refit_seconds(candidate("a", 10, 40, 100))
    tried = [candidate("a", 10, 40, 100), candidate("b", 20, 50, 100)]
    ra, rb = (refit_seconds(c) for c in tried)
    # "a" on two seeds: the second seed is one more run and its refit; "b" on one
    assert blend_time({"a": 2, "b": 1}, tried, refitting=True, folds=False) == BlendTime(10 + ra, ra + rb)
    assert blend_time({"a": 2, "b": 1}, tried, refitting=False, folds=False) == BlendTime(10, 0)
    # with folds, a second seed is a refit only
    assert blend_time({"a": 2, "b": 1}, tried, refitting=True, folds=True) == BlendTime(ra, ra + rb)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("limit")
    write_csv(root / "x.csv", 1500)
    transcode(root / "x.csv", root / "d", "--test-rows", "300")
    return root / "d"


COMMON = ("--no-progress", "--epochs", "2", "--folds", "1")  # held-out rows: a blend refits and has seeds


def test_past_the_search_share_no_further_candidate_is_tried(data, tmp_path):
    r = run_cli("train", "--data", data, "--run-dir", tmp_path / "run", "--time-limit", "0.0001", *COMMON)
    assert r.code == 0, r.out + r.err
    assert r.out.count("not tried (--time-limit)") == 6, r.out  # of 7 candidates, the first is tried
    assert (
        "search: 1 candidate recipes" in r.out
        and f"past {time_limit.SEARCH_SHARE:.0%} of --time-limit (0.0001 min)" in r.out
    ), r.out
    doc = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    # the regression, unsearched, its search run (its refit would pass the limit too)
    assert (doc["search-budget"], doc["blend"], doc["refit"]) == (0, "regression=1", False), doc


def test_a_blend_past_the_limit_is_trained_once_per_member_unrefitted_and_its_config_repeats_it(
    data, tmp_path, monkeypatch
):
    """The search keeps its candidates (its share raised past any run's time) while the blend's second
    seeds and refits are left out: each member is the search's own run, config.yaml says
    --blend-seeds 1 and --refit false, and `train --config` trains the same blend again."""
    monkeypatch.setattr(time_limit, "SEARCH_SHARE", 1e9)
    run, again = tmp_path / "run", tmp_path / "again"
    r = run_cli("train", "--data", data, "--run-dir", run, "--search-budget", "3", "--time-limit", "0.001", *COMMON)
    assert r.code == 0 and "blend:" in r.out, r.out + r.err  # these rows and seed end in a blend
    assert "time limit: each member trained on one seed (--blend-seeds 1)" in r.out, r.out
    assert "time limit: no refit (--refit false)" in r.out and "refit on the training" not in r.out, r.out
    doc = yaml.safe_load(open(run / "config.yaml"))
    assert doc["blend-seeds"] == 1 and doc["refit"] is False, doc
    members = yaml.safe_load(open(run / "checkpoints" / "blend.yaml"))["members"]
    assert len({m["name"] for m in members}) == len(members) >= 2  # one run per member
    assert r.out.count("(the search's run of it, not trained again)") == len(members), r.out
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", again, *COMMON[:1])
    assert r2.code == 0 and "time limit" not in r2.out, r2.out + r2.err
    a, b = (json.load(open(f / "metrics.json")) for f in (run, again))
    assert (a["auc"], a["logloss"]) == (b["auc"], b["logloss"]) and not a["refit"]


def test_options_given_are_kept_past_the_limit(data, tmp_path, monkeypatch):
    monkeypatch.setattr(time_limit, "SEARCH_SHARE", 1e9)
    r = run_cli("train", "--data", data, "--run-dir", tmp_path / "run", "--search-budget", "3", "--time-limit", "0.001",
                "--blend-seeds", "2", "--refit", "true", *COMMON)  # fmt: skip
    assert r.code == 0 and "blend:" in r.out and "time limit" not in r.out, r.out + r.err
    doc = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert doc["blend-seeds"] == 2 and doc["refit"] is True
    assert r.out.count("refit on the training and validation rows") > len(doc["blend"].split(";")), r.out


def test_cross_validated_past_the_limit_the_run_is_the_fold_models_unrefitted(data, tmp_path, monkeypatch):
    """Between FOLD_ROWS and FOLD_REFIT_ROWS the kept candidates are refitted on all rows; where
    the refits would pass the limit, each member is its fold models, averaged, as up to FOLD_ROWS."""
    from dlrmkit.train import recipe

    monkeypatch.setattr(recipe, "FOLD_ROWS", 1199)  # the 1,200 training rows: folds, then refits
    monkeypatch.setattr(time_limit, "SEARCH_SHARE", 1e9)
    run = tmp_path / "run"
    r = run_cli("train", "--data", data, "--run-dir", run, "--search-budget", "2", "--time-limit", "0.001",
                "--no-progress", "--epochs", "2")  # fmt: skip
    assert r.code == 0 and "cross-validation (--folds 5)" in r.out, r.out + r.err
    assert "time limit: no refit (--refit false)" in r.out and "refit on all rows" not in r.out, r.out
    doc = yaml.safe_load(open(run / "config.yaml"))
    assert (doc["folds"], doc["refit"]) == (5, False), doc
    members = yaml.safe_load(open(run / "checkpoints" / "blend.yaml"))["members"]
    for name in {m["name"] for m in members}:
        assert sorted(m["fold"] for m in members if m["name"] == name) == [1, 2, 3, 4, 5]
    assert not any(m.get("refit") for m in members) and not json.load(open(run / "metrics.json"))["refit"]


def test_a_run_ended_by_its_deadline_is_the_run_of_the_epochs_it_trained(data, monkeypatch):
    """Trainer.fit's deadline: the run ends at the epoch end where another epoch would pass it, its
    --epochs then says how many it trained, and it is, weight for weight, the run of that many."""
    import torch

    from dlrmkit.config import TrainConfig
    from dlrmkit.train import trainer as trainer_module
    from dlrmkit.train.trainer import Trainer

    def config(**kw):
        values = dict(data=str(data), preset="tiny", epochs=6, batch_size=64, lr=0.5, progress=False,
                      final_checkpoint=False, restore_best=True, patience=6, lr_decay_on_plateau=0.5,
                      numerical_transform="signed-log", standardize_numerical=True)  # fmt: skip
        return TrainConfig.of(**{**values, **kw})

    ends = []  # the epoch ends asked: at the third, another epoch would pass the deadline

    def past(deadline, epoch_seconds):
        ends.append(epoch_seconds)
        return len(ends) >= 3

    monkeypatch.setattr(trainer_module, "past", past)
    cut = Trainer(config())
    m = cut.fit(save=False, deadline=time.perf_counter() + 1e6)
    assert len(ends) == 3 and all(s > 0 for s in ends) and m["deadline_epochs"] == 3 == cut.cfg.schedule.epochs
    whole = Trainer(config(epochs=3))
    w = whole.fit(save=False)
    assert "deadline_epochs" not in w and m["steps"] == w["steps"] == 3 * len(whole.loader)
    for key in ("auc", "logloss", "val_auc", "val_logloss", "selected_step", "temperature"):
        assert m[key] == w[key], key
    for a, b in zip(cut.model.state_dict().values(), whole.model.state_dict().values()):
        assert torch.equal(a, b)
    assert cut.lr_scales == whole.lr_scales
    assert "deadline_epochs" not in Trainer(config(epochs=2)).fit(save=False)  # no deadline: not asked


def test_candidates_past_the_deadline_are_the_candidates_of_the_epochs_they_trained_and_config_repeats_them(
    data, tmp_path, monkeypatch
):
    """Without --epochs given, each candidate's training ends by the limit's deadline: a candidate
    then carries its epochs in its name ("NAME, N epochs"), the blend of such candidates takes over
    their search runs, and `train --config` trains the same blend again from its names."""
    monkeypatch.setattr(time_limit, "SEARCH_SHARE", 1e9)  # every candidate tried, each ended at its first epoch end
    run, again = tmp_path / "run", tmp_path / "again"
    r = run_cli("train", "--data", data, "--run-dir", run, "--search-budget", "4", "--time-limit", "0.001",
                "--folds", "1", "--no-progress")  # fmt: skip
    assert r.code == 0 and "blend:" in r.out, r.out + r.err  # these rows and seed end in a blend
    assert r.out.count("ended by --time-limit after its epoch 1:") == 4, r.out
    doc = yaml.safe_load(open(run / "config.yaml"))
    names = [item.rpartition("=")[0].strip() for item in doc["blend"].split(";")]
    assert len(names) >= 2 and all(n.endswith(", 1 epoch") for n in names), doc["blend"]
    assert doc.get("epochs") is None  # each member's own, from its name
    assert r.out.count("(the search's run of it, not trained again)") == len(names), r.out
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", again, "--no-progress")
    assert r2.code == 0 and "time limit" not in r2.out and "not trained again" not in r2.out, r2.out + r2.err
    a, b = (json.load(open(f / "metrics.json")) for f in (run, again))
    assert (a["auc"], a["logloss"]) == (b["auc"], b["logloss"])
    # a name of no candidate, cut or not: one line naming the candidates
    bad = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "bad", "--no-progress",
                  "--blend", "dlrm+wide, 0 epochs=1")  # fmt: skip
    assert bad.code == 2 and "no candidate named 'dlrm+wide, 0 epochs'" in bad.err, bad.out + bad.err


def test_a_single_choice_whose_refit_would_pass_the_limit_is_its_search_run(data, tmp_path):
    run, again = tmp_path / "run", tmp_path / "again"
    r = run_cli("train", "--data", data, "--run-dir", run, "--search-budget", "1", "--time-limit", "0.00001",
                "--folds", "1", "--no-progress")  # fmt: skip
    assert r.code == 0, r.out + r.err
    assert "time limit: no refit (--refit false), the run is the search's run of regression, 1 epoch" in r.out, r.out
    assert "refit on the training" not in r.out and "(the search's run of it, not trained again)" in r.out, r.out
    doc = yaml.safe_load(open(run / "config.yaml"))
    assert (doc["blend"], doc["blend-seeds"], doc["refit"]) == ("regression, 1 epoch=1", 1, False), doc
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", again, "--no-progress")
    assert r2.code == 0, r2.out + r2.err
    a, b = (json.load(open(f / "metrics.json")) for f in (run, again))
    assert (a["auc"], a["logloss"]) == (b["auc"], b["logloss"]) and not a["refit"]
    # --refit given: kept, past the limit too
    kept = run_cli("train", "--data", data, "--run-dir", tmp_path / "kept", "--search-budget", "1", "--time-limit",
                   "0.00001", "--folds", "1", "--no-progress", "--refit", "true")  # fmt: skip
    assert kept.code == 0 and "refit on the training" in kept.out and "time limit: no refit" not in kept.out, kept.out


def test_a_candidate_cut_to_its_epochs_is_named_so_and_read_back():
    from dlrmkit.train.recipe_search import candidates, cut, named

    pool = candidates(3)
    first = pool[0]
    assert named(pool, first.name) is first
    three = named(pool, "dlrm+wide, buckets, 3 epochs")
    assert three == cut(named(pool, "dlrm+wide, buckets"), 3) and three.values["epochs"] == 3
    assert three.values["numerical_buckets"] == named(pool, "dlrm+wide, buckets").values["numerical_buckets"]
    assert named(pool, "regression, 1 epoch").values == {**first.values, "epochs": 1}
    for bad in ("regression, 1 epochs", "regression, 01 epochs", "regression, 0 epochs", "regression, -2 epochs",
                "regression, 2 epochs, 2 epochs", "nothing, 2 epochs", "regression, ² epochs", "regression,"):  # fmt: skip
        assert named(pool, bad) is None, bad
