"""Options that act only under torchrun are refused in one process (a value equal to the default,
as a run's own config.yaml holds, passes); --resume and --target-auc say on screen what they did;
the log's samples_seen counts the samples trained."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import run_cli

ARGS = ("--max-steps", "2", "--batch-size", "64", "--no-progress")


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "flags, shown",
    [
        (["--sharding", "row_wise"], "--sharding row_wise"),
        (["--comm-dtype", "bf16"], "--comm-dtype bf16"),
        (["--loader", "broadcast"], "--loader broadcast"),
        (["--backend", "gloo"], "--backend gloo"),
        (["--collective-timeout", "5"], "--collective-timeout 5.0"),
        (["--no-bind-cores"], "--no-bind-cores"),
    ],
)
def test_a_torchrun_only_option_in_one_process_is_refused(tiny_data, tmp_path, flags, shown):
    r = run_cli("train", "--data", tiny_data, *ARGS, "--run-dir", tmp_path / "R", *flags)
    assert r.code == 2
    assert one_line(r.err).endswith(
        f"{shown} takes effect under torchrun only, and this is one process "
        "(run `torchrun --nproc_per_node=N -m dlrmkit ...`, or leave it out)"
    )
    assert not (tmp_path / "R").exists()  # before any work


def test_torchrun_options_from_a_config_file(tiny_data, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"sharding": "row_wise", "no-bind-cores": True}))
    r = run_cli("train", "--data", tiny_data, *ARGS, "--config", cfg, "--run-dir", tmp_path / "R")
    assert r.code == 2 and f"{cfg}: 'sharding: row_wise' takes effect under torchrun only" in one_line(r.err)
    # the defaults (a one-process run's own config.yaml holds them) pass: that run repeats
    r = run_cli("train", "--data", tiny_data, *ARGS, "--run-dir", tmp_path / "A")
    assert r.code == 0, r.err
    written = yaml.safe_load((tmp_path / "A" / "config.yaml").read_text())
    assert written["sharding"] == "auto" and written["no-bind-cores"] is False
    r = run_cli("train", "--config", tmp_path / "A" / "config.yaml", "--run-dir", tmp_path / "B")
    assert r.code == 0, r.err


def test_table_placement_host_on_the_cpu_is_refused(tiny_data, tmp_path):
    r = run_cli("train", "--data", tiny_data, *ARGS, "--table-placement", "host", "--run-dir", tmp_path / "R")
    assert r.code == 2 and one_line(r.err).endswith(
        "--table-placement host needs --device cuda (on the CPU every table is in host memory already)"
    )


def test_evaluate_and_bench_refuse_torchrun_only_options(tiny_data, tmp_path):
    r = run_cli("evaluate", "--data", tiny_data, "--checkpoint", tmp_path / "none", "--loader", "broadcast")
    assert r.code == 2 and "--loader broadcast takes effect under torchrun only" in one_line(r.err)
    for flags in (["--breakdown"], ["--no-overlap"], ["--sharding", "table_wise"]):
        r = run_cli("bench", "--steps", "1", "--windows", "1", *flags)
        assert r.code == 2 and f"{' '.join(flags)} takes effect under torchrun only" in one_line(r.err)


def test_bench_no_cuda_graphs_on_the_cpu_is_refused():
    r = run_cli("bench", "--steps", "1", "--windows", "1", "--device", "cpu", "--no-cuda-graphs")
    assert r.code == 2 and one_line(r.err).endswith(
        "--no-cuda-graphs needs --device cuda (on the CPU no step is captured in CUDA graphs)"
    )


def test_resume_and_target_auc_say_what_they_did(tiny_data, tmp_path):
    c, run = tmp_path / "C", ("train", "--data", tiny_data, "--batch-size", "64", "--no-progress", "--search-budget", "0")
    r = run_cli(*run, "--max-steps", "3", "--checkpoint-dir", c, "--resume", "--run-dir", tmp_path / "R1")
    assert r.code == 0, r.err
    assert f"no checkpoint in {c} yet: starting fresh" in r.err
    r = run_cli(*run, "--max-steps", "5", "--checkpoint-dir", c, "--resume", "--run-dir", tmp_path / "R2")
    assert r.code == 0, r.err
    assert f"resumed from {c}/step_3 (step 3, epoch 0)" in r.err
    r = run_cli(*run, "--epochs", "3", "--eval-every", "2", "--target-auc", "0.5", "--run-dir", tmp_path / "R3")
    assert r.code == 0, r.err
    assert "target AUC 0.5 reached at step 2 (AUC " in r.err
    assert json.loads((tmp_path / "R3" / "metrics.json").read_text())["steps"] == 2


def test_log_samples_seen_counts_the_samples_trained(tiny_data, tmp_path):
    """An epoch's last batch is partial: samples_seen adds the rows read, not steps x batch size."""
    r = run_cli(
        "train",
        "--data",
        tiny_data,
        "--batch-size",
        "700",
        "--epochs",
        "2",
        "--no-progress",
        "--log-every",
        "1",
        "--run-dir",
        tmp_path / "R",
        "--no-final-checkpoint",
    )
    assert r.code == 0, r.err
    records = [json.loads(line) for line in (tmp_path / "R" / "log.jsonl").read_text().splitlines()]
    end = records[-1]
    assert end["event"] == "end" and end["samples_seen"] == end["samples"]
    assert end["samples"] % 700 != 0  # the partial batches are in it
    assert not (tmp_path / "R" / "checkpoints").exists()  # --no-final-checkpoint: no empty folder
    assert json.loads((tmp_path / "R" / "run.json").read_text())["checkpoint_dir"] is None
