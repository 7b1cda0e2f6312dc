"""End-to-end checks of `dlrmkit synth`, `dlrmkit train` and `dlrmkit evaluate`, run in-process."""

import json
import os

import pytest
import torch

from dlrmkit.data.loader import epoch_order
from dlrmkit.checkpoint.save_load import latest_checkpoint

from helpers import TINY_ROWS, TINY_TEST_ROWS, run_cli

METRIC_KEYS = {
    "auc",
    "logloss",
    "steps",
    "samples",
    "samples_per_s",
    "train_loss",
    "world_size",
    "best_auc",
    "optimal_auc",
}
BATCH = 256  # the tiny preset's batch size
TRAIN_ROWS = TINY_ROWS - TINY_ROWS // 10  # `train` holds out the last 10% of the train mapping for validation
BATCHES_PER_EPOCH = -(-TRAIN_ROWS // BATCH)  # 15, the last one 16 rows


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_log(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_state(checkpoint_dir):
    """(step, {name: tensor}) of the latest checkpoint in `checkpoint_dir`: model weights as
    `model.*`, optimizer state as `opt.*`, the saved RNG state as `rng.*`.

    Reads either checkpoint layout: the first one (`state.pt`, a torch.save of state dicts) or
    the DCP one (`manifest.json` + DCP files, read with checkpoint.load_logical_state)."""
    path = latest_checkpoint(str(checkpoint_dir))
    assert path is not None, f"no checkpoint in {checkpoint_dir}"
    legacy = os.path.join(path, "state.pt")
    if os.path.exists(legacy):
        state = torch.load(legacy, map_location="cpu", weights_only=False)
        flat = {f"model.{k}": v for k, v in state["model"].items()}
        for i, opt in enumerate(state["optimizers"]):
            for pid, st in opt["state"].items():
                flat.update({f"opt.{i}.{pid}.{k}": torch.as_tensor(v) for k, v in st.items()})
        flat["rng.0"] = state["rng"]
        return state["step"], flat
    from dlrmkit.checkpoint.save_load import load_logical_state

    tensors, manifest = load_logical_state(path)
    flat = {}
    for key, value in tensors.items():
        if key.startswith("dense_opt."):  # dense_opt.<fqn>.<state>
            flat["opt." + key[len("dense_opt.") :]] = value
        elif key.startswith("table.") and ".opt." in key:  # table.<t>.opt.<state>
            flat["opt." + key] = value
        elif key.startswith("table."):  # table.<t>.weight
            flat["model." + key] = value
        else:  # model.<fqn>, rng.<rank>
            flat[key] = value
    return manifest["step"], flat


def samples_between(first_step, last_step, seed=0):
    """Rows the train loop reads in steps [first_step, last_step) of the tiny-preset run on `tiny_data`."""
    total = 0
    for step in range(first_step, last_step):
        epoch, index = divmod(step, BATCHES_PER_EPOCH)
        b = int(epoch_order(BATCHES_PER_EPOCH, epoch, seed, True)[index])
        total += min(BATCH, TRAIN_ROWS - b * BATCH)
    return total


def train(data, *extra):
    preset = () if "--preset" in extra or "--config" in extra else ("--preset", "tiny")
    result = run_cli("train", "--data", data, "--no-progress", *preset, *extra)
    assert result.code == 0, result.err
    return result


# ---- the acceptance check: real tiny preset ---------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_preset_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-preset")
    data, metrics = root / "D", root / "M.json"
    synth = run_cli("synth", "--preset", "tiny", "--out", data)
    assert synth.code == 0, synth.err
    result = run_cli("train", "--data", data, "--metrics-json", metrics, "--no-progress")  # the default recipe
    return synth, result, data, metrics


@pytest.mark.slow  # the tiny preset's whole recipe on 150,000 rows
def test_synth_tiny_preset(tiny_preset_run):
    synth, _, data, _ = tiny_preset_run
    assert "150,000 train + 20,000 test rows" in synth.out
    assert os.path.exists(data / "feature_spec.yaml")
    assert not os.path.exists(str(data) + ".tmp")


@pytest.mark.slow  # the tiny preset's whole recipe on 150,000 rows
def test_train_default_recipe_reaches_optimal_auc(tiny_preset_run):
    _, result, data, metrics_path = tiny_preset_run
    assert result.code == 0, result.err
    m = read_json(metrics_path)
    assert METRIC_KEYS <= set(m), METRIC_KEYS - set(m)
    assert abs(m["optimal_auc"] - m["auc"]) <= 0.02, m
    assert 0.5 < m["auc"] <= 1.0
    assert "recipe medium-data" in result.out  # 150,000 rows: the tiny preset's recipe, selected on validation
    assert "numerical inputs standardized" in result.out  # raw counts stalled SGD 1.0 at a constant on real logs
    # selected: at most 6 epochs of ceil(135000 / 256) batches (the last 15,000 rows validate), early
    # stops at an epoch end; then the refit, as many epochs of ceil(150000 / 256) batches of all the rows
    assert m["refit"] and m["selected_step"] <= 6 * 528 and m["selected_step"] % 528 == 0
    assert m["steps"] == m["selected_step"] // 528 * 586 and m["samples"] == m["steps"] // 586 * 150_000
    assert m["world_size"] == 1
    assert m["samples_per_s"] > 0
    assert 0 < m["logloss"] < 0.6931 and 0 < m["train_loss"] < 0.6931
    assert m["best_auc"] >= m["val_auc"] and 0.5 < m["val_auc"] <= 1.0
    assert "test AUC" in result.out and f"{m['auc']:.4f}" in result.out


# ---- checkpoints and --resume on the shared tiny dataset ------------------------------------------


def test_resume_continues_from_checkpoint_step(tiny_data, tmp_path):
    ckpt, m1, m2 = tmp_path / "C", tmp_path / "m1.json", tmp_path / "m2.json"
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 20, "--metrics-json", m1)
    first = read_json(m1)
    assert first["steps"] == 20
    assert load_state(ckpt)[0] == 20
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 45, "--resume", "--metrics-json", m2)
    second = read_json(m2)
    assert second["steps"] == 45
    # it trained only steps 20..44 (the batches after the checkpoint), not 45 steps from scratch
    assert second["samples"] == samples_between(20, 45)
    assert load_state(ckpt)[0] == 45
    assert sorted(os.listdir(ckpt)) == ["latest", "log.jsonl", "step_20", "step_45"]
    # the log shows the second run picking up where the first one ended
    log = read_log(ckpt / "log.jsonl")
    ends = [r for r in log if r["event"] == "end"]
    assert [r["steps"] for r in ends] == [20, 45]
    cut = log.index(ends[0])
    assert all(r["step"] > 20 for r in log[cut + 1 :] if "step" in r)
    assert [r["step"] for r in log if r["event"] == "eval"] == [15, 20, 30, 45]  # epoch ends (15 batches) and ends


def test_resume_of_a_finished_run_writes_nothing_and_names_its_final_checkpoint(tiny_data, tmp_path):
    """A run that ended (at its last step, or stopped early) is not trained, scored or saved again
    by --resume with its schedule; a larger --max-steps trains on from its final checkpoint."""
    ckpt = tmp_path / "C"
    first = train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 10)
    assert "train loss" in first.out
    files = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file() and not p.name.endswith(".lock")}
    for steps in (10, 8):  # its schedule; one ending before its step
        again = train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", steps, "--resume")
        assert again.out == "", again.out
        lines = again.err.strip().splitlines()
        assert "the run ended at step 10" in lines[-1] and str(ckpt / "step_10") in lines[-1], again.err
        assert {p: p.read_bytes() for p in files} == files  # the log and the checkpoint as they were
    longer = train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 12, "--resume")
    assert longer.out.strip().splitlines()[-1].startswith("steps 12  samples/s"), longer.out
    assert (ckpt / "latest").read_text() == "step_12"
    # in epochs: one fewer than the run's ended too (its counters are not checked against a schedule it will not run)
    by_epoch = ("--checkpoint-dir", tmp_path / "E", "--batch-size", 4096)
    train(tiny_data, *by_epoch, "--epochs", 2)
    again = train(tiny_data, *by_epoch, "--epochs", 1, "--resume")
    assert again.out == "" and "the run ended at step" in again.err, again.err


def test_resume_of_a_run_whose_last_step_was_saved_along_the_way_writes_nothing(tiny_data, tmp_path):
    """--checkpoint-every saving the last step makes that checkpoint the run's final one (it is
    not saved twice): --resume with the run's schedule does not score or log the run again."""
    ckpt = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 10, "--checkpoint-every", 5)
    files = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file() and not p.name.endswith(".lock")}
    again = train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 10, "--checkpoint-every", 5, "--resume")
    assert again.out == "", again.out
    assert "the run ended at step 10" in again.err.strip().splitlines()[-1], again.err
    assert {p: p.read_bytes() for p in files} == files  # no second test score in the log

def test_resume_without_checkpoint_starts_fresh(tiny_data, tmp_path):
    m = tmp_path / "m.json"
    train(tiny_data, "--checkpoint-dir", tmp_path / "C", "--resume", "--max-steps", 5, "--metrics-json", m)
    assert read_json(m)["steps"] == 5
    assert read_json(m)["samples"] == samples_between(0, 5)


def refused(data, *extra) -> str:
    """The one-line error of a train run that must be refused (exit 2)."""
    r = run_cli("train", "--data", data, "--no-progress", "--preset", "tiny", "--max-steps", 2, *extra)
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
    return lines[0]


@pytest.mark.parametrize("where", ["checkpoint-dir", "run-dir", "log-jsonl"])
def test_fresh_run_refuses_another_runs_log(tiny_data, tmp_path, where):
    """A run without --resume never appends to another run's log (with no checkpoint beside it,
    e.g. --no-final-checkpoint or a crash before the first save): refused before any work, as
    another run's checkpoints are; the old log, and the old run folder, stay byte for byte."""
    out = {
        "checkpoint-dir": ("--checkpoint-dir", tmp_path / "C"),
        "run-dir": ("--run-dir", tmp_path / "R"),
        "log-jsonl": ("--log-jsonl", tmp_path / "L.jsonl"),
    }[where]
    log = {"checkpoint-dir": tmp_path / "C" / "log.jsonl", "run-dir": tmp_path / "R" / "log.jsonl"}.get(where, out[1])
    train(tiny_data, *out, "--max-steps", 3, "--log-every", 1, "--no-final-checkpoint")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert len(read_log(log)) >= 4  # train records and the end
    line = refused(tiny_data, *out, "--run-dir" if where != "run-dir" else "--metrics-json", tmp_path / "new")
    assert f"--{where} {out[1]}" in line and "another run" in line and "--resume" in line, line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "new").exists()


def test_fresh_run_takes_an_empty_log_and_resume_appends(tiny_data, tmp_path):
    """An empty log file (a run that stopped before its first record) is taken; --resume appends
    to the log, so it tells the whole history: the first run's records, then the resumed run's."""
    c, log = tmp_path / "C", tmp_path / "C" / "log.jsonl"
    c.mkdir()
    log.write_text("")
    train(tiny_data, "--checkpoint-dir", c, "--max-steps", 3, "--log-every", 1, "--no-final-checkpoint")
    first = log.read_text()
    assert [r["event"] for r in read_log(log)].count("end") == 1
    train(tiny_data, "--checkpoint-dir", c, "--max-steps", 3, "--log-every", 1, "--resume")
    assert log.read_text().startswith(first)
    ends = [r["steps"] for r in read_log(log) if r["event"] == "end"]
    assert ends == [
        3,
        3,
    ]  # no checkpoint to resume from: the second run started at step 0, and said so in its own records
    restart = [r for r in read_log(log) if r["event"] == "restart"]
    assert len(restart) == 1 and "starting fresh" in restart[0]["why"]


def test_the_log_is_strict_json_lines(tiny_data, tmp_path):
    """Every log line parses as strict JSON (no bare NaN token): a figure that does not exist (no
    validation rows here) is null, which `report` reads as absent."""
    r = run_cli("train", "--data", tiny_data, "--no-progress", "--preset", "tiny", "--max-steps", 20,
                "--val-fraction", 0, "--run-dir", tmp_path / "run")  # fmt: skip
    assert r.code == 0, r.err

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    records = [json.loads(line, parse_constant=refuse) for line in open(tmp_path / "run" / "log.jsonl")]
    end = next(r for r in records if r["event"] == "end")
    assert end["val_auc"] is None and end["best_auc"] is None and end["auc"] > 0.5
    assert run_cli("report", tmp_path / "run").code == 0


def test_resume_needs_checkpoint_dir(tiny_data):
    result = run_cli("train", "--data", tiny_data, "--resume", "--max-steps", 2, "--no-progress")
    assert result.code == 2
    assert "--resume needs --checkpoint-dir (or the --run-dir of the run to continue)" in result.err


def test_resume_with_other_model_shape_is_refused(tiny_data, tmp_path):
    ckpt = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 3)
    result = run_cli(
        "train",
        "--data",
        tiny_data,
        "--preset",
        "small",
        "--checkpoint-dir",
        ckpt,
        "--resume",
        "--max-steps",
        6,
        "--no-progress",
    )
    assert result.code == 2
    assert "does not match" in result.err and "Traceback" not in result.err


@pytest.mark.slow  # an interrupted and an uninterrupted run per case
@pytest.mark.parametrize(
    "cut, extra",
    [
        (30, []),  # mid-epoch
        (32, []),  # exactly at an epoch boundary (16 batches per epoch)
        (
            23,
            [
                "--optimizer",
                "adagrad",
                "--lr",
                "0.05",
                "--warmup-steps",
                "10",
                "--decay-start",
                "40",
                "--decay-steps",
                "15",
                "--seed",
                "7",
            ],
        ),
    ],
)
def test_interrupted_and_resumed_run_equals_uninterrupted_run(tiny_data, tmp_path, cut, extra):
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    mi, ms = tmp_path / "mi.json", tmp_path / "ms.json"
    train(tiny_data, "--checkpoint-dir", interrupted, "--max-steps", cut, *extra)
    train(tiny_data, "--checkpoint-dir", interrupted, "--max-steps", 60, "--resume", "--metrics-json", mi, *extra)
    train(tiny_data, "--checkpoint-dir", straight, "--max-steps", 60, "--metrics-json", ms, *extra)
    (step_a, a), (step_b, b) = load_state(interrupted), load_state(straight)
    assert step_a == step_b == 60
    assert a.keys() == b.keys()
    assert any(k.startswith("model.") for k in a)
    differing = [k for k in a if k.startswith("model.") and not torch.equal(a[k], b[k])]
    assert differing == [], f"weights differ after resume: {differing}"
    differing = [k for k in a if not k.startswith("model.") and not torch.equal(a[k], b[k])]
    assert differing == [], f"optimizer or RNG state differs after resume: {differing}"
    assert read_json(mi)["auc"] == read_json(ms)["auc"]
    assert read_json(mi)["steps"] == read_json(ms)["steps"] == 60
    # the logged train loss is the mean of the last 100 steps: the checkpoint keeps the window's losses
    assert read_json(mi)["train_loss"] == read_json(ms)["train_loss"]


def test_checkpoint_every_keeps_two_latest(tiny_data, tmp_path):
    ckpt = tmp_path / "C"
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 10, "--checkpoint-every", 3)
    assert sorted(n for n in os.listdir(ckpt) if n.startswith("step_")) == ["step_10", "step_9"]
    assert (ckpt / "latest").read_text() == "step_10"
    assert not [n for n in os.listdir(ckpt) if n.startswith(".")]


# ---- evaluate ---------------------------------------------------------------------------------------


def test_evaluate_matches_train_metrics(tiny_data, tmp_path):
    ckpt, mt, me = tmp_path / "C", tmp_path / "train.json", tmp_path / "eval.json"
    train(tiny_data, "--checkpoint-dir", ckpt, "--max-steps", 40, "--metrics-json", mt)
    for checkpoint in (ckpt, ckpt / "step_40"):  # a checkpoint dir (via `latest`) or the folder itself
        result = run_cli("evaluate", "--data", tiny_data, "--checkpoint", checkpoint, "--metrics-json", me)
        assert result.code == 0, result.err
        t, e = read_json(mt), read_json(me)
        assert e["auc"] == pytest.approx(t["auc"], abs=1e-12)
        assert e["logloss"] == pytest.approx(t["logloss"], abs=1e-12)
        assert e["rows"] == TINY_TEST_ROWS
        assert f"AUC {t['auc']:.6f}" in result.out
    result = run_cli("evaluate", "--data", tiny_data, "--checkpoint", ckpt, "--mapping", "train", "--metrics-json", me)
    assert result.code == 0, result.err
    assert read_json(me)["rows"] == TINY_ROWS


def test_evaluate_without_checkpoint_fails_cleanly(tiny_data, tmp_path):
    result = run_cli("evaluate", "--data", tiny_data, "--checkpoint", tmp_path)
    assert result.code == 2
    assert str(tmp_path) in result.err and "no checkpoint" in result.err


def test_an_interrupted_run_says_what_it_leaves(tiny_data, tmp_path, monkeypatch):
    """Ctrl-C: exit 130 and one line naming the newest checkpoint --resume continues, or saying
    that none was saved."""
    from dlrmkit.train.trainer import Trainer

    step = Trainer.train_step

    def stop_at_12(self, batch):
        if self.step == 12:
            raise KeyboardInterrupt
        return step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", stop_at_12)
    common = ("train", "--data", tiny_data, "--preset", "tiny", "--max-steps", 30, "--no-progress")
    r = run_cli(*common, "--run-dir", tmp_path / "a", "--checkpoint-every", 5)
    (line,) = r.err.strip().splitlines()[-1:]
    assert r.code == 130 and line.startswith("dlrmkit train: interrupted; the newest checkpoint is "), r.err
    assert line.split("the newest checkpoint is ")[1].startswith(str(tmp_path / "a" / "checkpoints" / "step_10"))
    r = run_cli(*common, "--run-dir", tmp_path / "b")
    assert r.code == 130 and r.err.strip().endswith("interrupted before any checkpoint was saved "
                                                    "(--checkpoint-every N saves along the way)"), r.err  # fmt: skip


def test_large_raw_numerical_values_under_a_preset_are_noted(tiny_data, tmp_path):
    """A preset feeds numerical values to the model as they are: values in the millions are said
    before training, with the options that transform them (a diverged run says only NaN/Inf)."""
    lines = ["y,hour,c"] + [f"{i % 3 % 2},{14102100 + i % 24},{'abc'[i % 3]}" for i in range(600)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    r = run_cli("transcode", "--input", tmp_path / "d.csv", "--out", tmp_path / "ds", "--label", "y",
                "--numerical", "hour", "--categorical", "c", "--test-rows", "100")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "ds", "--preset", "tiny", "--max-steps", 1, "--no-progress",
                "--run-dir", tmp_path / "a")  # fmt: skip
    assert "note: numerical values up to 14,102,123 reach the model raw (--numerical-transform none" in r.out, r.out
    r = run_cli("train", "--data", tmp_path / "ds", "--preset", "tiny", "--max-steps", 1, "--no-progress",
                "--numerical-transform", "signed-log", "--standardize-numerical", "true", "--run-dir", tmp_path / "b")  # fmt: skip
    assert r.code == 0 and "reach the model raw" not in r.out, r.out + r.err
    r = run_cli("train", "--data", tiny_data, "--preset", "tiny", "--max-steps", 1, "--no-progress",
                "--run-dir", tmp_path / "c")  # fmt: skip
    assert r.code == 0 and "reach the model raw" not in r.out, r.out + r.err
