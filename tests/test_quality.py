"""Model quality tools: dropout, the FM term, Adam/AdamW beside the sparse tables, the temperature
fitted on validation rows and the calibration measures, the regression the wide term can start
from, and `--preset auto`'s search over candidate recipes on the validation rows."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import yaml

from helpers import run_cli
from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.train import recipe_search
from test_selection import transcode, write_csv

KDD12 = os.environ.get("DLRMKIT_KDD12") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "kdd12")


def small_model(**kw) -> DLRM:
    cfg = ModelConfig(num_numerical=2, table_sizes=[7, 5, 3], embedding_dim=4, bottom_mlp=[8, 4], top_mlp=[8, 1], **kw)
    model = DLRM(cfg)
    model.reset_parameters(0)
    return model


def batch(n: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, 2, generator=g)
    ids = torch.stack([torch.randint(0, s, (n,), generator=g) for s in (7, 5, 3)], dim=1)
    return dense, ids


def test_dropout_acts_in_training_only_and_keeps_plain_names():
    plain, dropped = small_model(), small_model(dropout=0.5)
    assert set(plain.state_dict()) <= set(small_model(dropout=0.0).state_dict())
    assert any(isinstance(m, torch.nn.Dropout) for m in dropped.modules())
    assert not any(isinstance(m, torch.nn.Dropout) for m in plain.modules())
    dense, ids = batch()
    dropped.eval()
    assert torch.equal(dropped(dense, ids), dropped(dense, ids))  # no dropout in eval mode
    dropped.train()
    torch.manual_seed(0)
    a = dropped(dense, ids)
    torch.manual_seed(1)
    assert not torch.equal(a, dropped(dense, ids))


def test_fm_term_is_the_sum_of_pairwise_dot_products():
    from dlrmkit.model.fm import FMTerm

    pooled = torch.randn(5, 4, 3)
    want = sum((pooled[:, i] * pooled[:, j]).sum(1) for i in range(4) for j in range(i + 1, 4))
    fm = FMTerm()
    assert torch.allclose(fm(pooled), want, atol=1e-5)
    with torch.no_grad():
        fm.weight.fill_(0.5)
    assert torch.allclose(fm(pooled), 0.5 * want, atol=1e-5)


def test_wide_and_fm_without_the_deep_part():
    model = small_model(wide=True, fm=True, deep=False)
    dense, ids = batch()
    pooled = model.embeddings(ids)
    emb, first = pooled[..., :-1], pooled[..., -1].sum(1) + model.linear(dense).squeeze(1)
    want = first + model.fm(emb)
    assert torch.allclose(model(dense, ids), want, atol=1e-6)
    from dlrmkit.errors import DlrmkitError

    with pytest.raises(DlrmkitError, match="wide or the FM term"):
        small_model(deep=False)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_trains_the_mlps_at_its_own_rate_beside_adagrad_tables(name):
    from dlrmkit.optim.build import build_optimizers
    from dlrmkit.optim.sparse import SparseAdagrad

    model = small_model()
    dense_opt, sparse_opt = build_optimizers(model, name, 0.05, dense_lr=0.001, dense_weight_decay=0.1)
    assert isinstance(sparse_opt, SparseAdagrad)
    ref = [p.detach().clone() for p in model.dense_parameters()]
    torch_opt = (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(ref, lr=0.001, weight_decay=0.1)
    dense, ids = batch()
    y = torch.randint(0, 2, (16,)).float()
    for _ in range(3):
        for opt in (dense_opt, sparse_opt):
            opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), y)
        loss.backward()
        for r, p in zip(ref, model.dense_parameters()):
            r.grad = p.grad.clone()
        dense_opt.step()
        torch_opt.step()
    for r, p in zip(ref, model.dense_parameters()):
        assert torch.allclose(r, p, atol=1e-6)
    assert dense_opt.param_groups[0]["lr"] == 0.05  # the schedule's value, scaled only inside step


def test_temperature_recovers_a_known_scale_and_folds_into_the_weights():
    from dlrmkit.train.calibration import expected_calibration_error, fit_scale, fold_scale, reliability

    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 200_000)
    y = (rng.random(len(z)) < 1 / (1 + np.exp(-z))).astype(np.float64)
    assert fit_scale(3.0 * z, y) == pytest.approx(1 / 3, rel=0.02)  # an overconfident model: T = 3
    for kw in ({"wide": True}, {"wide": True, "fm": True}, {"wide": True, "fm": True, "deep": False}, {}):
        model = small_model(**kw)
        dense, ids = batch()
        before = model(dense, ids).detach()
        fold_scale(model, 0.4)
        assert torch.allclose(model(dense, ids), 0.4 * before, atol=1e-5), kw
    p = np.array([0.1, 0.1, 0.9, 0.9])
    labels = np.array([0, 0, 1, 0])
    assert reliability(labels, p) == [[0.1, 0.0, 2], [0.9, 0.5, 2]]
    assert expected_calibration_error(labels, p) == pytest.approx(0.5 * 0.1 + 0.5 * 0.4)


def test_no_temperature_where_the_validation_rows_cannot_fit_one():
    from dlrmkit.train.calibration import MIN_LABEL_ROWS, fit_scale, unfitted

    rng = np.random.default_rng(1)
    z = rng.normal(0, 2, 2000)
    y = (rng.random(len(z)) < 1 / (1 + np.exp(-z))).astype(np.float64)
    assert unfitted(3.0 * z, y) is None and fit_scale(3.0 * z, y) < 0.5  # an overconfident model, fitted
    # every click above every non-click: the log loss falls without end as T falls
    separated = np.where(y == 1, np.abs(z) + 0.1, -np.abs(z))
    assert "every click above every non-click" in unfitted(separated, y)
    assert fit_scale(separated, y) == 1.0
    # a handful of clicks: the temperature would follow their noise
    few = np.zeros(500)
    few[: MIN_LABEL_ROWS - 1] = 1
    assert "9 clicks and 491 non-clicks" in unfitted(rng.normal(size=500), few)
    assert fit_scale(5.0 * rng.normal(size=500) + 3 * few, few) == 1.0


def test_three_validation_rows_leave_the_temperature_at_one_and_say_why(tmp_path):
    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300", "--val-rows", "3")
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--epochs", "2",
                "--search-budget", "0", "--calibration", "temperature")  # fmt: skip
    assert r.code == 0, r.err
    assert "calibration: temperature 1 (the validation rows hold" in r.err, r.err
    metrics = json.load(open(tmp_path / "run" / "metrics.json"))
    assert metrics["temperature"] == 1.0  # fitted on these 3 rows (1 click) it was 0.59


def test_wide_init_starts_the_model_at_the_validated_regression(tmp_path):
    from dlrmkit.config import TrainConfig
    from dlrmkit.train import regression
    from dlrmkit.train.trainer import Trainer

    write_csv(tmp_path / "x.csv", 900)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100", "--val-rows", "150")
    cfg = TrainConfig.of(
        data=str(tmp_path / "d"), wide=True, wide_init="regression", numerical_transform="signed-log", progress=False
    )
    trainer = Trainer(cfg)
    best, tried, lr = regression.select(trainer.model_cfg.table_sizes, trainer.train_set, trainer.val_set, True)
    assert trainer.wide_init["c"] == best["c"] and len(tried) < len(regression.C_GRID)
    rows = trainer.val_set.read(0, len(trainer.val_set))
    dense, ids = torch.tensor(np.array(rows.dense)), torch.from_numpy(rows.ids.astype(np.int64))
    with torch.no_grad():
        got = trainer.model.eval()(dense, ids).double()
    assert torch.allclose(got, lr.logits(dense, ids), atol=1e-4)  # the deep part starts at 0


@pytest.mark.parametrize("held", [True, False], ids=["batches-held", "batches-streamed"])
def test_the_regression_fit_is_the_minimum_of_its_objective(tmp_path, monkeypatch, held):
    """The fit's written-out gradient (sparse products on batches held in memory, a gather and a
    bincount on streamed ones) against autograd's of the same objective: ~0 at the fit."""
    from dlrmkit.data.split_binary import open_dataset
    from dlrmkit.train import regression

    write_csv(tmp_path / "x.csv", 900)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "100")
    spec, train, _ = open_dataset(str(tmp_path / "d"))
    if not held:
        monkeypatch.setattr(regression, "HELD_VALUES", 0)
    c = 0.3
    lr = regression.train_on(spec.cardinalities, train, c, signed=True, batch_size=256)
    rows = train.read(0, len(train))
    dense, ids = torch.tensor(np.array(rows.dense)), torch.from_numpy(rows.ids.astype(np.int64))
    y = torch.from_numpy(np.asarray(rows.labels, dtype=np.float64))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(lr.logits(dense, ids), y, reduction="sum")
    grads = torch.autograd.grad(loss + lr.penalty() / c, lr.parameters())
    assert max(float(g.abs().max()) for g in grads) < 1e-3 * len(train)  # L-BFGS's stop: 1e-5 per row
    assert float(lr.ids.detach().abs().max()) > 0.05 and float(lr.num.detach().abs().max()) > 0.05  # it moved


def spy_reads(monkeypatch) -> list[str]:
    """Every read of a mapping from now on, as 'mapping:rows', in order."""
    reads: list[str] = []
    original = SplitBinaryDataset.read

    def spy(self, start, end, check_ids=True):
        reads.append(f"{self.mapping}:{end - start}")
        return original(self, start, end, check_ids)

    monkeypatch.setattr(SplitBinaryDataset, "read", spy)
    return reads


def assert_test_rows_read_last(reads: list[str]) -> None:
    """Every test read (a non-empty one) comes after the last train and validation read."""
    nonempty = [x for x in reads if not x.endswith(":0")]
    first_test = next(i for i, x in enumerate(nonempty) if x.startswith("test"))
    assert all(x.startswith("test") for x in nonempty[first_test:]), nonempty[first_test - 3 :]


def test_auto_searches_candidates_on_validation_rows_and_config_repeats_without_search(tmp_path, monkeypatch):
    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300")
    reads = spy_reads(monkeypatch)
    threads, set_threads, before = [], torch.set_num_threads, torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (threads.append(n), set_threads(n)))
    run = tmp_path / "run"
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", run, "--no-progress", "--epochs", "2")
    set_threads(before)
    assert r.code == 0, r.err
    # 1,200 training rows, no val mapping: cross-validated (tests/test_folds.py)
    assert "search: 7 candidate recipes on all 5 folds' validation rows" in r.out, r.out
    # one thread in every candidate, the 400-wide ones too (two spin waiting for each other on a busy machine)
    assert set(threads) == {1}, threads
    assert r.out.count("<- chosen") == 1 and "why:" in r.out
    assert_test_rows_read_last(reads)
    cfg = yaml.safe_load(open(run / "config.yaml"))
    # one model: its temperature in config.yaml; a blend: the members, each with its own
    assert cfg["search-budget"] == 0 and (cfg.get("blend") or cfg["calibration"] == "temperature")
    chosen = [line for line in r.out.splitlines() if "<- chosen" in line][0]
    m = json.load(open(run / "metrics.json"))
    assert f"val AUC {m['val_auc']:.4f}" in chosen or cfg.get("calibration") == "temperature" or cfg.get("blend")
    assert 0.0 <= m["ece"] <= 1.0 and m["temperature"] > 0
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "run2", "--no-progress")
    assert r2.code == 0 and ("search: off" in r2.out or "(--blend, no search)" in r2.out), r2.out + r2.err
    assert json.load(open(tmp_path / "run2" / "metrics.json"))["auc"] == m["auc"]


def test_a_search_budget_given_does_not_search_again_from_config_yaml(tmp_path):
    """A run whose search chose one candidate writes `search-budget: 0` into config.yaml though the
    command line gave a budget, so `train --config` repeats the choice without searching."""
    write_csv(tmp_path / "x.csv", 1500)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "300")
    run = tmp_path / "run"
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", run, "--no-progress", "--folds", "1",
                "--search-budget", "1")  # fmt: skip
    assert r.code == 0, r.err
    assert "search: 1 candidate recipes" in r.out and "<- chosen" in r.out and "blend:" not in r.out, r.out
    cfg = yaml.safe_load(open(run / "config.yaml"))
    assert cfg["search-budget"] == 0 and not cfg.get("blend"), cfg
    r2 = run_cli("train", "--config", run / "config.yaml", "--run-dir", tmp_path / "run2", "--no-progress")
    assert r2.code == 0, r2.err
    assert "search: off (--search-budget 0)" in r2.out and "candidate recipes" not in r2.out, r2.out
    m, again = (json.load(open(p / "metrics.json")) for p in (run, tmp_path / "run2"))
    assert again["auc"] == m["auc"] and again["val_auc"] == m["val_auc"]


@pytest.mark.skipif(not os.path.isdir(KDD12), reason="the KDD Cup 2012 sample is not at ../shared/data/kdd12")
def test_baseline_on_kdd12_matches_scikit_learn_validated_regression(tmp_path):
    pytest.importorskip("sklearn", reason="the reference logistic regression needs scikit-learn (test extra)")
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder

    cols = "url_hash,ad_id,advertiser_id,depth,position,query_id,keyword_id,title_id,description_id,user_id"
    files = [os.path.join(KDD12, f"{n}.csv") for n in ("train", "valid", "test")]
    r = run_cli(
        "transcode", "--input", *files, "--out", tmp_path / "d", "--label", "click", "--numerical", "impression",
        "--categorical", cols, "--test-rows", "3996", "--val-rows", "3994",
    )  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("baseline", "--data", tmp_path / "d", "--c-grid", "0.03,0.1,0.3,1")
    assert r.code == 0, r.err
    result = json.load(open(tmp_path / "d" / "baseline.json"))
    from dlrmkit.data.split_binary import open_dataset, open_val

    spec, train, test = open_dataset(str(tmp_path / "d"))
    parts = [d.read(0, len(d)) for d in (train, open_val(spec), test)]
    enc = OneHotEncoder(handle_unknown="ignore").fit(parts[0].ids)
    signed = result["numerical_transform"] == "signed-log"
    num = [np.log1p(p.dense.astype(np.float64)) if signed else p.dense.astype(np.float64) for p in parts]
    x = [sp.hstack([enc.transform(p.ids), n]).tocsr() for p, n in zip(parts, num)]
    mu, sd = x[0][:, -1].mean(), x[0][:, -1].toarray().std()
    best = None
    for c in (0.03, 0.1, 0.3, 1.0):
        xs = [sp.hstack([xi[:, :-1], (xi[:, -1].toarray() - mu) / sd]).tocsr() for xi in x]
        m = LogisticRegression(C=c, max_iter=5000).fit(xs[0], parts[0].labels)
        val = roc_auc_score(parts[1].labels, m.predict_proba(xs[1])[:, 1])
        if best is None or val > best[0]:
            best = (val, c, roc_auc_score(parts[2].labels, m.predict_proba(xs[2])[:, 1]))
    assert result["c"] == best[1], (result["c_tried"], best)
    assert abs(result["test_auc"] - best[2]) < 0.005, (result["test_auc"], best)


def test_search_regression_candidate_is_the_baselines_model_with_every_id(tmp_path):
    """The base recipe merges ids seen once (--min-id-count 2); the regression candidate keeps
    every id, as `dlrmkit baseline` and scikit-learn's one-hot regression do: the run's evaluation
    before its first step has the baseline's validation AUC on a log where most user ids are seen
    once (with the ids merged it has another)."""
    import csv

    rng = np.random.default_rng(3)
    with open(tmp_path / "x.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "user", "ad"])
        for _ in range(2400):
            user, ad = int(rng.integers(0, 3000)), int(rng.integers(0, 30))
            p = 1 / (1 + np.exp(-(1.5 * (user % 2) - 0.8 + 0.05 * (ad % 7))))
            w.writerow([int(rng.random() < p), f"u{user}", f"a{ad}"])
    r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
                "--categorical", "user,ad", "--test-rows", "400", "--val-rows", "400")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("baseline", "--data", tmp_path / "d")
    assert r.code == 0, r.err
    base = json.load(open(tmp_path / "d" / "baseline.json"))
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--search-budget", "1",
                "--folds", "1")  # the val mapping's rows validate, as the baseline's do  # fmt: skip
    assert r.code == 0, r.err
    assert "ids seen fewer than 2 times share id 0" in r.out, r.out  # the base merges them
    assert "the regression with them folded is not clearly worse" in r.out, r.out  # checked, and kept
    log = [json.loads(x) for x in open(tmp_path / "run" / "log.jsonl")]
    start = next(e for e in log if e["event"] == "eval" and e["step"] == 0)  # the regression, before any step
    assert start["auc"] == pytest.approx(base["val_auc"], abs=1e-6), (start, base["val_auc"])


def test_report_plots_the_test_reliability_and_ignores_a_malformed_table(tmp_path):
    pytest.importorskip("matplotlib", reason="report plots need matplotlib (the report extra)")
    from dlrmkit.commands.report import reliability_bins, reliability_plot

    good = [{"event": "test", "auc": 0.7, "reliability": [[0.1, 0.12, 50], [0.5, 0.4, 10]]}]
    assert reliability_bins(good) == [(0.1, 0.12, 50), (0.5, 0.4, 10)]
    assert reliability_plot(good, str(tmp_path)) == [str(tmp_path / "test_reliability.png")]
    assert (tmp_path / "test_reliability.png").stat().st_size > 1000
    for bad in (
        [[0.1, 2.0, 5]],
        [[0.1, 0.2]],
        "x",
        [[0.1, 0.2, "7"]],
        [[float("nan"), 0.1, 3]],
        [[0.1, 0.1, 1]] * 1001,
    ):
        assert reliability_bins([{"event": "test", "reliability": bad}]) == [], bad
    assert reliability_plot([{"event": "eval", "auc": 0.6}], str(tmp_path / "none")) == []


@pytest.mark.parametrize("field,value", [("fm", "yes"), ("deep", 1), ("dropout", "0.1"), ("dropout", 1.5)])
def test_model_config_refuses_bad_quality_fields(field, value):
    from dlrmkit.errors import DlrmkitError

    cfg = ModelConfig(num_numerical=0, table_sizes=[3], embedding_dim=4, bottom_mlp=[], top_mlp=[1])
    setattr(cfg, field, value)
    with pytest.raises(DlrmkitError, match=field):
        cfg.check()


def test_a_search_candidate_whose_loss_diverges_is_left_out_and_named(tmp_path, monkeypatch):
    """A candidate whose training loss goes NaN leaves the search (named, with its step) and the
    run goes on with the others; where every candidate does, one line names the first."""
    from dlrmkit.errors import NonFiniteLoss

    write_csv(tmp_path / "x.csv", 800)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "200")
    real = recipe_search.train_candidate
    diverging: set[str] = set()

    def train_candidate(cfg, deadline=None):
        if cfg.model.deep is not False:  # the deep candidates, say
            diverging.add("deep")
            raise NonFiniteLoss("loss is nan at step 7; no checkpoint saved before it; lower --lr, ...")
        return real(cfg, deadline)

    monkeypatch.setattr(recipe_search, "train_candidate", train_candidate)
    argv = ("train", "--data", tmp_path / "d", "--no-progress", "--epochs", "1", "--search-budget", "3")
    r = run_cli(*argv, "--run-dir", tmp_path / "run")
    assert r.code == 0 and diverging, r.err
    assert "search 3/3: dlrm+wide: loss is nan at step 7" in r.out and "; left out" in r.out, r.out
    assert f"  {'dlrm+wide':<26} left out: its training loss is nan at step 7" in r.out, r.out
    assert "search: 2 candidate recipes" in r.out and r.out.count("<- chosen") == 1, r.out
    assert os.path.isfile(tmp_path / "run" / "metrics.json")

    def every_one_diverges(cfg, deadline=None):
        raise NonFiniteLoss("loss is inf at step 3")

    monkeypatch.setattr(recipe_search, "train_candidate", every_one_diverges)
    r = run_cli(*argv, "--run-dir", tmp_path / "run2")
    assert r.code == 2 and r.err.strip().splitlines()[-1].endswith("search candidate regression: loss is inf at step 3"), r.err


def test_the_fm_candidate_is_not_trained_again_where_it_has_no_pair_of_tables(tmp_path):
    """With one categorical column and no buckets the FM term has no pair of tables to sum: the
    `dlrm+wide+fm` candidate is `dlrm+wide` again, so the search trains it once; with two it trains."""
    write_csv(tmp_path / "x.csv", 800)
    lines = {}
    for cats in ("a", "a,b"):
        data = tmp_path / cats.replace(",", "")
        r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", data, "--label", "y", "--numerical", "n1,n2",
                    "--categorical", cats, "--test-rows", "200")  # fmt: skip
        assert r.code == 0, r.err
        r = run_cli("train", "--data", data, "--no-progress", "--epochs", "1", "--search-budget", "5",
                    "--folds", "1", "--run-dir", tmp_path / f"run-{cats}")  # fmt: skip
        assert r.code == 0, r.err
        lines[cats] = [ln for ln in r.out.splitlines() if ln.startswith("search ") and " val AUC " in ln]
    assert [ln.split(": ")[1] for ln in lines["a"]] == ["regression", "regression, buckets", "dlrm+wide",
                                                        "dlrm+wide, buckets"], lines["a"]  # fmt: skip
    assert any(ln.split(": ")[1] == "dlrm+wide+fm" for ln in lines["a,b"]), lines["a,b"]


def test_auto_search_keeps_a_deep_model_when_a_deep_option_is_given(tmp_path):
    write_csv(tmp_path / "x.csv", 800)
    transcode(tmp_path / "x.csv", tmp_path / "d", "--test-rows", "200")
    r = run_cli(
        "train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--epochs", "1",
        "--interaction", "dcn", "--dcn-layers", "1", "--search-budget", "3",
    )  # fmt: skip
    assert r.code == 0, r.err
    tried = [line.split()[0] for line in r.out.splitlines() if "val AUC" in line and "best epoch" in line]
    assert tried == ["dlrm+wide", "dlrm+wide,", "dlrm+wide+fm"], r.out  # the second: dlrm+wide, buckets
    assert yaml.safe_load(open(tmp_path / "run" / "config.yaml"))["interaction"] == "dcn"


def test_candidates_with_wide_mlps_run_the_bases_one_thread_and_the_users_threads_win():
    wide = [c for c in recipe_search.candidates(3) if c.values.get("top_mlp", [0])[0] == 400]
    assert [c.name for c in wide] == ["deepfm, adam, lr decay", "dlrm+wide+fm, wide top MLP"]
    assert not any("threads" in c.values for c in recipe_search.candidates(3))
    from dlrmkit.config import TrainConfig
    from dlrmkit.train.recipe import Recipe, fill

    for given, want in ((None, 1), (2, 2)):
        cfg = TrainConfig.of(data="x", threads=given)
        fill(cfg, Recipe("small-data", {"threads": 1, **wide[1].values}))
        assert cfg.device.threads == want


def test_table_adam_equals_torch_adam_with_l2_on_every_row():
    from dlrmkit.optim.table_adam import TableAdam

    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 3, generator=g)
    sparse = torch.nn.Parameter(w0.clone())
    dense = torch.nn.Parameter(w0.clone())
    ours = TableAdam([sparse], lr=0.01, weight_decay=0.1)
    ref = torch.optim.Adam([dense], lr=0.01, weight_decay=0.1)
    for step in range(4):
        ids = torch.tensor([[0, 2], [2, 5]][step % 2])  # rows 1, 3, 4 never touched: decay still acts
        target = torch.randn(2, 3, generator=g)
        for p in (sparse, dense):
            p.grad = None
        torch.nn.functional.embedding(ids, sparse, sparse=True).sub(target).pow(2).sum().backward()
        torch.nn.functional.embedding(ids, dense).sub(target).pow(2).sum().backward()
        assert sparse.grad.is_sparse
        ours.step()
        ref.step()
    torch.testing.assert_close(sparse.detach(), dense.detach(), rtol=1e-6, atol=1e-7)
    assert not torch.equal(sparse[1], w0[1])  # an untouched row decayed


def test_search_choice_settles_near_ties_on_log_loss_after_the_temperature():
    from dlrmkit.train.recipe_search import Candidate, choose, near_tie_auc

    def cand(name, auc, ll, ll_t=float("nan"), rows=4000):
        return Candidate(name, {}, "", {"val_auc": auc, "val_logloss": ll, "val_logloss_t": ll_t, "val_rows": rows})

    tie = near_tie_auc(4000)
    assert tie == pytest.approx(0.002) and near_tie_auc(16000) == pytest.approx(0.001)
    # a clear AUC lead wins whatever the log losses
    assert choose([cand("a", 0.70, 0.60, 0.60), cand("b", 0.70 + 2 * tie, 0.70, 0.70)]).name == "b"
    # a near-tie: the overconfident model whose temperature fixes it wins on its log loss after T
    calibrated, confident = cand("regression", 0.700, 0.620, 0.619), cand("dlrm", 0.701, 0.640, 0.610)
    assert choose([calibrated, confident]).name == "dlrm"
    # log losses within NEAR_TIE_LOGLOSS: the candidate tried first
    assert choose([cand("first", 0.700, 0.62, 0.6100), cand("second", 0.701, 0.62, 0.6095)]).name == "first"
    # without a figure after T (not measured): the raw log loss
    assert choose([cand("a", 0.700, 0.630), cand("b", 0.701, 0.610)]).name == "b"
    # a candidate without a validation figure is never chosen over one with
    assert choose([cand("none", float("nan"), float("nan")), cand("b", 0.6, 0.7)]).name == "b"


def test_search_choice_leaves_out_a_clearly_worse_log_loss():
    """A candidate whose per-row validation log loss (after T) exceeds the lowest by more than
    LOGLOSS_SIGNIFICANCE standard errors of the paired differences is out, whatever its AUC; a
    difference within the rows' noise leaves it in; without per-row losses nobody is out; the
    printed search names the one left out and why."""
    from dlrmkit.train.recipe_search import Candidate, choose, clearly_worse, describe

    rng = np.random.default_rng(0)
    base = rng.exponential(0.55, 500)  # the regression's per-row losses on 500 validation rows

    def cand(name, auc, rows):
        return Candidate(
            name,
            {},
            f"the {name}",
            {"val_auc": auc, "val_logloss": float(rows.mean()), "val_logloss_t": float(rows.mean()),
             "val_row_logloss": rows.astype(np.float32), "val_rows": len(rows), "best_epoch": 1, "seconds": 1.0},
        )  # fmt: skip

    regression = cand("regression", 0.716, base)
    worse = cand("deep", 0.727, base + 0.08 + rng.normal(0, 0.3, 500))  # +0.08, standard error ~0.013
    noisy = cand("deep", 0.727, base + 0.005 + rng.normal(0, 0.3, 500))  # +0.005: within the noise
    assert set(clearly_worse([regression, worse])) == {"deep"}
    assert choose([regression, worse]).name == "regression"
    assert clearly_worse([regression, noisy]) == {} and choose([regression, noisy]).name == "deep"
    text = "\n".join(describe(regression, [regression, worse], 7))
    assert "(out of the single choice, not of a blend: log loss after T +0.0" in text and "standard error" in text
    # figures without per-row losses (a replay of a grid): nobody is out
    for c in (regression, worse):
        c.result.pop("val_row_logloss")
    assert clearly_worse([regression, worse]) == {} and choose([regression, worse]).name == "deep"


def write_reorders(path, users: int, seed: int = 0) -> None:
    """A log whose label follows an id's novelty, sorted by user: each user buys from a basket of
    products of their own (most products belong to one user), and a row is a click (a reorder) when
    the user bought the product before; `n` is the user's order count so far, capped at 9."""
    import csv

    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "user", "product", "n"])
        for u in range(users):
            basket = rng.integers(0, 100_000, size=int(rng.integers(4, 12)))
            bought: set[int] = set()
            for n in range(int(rng.integers(8, 20))):
                p = int(rng.choice(basket))
                w.writerow([int(p in bought), f"u{u}", f"p{p}", f"n{min(n, 9)}"])
                bought.add(p)


def test_auto_keeps_every_id_where_folding_rare_ids_misleads_the_validation_rows(tmp_path):
    """Where a label follows an id's novelty (a first purchase is never a reorder), an id seen once
    in the training rows means "not a reorder", which an id first seen at test time does not: the
    validation rows, read as test rows are, show the folded regression's log loss clearly worse,
    and the search keeps every id (--min-id-count 1) for every candidate (where the label does not
    follow novelty the base's rule stays: test_search_regression_candidate_is_the_baselines_model_with_every_id)."""
    write_reorders(tmp_path / "r.csv", 260)
    r = run_cli("transcode", "--input", tmp_path / "r.csv", "--out", tmp_path / "d", "--label", "y",
                "--categorical", "user,product,n", "--test-fraction", "0.1")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress", "--search-budget", "2")
    assert r.code == 0, r.err
    assert "every id its own row (--min-id-count 1)" in r.out and "clearly worse" in r.out, r.out
    assert "ids seen fewer than 2 times share id 0" not in r.out, r.out
    cfg = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert cfg["min-id-count"] == 1, cfg


def write_sizes(path, rows: int, heavy_tailed: bool, seed: int = 0) -> None:
    """Two large numbers and a category. `heavy_tailed`: counts spread over decades, the label
    following their logs (the signed log pays); else measurements on one scale whose sum tells
    the label (a line in the numbers as they are, a curve in their logs)."""
    import csv

    rng = np.random.default_rng(seed)
    if heavy_tailed:
        a, b = np.exp(rng.uniform(0, 9, rows)), np.exp(rng.uniform(0, 9, rows))
        z = np.log1p(a) - np.log1p(b)
    else:
        a, b = rng.uniform(0, 10_000, rows), rng.uniform(0, 10_000, rows)
        z = (a + b - 10_000) / 1_500
    y = rng.random(rows) < 1 / (1 + np.exp(-2 * z))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "a", "b", "g"])
        w.writerows([int(l), round(float(u), 1), round(float(v), 1), f"g{k}"]
                    for l, u, v, k in zip(y, a, b, rng.integers(0, 30, rows)))  # fmt: skip


@pytest.mark.parametrize("heavy_tailed", [False, True], ids=["measurements", "counts"])
def test_auto_checks_the_signed_log_of_large_numbers_on_the_validation_rows(tmp_path, heavy_tailed):
    """Numerical values over 20 reach the base recipe as sign(x) log(1+|x|); right after the
    `regression` candidate the search fits it on the numbers as they are and keeps what the
    validation rows prefer: the numbers as they are where their sum tells the label (then every
    later candidate and config.yaml take --numerical-transform none), the log for counts."""
    write_sizes(tmp_path / "x.csv", 3000, heavy_tailed)
    r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
                "--numerical", "a,b", "--categorical", "g", "--test-fraction", "0.1")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress",
                "--search-budget", "3", "--folds", "1", "--epochs", "2")  # fmt: skip
    assert r.code == 0, r.err
    cfg = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    if heavy_tailed:
        assert "the signed log kept" in r.out and cfg.get("numerical-transform") != "none", r.out  # the recipe's
    else:
        assert "numerical features as they are, standardized (--numerical-transform none)" in r.out, r.out
        assert "sign(x) log(1+|x|) (val AUC" in r.out and cfg["numerical-transform"] == "none", r.out
        line = next(ln for ln in r.out.splitlines() if ln.strip().startswith("regression ") and "val AUC" in ln)
        auc = float(line.split("val AUC")[1].split()[0])
        said = r.out.split("numerical features as they are")[1].split("val AUC ")[1].split()[0]
        assert auc == pytest.approx(float(said), abs=1e-4), (line, said)  # the candidate is their fit


@pytest.mark.parametrize("heavy_tailed", [False, True], ids=["measurements", "counts"])
def test_baseline_chooses_the_numbers_signed_log_or_as_they_are_on_the_validation_rows(tmp_path, heavy_tailed):
    write_sizes(tmp_path / "x.csv", 3000, heavy_tailed)
    r = run_cli("transcode", "--input", tmp_path / "x.csv", "--out", tmp_path / "d", "--label", "y",
                "--numerical", "a,b", "--categorical", "g", "--test-fraction", "0.1")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("baseline", "--data", tmp_path / "d", "--c-grid", "0.1,1")
    assert r.code == 0, r.err
    result = json.load(open(tmp_path / "d" / "baseline.json"))
    assert sorted(t["numerical_transform"] for t in result["c_tried"]) == ["none"] * 2 + ["signed-log"] * 2
    assert "numbers as they are, C=0.1" in r.out and "numbers signed log, C=1" in r.out and r.out.count("<- chosen") == 1
    want = "signed-log" if heavy_tailed else "none"
    assert result["numerical_transform"] == want, result
    chosen = [t for t in result["c_tried"] if t["numerical_transform"] == want and t["c"] == result["c"]]
    assert chosen and chosen[0]["val_auc"] == result["val_auc"], result


@pytest.mark.slow  # 110,000 rows: the medium-data recipe
def test_auto_on_medium_data_tries_the_regression_beside_the_recipes_dlrm(tmp_path):
    """Past 100,000 training rows `train --data D` tries two candidates on the validation rows, the
    regression and the medium-data recipe's DLRM, and keeps the better or their blend; its
    config.yaml repeats the choice without searching."""
    rng = np.random.default_rng(5)
    n = 110_000
    a, b = rng.integers(0, 300, n), rng.integers(0, 40, n)
    x = rng.exponential(20.0, n).round()
    logit = 0.8 * np.sin(a) + 0.5 * np.cos(b) + 0.4 * np.log1p(x) - 1.2
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(tmp_path / "m.csv", "w") as f:
        f.write("y,x,a,b\n" + "".join(f"{y[i]},{x[i]:.0f},a{a[i]},b{b[i]}\n" for i in range(n)))
    r = run_cli("transcode", "--input", tmp_path / "m.csv", "--out", tmp_path / "d", "--label", "y",
                "--numerical", "x", "--categorical", "a,b", "--test-rows", "5000")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "d", "--run-dir", tmp_path / "run", "--no-progress")
    assert r.code == 0, r.err
    assert "recipe medium-data" in r.out and "search: 2 candidate recipes" in r.out, r.out
    assert "\n  regression " in r.out and "\n  dlrm " in r.out, r.out
    m = json.load(open(tmp_path / "run" / "metrics.json"))
    cfg = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert cfg["search-budget"] == 0
    r = run_cli("train", "--config", tmp_path / "run" / "config.yaml", "--run-dir", tmp_path / "again", "--no-progress")
    assert r.code == 0, r.err
    assert "search:" not in r.out, r.out
    again = json.load(open(tmp_path / "again" / "metrics.json"))
    assert again["auc"] == pytest.approx(m["auc"], abs=1e-6) and m["auc"] > 0.6, (m["auc"], again["auc"])
