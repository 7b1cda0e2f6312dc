"""`dlrmkit tune`: a 4-trial study killed after 2 finished trials resumes from its SQLite file
and ends with 4; its best config trains with `dlrmkit train --config`; plots are written."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

pytest.importorskip("optuna", reason="tune needs optuna (pip install 'dlrmkit[tune]')")

from helpers import run_cli  # noqa: E402

pytestmark = pytest.mark.slow  # several training trials

SPACE = {
    "lr": {"type": "float", "low": 0.05, "high": 1.0, "log": True},
    "batch-size": {"type": "categorical", "choices": [256, 512]},
    "embedding-dim": {"type": "categorical", "choices": [4, 8]},
    "top-mlp": {"type": "categorical", "choices": ["16", "32,16"]},
}


def finished_trials(db):
    if not os.path.exists(db):
        return 0
    try:
        with sqlite3.connect(db) as con:
            return con.execute("select count(*) from trials where state in ('COMPLETE', 'PRUNED')").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0


def test_study_resumes_after_kill_and_best_config_trains(tiny_data, tmp_path):
    space, out = tmp_path / "space.yaml", tmp_path / "T"
    space.write_text(yaml.safe_dump(SPACE))
    db = out / "study.db"
    argv = [
        "tune",
        "--data",
        tiny_data,
        "--trials",
        4,
        "--space",
        space,
        "--out",
        out,
        "--storage",
        f"sqlite:///{db}",
        "--max-steps",
        6,
        "--eval-every",
        3,
    ]  # 2 reported AUCs per trial
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrmkit", *map(str, argv)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while finished_trials(db) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = finished_trials(db)
    assert 2 <= first < 4, f"killed run finished {first} trials"

    result = run_cli(*argv)
    assert result.code == 0, result.err
    assert f"{first} finished trials, running {4 - first} more" in result.out
    assert finished_trials(db) == 4
    assert "AUC" in result.out and (out / "best.yaml").exists()
    assert (out / "history.png").stat().st_size > 1000

    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["embedding-dim"] in (4, 8) and best["top-mlp"][-1] == 1
    assert best["search-budget"] == 0  # the trial's model as it was trained, not a search over others
    train = run_cli("train", "--config", out / "best.yaml", "--no-progress", "--run-dir", tmp_path / "R")
    assert train.code == 0, train.err
    assert "search: off" in train.out and "blend" not in train.out, train.out
    resolved = yaml.safe_load((tmp_path / "R" / "config.yaml").read_text())
    assert resolved["lr"] == best["lr"] and resolved["embedding-dim"] == best["embedding-dim"]


def test_unknown_space_key_is_an_error(tiny_data, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning-rate: {type: float, low: 0.1, high: 1}\n")
    result = run_cli("tune", "--data", tiny_data, "--trials", 1, "--space", space, "--out", tmp_path / "T")
    assert result.code == 2 and "unknown train option 'learning-rate'" in result.err


@pytest.mark.parametrize("table", ["studies", "trials"])
def test_a_storage_of_other_tables_is_one_line(tiny_data, tmp_path, table):
    """An SQLite file that is not an Optuna study (a table of that name, other columns) is refused
    in one line (it ended in "internal error", after optuna's multi-line warnings)."""
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:
        con.execute(f"create table {table} (x int)")
    url = f"sqlite:///{db}"
    r = run_cli("tune", "--data", tiny_data, "--trials", 1, "--max-steps", 2, "--storage", url, "--out", tmp_path / "T")
    assert r.code == 2, r.err
    (line,) = r.err.strip().splitlines()
    assert f"--storage {url}: not an Optuna study storage" in line, line


def shared_study(db, **attrs):
    """A study storage holding one complete trial with these user attributes, as another process
    sharing --storage (or a crafted file) could leave it."""
    import optuna

    study = optuna.create_study(study_name="dlrmkit", storage=f"sqlite:///{db}", direction="maximize")
    dist = {"lr": optuna.distributions.FloatDistribution(0.01, 1.0)}
    study.add_trial(optuna.trial.create_trial(params={"lr": 0.1}, distributions=dist, value=0.7, user_attrs=attrs))


@pytest.mark.parametrize(
    "attrs, phrase",
    [
        ({"train_options": {"lr": "abc"}}, "user attribute 'train_options': option 'lr': invalid value 'abc'"),
        ({"train_options": {"run_dir": "/etc"}}, "user attribute 'train_options': 'run-dir' says where the run writes"),
        ({"train_options": {"bogus": 1}}, "user attribute 'train_options': unknown train option 'bogus'"),
        ({"train_options": ["lr"]}, "user attribute 'train_options': must be a mapping of option: value, not list"),
        (
            {"train_options": {"shuffle": "yes"}},
            "user attribute 'train_options': option 'no-shuffle' must be true or false, got 'yes'",
        ),
        ({}, "user attribute 'train_options' is missing"),
        ({"train_options": {"lr": 0.1}, "test_auc": "high"}, "user attribute 'test_auc' is 'high', not a number"),
        (
            {"train_options": {"lr": 0.1}, "test_auc": 0.5, "test_logloss": [1]},
            "user attribute 'test_logloss' is '[1]', not a number",
        ),
    ],
    ids=["bad-value", "output-option", "unknown-option", "a-list", "switch-text", "missing", "auc-text", "logloss"],
)
def test_a_shared_studys_best_trial_is_checked_as_its_config_file_would_be(tiny_data, tmp_path, attrs, phrase):
    """The best trial's train options become best.yaml, checked as `train --config` checks it, and
    its test figures are printed: a trial not as tune records them is one line naming the trial
    and the attribute, and no best.yaml (written unchecked, or "internal error" on printing)."""
    db, out = tmp_path / "shared.db", tmp_path / "T"
    shared_study(db, **attrs)
    r = run_cli("tune", "--data", tiny_data, "--trials", 1, "--storage", f"sqlite:///{db}", "--out", out)
    assert r.code == 2, (r.err, r.out)
    (line,) = r.err.strip().splitlines()
    assert f"--storage sqlite:///{db}: trial 0: {phrase}" in line, line
    assert not (out / "best.yaml").exists()


def test_a_shared_studys_trial_that_passes_is_written_as_it_trained(tiny_data, tmp_path):
    db, out = tmp_path / "shared.db", tmp_path / "T"
    shared_study(db, train_options={"data": str(tiny_data), "lr": 0.1, "shuffle": False}, test_auc=float("nan"))
    r = run_cli("tune", "--data", tiny_data, "--trials", 1, "--storage", f"sqlite:///{db}", "--out", out)
    assert r.code == 0, r.err
    assert "best trial 0: test AUC nan, test logloss nan" in r.out  # a one-class test set's AUC
    assert yaml.safe_load((out / "best.yaml").read_text()) == {"data": str(tiny_data), "no-shuffle": True, "lr": 0.1}


def test_a_study_tune_cannot_use_is_one_line(tiny_data, tmp_path):
    """A study of the name that minimizes (another tool's), a trial row Optuna cannot read, and a
    pruned trial's reason holding an escape sequence (printed escaped)."""
    import optuna

    other = tmp_path / "other.db"
    optuna.create_study(study_name="dlrmkit", storage=f"sqlite:///{other}", direction="minimize")
    argv = ("tune", "--data", tiny_data, "--trials", 1, "--out", tmp_path / "T")
    r = run_cli(*argv, "--storage", f"sqlite:///{other}")
    assert r.code == 2 and "study 'dlrmkit' has direction(s) minimize; a tune study maximizes" in r.err, r.err
    db = tmp_path / "shared.db"
    shared_study(db, train_options={"lr": 0.1}, pruned="diverged\x1b[2J")
    with sqlite3.connect(db) as con:
        con.execute("update trials set state = 'PRUNED'")
    r = run_cli(*argv, "--storage", f"sqlite:///{db}")
    assert r.code == 0 and "trial 0 pruned: diverged\\x1b[2J\n" in r.out, r.out
    with sqlite3.connect(db) as con:
        con.execute("update trials set state = 'UNHEARD'")
    r = run_cli(*argv, "--storage", f"sqlite:///{db}")
    assert r.code == 2, r.err
    (line,) = r.err.strip().splitlines()
    assert "study 'dlrmkit' holds a trial Optuna cannot read (LookupError: 'UNHEARD' is not" in line, line

    from dlrmkit.commands.tune import best_table

    study = optuna.create_study(direction="maximize")  # a drawn value's text, escaped in the table too
    dist = {"preset": optuna.distributions.CategoricalDistribution(["tiny\x1b[2J"])}
    study.add_trial(optuna.trial.create_trial(params={"preset": "tiny\x1b[2J"}, distributions=dist, value=0.7))
    assert "tiny\\x1b[2J" in best_table(study) and "\x1b" not in best_table(study)


def test_a_pruned_trial_is_named_with_why(tiny_data, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("lr: {type: categorical, choices: [100000.0]}\n")  # diverges: the trial ends early
    argv = ["tune", "--data", tiny_data, "--trials", 1, "--space", space, "--out", tmp_path / "T", "--preset", "tiny"]
    result = run_cli(*argv, "--max-steps", 6, "--eval-every", 3)
    assert result.code == 0, result.err
    assert "trial 0 pruned: loss is nan at step" in result.out


def test_a_trial_of_sgd_tables_takes_no_table_weight_decay():
    """The default space draws --embedding-weight-decay beside --optimizer sgd, whose tables take no
    L2: such a trial trains without it (rather than ending on the option error), and so does one
    that keeps the small-data recipe's decay while the space chose sgd."""
    from dlrmkit.commands.tune import train_options

    base = {"preset": "auto", "optimizer": "adagrad", "embedding_weight_decay": 0.01}
    assert train_options({"optimizer": "sgd", "embedding_weight_decay": 0.03}, base)["embedding_weight_decay"] is None
    assert train_options({"optimizer": "sgd"}, base)["embedding_weight_decay"] is None
    adagrad = train_options({"optimizer": "adagrad", "embedding_weight_decay": 0.03}, base)
    assert adagrad["embedding_weight_decay"] == 0.03
    kept = train_options({"optimizer": "sgd", "embedding_optimizer": "adagrad"}, base)
    assert kept["embedding_weight_decay"] == 0.01
    assert train_options({"embedding_weight_decay": 0.01}, {"preset": "small"})["embedding_weight_decay"] == 0.01
    assert train_options({"embedding_weight_decay": 0.01}, {"preset": "tiny"})["embedding_weight_decay"] is None


def test_the_best_trials_table_shows_a_drawn_value_not_trained_as_not_applied():
    import optuna

    from dlrmkit.commands.tune import best_table

    study = optuna.create_study(direction="maximize")
    for optimizer, value in (("sgd", 0.7), ("adagrad", 0.6)):
        dists = {"optimizer": optuna.distributions.CategoricalDistribution(["sgd", "adagrad"]),
                 "embedding-weight-decay": optuna.distributions.CategoricalDistribution([0.0, 0.03])}  # fmt: skip
        trained = {"optimizer": optimizer, **({"embedding_weight_decay": 0.03} if optimizer == "adagrad" else {})}
        study.add_trial(optuna.trial.create_trial(params={"optimizer": optimizer, "embedding-weight-decay": 0.03},
                                                  distributions=dists, value=value,
                                                  user_attrs={"train_options": trained}))  # fmt: skip
    rows = [line.split() for line in best_table(study).splitlines()]
    assert rows[0] == ["trial", "val", "AUC", "embedding-weight-decay", "optimizer"], rows
    assert rows[1] == ["0", "0.7000", "-", "sgd"] and rows[2] == ["1", "0.6000", "0.03", "adagrad"], rows
