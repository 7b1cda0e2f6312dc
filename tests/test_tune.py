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
