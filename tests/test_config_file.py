"""`dlrmkit train --config`: options from YAML, CLI flags win, unknown keys rejected, and the run
folder's resolved config.yaml repeats the run exactly."""

import json

import yaml

from helpers import run_cli


def train(*argv):
    result = run_cli("train", "--no-progress", *argv)
    assert result.code == 0, result.err
    return result


def test_config_file_sets_options_and_flags_override(tiny_data, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"data": str(tiny_data), "max-steps": 7, "lr": 0.5, "batch-size": 128, "search-budget": 0}))
    train("--config", cfg, "--max-steps", 5, "--run-dir", tmp_path / "R")
    resolved = yaml.safe_load((tmp_path / "R" / "config.yaml").read_text())
    assert resolved["max-steps"] == 5  # the flag wins
    assert resolved["lr"] == 0.5 and resolved["batch-size"] == 128  # from the file
    assert resolved["embedding-dim"] == 8 and resolved["wide"] is True  # filled in by the small-data recipe
    metrics = json.loads((tmp_path / "R" / "metrics.json").read_text())
    assert metrics["steps"] == 5


def test_unknown_or_bad_key_is_a_one_line_error(tiny_data, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: x\nlearning_rate: 0.1\n")
    result = run_cli("train", "--config", cfg)
    assert result.code == 2
    assert "unknown option 'learning_rate'" in result.err and str(cfg) in result.err
    assert len(result.err.strip().splitlines()) == 1
    cfg.write_text(f"data: {tiny_data}\nbatch-size: many\n")
    result = run_cli("train", "--config", cfg)
    assert result.code == 2 and "batch-size" in result.err


def test_resolved_config_repeats_the_run(tiny_data, tmp_path):
    train(
        "--data",
        tiny_data,
        "--max-steps",
        12,
        "--lr",
        0.3,
        "--embedding-dim",
        8,
        "--bottom-mlp",
        "32,8",
        "--run-dir",
        tmp_path / "A",
        "--metrics-json",
        tmp_path / "a.json",
    )
    train(
        "--config", tmp_path / "A" / "config.yaml", "--run-dir", tmp_path / "B", "--metrics-json", tmp_path / "b.json"
    )
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    # the replay resolves every option (the recipe's choices, the nulls left to run-time defaults) the same way
    ca, cb = (yaml.safe_load((tmp_path / r / "config.yaml").read_text()) for r in ("A", "B"))
    assert ca == cb and ca["preset"] == "auto"
    assert a["auc"] == b["auc"] and a["logloss"] == b["logloss"]
    pa, pb = (json.loads((tmp_path / r / "plan.json").read_text()) for r in ("A", "B"))
    assert pa == pb
    if ca.get("blend"):  # the search chose a blend: each member's folder holds its whole config
        ma, mb = ([yaml.safe_load(p.read_text()) for p in sorted((tmp_path / r / "checkpoints").glob("*/config.yaml"))]
                  for r in ("A", "B"))  # fmt: skip
        assert ma == mb and len(ma) == len(pa["blend"]) >= 2
        assert all(m["lr"] == 0.3 and m["embedding-dim"] == 8 and m["max-steps"] == 12 for m in ma)
        if ca.get("folds"):  # cross-validated: each member run one fold's model, 12 steps, no refit
            assert not a["refit"] and a["steps"] == b["steps"] <= 12 * len(ma) and len(ma) % ca["folds"] == 0
        else:  # each member run trained 12 steps, then its refit on the training and validation rows the
            # epochs selection chose of them (the steps a blend counts are its refits')
            assert a["refit"] and a["steps"] == b["steps"] <= round(12 * 1.12) * len(ma)
        assert (tmp_path / "B" / "checkpoints" / "blend.yaml").exists()
        return
    assert ca["wide"] is True
    assert a["steps"] == b["steps"] and (a["steps"] == 12 or a["refit"] and a["refit_steps"] == a["steps"])
    plan = json.loads((tmp_path / "B" / "plan.json").read_text())
    assert plan["model_config"]["embedding_dim"] == 8 and plan["model_config"]["bottom_mlp"] == [32, 8]
    assert (tmp_path / "B" / "checkpoints" / "latest").exists()


def test_a_number_in_a_config_file_reads_as_on_the_command_line(tiny_data, tmp_path):
    """YAML 1.1 reads `017` as 15, `0x10` as 16 and `1:30` as 90: a config file's number is read
    in decimal, as the flag reads it (--max-steps 017 is 17), or refused as the flag refuses it."""
    from dlrmkit.errors import DlrmkitError
    from dlrmkit.train.config_file import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {tiny_data}\nmax-steps: 017\nlr: 0.5\nepochs: 3\n")
    values = load_config(str(cfg))
    assert (values["max_steps"], values["lr"], values["epochs"]) == (17, 0.5, 3)
    for spelling in ("0x10", "1:30", "0b11"):
        cfg.write_text(f"data: {tiny_data}\nmax-steps: {spelling}\n")
        try:
            load_config(str(cfg))
        except DlrmkitError as exc:
            assert "max-steps" in str(exc) and "expected an integer" in str(exc)
        else:
            raise AssertionError(f"max-steps: {spelling} was read as a number")
