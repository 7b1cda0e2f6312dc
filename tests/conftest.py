"""Fixtures shared by the tests: a tiny synthetic dataset, one trained tiny run, and the CLI
runners. Helpers that tests import (run_cli, tiny_config, ...) live in helpers.py.

Markers (pyproject.toml): `multirank` (launches ranks with torchrun), `gpu` (needs a CUDA GPU;
skipped here, saying why), `slow` (trains a whole recipe). `make test-fast` leaves out all three."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from dlrmkit.data.synthetic import generate
from helpers import run_cli, run_cli_subprocess, scratch_cwd, tiny_config

# The test machines have 2 cores; one intra-op thread keeps the small models fast and the
# results independent of the machine's core count.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A synthetic dataset (read-only for tests: copy it with `dataset_copy` before changing it)."""
    out = tmp_path_factory.mktemp("synth") / "tiny"
    generate(str(out), tiny_config(), seed=0, preset="test-tiny")
    return out


@pytest.fixture
def dataset_copy(tiny_data, tmp_path) -> Path:
    """A private copy of `tiny_data` that a test may corrupt."""
    dst = tmp_path / "data"
    shutil.copytree(tiny_data, dst)
    return dst


@pytest.fixture(scope="session")
def tiny_run(tiny_data, tmp_path_factory) -> Path:
    """One finished run on `tiny_data`, trained once for every test that reads a run folder
    (read-only: copy it before changing it): 40 steps, evaluated every 10, the loss logged every 5,
    checkpoints in <run>/checkpoints."""
    run = tmp_path_factory.mktemp("tiny-run") / "run"
    result = run_cli(
        "train", "--data", tiny_data, "--max-steps", 40, "--eval-every", 10, "--log-every", 5,
        "--no-progress", "--run-dir", run,
    )  # fmt: skip
    assert result.code == 0, result.err
    return run


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Every test (its fixtures too), and every process it starts without a `cwd` of its own, runs
    in the scratch folder: a command's default outputs (`runs/<timestamp>`) never land in the checkout."""
    os.chdir(scratch_cwd())
    gpu_only = item.get_closest_marker("gpu") is not None and item.get_closest_marker("skipif") is None
    if gpu_only and not torch.cuda.is_available():  # helpers.needs_gpu gives its own reason
        pytest.skip("needs a CUDA GPU; none here")


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_subprocess():
    return run_cli_subprocess
