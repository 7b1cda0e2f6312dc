"""`dlrmkit predict`: raw Criteo rows scored through the stored vocabulary give the same
probabilities as evaluating the preprocessed test mapping; bad rows are counted, located and
skipped (or stop the run with --strict); a transcoded CSV dataset scores its own CSV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli
from dlrmkit.data.feature_spec import FeatureSpec
from dlrmkit.data.split_binary import SplitBinaryDataset
from dlrmkit.checkpoint.save_load import load_single_process_model
from dlrmkit.train.evaluation import predict

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo"
TSV = CRITEO / "criteo_kaggle_head6k.tsv"
CSV = CRITEO / "deepctr_criteo_sample200.csv"
needs_criteo = pytest.mark.skipif(not TSV.exists(), reason="needs ../shared/data/criteo")
TRAIN = (
    "--max-steps",
    15,
    "--batch-size",
    256,
    "--embedding-dim",
    4,
    "--bottom-mlp",
    "16,4",
    "--top-mlp",
    "16,1",
    "--eval-every",
    0,
    "--no-progress",
    "--search-budget",  # one model (a search may end in a blend)
    0,
)


def read_scores(path: Path) -> tuple[list[str], np.ndarray]:
    header = path.read_text().splitlines()[0].split(",")
    return header, np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)


@pytest.fixture(scope="module")
def criteo_model(tmp_path_factory):
    if not TSV.exists():
        pytest.skip("needs ../shared/data/criteo")
    root = tmp_path_factory.mktemp("predict")
    ds = root / "ds"
    r = run_cli(
        "preprocess",
        "criteo",
        "--input",
        TSV,
        "--out",
        ds,
        "--test-rows",
        1000,
        "--frequency-threshold",
        2,
        "--workers",
        1,
        "--no-progress",
    )
    assert r.code == 0, r.err
    r = run_cli("train", "--data", ds, *TRAIN, "--run-dir", root / "run")
    assert r.code == 0, r.err
    tail = root / "last1000.tsv"  # a scratch copy of the raw test lines, outside the repo
    tail.write_bytes(b"".join(TSV.read_bytes().splitlines(keepends=True)[-1000:]))
    return ds, root / "run" / "checkpoints", tail


def evaluate_probs(ds: Path, ckpt: Path) -> tuple[np.ndarray, np.ndarray]:
    from dlrmkit.data.numerical_buckets import model_view

    model, cfg = load_single_process_model(str(ckpt))
    test = model_view(SplitBinaryDataset(FeatureSpec.from_yaml(str(ds)), "test"), cfg)  # as evaluate reads it
    return predict(model, test, 4096)


@needs_criteo
def test_predict_matches_evaluate_on_raw_test_rows(criteo_model, tmp_path):
    ds, ckpt, tail = criteo_model
    assert FeatureSpec.from_yaml(str(ds)).metadata["preprocess"]["report"]["rows_written"] == 6000
    out = tmp_path / "scores.csv"
    # no --data: the dataset comes from the checkpoint's recorded train config
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tail, "--output", out, "--batch-size", 300)
    assert r.code == 0, r.err
    assert "rows read 1,000  scored 1,000  skipped 0" in r.out
    header, got = read_scores(out)
    assert header == ["row", "label", "probability"]
    want_p, want_y = evaluate_probs(ds, ckpt)
    assert got.shape == (1000, 3) and len(want_p) == 1000
    np.testing.assert_array_equal(got[:, 0], np.arange(1, 1001))
    np.testing.assert_array_equal(got[:, 1], want_y)
    np.testing.assert_allclose(got[:, 2], want_p, rtol=1e-5, atol=1e-7)
    assert np.std(want_p) > 0  # a trained model, not a constant


@needs_criteo
def test_predict_rows_without_label(criteo_model, tmp_path):
    ds, ckpt, tail = criteo_model
    unlabeled = tmp_path / "nolabel.tsv"
    unlabeled.write_bytes(b"".join(line.split(b"\t", 1)[1] for line in tail.read_bytes().splitlines(keepends=True)))
    r = run_cli(
        "predict",
        "--checkpoint",
        ckpt,
        "--data",
        ds,
        "--input",
        unlabeled,
        "--no-label",
        "--output",
        tmp_path / "s.csv",
    )
    assert r.code == 0, r.err
    header, got = read_scores(tmp_path / "s.csv")
    assert header == ["row", "probability"]
    np.testing.assert_allclose(got[:, 1], evaluate_probs(ds, ckpt)[0], rtol=1e-5, atol=1e-7)


@needs_criteo
def test_kept_columns_of_criteo_rows_are_refused_in_one_line(criteo_model):
    ds, ckpt, tail = criteo_model
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", tail, "--keep-columns", "id")
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1, r.err
    assert "--keep-columns: " in r.err and "Criteo TSV rows, whose fields have no names" in r.err, r.err


def test_malformed_rows_are_counted_located_and_skipped(criteo_model, tmp_path):
    ds, ckpt, tail = criteo_model
    lines = tail.read_bytes().splitlines(keepends=True)[:40]
    broken = list(lines)
    broken[2] = b"\t".join(lines[2].split(b"\t")[:-3]) + b"\n"  # line 3: too few fields
    f = lines[6].split(b"\t")
    broken[6] = b"\t".join([f[0], b"abc", *f[2:]])  # line 7: I1 not an integer
    broken[9] = b"2" + lines[9][1:]  # line 10: label 2
    broken[11] = lines[11].replace(b"\t", b"\t\xff", 1)  # line 12: not UTF-8
    src = tmp_path / "broken.tsv"
    src.write_bytes(b"".join(broken))
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", src, "--output", tmp_path / "s.csv")
    assert r.code == 0, r.err
    assert "rows read 40  scored 36  skipped 4" in r.out
    for reason in ("wrong_field_count 1", "bad_integer 1", "bad_label 1", "undecodable 1"):
        assert reason in r.out
    for line in (3, 7, 10, 12):
        assert f"{src}:{line}: " in r.out
    _, got = read_scores(tmp_path / "s.csv")
    keep = [i for i in range(40) if i + 1 not in (3, 7, 10, 12)]
    np.testing.assert_array_equal(got[:, 0], np.array(keep) + 1)
    np.testing.assert_allclose(got[:, 2], evaluate_probs(ds, ckpt)[0][keep], rtol=1e-5, atol=1e-7)

    strict = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", src, "--strict")
    assert strict.code == 2
    assert f"{src}:3: bad row (wrong_field_count" in strict.err and "--strict" in strict.err


@pytest.mark.skipif(not CSV.exists(), reason="needs ../shared/data/criteo")
def test_transcoded_csv_dataset_scores_its_csv(tmp_path):
    ints, cats = [f"I{i}" for i in range(1, 14)], [f"C{i}" for i in range(1, 27)]
    ds = tmp_path / "ds"
    r = run_cli(
        "transcode",
        "--input",
        CSV,
        "--out",
        ds,
        "--label",
        "label",
        "--numerical",
        ",".join(ints),
        "--categorical",
        ",".join(cats),
        "--test-rows",
        50,
        "--log-transform",
    )
    assert r.code == 0, r.err
    r = run_cli("train", "--data", ds, *TRAIN, "--run-dir", tmp_path / "run")
    assert r.code == 0, r.err
    ckpt = tmp_path / "run" / "checkpoints"
    r = run_cli("predict", "--checkpoint", ckpt, "--input", CSV, "--output", tmp_path / "s.csv")
    assert r.code == 0, r.err
    _, got = read_scores(tmp_path / "s.csv")
    n = len(got)
    assert n == FeatureSpec.from_yaml(str(ds)).metadata["preprocess"]["report"]["rows_written"]
    np.testing.assert_allclose(got[-50:, 2], evaluate_probs(ds, ckpt)[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[-50:, 0], np.arange(n - 49, n + 1))


def test_quoted_fields_and_missing_numbers_are_read_as_transcode_read_them(tmp_path):
    """Values in CSV quotes holding the delimiter, and numbers missing as NA, null or empty: predict
    reads the raw rows as transcode did, so its scores are evaluate's on the dataset."""
    rng = np.random.default_rng(3)
    colors = ['"red, dark"', "green", '"blue ""navy"""', "red"]
    lines = ["y,a,c"]
    for i in range(300):
        a = ["NA", "null", ""][i % 3] if i % 7 == 0 else f"{rng.normal():.4f}"
        lines.append(f"{int(rng.random() < 0.3 + 0.3 * (i % 4 == 0))},{a},{colors[i % 4]}")
    src = tmp_path / "rows.csv"
    src.write_text("\n".join(lines) + "\n")
    ds = tmp_path / "ds"
    r = run_cli("transcode", "--input", src, "--out", ds, "--label", "y", "--numerical", "a", "--categorical", "c",
                "--test-rows", 60)  # fmt: skip
    assert r.code == 0 and "written 300  skipped 0" in r.out, r.out + r.err
    assert "numerical values missing (empty, NA, NaN, null, ...), read as 0: a 43" in r.out
    assert "cardinalities [5]" in r.out  # four colors and the unknown id
    r = run_cli("train", "--data", ds, *TRAIN, "--run-dir", tmp_path / "run")
    assert r.code == 0, r.err
    ckpt = tmp_path / "run" / "checkpoints"
    r = run_cli("predict", "--checkpoint", ckpt, "--input", src, "--output", tmp_path / "s.csv")
    assert r.code == 0 and "scored 300  skipped 0" in r.out, r.out + r.err
    _, got = read_scores(tmp_path / "s.csv")
    np.testing.assert_allclose(got[-60:, 2], evaluate_probs(ds, ckpt)[0], rtol=1e-5, atol=1e-7)


def test_dataset_without_raw_format_is_a_one_line_error(tiny_data, tmp_path):
    r = run_cli("train", "--data", tiny_data, "--max-steps", 2, "--no-progress", "--run-dir", tmp_path / "R")
    assert r.code == 0, r.err
    src = tmp_path / "x.tsv"
    src.write_text("0\t1\n")
    r = run_cli("predict", "--checkpoint", tmp_path / "R" / "checkpoints", "--input", src)
    assert r.code == 2 and "not by preprocess/transcode" in r.err


@needs_criteo
def test_no_valid_rows_is_an_error_with_the_no_label_hint(criteo_model, tmp_path):
    ds, ckpt, tail = criteo_model
    unlabeled = tmp_path / "nolabel.tsv"  # 39-field rows, --no-label forgotten
    unlabeled.write_bytes(b"".join(line.split(b"\t", 1)[1] for line in tail.read_bytes().splitlines(keepends=True)))
    out = tmp_path / "s.csv"
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", unlabeled, "--output", out)
    assert r.code == 2
    (line,) = r.err.strip().splitlines()
    assert line.startswith(f"dlrmkit predict: error: --input {unlabeled}: no valid rows (1,000 bad rows: ")
    assert "wrong_field_count 1,000" in line and f"first: {unlabeled}:1: wrong_field_count" in line
    assert line.endswith("add --no-label")
    assert not out.exists()  # no CSV of a header alone

    short = tmp_path / "short.tsv"  # bad in another way: no hint
    short.write_bytes(b"".join(b"\t".join(ln.split(b"\t")[:-3]) + b"\n" for ln in tail.read_bytes().splitlines()[:5]))
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", short)
    assert r.code == 2 and "no valid rows (5 bad rows: wrong_field_count 5" in r.err
    assert r.out == ""  # standard output: no CSV header before the error
    assert "--no-label" not in r.err

    mixed = tmp_path / "mixed.tsv"  # one 39-field row among shorter ones: not every row, so no hint
    mixed.write_bytes(unlabeled.read_bytes().splitlines(keepends=True)[0] + short.read_bytes())
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", mixed)
    assert r.code == 2 and "no valid rows (6 bad rows" in r.err and "--no-label" not in r.err

    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", empty)
    assert r.code == 2 and f"--input {empty}: no valid rows (no rows at all)" in r.err

    labeled = tmp_path / "labeled.tsv"  # and the other way round: labeled rows given --no-label
    labeled.write_bytes(b"".join(tail.read_bytes().splitlines(keepends=True)[:3]))
    r = run_cli("predict", "--checkpoint", ckpt, "--data", ds, "--input", labeled, "--no-label")
    assert r.code == 2 and "no valid rows (3 bad rows" in r.err and "add --no-label" not in r.err


@needs_criteo
def test_predict_to_a_reader_that_stops_early_ends_quietly(criteo_model, tmp_path):
    from test_cli_usage import reader_gone

    from dlrmkit.cli import SIGPIPE_EXIT

    ds, ckpt, tail = criteo_model
    r = reader_gone(["predict", "--checkpoint", str(ckpt), "--data", str(ds), "--input", str(tail)], tmp_path)
    assert r.returncode == SIGPIPE_EXIT, r.stderr
    assert "error" not in r.stderr and "Traceback" not in r.stderr


def write_rows(path: Path, rows: int, label: bool = True, start: int = 0) -> None:
    """A small CSV of a 0/1 label y, numbers a and words c (y left out when `label` is false)."""
    rng = np.random.default_rng(7)
    lines = ["y,a,c" if label else "a,c"]
    for i in range(start, start + rows):
        a, c = float(rng.normal()), ["red", "green", "blue"][i % 3]
        y = int(a + (c == "red") + rng.normal() > 0.5)
        lines.append(f"{y},{a:.4f},{c}" if label else f"{a:.4f},{c}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def csv_model(tmp_path_factory):
    """A model trained on a transcoded CSV dataset written here."""
    root = tmp_path_factory.mktemp("predict_csv")
    write_rows(root / "train.csv", 600)
    r = run_cli("transcode", "--input", root / "train.csv", "--out", root / "ds", "--label", "y",
                "--numerical", "a", "--categorical", "c", "--test-rows", "100")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", root / "ds", *TRAIN, "--run-dir", root / "run")
    assert r.code == 0, r.err
    return root / "ds", root / "run" / "checkpoints"


def test_transcoded_rows_without_the_label_column_are_scored_with_no_label(csv_model, tmp_path):
    ds, ckpt = csv_model
    write_rows(tmp_path / "with.csv", 30, start=1000)
    write_rows(tmp_path / "without.csv", 30, label=False, start=1000)
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "with.csv", "--output", tmp_path / "a.csv")
    assert r.code == 0, r.err
    header, want = read_scores(tmp_path / "a.csv")
    assert header == ["row", "label", "probability"] and want.shape == (30, 3)
    assert np.std(want[:, 2]) > 0  # the rows get different scores, so a mix-up would show

    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "without.csv", "--no-label")
    assert r.code == 0, r.err
    assert r.out.startswith("row,probability\n") and "rows read 30  scored 30  skipped 0" in r.err
    got = np.loadtxt(r.out.splitlines()[1:], delimiter=",", ndmin=2)
    np.testing.assert_array_equal(got[:, 0], np.arange(1, 31))
    np.testing.assert_allclose(got[:, 1], want[:, 2], rtol=1e-6)

    # a label column that is there is ignored with --no-label: the same scores, no label column
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "with.csv", "--no-label")
    assert r.code == 0, r.err
    assert r.out.splitlines()[0] == "row,probability"
    np.testing.assert_allclose(np.loadtxt(r.out.splitlines()[1:], delimiter=",", ndmin=2)[:, 1], want[:, 2], rtol=1e-6)

    # without --no-label: one line that names the missing column and says what to add
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "without.csv")
    assert r.code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert (
        f"{tmp_path / 'without.csv'}: no column(s) y (has: a, c); rows without the label column: add --no-label" in line
    )


def test_kept_columns_are_written_beside_each_probability_as_read(csv_model, tmp_path):
    """--keep-columns carries raw columns (a request's own key) through to the output, as read and
    quoted where CSV needs it, on the row they came from: bad rows skipped do not shift them."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    ds, ckpt = csv_model
    write_rows(tmp_path / "plain.csv", 30, start=1000)
    lines = (tmp_path / "plain.csv").read_text().splitlines()
    ids = [str(10**18 + 7 * i) for i in range(30)]  # past a float's exact integers: kept as text
    notes = [f'say "{i}"' if i % 4 == 0 else f"n{i}" for i in range(30)]
    rows = [f"{k},{x},{n}" for k, x, n in zip(ids, lines[1:], notes)]
    rows[5] = rows[5].replace(",red", ",red,extra").replace(",green", ",green,extra").replace(",blue", ",blue,extra")
    (tmp_path / "keyed.csv").write_text("\n".join(["id," + lines[0] + ",note", *rows]) + "\n")
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "plain.csv", "--output", tmp_path / "a.csv")
    assert r.code == 0, r.err
    _, want = read_scores(tmp_path / "a.csv")
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "keyed.csv", "--keep-columns", "id,note")
    assert r.code == 0 and "scored 29  skipped 1" in r.err, r.err
    got = list(csv.reader(r.out.splitlines()))
    assert got[0] == ["row", "id", "note", "label", "probability"], got[0]
    kept = [i for i in range(30) if i != 5]  # data row 6 has a field too many
    assert [g[0] for g in got[1:]] == [str(i + 1) for i in kept]
    assert [g[1] for g in got[1:]] == [ids[i] for i in kept] and [g[2] for g in got[1:]] == [notes[i] for i in kept]
    assert '1000000000000000000,"say ""0""",' in r.out  # a quote doubled, the field quoted
    np.testing.assert_allclose([float(g[4]) for g in got[1:]], want[kept, 2], rtol=1e-6)

    # Parquet: a value holding a comma, a quote or a line break is one field; a missing one is empty
    odd = ["a,b", 'q"q', "two\nlines", None, "plain"]
    table = pa.table({
        "id": pa.array([10**18 + 7 * i for i in range(30)], pa.int64()),
        "y": [int(x.split(",")[0]) for x in lines[1:]],
        "a": [float(x.split(",")[1]) for x in lines[1:]],
        "c": [x.split(",")[2] for x in lines[1:]],
        "note": [odd[i % 5] for i in range(30)],
    })  # fmt: skip
    pq.write_table(table, tmp_path / "keyed.parquet")
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "keyed.parquet", "--keep-columns", "note,id",
                "--output", tmp_path / "p.csv")  # fmt: skip
    assert r.code == 0, r.err
    with open(tmp_path / "p.csv", newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == ["row", "note", "id", "label", "probability"] and len(got) == 31
    assert [g[1] for g in got[1:]] == [odd[i % 5] or "" for i in range(30)] and [g[2] for g in got[1:]] == ids
    np.testing.assert_allclose([float(g[4]) for g in got[1:]], want[:, 2], rtol=1e-6)

    # a kept value that is not UTF-8 (the model never reads it) keeps its row, escaped and counted;
    # the same bytes in a column the model reads skip the row
    raw = (tmp_path / "keyed.csv").read_bytes().replace(b",n1\n", b",n\xff1\n")
    (tmp_path / "latin.csv").write_bytes(raw)
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "latin.csv", "--keep-columns", "id,note")
    assert r.code == 0 and "scored 29  skipped 1" in r.err and "kept values not UTF-8 1 (written with \\x escapes)" in r.err, r.err
    assert [g[2] for g in csv.reader(r.out.splitlines())][1:3] == [notes[0], "n\\xff1"]
    (tmp_path / "latin.csv").write_bytes(raw.replace(b",n\xff1\n", b",n1\n").replace(b",red,", b",r\xffd,", 1))
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "latin.csv", "--keep-columns", "id,note")
    assert r.code == 0 and "scored 28  skipped 2 (wrong_field_count 1, undecodable 1)" in r.err, r.err

    # a column the input lacks, or one predict writes itself: one line, nothing written
    for keep, said in (("id,nonesuch", "no column(s) nonesuch (has: id, y, a, c, note); --keep-columns"),
                       ("probability", "--keep-columns: 'probability' is a column predict writes itself")):  # fmt: skip
        r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "keyed.csv", "--keep-columns", keep)
        assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1 and said in r.err, r.err


def test_kept_values_not_utf8_are_counted_in_the_rows_written_only(csv_model, tmp_path):
    """The count of escaped kept values is of those written: a row skipped for its own columns (a
    model column not UTF-8, a bad number) writes none of its kept values, so none are counted."""
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, ckpt = csv_model
    rows = b"y,a,c,note\n1,0.5,red,ok\n1,0.5,r\xffd,n\xff2\n1,abc,red,n\xff3\n1,0.3,blue,n\xff4\n"
    (tmp_path / "rows.csv").write_bytes(rows)
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "rows.csv", "--keep-columns", "note")
    assert r.code == 0 and "scored 2  skipped 2 (bad_number 1, undecodable 1)" in r.err, r.err
    assert [g[1] for g in csv.reader(r.out.splitlines())][1:] == ["ok", "n\\xff4"]
    assert "kept values not UTF-8 1 (written with \\x escapes)" in r.err, r.err
    table = pa.table({"y": [1, 1, 1], "a": [0.5, 0.1, 0.2], "c": pa.array([b"red", b"r\xffd", b"blue"], pa.binary()),
                      "note": pa.array([b"ok", b"n\xff", b"m\xfe\xfe"], pa.binary())})  # fmt: skip
    pq.write_table(table, tmp_path / "rows.parquet")
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "rows.parquet", "--keep-columns", "note")
    assert r.code == 0 and "scored 2  skipped 1 (undecodable 1)" in r.err, r.err
    assert [g[1] for g in csv.reader(r.out.splitlines())][1:] == ["ok", "m\\xfe\\xfe"]
    assert "kept values not UTF-8 1 (written with \\x escapes)" in r.err, r.err


def test_a_model_of_other_bag_sizes_is_refused_in_one_line(csv_model, tmp_path):
    """Raw rows give one id per table: a model trained on bags of the dataset's ids (`multihot`)
    would sum-pool other ids than it learned, so it is refused, naming the table and both sizes."""
    from dlrmkit.data.multi_hot import materialize

    ds, _ = csv_model
    materialize(str(ds), str(tmp_path / "mh"), [2], seed=0, progress=False)
    r = run_cli("train", "--data", tmp_path / "mh", *TRAIN, "--run-dir", tmp_path / "run")
    assert r.code == 0, r.err
    write_rows(tmp_path / "rows.csv", 30, start=1000)
    out = tmp_path / "scores.csv"
    r = run_cli("predict", "--checkpoint", tmp_path / "run" / "checkpoints", "--data", ds, "--input",
                tmp_path / "rows.csv", "--output", out)  # fmt: skip
    assert r.code == 2 and r.out == "" and not out.exists(), r.err
    (line,) = r.err.strip().splitlines()
    name = FeatureSpec.from_yaml(str(ds)).categorical_names[0]
    assert f"checkpoints: table 0 ({name}) was trained on bags of 2 ids per sample, but {ds} has bags of 1" in line


def test_bad_input_writes_nothing_to_standard_output(csv_model, tmp_path):
    ds, ckpt = csv_model
    bad = tmp_path / "bad.csv"
    bad.write_text("y,a,c\n7,0.5,red\n1,x,red\n")  # every row bad
    r = run_cli("predict", "--checkpoint", ckpt, "--input", bad)
    assert r.code == 2
    assert r.out == ""  # no header of a CSV that never comes
    (line,) = r.err.strip().splitlines()
    assert "no valid rows (2 bad rows: bad_label 1, bad_number 1; " in line
    assert f"first: {bad}:2: data row 1: bad_label in column y ('7')" in line
    r = run_cli("predict", "--checkpoint", ckpt, "--input", bad, "--strict")
    assert r.code == 2 and r.out == "" and f"{bad}:2: data row 1: bad_label in column y ('7')" in r.err
    r = run_cli("predict", "--checkpoint", ckpt, "--input", bad, "--output", tmp_path / "s.csv")
    assert r.code == 2 and not (tmp_path / "s.csv").exists()


def test_a_blank_header_or_a_compressed_input_is_one_line(csv_model, criteo_model, tmp_path):
    """Rows read as transcode reads them: a blank first line is no header, and a compressed file
    of a format not read is named by its first bytes, for CSV and Criteo rows alike (they were
    "no column(s) y, a, c (has: )" and "the header line is not UTF-8", or every row bad)."""
    import bz2

    _, ckpt = csv_model
    write_rows(tmp_path / "rows.csv", 10)
    blank = tmp_path / "blank.csv"
    blank.write_bytes(b"\n" + (tmp_path / "rows.csv").read_bytes())
    packed = tmp_path / "rows.csv.bz2"
    packed.write_bytes(bz2.compress((tmp_path / "rows.csv").read_bytes()))
    _, criteo_ckpt, tail = criteo_model
    criteo = tmp_path / "tail.tsv.bz2"
    criteo.write_bytes(bz2.compress(tail.read_bytes()))
    for checkpoint, path, phrase in (
        (ckpt, blank, f"{blank}:1: the header line is blank (line 2 is the first that is not)"),
        (ckpt, packed, f"{packed}: holds bzip2-compressed data; text input is read plain or gzip-compressed"),
        (criteo_ckpt, criteo, f"{criteo}: holds bzip2-compressed data"),
    ):
        r = run_cli("predict", "--checkpoint", checkpoint, "--input", path)
        assert r.code == 2 and r.out == "", r.err
        (line,) = r.err.strip().splitlines()
        assert phrase in line, line


@pytest.mark.parametrize(
    "edit, phrase",
    [
        ({"categorical_columns": ["a"]}, "metadata.categorical_columns ['a'] are not its vocabulary's columns ['c']"),
        ({"categorical_columns": "c"}, "metadata.categorical_columns must be a list of column names, not 'c'"),
        ({"numerical_columns": ["a", "a"]}, "metadata.numerical_columns names 2 column(s), the dataset has 1"),
        ({"numerical_columns": ["c"]}, "metadata names column 'c' twice"),
        ({"label": None}, "metadata.label must name the label column, not None"),
        ({"generator": 5}, "made by '5', not by preprocess/transcode"),
    ],
    ids=["not-the-vocabularys", "a-string", "numerical-more", "column-twice", "no-label", "generator"],
)
def test_a_datasets_column_record_that_disagrees_is_one_line(csv_model, tmp_path, edit, phrase):
    """A transcoded dataset's metadata says which raw column feeds which feature: one that does not
    fit the dataset is refused, never scored (a numerical column read as the category scored every
    row; others ended in "internal error")."""
    import shutil

    import yaml

    ds, ckpt = csv_model
    shutil.copytree(ds, tmp_path / "ds")
    doc = yaml.safe_load((tmp_path / "ds" / "feature_spec.yaml").read_text())
    doc["metadata"].update(edit)
    (tmp_path / "ds" / "feature_spec.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    write_rows(tmp_path / "rows.csv", 10)
    r = run_cli("predict", "--checkpoint", ckpt, "--data", tmp_path / "ds", "--input", tmp_path / "rows.csv")
    assert r.code == 2 and r.out == "", (r.code, r.err)
    (line,) = r.err.strip().splitlines()
    assert phrase in line, line


def test_rows_of_a_dataset_transcoded_with_label_values_are_read_with_them(tmp_path):
    write_rows(tmp_path / "train.csv", 300)
    words = tmp_path / "words.csv"  # the same rows, the label as words
    lines = (tmp_path / "train.csv").read_text().splitlines()
    words.write_text("\n".join([lines[0], *(("yes" if x[0] == "1" else "no") + x[1:] for x in lines[1:])]) + "\n")
    r = run_cli("transcode", "--input", words, "--out", tmp_path / "ds", "--label", "y", "--label-values", "no,yes",
                "--numerical", "a", "--categorical", "c", "--test-rows", "50")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "ds", *TRAIN, "--run-dir", tmp_path / "run")
    assert r.code == 0, r.err
    ckpt = tmp_path / "run" / "checkpoints"
    r = run_cli("predict", "--checkpoint", ckpt, "--input", words, "--output", tmp_path / "s.csv")
    assert r.code == 0 and "rows read 300  scored 300  skipped 0" in r.out, r.out + r.err
    _, got = read_scores(tmp_path / "s.csv")
    assert got[:, 1].astype(int).tolist() == [int(x[0] == "1") for x in lines[1:]]
    # rows with 0/1 labels are not this dataset's: each a bad label, said
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "train.csv", "--output", tmp_path / "t.csv")
    assert r.code == 2 and "bad_label in column y ('1')" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    # the dataset's record of them is read as untrusted input
    spec = tmp_path / "ds" / "feature_spec.yaml"
    spec.write_text(spec.read_text().replace("- 'no'", "- 'yes'"))
    r = run_cli("predict", "--checkpoint", ckpt, "--input", words, "--output", tmp_path / "u.csv")
    assert r.code == 2 and "metadata.label_values must be two different values" in r.err, r.err


def test_rows_of_a_headerless_dataset_are_read_with_its_columns_and_delimiter(tmp_path):
    """transcode records --no-header --columns and --delimiter; predict reads new rows the same way."""

    def semicolons(src: Path, dst: Path) -> list[str]:
        lines = src.read_text().splitlines()[1:]  # no header line
        dst.write_text("\n".join(x.replace(",", ";") for x in lines) + "\n")
        return lines

    write_rows(tmp_path / "train.csv", 300)
    lines = semicolons(tmp_path / "train.csv", tmp_path / "train.txt")
    r = run_cli("transcode", "--input", tmp_path / "train.txt", "--out", tmp_path / "ds", "--label", "y",
                "--no-header", "--columns", "y,a,c", "--delimiter", ";",
                "--numerical", "a", "--categorical", "c", "--test-rows", "50")  # fmt: skip
    assert r.code == 0, r.err
    r = run_cli("train", "--data", tmp_path / "ds", *TRAIN, "--run-dir", tmp_path / "run")
    assert r.code == 0, r.err
    ckpt = tmp_path / "run" / "checkpoints"
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "train.txt", "--output", tmp_path / "s.csv")
    assert r.code == 0 and "rows read 300  scored 300  skipped 0" in r.out, r.out + r.err
    _, got = read_scores(tmp_path / "s.csv")
    assert got[:, 1].astype(int).tolist() == [int(x[0]) for x in lines]  # the first line is a row, not a header
    np.testing.assert_allclose(got[-50:, 2], evaluate_probs(tmp_path / "ds", ckpt)[0], rtol=1e-5, atol=1e-7)
    # rows without the label: the recorded columns less the label's
    write_rows(tmp_path / "new.csv", 30, label=False)
    semicolons(tmp_path / "new.csv", tmp_path / "new.txt")
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "new.txt", "--no-label")
    assert r.code == 0 and "rows read 30  scored 30  skipped 0" in r.err, r.err
    # kept columns are named by the recorded columns too, their values as read
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "new.txt", "--no-label", "--keep-columns", "a")
    assert r.code == 0 and r.out.splitlines()[0] == "row,a,probability", r.err
    raw = [x.split(",")[0] for x in (tmp_path / "new.csv").read_text().splitlines()[1:]]
    assert [x.split(",")[1] for x in r.out.splitlines()[1:]] == raw
    # the dataset's record of them is read as untrusted input
    spec = tmp_path / "ds" / "feature_spec.yaml"
    spec.write_text(spec.read_text().replace("delimiter: ;", "delimiter: ;;"))
    r = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "train.txt", "--output", tmp_path / "u.csv")
    assert r.code == 2 and "metadata.delimiter must be one character" in r.err, r.err


def checkpoint_copy(ckpt: Path, dest: Path, edit=None) -> Path:
    """A copy of checkpoint folder `ckpt` at `dest`, `edit` applied to the manifest `latest` names."""
    import json
    import shutil

    from dlrmkit.checkpoint.save_load import resolve_checkpoint

    shutil.copytree(ckpt, dest, symlinks=True)
    fp = Path(resolve_checkpoint(str(dest))) / "manifest.json"
    m = json.loads(fp.read_text())
    if edit:
        edit(m)
        fp.write_text(json.dumps(m))
    return dest


def other_vocabulary(ds: Path, out: Path) -> Path:
    """A copy of dataset `ds` whose vocabulary numbers the same values otherwise (table sizes kept)."""
    import shutil

    import pyarrow as pa

    from dlrmkit.data.encoder import Vocabulary

    shutil.copytree(ds, out)
    vocab = Vocabulary.load(str(out))
    vocab.values[0] = pa.array(vocab.values[0].to_pylist()[::-1], pa.string())
    vocab.save(str(out))
    assert Vocabulary.load(str(out)).cardinalities == Vocabulary.load(str(ds)).cardinalities
    return out


def test_a_dataset_of_another_vocabulary_is_refused_and_one_made_again_is_read(csv_model, tmp_path):
    """Without --data, predict reads the vocabulary at the path the checkpoint records: a folder
    there holding another dataset of the same table sizes (a checkpoint from another machine, or
    crafted) read every category as another id. The vocabulary's fingerprint recorded at training
    is compared with the one read: another is one line naming both paths, with --data too; the
    genuine dataset, or one made again from the same rows, scores as before."""
    ds, ckpt = csv_model
    rows = tmp_path / "rows.csv"
    write_rows(rows, 30, start=1000)
    r = run_cli("predict", "--checkpoint", ckpt, "--input", rows, "--output", tmp_path / "want.csv")
    assert r.code == 0, r.err
    _, want = read_scores(tmp_path / "want.csv")
    other = other_vocabulary(ds, tmp_path / "other")
    moved = checkpoint_copy(ckpt, tmp_path / "ck", lambda m: m["train_config"].update(data=str(other)))
    assert len(json_manifest(moved)["dataset"]["vocabulary"]) == 64  # recorded at training
    for given in ([], ["--data", other]):
        r = run_cli("predict", "--checkpoint", moved, "--input", rows, "--output", tmp_path / "s.csv", *given)
        assert r.code == 2 and r.out == "" and not (tmp_path / "s.csv").exists(), r.err
        (line,) = r.err.strip().splitlines()
        assert f"the model was trained on {ds}, but " in line and "holds another vocabulary" in line, line
        assert f"{other}" in line and "pass --data DIR, the dataset it was trained on" in line, line
    r = run_cli("predict", "--checkpoint", moved, "--input", rows, "--output", tmp_path / "s.csv", "--data", ds)
    assert r.code == 0, r.err
    np.testing.assert_array_equal(read_scores(tmp_path / "s.csv")[1], want)
    # made again from the same rows, at the path the checkpoint records: its vocabulary is the same
    r = run_cli("transcode", "--input", ds.parent / "train.csv", "--out", tmp_path / "again", "--label", "y",
                "--numerical", "a", "--categorical", "c", "--test-rows", "100")  # fmt: skip
    assert r.code == 0, r.err
    again = checkpoint_copy(ckpt, tmp_path / "ck2", lambda m: m["train_config"].update(data=str(tmp_path / "again")))
    r = run_cli("predict", "--checkpoint", again, "--input", rows, "--output", tmp_path / "s2.csv")
    assert r.code == 0, r.err
    np.testing.assert_array_equal(read_scores(tmp_path / "s2.csv")[1], want)


def json_manifest(ckpt: Path) -> dict:
    import json

    from dlrmkit.checkpoint.save_load import resolve_checkpoint

    return json.loads((Path(resolve_checkpoint(str(ckpt))) / "manifest.json").read_text())


def test_a_checkpoint_without_the_vocabularys_fingerprint_is_read_as_before(csv_model, tmp_path):
    """A checkpoint saved before the vocabulary's fingerprint was recorded: the path it records is
    read while the dataset's fingerprint (its spec and binary files) matches, else refused in one
    line (a --data given is read, as before); one that records no dataset at all is read as before
    (table sizes checked)."""
    ds, ckpt = csv_model
    rows = tmp_path / "rows.csv"
    write_rows(rows, 30, start=1000)
    write_rows(tmp_path / "other.csv", 600, start=1)  # other rows: the same three values, counted otherwise
    other = tmp_path / "other"
    r = run_cli("transcode", "--input", tmp_path / "other.csv", "--out", other, "--label", "y", "--numerical", "a",
                "--categorical", "c", "--test-rows", "100")  # fmt: skip
    assert r.code == 0, r.err

    def older(m: dict, keep_dataset: bool = True) -> None:
        m["train_config"]["data"] = str(other)
        m["dataset"].pop("vocabulary")
        if not keep_dataset:
            del m["dataset"]

    old = checkpoint_copy(ckpt, tmp_path / "old", older)
    r = run_cli("predict", "--checkpoint", old, "--input", rows)
    assert r.code == 2 and r.out == "", r.err
    (line,) = r.err.strip().splitlines()
    assert f"the model was trained on {ds}, but {other}, the dataset path it records, holds other files" in line, line
    for checkpoint, given in ((old, ["--data", other]), (old, ["--data", ds]), (tmp_path / "oldest", [])):
        if not checkpoint.exists():
            checkpoint_copy(ckpt, checkpoint, lambda m: older(m, keep_dataset=False))
        r = run_cli("predict", "--checkpoint", checkpoint, "--input", rows, *given)
        assert r.code == 0 and "scored 30" in r.err, (checkpoint, given, r.err)
