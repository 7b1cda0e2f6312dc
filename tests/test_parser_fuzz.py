"""Property-based fuzzing (hypothesis, bounded) of the two row parsers: the Criteo TSV block
parser and the CSV transcode parser. Random bytes and mutated valid rows never crash them, and
every row read is either written or counted as skipped (rows read = written + skipped)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (pip install -e '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dlrmkit.data.criteo_tsv import Bad, parse_block  # noqa: E402
from dlrmkit.data.transcode import Report, TranscodeOptions, iter_clean  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _criteo_rows() -> list[bytes]:
    """Real rows when ../shared/data is there, else valid rows of the same shape."""
    path = SHARED / "criteo_kaggle_head6k.tsv"
    if path.exists():
        return path.read_bytes().splitlines(keepends=True)[:200]
    rng = np.random.default_rng(0)
    return [
        (
            "\t".join(
                [str(rng.integers(0, 2))]
                + [str(rng.integers(0, 50)) for _ in range(13)]
                + [f"{rng.integers(0, 1 << 32):08x}" for _ in range(26)]
            )
            + "\n"
        ).encode()
        for _ in range(200)
    ]


CRITEO_ROWS = _criteo_rows()
CSV_HEADER = b"y,a,b,c\n"
CSV_ROWS = [f"{i % 2},{i * 1.5},{i % 7},cat{i % 5}\n".encode() for i in range(50)]
NASTY = [
    b"\t",
    b"\n",
    b"\r\n",
    b'"',
    b"\xff",
    b"\x00",
    b",",
    b"-",
    b"1e400",
    b"99999999999999999999",
    b" ",
    b"nan",
    b"inf",
    b"\xe2\x82",
    b"70000",
    b"\\",
    b"'",
]


def mutate(rows: list[bytes], picks: list[int], edits: list[tuple[int, int, bytes]]) -> bytes:
    """Rows chosen by `picks`, with each edit (row, position, bytes) inserted or overwriting."""
    chosen = [bytearray(rows[i % len(rows)]) for i in picks] or [bytearray()]
    for row, pos, new in edits:
        r = chosen[row % len(chosen)]
        p = pos % (len(r) + 1)
        r[p : p + (len(new) if row % 2 else 0)] = new
    return b"".join(bytes(r) for r in chosen)


def as_block(data: bytes) -> bytes:
    """iter_blocks hands the parser whole lines, each ending in a newline."""
    return data if data.endswith(b"\n") else data + b"\n"


def check_criteo(block: bytes) -> None:
    bad = Bad()
    p = parse_block(block, bad, 1)
    lines = block.replace(b"\r\n", b"\n").count(b"\n")
    assert p.lines == lines
    assert len(p.labels) + sum(bad.counts.values()) == lines, (len(p.labels), bad.counts, lines)
    assert all(len(a) == len(p.labels) for a in p.ints + p.cats)


@FUZZ
@given(st.binary(min_size=1, max_size=600))
def test_criteo_parser_random_bytes(data):
    check_criteo(as_block(data))


@FUZZ
@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 1000), st.sampled_from(NASTY) | st.binary(max_size=4)),
        max_size=8,
    ),
)
def test_criteo_parser_mutated_rows(picks, edits):
    check_criteo(as_block(mutate(CRITEO_ROWS, picks, edits)))


def check_csv(body: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "in.csv")
        with open(path, "wb") as f:
            f.write(CSV_HEADER + body)
        opts = TranscodeOptions(
            inputs=[path], out=os.path.join(tmp, "o"), label="y", numerical=["a", "b"], categorical=["c"]
        )
        report = Report()
        written = 0
        for labels, dense, cats in iter_clean(opts, report):
            assert len(dense) == len(labels) and all(len(c) == len(labels) for c in cats)
            assert np.isfinite(dense.astype(np.float32)).all()  # nothing out of float16's range slips in
            written += len(labels)
        assert report.read == written + sum(report.skipped.values()), (report.read, written, report.skipped)
        lines = [ln for ln in body.replace(b"\r\n", b"\n").split(b"\n") if ln]
        assert report.read == len(lines)  # every non-empty line is a row: a quote never joins lines


@FUZZ
@given(st.binary(min_size=1, max_size=600))
def test_csv_parser_random_bytes(data):
    check_csv(as_block(data))


@FUZZ
@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 1000), st.sampled_from(NASTY) | st.binary(max_size=4)),
        max_size=8,
    ),
)
def test_csv_parser_mutated_rows(picks, edits):
    check_csv(as_block(mutate(CSV_ROWS, picks, edits)))


def check_quoted_lines(lines: list[bytes]) -> None:
    """Every line `quoted_lines` admits splits as Python's csv module splits it (strict), into the
    fields Arrow's quoting reader gives; every line csv itself would write with quotes is admitted."""
    import csv
    import io

    from dlrmkit.data.transcode import _read_fields, quoted_lines

    lines = [ln.replace(b"\n", b"").replace(b"\r", b"") for ln in lines]
    block = b"".join(ln + b"\n" for ln in lines)
    b = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(b == 10)
    starts = np.concatenate([[0], ends[:-1] + 1])
    fields, stray = quoted_lines(b, starts, ends, ord(","))
    with patch("dlrmkit.data.transcode.QUOTE_CHUNK_BYTES", 7):  # a few lines at a time: the same answer
        chunked = quoted_lines(b, starts, ends, ord(","))
    np.testing.assert_array_equal(chunked[0], fields)
    np.testing.assert_array_equal(chunked[1], stray)
    for line, n, out in zip(lines, fields, stray):
        q = n > 0
        assert out == (b'"' in line and not q), line  # a line with quotes is either read as CSV or stray
        text = line.decode("latin-1")
        strict = csv.reader([text], strict=True)
        try:
            want = next(strict)
        except csv.Error:
            assert not q, line  # csv rejects it: never read as quoted
            continue
        if not q:  # left out: a line csv would write as it is holds no quote (a quote in it is out of place)
            written = io.StringIO()
            csv.writer(written, lineterminator="").writerow(want)
            assert '"' not in text or written.getvalue() != text, (line, want)
            continue
        assert n == len(want), (line, want)
        names = [f"f{i}" for i in range(n)]
        got = _read_fields(line + b"\n", names, names, ",", quoted=True)
        assert len(got) == 1 and [got[c][0].as_py().decode("latin-1") for c in names] == want, (line, want)


QUOTE_BYTES = st.lists(st.sampled_from([b'"', b",", b"a", b" ", b'""', b'"a,b"']), max_size=10).map(b"".join)


@FUZZ
@given(st.lists(QUOTE_BYTES, min_size=1, max_size=12))
def test_quoted_lines_split_as_csv_does(lines):
    check_quoted_lines(lines)


def test_quoted_lines_cases():
    lines = [b'1,"x, y",3', b'4,5" screen,6', b'7,"open,8', b'"a"x"b,c"', b'13,"said ""hi""",14', b'"",""""']
    check_quoted_lines(lines)
