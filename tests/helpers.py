"""Helpers the tests import: the tiny synthetic dataset's shape, and functions that run the
`dlrmkit` CLI in this process or in a fresh interpreter, from a scratch folder. Fixtures live in
conftest.py; tests import helpers from here, never from conftest or from other tests."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from dlrmkit.cli import main as cli_main
from dlrmkit.data.synthetic import SynthConfig

# Small enough to write in well under a second, large enough for 16 batches of 256.
TINY_TABLES = [3, 8, 20, 50, 120]
TINY_NUMERICAL = 4
TINY_ROWS, TINY_TEST_ROWS = 4000, 1000


def tiny_config(**overrides) -> SynthConfig:
    kw = dict(table_sizes=list(TINY_TABLES), num_numerical=TINY_NUMERICAL, rows=TINY_ROWS, test_rows=TINY_TEST_ROWS)
    kw.update(overrides)
    return SynthConfig(**kw)


@dataclass
class CliResult:
    code: int
    out: str
    err: str


_scratch: list[str] = []


def scratch_cwd() -> str:
    """A throw-away working directory for CLI runs, so whatever a command writes relative to the
    current directory (e.g. a default `runs/<timestamp>` folder) never lands in the repository."""
    if not _scratch:
        _scratch.append(tempfile.mkdtemp(prefix="dlrmkit-cli-cwd-"))
        atexit.register(shutil.rmtree, _scratch[0], True)
    return _scratch[0]


def run_cli(*argv: str, cwd: str | os.PathLike | None = None) -> CliResult:
    """`dlrmkit ARGV` in this process (dlrmkit.cli.main returns the exit code). Pass absolute paths:
    the command runs in `cwd` (default: a scratch folder)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or scratch_cwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main([str(a) for a in argv])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli_subprocess(*argv: str, cwd: str | os.PathLike | None = None, timeout: float = 120) -> CliResult:
    """`python -m dlrmkit ARGV` in a fresh interpreter, as a user runs it (in `cwd`, default: a
    scratch folder; pass absolute paths)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "dlrmkit", *[str(a) for a in argv]],
        cwd=cwd or scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def needs_gpu(reason: str):
    """Marks a test `gpu` and skips it, saying `reason`, where torch sees no CUDA GPU."""
    import pytest
    import torch

    def mark(test):
        return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)(test))

    return mark
