"""Streams are streams and memory stays bounded: `-` and /dev/stdout as an output write to standard
output (never a file of that name), FIFOs and devices as inputs are one line (never a hang), an
output on a kernel file system is refused before any work, an SQLite storage URL in any dialect
spelling is checked like the plain one, and 200 rows followed by 16 MiB of empty lines (plain or
gzip) are read in bounded memory (RLIMIT_AS 4 GB in a subprocess) with the empty lines counted."""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli, scratch_cwd
from dlrmkit.data.feature_spec import FeatureSpec
from test_checkpoint_trust import assert_one_line_error, transcoded  # noqa: F401 (fixture)

EMPTY_LINES = 16 << 20


def run_limited(*argv, cwd=None, limit_gb: int = 4, timeout: float = 120):
    """`python -m dlrmkit ARGV` with at most `limit_gb` GB of address space."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_gb << 30, limit_gb << 30))

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "dlrmkit", *map(str, argv)],
        cwd=cwd or scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


# ---- standard output -------------------------------------------------------------------------------------
def test_metrics_json_dash_writes_json_to_standard_output(transcoded, tmp_path):  # noqa: F811
    ds, c, _ = transcoded
    r = run_cli("evaluate", "--data", ds, "--checkpoint", c, "--metrics-json", "-", cwd=tmp_path)
    assert r.code == 0, r.err
    assert json.loads(r.out)["rows"] == 100 and "AUC" in r.err
    assert os.listdir(tmp_path) == []  # no file named '-', no lock


@pytest.mark.parametrize(
    "argv, key",
    [
        (("plan", "--tables", "1000x8,50x8", "--world-size", "2"), "tables"),
        (
            ("bench", "--steps", "1", "--windows", "1", "--warmup", "0", "--batch-size", "16", "--no-compile"),
            "samples_per_s",
        ),
        (("baseline", "--data", "{data}", "--max-iter", "5", "--c", "1", "--out"), "test_auc"),
    ],
    ids=["plan", "bench", "baseline"],
)
def test_json_dash_is_the_whole_standard_output(argv, key, tiny_data, tmp_path):
    """`plan --json -`, `bench --json -` and `baseline --out -`: standard output is the JSON alone,
    the words on stderr (the plan's table, the figures and baseline's "wrote -" came first on
    standard output, which then did not parse)."""
    argv = [str(tiny_data) if a == "{data}" else a for a in argv]
    r = run_cli(*argv, *(["-"] if argv[-1] == "--out" else ["--json", "-"]), cwd=tmp_path)
    assert r.code == 0, r.err
    assert key in json.loads(r.out) and r.err.strip()
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.islink("/dev/stdout"), reason="/dev/stdout is not the usual link here")
def test_dev_stdout_is_written_not_replaced(transcoded, tmp_path):  # noqa: F811
    ds, c, csv = transcoded
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    argv = [sys.executable, "-m", "dlrmkit", "predict", "--checkpoint", c, "--input", csv, "--output", "/dev/stdout"]
    proc = subprocess.run(list(map(str, argv)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("row,label,probability\n") and len(proc.stdout.splitlines()) == 601
    assert os.path.islink("/dev/stdout")  # the system's link, not replaced by a file
    for link in ("/dev/stderr", "/dev/fd/2"):  # another stream's link: refused, never replaced
        r = run_cli("predict", "--checkpoint", c, "--input", csv, "--output", link)
        assert r.code == 2 and "--output" in r.err, r.err
        assert os.path.islink("/dev/stderr")


def test_predict_output_dash_is_standard_output(transcoded, tmp_path):  # noqa: F811
    ds, c, csv = transcoded
    r = run_cli("predict", "--checkpoint", c, "--input", csv, "--output", "-", cwd=tmp_path)
    assert r.code == 0, r.err
    assert r.out.startswith("row,label,probability\n") and "rows read 600" in r.err
    assert os.listdir(tmp_path) == []


# ---- inputs that are not files ----------------------------------------------------------------------------
@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


def test_predict_input_fifo_or_device_is_one_line(transcoded, fifo):  # noqa: F811
    ds, c, _ = transcoded
    for bad in (fifo, "/dev/zero"):
        r = run_cli("predict", "--checkpoint", c, "--input", bad)
        assert_one_line_error(r, str(bad), "not a regular file")


def test_report_on_a_log_that_is_a_fifo_or_device_is_one_line(tiny_data, tmp_path, fifo):
    run = tmp_path / "run"
    r = run_cli("train", "--data", tiny_data, "--no-progress", "--max-steps", 2, "--run-dir", run)
    assert r.code == 0, r.err
    for bad in (fifo, Path("/dev/zero")):
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**info, "log_jsonl": str(bad)}))
        r = run_limited("report", run, "--out", tmp_path / "rep", timeout=60)
        assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr, r.stderr
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    r = run_limited("report", run, "--out", tmp_path / "rep", timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr


# ---- outputs checked before any work ----------------------------------------------------------------------
def test_an_output_on_a_kernel_file_system_is_refused_before_the_work(transcoded):  # noqa: F811
    ds, c, csv = transcoded
    r = run_cli("evaluate", "--data", ds, "--checkpoint", c, "--metrics-json", "/proc/self/dlrmkit.json")
    assert_one_line_error(r, "--metrics-json", "/proc")
    assert r.out == ""  # no evaluation ran
    r = run_cli("predict", "--checkpoint", c, "--input", csv, "--output", "/sys/kernel/dlrmkit.csv")
    assert_one_line_error(r, "--output", "/sys")


def test_an_sqlite_dialect_url_is_checked_like_the_plain_one(tiny_data, tmp_path):
    for url in (f"sqlite+pysqlite:///{tiny_data}/study.db", f"SQLite:///{tiny_data}/study.db"):
        r = run_cli("tune", "--data", tiny_data, "--out", tmp_path / "t", "--trials", 1, "--storage", url)
        assert_one_line_error(r, "--storage", "inside --data")
    assert not (Path(tiny_data) / "study.db").exists()


# ---- bounded memory on empty lines -------------------------------------------------------------------------
def criteo_rows(n: int) -> bytes:
    rng = random.Random(0)
    lines = [
        "\t".join(
            [
                str(rng.randint(0, 1)),
                *(str(rng.randint(0, 99)) for _ in range(13)),
                *(format(rng.randint(0, 40), "08x") for _ in range(26)),
            ]
        )
        for _ in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow  # parses 16 MiB of empty lines
def test_preprocess_reads_empty_lines_in_bounded_memory(tmp_path):
    src = tmp_path / "rows.tsv"
    src.write_bytes(criteo_rows(200) + b"\n" * EMPTY_LINES)
    r = run_limited(
        "preprocess",
        "criteo",
        "--input",
        src,
        "--out",
        tmp_path / "o",
        "--workers",
        1,
        "--test-rows",
        20,
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rep = FeatureSpec.from_yaml(str(tmp_path / "o")).metadata["preprocess"]["report"]
    assert rep["rows_written"] == 200 and sum(rep["rows_skipped"].values()) == EMPTY_LINES


@pytest.mark.slow  # parses 16 MiB of empty lines twice
def test_transcode_and_predict_read_a_gzip_of_empty_lines_in_bounded_memory(transcoded, tmp_path):  # noqa: F811
    ds, c, csv = transcoded
    src = tmp_path / "rows.csv.gz"
    with gzip.open(src, "wb", compresslevel=9) as f:  # a few KiB that expand to 16 MiB
        f.write(csv.read_bytes() + b"\n" * EMPTY_LINES)
    assert src.stat().st_size < 64 << 10
    r = run_limited("predict", "--checkpoint", c, "--input", src, "--output", tmp_path / "p.csv")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "scored 600" in r.stdout and f"empty lines skipped {EMPTY_LINES:,}" in r.stdout, r.stdout
    r = run_limited(
        "transcode",
        "--input",
        src,
        "--out",
        tmp_path / "t",
        "--label",
        "label",
        "--numerical",
        "x",
        "--categorical",
        "c1,c2",
        "--test-rows",
        100,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"empty lines skipped {EMPTY_LINES:,}" in r.stdout, r.stdout


# ---- long categorical values -----------------------------------------------------------------------------
LONG = 256 << 10  # bytes of each long value


def long_values_parquet(path: Path, rows: int = 4096) -> None:
    """4 distinct values of 256 KiB over `rows` rows, dictionary-encoded and zstd-compressed: about
    12 KiB on disk, 1 GiB of values (the whole file was one batch of rows, expanded)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    c1 = pa.DictionaryArray.from_arrays(
        pa.array(np.arange(rows) % 4, pa.int32()), pa.array([chr(97 + k) * LONG for k in range(4)])
    )
    t = pa.table(
        {
            "label": pa.array(np.arange(rows) % 2, pa.int8()),
            "x": pa.array(np.arange(rows, dtype=np.float64)),
            "c1": c1,
            "c2": pa.array([f"b{i % 7}" for i in range(rows)]),
        }
    )
    pq.write_table(t, path, compression="zstd")


def long_values_csv_gz(path: Path, rows: int = 9600, length: int = 64 << 10) -> None:
    """`rows` rows whose c1 is a distinct value of `length` bytes (a long shared prefix and the row
    number): 0.7 MiB of gzip, 600 MiB of values. Each 8 MiB block's value counts were kept until
    4,000,000 of them (a row count), and the vocabulary held every value whole."""
    prefix = "q" * length
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(b"label,x,c1,c2\n")
        for i in range(rows):
            f.write(f"{i % 2},{i},{prefix}{i},b{i % 7}\n".encode())


def transcode_args(src, out) -> list:
    return ["transcode", "--input", src, "--out", out, "--label", "label", "--numerical", "x"] + [
        "--categorical", "c1,c2", "--test-rows", 100,
    ]  # fmt: skip


def test_transcode_reads_a_parquet_of_long_repeated_values_in_bounded_memory(tmp_path):
    src = tmp_path / "rows.parquet"
    long_values_parquet(src)
    assert src.stat().st_size < 64 << 10
    r = run_limited(*transcode_args(src, tmp_path / "o"), limit_gb=2, timeout=60)  # took 7.3 GB
    assert r.returncode == 0, r.stderr[-2000:]
    assert "longer than 1,024 bytes read as their first 32 characters and SHA-256: 4,096 rows (c1 4,096)" in r.stdout
    spec = FeatureSpec.from_yaml(str(tmp_path / "o"))
    assert spec.cardinalities[0] == 5  # the 4 values stay 4 (and id 0)
    assert spec.metadata["preprocess"]["report"]["long_values_as_keys"] == {"c1": 4096}


@pytest.mark.slow  # 600 MiB of values, read three times
def test_transcode_reads_a_gzip_of_long_distinct_values_in_bounded_memory(tmp_path):
    src = tmp_path / "rows.csv.gz"
    long_values_csv_gz(src)
    assert src.stat().st_size < 2 << 20
    r = run_limited(*transcode_args(src, tmp_path / "o"), limit_gb=1, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SHA-256: 9,600 rows (c1 9,600)" in r.stdout, r.stdout
    assert FeatureSpec.from_yaml(str(tmp_path / "o")).cardinalities[0] == 9501  # train rows' values, each kept
    vocab = tmp_path / "o" / "vocabulary" / "cat_0.arrow"
    assert vocab.stat().st_size < 9600 * 256  # keys of at most 202 bytes, not 64 KiB values


def test_a_long_value_gets_the_same_id_from_csv_and_parquet_as_transcode_gave_it(tmp_path):
    """The rule is `clean`'s, which transcode and predict both read rows through: a long value
    (trimmed, quoted or not, from text or from a Parquet dictionary) is read as the same key, which
    the vocabulary holds; a vocabulary holding a longer value (an older transcode) is read whole."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrmkit.data.encoder import LONG_VALUE_BYTES, Vocabulary, long_value_key
    from dlrmkit.data.transcode import Report, TranscodeOptions, clean, iter_batches, transcode

    long = ["é" * 700 + str(k) for k in range(3)]  # 1,401 bytes: over the limit in bytes, not in characters
    rows = [(i % 2, i, long[i % 3] if i % 4 else f"s{i % 5}", f"b{i % 3}") for i in range(200)]
    csv = tmp_path / "rows.csv"
    csv.write_text("label,x,c1,c2\n" + "".join(f'{a},{b}, "{c}" ,{d}\n' for a, b, c, d in rows), encoding="utf-8")
    pq.write_table(
        pa.table({k: [r[j] for r in rows] for j, k in enumerate(["label", "x", "c1", "c2"])}), tmp_path / "rows.parquet"
    )
    opts = TranscodeOptions([str(csv)], str(tmp_path / "ds"), "label", ["x"], ["c1", "c2"], test_rows=20)
    transcode(opts)
    vocab = Vocabulary.load(str(tmp_path / "ds"))
    assert vocab.long_value_bytes() == LONG_VALUE_BYTES
    keys = {long_value_key(v.encode()) for v in long}
    assert keys <= set(vocab.values[0].to_pylist()) and max(len(k.encode()) for k in keys) <= 202
    ids = {}
    for name in ("rows.csv", "rows.parquet"):
        o = TranscodeOptions([str(tmp_path / name)], "", None, ["x"], ["c1", "c2"])
        report, got = Report(), []
        for t, r in iter_batches(o, str(tmp_path / name), report):
            _, _, cats = clean(o, t, report, str(tmp_path / name), r)
            got.append(vocab.encode_column(0, cats[0]))
        ids[name] = np.concatenate(got)
        assert report.long_values == {"c1": 150}
    assert (ids["rows.csv"] == ids["rows.parquet"]).all() and (ids["rows.csv"] > 0).all()
    assert len(set(ids["rows.csv"][[1, 2, 3]])) == 3  # the three long values stay three
    # the library's encode reads a raw long value as transcode did
    raw = vocab.encode({"c1": [rows[i][2].strip() for i in (1, 2, 3)], "c2": ["b1", "b2", "b0"]})
    assert (raw[:, 0] == ids["rows.csv"][[1, 2, 3]]).all() and (raw > 0).all()
    old = Vocabulary(["c1"], [pa.array(["v" * 2000])], [np.array([5])])
    assert old.long_value_bytes() is None and old.encode({"c1": ["v" * 2000]})[0, 0] == 1


def test_a_parquet_row_of_more_than_16_mib_of_values_is_one_line(tmp_path):
    """A long value in a column other than a categorical one (here the numerical column, held once
    in a dictionary) is not expanded: its row is refused as a text line over 16 MiB is."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = pa.DictionaryArray.from_arrays(pa.array(np.arange(300) == 7, pa.int32()), pa.array(["1", "9" * (17 << 20)]))
    pq.write_table(
        pa.table({"label": pa.array(np.arange(300) % 2, pa.int8()), "x": x, "c1": ["a"] * 300, "c2": ["b"] * 300}),
        tmp_path / "rows.parquet",
        compression="zstd",
    )
    r = run_cli(*transcode_args(tmp_path / "rows.parquet", tmp_path / "o"))
    assert_one_line_error(r, "rows.parquet: data row 8: its values hold 17,825,", "more than the 16 MiB a row may hold")
    assert not (tmp_path / "o").exists()
