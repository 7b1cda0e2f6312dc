"""`dlrmkit report RUN`: PNG plots with real content and a Markdown summary of a finished run."""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import run_cli


@pytest.fixture(scope="module")
def finished_run(tiny_run, tmp_path_factory):
    """A copy of the shared finished run (conftest.py `tiny_run`: 40 steps, evaluated every 10):
    `report` writes its plots into the run folder."""
    run = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(tiny_run, run)
    return run


def test_report_writes_plots_and_summary(finished_run):
    result = run_cli("report", finished_run)
    assert result.code == 0, result.err
    import matplotlib.image as mpimg

    for name in ("train_loss.png", "val_auc.png", "val_logloss.png", "throughput.png"):
        img = mpimg.imread(finished_run / name)
        assert img.shape[0] > 100 and img.shape[1] > 100, name
        assert np.std(img[..., :3]) > 0.01, f"{name} is blank"
    text = (finished_run / "report.md").read_text()
    assert "status: finished" in text
    assert text.count("\n| 40 |") == 1  # the last evaluation, once
    assert "![val_auc](val_auc.png)" in text


def log_records(run):
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_report_calls_validation_scores_validation_and_shows_the_test_score_once(finished_run, tmp_path):
    """Evaluations during training read the val mapping: the report names them validation, and
    the test score is the log's one final `test` record, never an evaluation's."""
    result = run_cli("report", finished_run, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    text = (tmp_path / "out" / "report.md").read_text()
    records = log_records(finished_run)
    evals = [r for r in records if r["event"] == "eval"]
    (test,) = [r for r in records if r["event"] == "test"]
    assert {r["mapping"] for r in evals} == {"val"} and test["mapping"] == "test"
    assert "| step | samples seen | validation AUC | validation log loss |" in text
    assert "test AUC |" not in text and not (tmp_path / "out" / "test_auc.png").exists()
    test_lines = [line for line in text.splitlines() if "test AUC" in line]
    assert test_lines == [test_lines[0]] and f"test AUC {test['auc']:.4f}" in test_lines[0]
    for r in evals:  # every validation score sits in the validation table
        assert f"| {r['step']} | {r['samples_seen']} | {r['auc']:.4f} | {r['logloss']:.4f} |" in text


def test_report_labels_evaluations_by_their_mapping(finished_run, tmp_path):
    """A log holding evaluations on another mapping (and old ones without a mapping) gets a table
    and plots per mapping, each named by it; a mapping that is not a plain name is refused."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    records = log_records(run)
    extra = [{**r, "mapping": "holdout", "auc": 0.25} for r in records if r["event"] == "eval"]
    old = [{k: v for k, v in r.items() if k != "mapping"} for r in records if r["event"] == "eval"][:1]
    lines = [json.dumps(r) for r in records + extra + old]
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "log_jsonl": str(run / "log.jsonl")}))
    (run / "log.jsonl").write_text("\n".join(lines) + "\n")
    result = run_cli("report", run)
    assert result.code == 0, result.err
    text = (run / "report.md").read_text()
    assert "| step | samples seen | 'holdout' mapping AUC | 'holdout' mapping log loss |" in text
    assert "| 'unrecorded' mapping AUC |" in text
    assert (run / "holdout_auc.png").is_file() and (run / "val_auc.png").is_file()
    assert text.count("| 0.2500 |") == len(extra)
    (run / "log.jsonl").write_text(json.dumps({**extra[0], "mapping": "../../x"}) + "\n")
    result = run_cli("report", run)
    assert result.code == 2 and "log.jsonl:1: field 'mapping'" in result.err
    many = [json.dumps({**extra[0], "mapping": f"m{k}"}) for k in range(17)]  # two plots each: bounded
    (run / "log.jsonl").write_text("\n".join(many) + "\n")
    result = run_cli("report", run, "--out", tmp_path / "many")
    assert result.code == 2 and "more than 16 mappings" in result.err and not (tmp_path / "many").exists()


def test_report_on_a_non_run_folder_is_a_one_line_error(tmp_path):
    result = run_cli("report", tmp_path)
    assert result.code == 2 and "not a run folder" in result.err


def read_scalars(logdir):
    """tag -> [(step, value)] of the TensorBoard event files in logdir."""
    ea = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="reading TensorBoard events needs tensorboard (pip install 'dlrmkit[report]')",
    )
    acc = ea.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_report_tensorboard_events_hold_the_log(finished_run, tmp_path):
    pytest.importorskip("tensorboard", reason="--tensorboard needs tensorboard (pip install 'dlrmkit[report]')")
    result = run_cli("report", finished_run, "--out", tmp_path / "out", "--tensorboard", tmp_path / "tb")
    assert result.code == 0, result.err
    scalars = read_scalars(tmp_path / "tb")
    assert {"train/loss", "val/auc", "val/logloss", "test/auc", "test/logloss"} <= set(scalars)
    assert [s for s, _ in scalars["val/auc"]] == [10, 20, 30, 40]
    assert [s for s, _ in scalars["test/auc"]] == [40]
    evals = [
        r for r in map(json.loads, (finished_run / "log.jsonl").read_text().splitlines()) if r.get("event") == "eval"
    ]
    np.testing.assert_allclose([v for _, v in scalars["val/auc"]], [r["auc"] for r in evals], rtol=1e-6)


def test_train_tensorboard_writes_events(tiny_data, tmp_path):
    pytest.importorskip("tensorboard", reason="--tensorboard needs tensorboard (pip install 'dlrmkit[report]')")
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--max-steps",
        10,
        "--eval-every",
        5,
        "--log-every",
        5,
        "--no-progress",
        "--search-budget",
        0,
        "--run-dir",
        tmp_path / "R",
        "--tensorboard",
        tmp_path / "tb",
    )
    assert result.code == 0, result.err
    scalars = read_scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["val/auc"]] == [5, 10]
    assert "train/loss" in scalars
    assert "tensorboard" not in (tmp_path / "R" / "config.yaml").read_text()  # an output path, not a recipe option


def eval_record(step, auc):
    return json.dumps({"event": "eval", "step": step, "mapping": "val", "auc": auc, "logloss": 0.5,
                       "samples_seen": step * 100, "time": 1.0})  # fmt: skip


def test_report_reads_a_moved_or_copied_run_folders_own_log(tiny_run, tmp_path):
    """run.json names the folder's own log relative to it: a moved folder still reports, and a
    copy reports its own log, never the original's (older run.json with absolute paths too)."""
    shutil.copytree(tiny_run, tmp_path / "A")
    os.rename(tmp_path / "A", tmp_path / "B")
    result = run_cli("report", tmp_path / "B", "--out", tmp_path / "rep-B")
    assert result.code == 0, result.err
    shutil.copytree(tmp_path / "B", tmp_path / "C")
    with open(tmp_path / "C" / "log.jsonl", "a") as f:
        f.write(eval_record(777, 0.3125) + "\n")
    for folder in ("B", "C"):
        result = run_cli("report", tmp_path / folder, "--out", tmp_path / f"rep-{folder}")
        assert result.code == 0, result.err
    assert "| 777 |" in (tmp_path / "rep-C" / "report.md").read_text()
    assert "| 777 |" not in (tmp_path / "rep-B" / "report.md").read_text()
    # run.json as older versions wrote it: absolute paths into the folder it was written in (B)
    info = json.loads((tmp_path / "C" / "run.json").read_text())
    del info["format"]
    old = {
        **info,
        "log_jsonl": str(tmp_path / "B" / "log.jsonl"),
        "checkpoint_dir": str(tmp_path / "B" / "checkpoints"),
    }
    (tmp_path / "C" / "run.json").write_text(json.dumps(old))
    result = run_cli("report", tmp_path / "C", "--out", tmp_path / "rep-C-old")
    assert result.code == 0, result.err
    assert "| 777 |" in (tmp_path / "rep-C-old" / "report.md").read_text()


@pytest.mark.parametrize(
    "record,needle",
    [
        (
            '{"event":"train","step":8,"loss":' + "9" * 401 + ',"samples_seen":5}',
            "field 'loss' is an integer of 401 digits",
        ),
        ('{"event":"train","step":8,"loss":0.5,"samples_seen":' + "9" * 401 + "}", "field 'samples_seen'"),
        ('{"event":"train","step":8,"loss":' + "9" * 5001 + "}", "an integer of more than"),
    ],
)
def test_report_on_a_number_out_of_range_is_one_line_naming_the_line(finished_run, tmp_path, record, needle):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    lines = (run / "log.jsonl").read_text().splitlines()
    (run / "log.jsonl").write_text("\n".join(lines[:3] + ["", record] + lines[3:]) + "\n")
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 2, (result.code, result.err)
    err = [ln for ln in result.err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in result.err, result.err
    assert f"log.jsonl:5: {needle}" in err[0], err[0]


def test_report_skips_a_reliability_table_with_an_infinite_count_and_says_so(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "log.jsonl", "a") as f:
        f.write('{"event":"test","step":8,"reliability":[[0.5,0.5,1e999]]}\n')
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    assert not (tmp_path / "out" / "test_reliability.png").exists()
    assert (tmp_path / "out" / "train_loss.png").is_file()
    assert "reliability table: malformed in the log" in (tmp_path / "out" / "report.md").read_text()
    result = run_cli("report", finished_run, "--out", tmp_path / "good")  # the run's own table: plotted
    assert result.code == 0, result.err
    assert (tmp_path / "good" / "test_reliability.png").is_file()
    assert "reliability table" not in (tmp_path / "good" / "report.md").read_text()


def test_report_md_holds_a_logs_text_on_its_own_lines(finished_run, tmp_path):
    """Text from the log (a blend member's name, folder, seed) is one line of report.md each: a
    line break in it would start a heading or a table of its own; a member record that is not an
    object is counted, not silently dropped."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    members = [{"name": "a\n# injected", "weight": 1, "folder": "x`\n|", "seed": "0\n- forged"}, 7]
    with open(run / "log.jsonl", "a") as f:
        f.write(json.dumps({"event": "blend", "members": members}) + "\n")
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    lines = (tmp_path / "out" / "report.md").read_text().splitlines()
    assert not [ln for ln in lines if ln.startswith(("# injected", "- forged", "|/`"))], lines
    assert "  - a?# injected, seed 0?- forged x1 (`x??|/`)" in lines
    assert "  - 1 more member record(s) malformed in the log, not listed" in lines


def test_report_leaves_out_a_calibration_error_the_run_has_not_got(finished_run, tmp_path):
    """A test record without a reliability table (an older torchrun run's) has no calibration
    error: the summary leaves it out rather than printing 'n/a'; a run's that has it is shown."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)

    def text():
        return (run / "report.md").read_text()

    assert run_cli("report", run).code == 0 and "expected calibration error 0." in text()
    drop = ("ece", "reliability")
    records = [{k: v for k, v in r.items() if k not in drop} for r in log_records(run)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = run_cli("report", run)
    assert result.code == 0, result.err
    assert "test AUC" in text() and "calibration error" not in text(), text()


def test_report_of_a_torchrun_run_repeats_it_under_torchrun(finished_run, tmp_path):
    """A run on 2 ranks (its end record's world_size) is repeated with torchrun on 2 ranks: its
    config.yaml may hold a --plan, which one process refuses ("Repeat it: `dlrmkit train ...`")."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    records = [{**r, "world_size": 2} if r["event"] == "end" else r for r in log_records(run)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    config = run / "config.yaml"
    lines = (tmp_path / "out" / "report.md").read_text().splitlines()
    assert f"Repeat it (2 ranks): `torchrun --nproc_per_node=2 -m dlrmkit train --config {config}`" in lines
    assert run_cli("report", finished_run, "--out", tmp_path / "one").code == 0  # one process: as it was
    assert (
        f"Repeat it: `dlrmkit train --config {finished_run / 'config.yaml'}`"
        in (tmp_path / "one" / "report.md").read_text()
    )


def test_report_reads_the_run_after_a_restart(tiny_data, tmp_path):
    """An attempt that saved no checkpoint, then --resume, which finds none and starts over at
    step 0, appending to the log: report plots and tables the run after the restart, and says how
    many earlier records it left out."""
    run = tmp_path / "run"
    common = ("train", "--data", tiny_data, "--preset", "tiny", "--no-progress", "--eval-every", 10, "--run-dir", run)
    assert run_cli(*common, "--max-steps", 30, "--no-final-checkpoint").code == 0
    assert run_cli(*common, "--max-steps", 20, "--resume").code == 0
    records = log_records(run)
    assert [r["step"] for r in records if r["event"] == "eval"] == [10, 20, 30, 10, 20]  # both attempts
    result = run_cli("report", run)
    assert result.code == 0, result.err
    text = (run / "report.md").read_text()
    earlier = next(i for i, r in enumerate(records) if r["event"] == "restart")
    assert f"the {earlier:,} log records before it (an attempt that saved none) are left out" in text, text
    assert "\n| 30 |" not in text and text.count("\n| 20 |") == 1, text


def test_report_says_a_run_stopped_by_an_error_failed_and_why(tiny_data, tmp_path, monkeypatch):
    """A run stopped by an error ends its log with one `failed` record holding the error's line,
    and report says so; a log that just stops (a killed run) is still unfinished."""
    monkeypatch.setenv("DLRMKIT_FAULT", "train:nan-loss-4")  # step 4's loss reads as NaN (a diverged step)
    run = tmp_path / "run"
    result = run_cli("train", "--data", tiny_data, "--preset", "tiny", "--no-progress", "--max-steps", 8,
                     "--log-every", 2, "--run-dir", run)  # fmt: skip
    assert result.code == 2 and "loss is nan at step 4" in result.err, result.err
    records = log_records(run)
    assert [r["event"] for r in records].count("failed") == 1 and records[-1]["event"] == "failed", records
    assert records[-1]["why"] in result.err and records[-1]["step"] >= 4
    assert run_cli("report", run).code == 0
    text = (run / "report.md").read_text()
    assert "status: failed: loss is nan at step 4; " in text and "unfinished" not in text, text
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))  # as a killed run leaves it
    assert run_cli("report", run).code == 0
    assert "status: unfinished (no end record)" in (run / "report.md").read_text()


def test_report_says_an_interrupted_run_was_interrupted(tiny_data, tmp_path, cli_subprocess, monkeypatch):
    monkeypatch.setenv("DLRMKIT_FAULT", "train:step-3@:SIGINT")  # Ctrl-C after step 3
    run = tmp_path / "run"
    result = cli_subprocess("train", "--data", tiny_data, "--preset", "tiny", "--no-progress", "--max-steps", 8,
                            "--run-dir", run)  # fmt: skip
    assert result.code == 130 and "interrupted" in result.err, result.err
    last = log_records(run)[-1]
    assert last["event"] == "interrupted" and last["step"] == 3, last
    monkeypatch.delenv("DLRMKIT_FAULT")
    assert run_cli("report", run).code == 0
    assert "status: interrupted at step 3 (Ctrl-C)" in (run / "report.md").read_text()


def test_report_shows_a_blends_one_evaluation_as_the_blends(finished_run, tmp_path):
    """A blend's log holds one evaluation, of the blend, logged at no step of its own: its row in
    the validation table says so instead of a step 0."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    member = {"name": "dlrm", "seed": 0, "weight": 1, "folder": "dlrm"}
    score = {"mapping": "val", "auc": 0.75, "logloss": 0.5, "samples_seen": 2400, "time": 2.0}
    records = [
        {"event": "blend", "members": [member], "samples_seen": 2400, "time": 1.0},
        {"event": "eval", "step": 0, **score},
        {"event": "test", "step": 0, **score, "mapping": "test"},
        {"event": "end", "auc": 0.75, "logloss": 0.5, "val_auc": 0.75, "val_logloss": 0.5, "steps": 24,
         "blend": [member], "samples_seen": 2400, "time": 3.0},
    ]  # fmt: skip
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run_cli("report", run).code == 0
    text = (run / "report.md").read_text()
    assert "| (the blend) | 2400 | 0.7500 | 0.5000 |" in text and "| 0 |" not in text, text


def test_report_thins_a_flood_of_training_records_and_says_so(finished_run, tmp_path, monkeypatch):
    """Memory stays bounded on any log: past run_log.MAX_TRAIN_RECORDS training-loss records every
    second one is let go (then every fourth...), each kept with its known numeric fields only, and
    report.md says how many were plotted."""
    from dlrmkit.train import run_log

    monkeypatch.setattr(run_log, "MAX_TRAIN_RECORDS", 50)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "log.jsonl", "a") as f:
        for i in range(1000):
            f.write(json.dumps({"event": "train", "step": i, "loss": 0.5, "samples_seen": i, "pad": "x" * 100}) + "\n")
    log = run_log.read_log(str(run / "log.jsonl"))
    train = [r for r in log if r["event"] == "train"]
    assert log.train_every == 32 and log.train_seen > 1000  # the run's own and the flood
    assert 25 <= len(train) <= 50 and all("pad" not in r for r in train)
    assert [r for r in log if r["event"] != "train"] == [
        r for r in run_log.read_log(str(finished_run / "log.jsonl")) if r["event"] != "train"
    ]  # every other record kept whole
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 0, result.err
    assert "one in every 32 is plotted" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "train_loss.png").is_file()


def test_report_refuses_a_log_of_too_many_other_records(finished_run, tmp_path, monkeypatch):
    from dlrmkit.train import run_log

    monkeypatch.setattr(run_log, "MAX_OTHER_BYTES", 1 << 20)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "log.jsonl", "a") as f:
        f.write("{}\n" * 2000)  # each counts RECORD_COST bytes: a flood of tiny records is no cheaper
    result = run_cli("report", run, "--out", tmp_path / "out")
    assert result.code == 2, (result.code, result.err)
    err = [ln for ln in result.err.splitlines() if ln.strip()]
    assert len(err) == 1 and "more than 1 MiB of records besides training losses" in err[0] and "log.jsonl:" in err[0], err
