"""`plan --data D` resolves the model and batch as `train --data D` does, and its memory per
rank matches what a torchrun job then holds for its tables and their optimizer state."""

from __future__ import annotations

import csv
import json

import numpy as np
import yaml
import pytest

from dlrmkit.data.synthetic import generate
from dlrmkit.data.synthetic_shapes import config_for_tables
from dlrmkit.parallel.plan import ShardingPlan
from helpers import run_cli
from parallel_util import torchrun


@pytest.fixture(scope="module")
def wide_data(tmp_path_factory):
    """Tables large enough to be sharded (the planner replicates tables under 2,048 rows)."""
    out = tmp_path_factory.mktemp("plan") / "wide"
    generate(
        str(out),
        config_for_tables([60_000, 25_000, 9_000, 300, 40], rows=3000, test_rows=1000, num_numerical=4),
        seed=0,
        progress=False,
    )
    return out


def test_plan_data_resolves_as_train(cli, wide_data):
    r = cli("plan", "--data", wide_data, "--world-size", "2")
    assert r.code == 0, r.err
    assert (
        "preset auto, embedding dim 8 (table width 9 with the wide term), global batch 64, tables' optimizer "
        "adagrad (1 state value per weight)"
    ) in r.out  # the recipe train chooses for these 60k rows
    r = cli("plan", "--data", wide_data, "--world-size", "2", "--preset", "mlperf", "--optimizer", "adagrad")
    assert "preset mlperf, embedding dim 128, global batch 65536, tables' optimizer adagrad (1 state" in r.out
    r = cli(
        "plan",
        "--data",
        wide_data,
        "--world-size",
        "2",
        "--preset",
        "criteo-kaggle",
        "--embedding-dim",
        "8",
        "--batch-size",
        "64",
        "--embedding-optimizer",
        "rowwise-adagrad",
    )
    assert (
        "preset criteo-kaggle, embedding dim 8, global batch 64, tables' optimizer rowwise-adagrad (1/8 state value per weight (one per row))"
        in r.out
    )


def test_old_preset_usage_names_the_new_flag(cli):
    r = cli("plan", "--preset", "criteo-1tb-mlperf", "--world-size", "8")
    assert r.code == 2 and "--tables-preset criteo-1tb-mlperf" in r.err and len(r.err.strip().splitlines()) == 1
    r = cli("plan", "--tables", "1000x16", "--preset", "tiny", "--world-size", "2")
    assert r.code == 2 and "--preset" in r.err and "--data" in r.err
    ok = cli("plan", "--tables-preset", "criteo-kaggle", "--world-size", "2")
    assert ok.code == 0 and "global batch 65536" in ok.out


@pytest.mark.multirank
@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_planned_bytes_match_a_torchrun_job(cli, wide_data, tmp_path, optimizer):
    plan_json = tmp_path / "plan.json"
    r = cli("plan", "--data", wide_data, "--world-size", "2", "--optimizer", optimizer, "--json", plan_json)
    assert r.code == 0, r.err
    metrics, run = tmp_path / "m.json", tmp_path / "run"
    proc = torchrun(
        2,
        "-m",
        "dlrmkit",
        "train",
        "--data",
        wide_data,
        "--optimizer",
        optimizer,
        "--max-steps",
        "3",
        "--no-progress",
        "--metrics-json",
        metrics,
        "--run-dir",
        run,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = ShardingPlan.load(str(plan_json))
    used = ShardingPlan.from_dict(json.loads((run / "plan.json").read_text())["sharding_plan"])
    assert planned.to_dict() == used.to_dict()  # the very plan train made
    m = json.loads(metrics.read_text())
    stats = planned.rank_stats()
    for rank in range(2):
        held = m["rank_table_bytes"][rank] + m["rank_state_bytes"][rank]
        assert m["rank_planned_bytes"][rank] == stats[rank]["memory"]
        assert abs(held - stats[rank]["memory"]) <= 0.1 * stats[rank]["memory"], (rank, held, stats[rank]["memory"])
    if optimizer == "adagrad":
        assert m["rank_state_bytes"] == m["rank_table_bytes"]
    else:
        assert m["rank_state_bytes"] == [0, 0]


def test_table_state_in_words():
    from dlrmkit.commands.plan import state_words

    assert state_words(1.0) == "1 state value per weight"
    assert state_words(0.0) == "no optimizer state"
    assert state_words(1 / 16) == "1/16 state value per weight (one per row)"


@pytest.mark.multirank
def test_ranks_that_plan_differently_stop_with_one_line(tmp_path):
    """Every rank plans alone; plans that differ (hosts with different memory) would hang or
    corrupt the exchanges, so each rank names the problem and the fix instead."""
    from parallel_util import ROOT

    proc = torchrun(2, ROOT / "tests" / "plan_check_worker.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(2):
        text = (tmp_path / f"rank{r}.txt").read_text()
        assert text.startswith("the ranks made different sharding plans") and "--plan FILE" in text, text


@pytest.mark.multirank
def test_row_wise_adagrad_tables_are_cut_into_row_ranges_and_train_as_one_process(cli, wide_data, tmp_path):
    """Row-wise Adagrad keeps one value per row: auto cuts a large table into row ranges (column
    slices would each keep their own value, train unlike one process and could not be saved), and
    a plan file with column slices is refused before any step."""
    common = ["--preset", "tiny", "--batch-size", "1200", "--embedding-optimizer", "rowwise-adagrad"]
    plan_json = tmp_path / "plan.json"
    r = cli("plan", "--data", wide_data, "--world-size", "2", *common, "--json", plan_json)
    assert r.code == 0, r.err
    kinds = {tp.strategy for tp in ShardingPlan.load(str(plan_json)).tables}
    assert "row_wise" in kinds and "column_wise" not in kinds, r.out
    r = cli("plan", "--data", wide_data, "--world-size", "2", *common, "--sharding", "column_wise")
    assert r.code == 2 and "table 0 is cut into column slices" in r.err and len(r.err.strip().splitlines()) == 1
    run = ["-m", "dlrmkit", "train", "--data", wide_data, *common, "--search-budget", "0", "--no-shuffle"]
    run += ["--max-steps", "2", "--no-progress"]
    one, two, ck = tmp_path / "one.json", tmp_path / "two.json", tmp_path / "ck"
    assert cli(*run[2:], "--metrics-json", one, "--no-final-checkpoint").code == 0
    proc = torchrun(2, *run, "--metrics-json", two, "--checkpoint-dir", ck)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m, single = json.loads(two.read_text()), json.loads(one.read_text())
    assert m["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert m["val_auc"] == pytest.approx(single["val_auc"], abs=1e-5)
    columns = plan_json.with_name("columns.json")
    r = cli(
        "plan", "--data", wide_data, "--world-size", "2", *common[:4], "--sharding", "column_wise", "--json", columns
    )
    assert r.code == 0, r.err
    proc = torchrun(2, *run, "--plan", columns, "--no-final-checkpoint")
    assert proc.returncode != 0 and f"{columns}: table 0 is cut into column slices" in proc.stderr
    assert "steps 2" not in proc.stdout


@pytest.fixture(scope="module")
def log_data(tmp_path_factory):
    """A transcoded click log (ids numbered by count, as --min-id-count needs): a category, a
    user seen once in half the rows, two numerical features."""
    root = tmp_path_factory.mktemp("log")
    rng = np.random.default_rng(0)
    with open(root / "log.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["y", "x", "z", "a", "u"])
        for i in range(1200):
            a = int(rng.integers(0, 8))
            y = int(rng.random() < 1 / (1 + np.exp(-(a - 3.5) / 2)))
            u = f"u{i}" if rng.random() < 0.5 else f"v{int(rng.integers(0, 40))}"
            w.writerow([y, int(rng.integers(0, 5000)), round(float(rng.random()), 3), f"a{a}", u])
    r = run_cli(
        "transcode", "--input", root / "log.csv", "--out", root / "d", "--label", "y", "--numerical", "x,z",
        "--categorical", "a,u", "--test-rows", "200", "--val-rows", "200",
    )  # fmt: skip
    assert r.code == 0, r.err
    return root / "d"


def test_plan_data_plans_the_tables_the_model_options_make(cli, log_data, tmp_path):
    """--numerical-buckets adds a table per numerical feature, --min-id-count keeps the frequent
    ids, --wide a column: plan sizes them as train does (data/model_tables.py)."""
    plain, shaped = tmp_path / "plain.json", tmp_path / "shaped.json"
    assert cli("plan", "--data", log_data, "--world-size", "2", "--min-id-count", "1", "--json", plain).code == 0
    r = cli(
        "plan", "--data", log_data, "--world-size", "2", "--numerical-buckets", "4", "--min-id-count", "2",
        "--wide", "false", "--json", shaped,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "ids seen 2+ times kept, 2 bucket tables (--numerical-buckets 4)" in r.out
    before = [(t.rows, t.dim) for t in ShardingPlan.load(str(plain)).tables]
    after = [(t.rows, t.dim) for t in ShardingPlan.load(str(shaped)).tables]
    assert before[0][1] == 9 and len(after) == len(before) + 2  # the recipe's wide term: dim 8 + 1
    assert after[0] == (before[0][0], 8) and after[1][0] < before[1][0] // 2  # users: mostly seen once
    r = cli("plan", "--tables", "1000x16", "--numerical-buckets", "4", "--world-size", "2")
    assert r.code == 2 and "--numerical-buckets applies with --data" in r.err


@pytest.mark.multirank
def test_a_plan_of_bucket_tables_and_kept_ids_trains_as_one_process(cli, log_data, tmp_path):
    """`plan --data D OPTIONS --json p.json`, then `torchrun train --data D OPTIONS --plan p.json`:
    the planned tables are the model's, sharded one per rank, and the run equals one process's."""
    shape = ["--numerical-buckets", "4", "--min-id-count", "2"]
    plan_json = tmp_path / "plan.json"
    r = cli("plan", "--data", log_data, "--world-size", "2", *shape, "--sharding", "table_wise", "--json", plan_json)
    assert r.code == 0, r.err
    run = ["-m", "dlrmkit", "train", "--data", log_data, *shape, "--search-budget", "0", "--no-shuffle"]
    run += ["--max-steps", "3", "--no-progress", "--no-final-checkpoint"]
    one, two, out = tmp_path / "one.json", tmp_path / "two.json", tmp_path / "run"
    assert cli(*run[2:], "--metrics-json", one).code == 0
    proc = torchrun(2, *run, "--plan", plan_json, "--metrics-json", two, "--run-dir", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = ShardingPlan.load(str(plan_json))
    used = ShardingPlan.from_dict(json.loads((out / "plan.json").read_text())["sharding_plan"])
    assert planned.to_dict() == used.to_dict() and len(used.tables) == 4
    assert {s.rank for tp in used.tables for s in tp.shards} == {0, 1}
    m, single = json.loads(two.read_text()), json.loads(one.read_text())
    assert m["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert m["val_auc"] == pytest.approx(single["val_auc"], abs=1e-5)


def write_config(path, **options) -> str:
    """A `train --config` file: keys as the flags."""
    path.write_text(yaml.safe_dump({k.replace("_", "-"): v for k, v in options.items()}, sort_keys=False))
    return str(path)


def planned_tables(path) -> list[tuple[int, int]]:
    return [(t.rows, t.dim) for t in ShardingPlan.load(str(path)).tables]


def test_plan_config_plans_the_file_as_the_same_flags(cli, log_data, tmp_path):
    """`plan --config FILE` reads train's config file (options it does not use, such as max-steps,
    taken as train takes them): the file's buckets, kept ids and wide term give the plan the same
    flags give, and flags given win over the file."""
    shape = {"numerical_buckets": 4, "min_id_count": 2, "wide": False}
    config = write_config(
        tmp_path / "run.yaml", data=str(log_data), **shape, max_steps=2, lr=0.5, search_budget=0, no_progress=True
    )
    flags, filed = tmp_path / "flags.json", tmp_path / "file.json"
    r = cli("plan", "--data", log_data, "--world-size", "2", "--numerical-buckets", "4", "--min-id-count", "2",
            "--wide", "false", "--json", flags)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("plan", "--config", config, "--world-size", "2", "--json", filed)
    assert r.code == 0, r.err
    assert f"as `dlrmkit train --config {config} --data {log_data}` resolves it" in r.out
    assert "ids seen 2+ times kept, 2 bucket tables (--numerical-buckets 4)" in r.out
    assert ShardingPlan.load(str(filed)).to_dict() == ShardingPlan.load(str(flags)).to_dict()
    assert len(planned_tables(filed)) == 4 and planned_tables(filed)[0][1] == 8  # no wide column

    # flags over the file, as for train: --numerical-buckets 0 and --wide true win
    over, want = tmp_path / "over.json", tmp_path / "want.json"
    r = cli("plan", "--config", config, "--world-size", "2", "--numerical-buckets", "0", "--wide", "true",
            "--json", over)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("plan", "--data", log_data, "--world-size", "2", "--min-id-count", "2", "--wide", "true", "--json", want)
    assert r.code == 0, r.err
    assert ShardingPlan.load(str(over)).to_dict() == ShardingPlan.load(str(want)).to_dict()
    assert [dim for _, dim in planned_tables(over)] == [9, 9]
    # a file without the dataset takes --data's
    bare = write_config(tmp_path / "bare.yaml", **shape)
    r = cli("plan", "--config", bare, "--data", log_data, "--world-size", "2", "--json", tmp_path / "bare.json")
    assert r.code == 0, r.err
    assert planned_tables(tmp_path / "bare.json") == planned_tables(filed)


def test_plan_config_gives_the_tables_train_builds_for_it(cli, log_data, tmp_path):
    """The plan of a config file lists the tables `train --config` builds from it (rows and width of
    each, in order), and the config.yaml the run writes plans them again."""
    config = write_config(tmp_path / "run.yaml", data=str(log_data), numerical_buckets=3, min_id_count=2,
                          max_steps=2, search_budget=0, no_progress=True, no_final_checkpoint=False)  # fmt: skip
    r = cli("train", "--config", config, "--run-dir", tmp_path / "R")
    assert r.code == 0, r.err
    ckpt = tmp_path / "R" / "checkpoints"
    manifest = json.loads((ckpt / (ckpt / "latest").read_text().strip() / "manifest.json").read_text())
    mc = manifest["model_config"]
    built = [(rows, mc["embedding_dim"] + int(mc["wide"])) for rows in mc["table_sizes"]]
    assert len(built) == 4 and mc["min_id_count"] == 2
    for i, source in enumerate((config, tmp_path / "R" / "config.yaml")):
        out = tmp_path / f"plan{i}.json"
        r = cli("plan", "--config", source, "--world-size", "2", "--json", out)
        assert r.code == 0, r.err
        assert planned_tables(out) == built, source


@pytest.mark.parametrize(
    "options, said",
    [
        ({"buckets": 4}, "unknown option 'buckets' (see `dlrmkit train --help`)"),
        ({"min_id_count": 2}, "unknown option 'min_id_count' (keys are the flags: did you mean 'min-id-count'?)"),
        ({"min-id-count": 0}, "option 'min-id-count': invalid value 0"),
        ({"wide": "maybe"}, "option 'wide': invalid value 'maybe'"),
        ({"run-dir": "out"}, "'run-dir' says where the run writes"),
        ({"preset": "huge"}, "option 'preset': unknown preset 'huge'"),
        ({"data": None}, "no 'data': give the dataset there or as --data"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it(cli, log_data, tmp_path, options, said):
    config = tmp_path / "bad.yaml"  # keys as given
    config.write_text(yaml.safe_dump({"data": str(log_data), **options}))
    r = cli("plan", "--config", config, "--world-size", "2")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1, r.err
    assert f"{config}: " in lines[0] and said in lines[0], lines[0]


def test_plan_config_takes_a_dataset_not_table_sizes(cli, log_data, tmp_path):
    config = write_config(tmp_path / "run.yaml", data=str(log_data))
    r = cli("plan", "--config", config, "--tables", "1000x16", "--world-size", "2")
    assert r.code == 2 and "--tables takes none" in r.err and len(r.err.strip().splitlines()) == 1
    (tmp_path / "list.yaml").write_text("- data\n")
    r = cli("plan", "--config", tmp_path / "list.yaml", "--data", log_data, "--world-size", "2")
    assert r.code == 2 and f"{tmp_path / 'list.yaml'}: a config file must be a mapping" in r.err


def test_plan_config_of_a_blend_is_refused_naming_its_members_configs(cli, log_data, tmp_path):
    """A blend's config.yaml (what a `preset: auto` run that chose a blend writes) trains several
    models, each with its own recipe's tables (buckets, width) over the file's options: one plan of
    the base recipe's tables would be none of them, so plan names the members' config.yaml."""
    config = write_config(tmp_path / "config.yaml", data=str(log_data), preset="auto", search_budget=0,
                          blend="regression, buckets=3; dlrm+wide=1")  # fmt: skip
    r = cli("plan", "--config", config, "--world-size", "2")
    lines = r.err.strip().splitlines()
    assert r.code == 2 and len(lines) == 1, r.err
    assert f"{config}: a blend" in lines[0] and "<checkpoint folder>/<member>/config.yaml" in lines[0], lines[0]
